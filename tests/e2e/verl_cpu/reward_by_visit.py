"""A reward set by how often each prompt has been scored, in verl's ``custom_reward_function`` form, for the runs
whose collapses must not depend on what the policy writes or which groups finish first: the allocation run's
pilots and their outcomes, the stall of a separate_async run's first step. Each prompt's
first :data:`FIRST_VISIT` responses score 0 (its group collapses on its first visit); after that, a prompt of
even ``extra_info.index`` scores 1, 0, 1, 0, ... (a pilot that spreads) and one of odd index 0 (a pilot that
collapses). verl scores in one reward worker (``reward.num_workers=1``) on a thread pool, hence the lock."""

import collections
import threading

FIRST_VISIT = 4  # launch.py's GROUP_SIZE: one full group

_scored: collections.Counter = collections.Counter()
_lock = threading.Lock()


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    index = extra_info["index"]
    with _lock:
        count = _scored[index]
        _scored[index] += 1
    if count < FIRST_VISIT or index % 2:
        return 0.0
    return float((count - FIRST_VISIT) % 2 == 0)
