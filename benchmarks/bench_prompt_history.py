"""Memory and per-step cost of the per-prompt history (core.prompt_history) and the skip rule, at 1k,
100k and 1M prompts, against verl's ``compute_grpo_outcome_advantage`` on the same batch.

For each history size and key kind (``int``: a dataset index; ``str``: ``prompt_key`` hashes, 32 hex
characters) the history is filled with that many prompts, then one step's batch (N responses in
groups of G, built by ``bench_advantage.make_batch``: uuid4 uids in shuffled order) is timed:

    new prompts       the tracker's step with prompt keys, every group a prompt never seen (the
                      history grows: the first epoch's worst case): ``set_prompt_keys`` + ``end_step``
    revisits          the same, every group a prompt already in the history (later epochs)
    no keys           ``end_step`` without prompt keys (the tracker's cost before this feature)
    select_prompts    the skip rule's decision for the step's prompts (skipping on)
    grpo              verl's ``compute_grpo_outcome_advantage`` on the same batch (the advantage
                      stage every GRPO step pays)

Memory: the history's arrays (``nbytes``), the resident set it added while filled (``VmRSS``
before and after, Linux), and its saved state (``torch.save`` of ``state_dict``). Times are
medians over ``--repeats`` calls after warm-up, rows taking turns (``bench_advantage.time_calls``).

Usage:
    python benchmarks/bench_prompt_history.py                 # 1k, 100k, 1M prompts; N=8k, L=1k, G=8
    python benchmarks/bench_prompt_history.py --prompts 1000 --repeats 3
"""

from __future__ import annotations

import argparse
import gc
import io
import sys
from pathlib import Path

import numpy as np
import torch
from verl.trainer.ppo import core_algos

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_advantage, beside this script

from bench_advantage import _status_kib, count_list, environment, make_batch, time_calls  # noqa: E402

from verl_avspo.core.acr_config import ACRConfig  # noqa: E402
from verl_avspo.core.prompt_history import prompt_key  # noqa: E402
from verl_avspo.core.prompt_skip import PromptSkipConfig  # noqa: E402
from verl_avspo.core.run_tracker import RunTracker  # noqa: E402
from verl_avspo.tools.markdown import render_table  # noqa: E402

COLUMNS = ("prompts", "keys", "arrays MiB", "B/prompt", "RSS MiB", "state MiB")
COLUMNS += ("new prompts ms", "revisits ms", "no keys ms", "select_prompts ms", "grpo ms", "new / grpo")


def keys_of(kind: str, numbers: np.ndarray) -> list:
    return numbers.tolist() if kind == "int" else [prompt_key(f"prompt {n}") for n in numbers.tolist()]


def rss_mib() -> float:
    try:
        return _status_kib("VmRSS") / 1024
    except (OSError, AttributeError):
        return float("nan")


def row(num_prompts: int, kind: str, batch, group_size: int, repeats: int) -> list[str]:
    gc.collect()
    before = rss_mib()
    tracker = RunTracker(ACRConfig(), prompt_skip=PromptSkipConfig(enable=True))
    filled = np.arange(num_prompts)
    tracker.prompt_history.record(
        keys_of(kind, filled), np.zeros(num_prompts), np.zeros(num_prompts, bool), np.ones(num_prompts, bool), 0
    )
    added = rss_mib() - before
    nbytes = tracker.prompt_history.nbytes
    buffer = io.BytesIO()
    torch.save(tracker.prompt_history.state_dict(), buffer)

    uids = list(dict.fromkeys(batch.index.tolist()))
    num_groups = len(uids)
    fresh = iter(range(num_prompts, num_prompts + 10**9, num_groups))
    spread = np.arange(num_groups) * max(1, num_prompts // num_groups)  # prompts already in the history
    revisit_keys = dict(zip(uids, keys_of(kind, spread), strict=True))
    scores = batch.scores
    steps = iter(range(1, 10**9))

    def step(keys_by_uid):
        tracker.measure(scores, batch.index)
        if keys_by_uid is not None:
            tracker.set_prompt_keys(keys_by_uid)
        return tracker.end_step(next(steps))

    def new_prompts():
        start = next(fresh)
        return step(dict(zip(uids, keys_of(kind, np.arange(start, start + num_groups)), strict=True)))

    candidates = list(revisit_keys.values())
    inputs = {"token_level_rewards": batch.token_level_rewards, "response_mask": batch.response_mask}
    calls = {
        "new": new_prompts,
        "revisit": lambda: step(revisit_keys),
        "none": lambda: step(None),
        "select": lambda: tracker.select_prompts(candidates, group_size),
        "grpo": lambda: core_algos.compute_grpo_outcome_advantage(**inputs, index=batch.index),
    }
    median = {name: float(np.median(ms)) for name, ms in time_calls(calls, repeats, 1, lambda: None).items()}
    return [
        f"{num_prompts:,}",
        kind,
        f"{nbytes / 2**20:.1f}",
        f"{nbytes / num_prompts:.0f}",
        f"{added:.1f}",
        f"{buffer.getbuffer().nbytes / 2**20:.1f}",
        *(f"{median[name]:.2f}" for name in ("new", "revisit", "none", "select", "grpo")),
        f"{median['new'] / median['grpo']:.3f}",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=count_list, default=[1000, 100_000, 1_000_000], help="history sizes")
    parser.add_argument("--kinds", default="int,str", help="key kinds: int, str or both (default int,str)")
    parser.add_argument("--responses", type=int, default=8192, help="responses N in the step's batch (default 8192)")
    parser.add_argument("--length", type=int, default=1024, help="response length L (default 1024)")
    parser.add_argument("--group-size", type=int, default=8, help="group size G (default 8)")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per row (default 7)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as verl's trainer)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    batch = make_batch(args.responses, args.length, args.group_size, collapsed=0.4)
    rows = [row(n, kind, batch, args.group_size, args.repeats) for n in args.prompts for kind in args.kinds.split(",")]
    print(f"N={args.responses} L={args.length} G={args.group_size}; {environment('cpu')}")
    print(render_table(COLUMNS, rows))


if __name__ == "__main__":
    main()
