"""The harness's reward, in verl's ``custom_reward_function`` form: 1 when the response writes the
sum anywhere, else 0. (A random policy over a 16-token vocabulary scores on one-digit sums now and
then, and almost never on two-digit ones: see :mod:`verl_cpu.assets`.)"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    return 1.0 if str(ground_truth) in solution_str else 0.0
