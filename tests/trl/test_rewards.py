"""What the TRL adapter checks of the rewards (``verl_avspo.trl.rewards``): a reward function that
returns something other than a number or None, sync or async, is refused naming the function, the
completion and the value (TRL's own error would be "too many dimensions 'str'"), and an infinite reward
stops the step naming the function and the value, with either estimator (TRL would compute NaN
advantages); a reward model is left as it is. The trainer's runs train the tiny model of conftest.py.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

pytest.importorskip("trl", reason="TRL is not installed (pip install 'verl-avspo[trl]')")

from trl.trainer.utils import is_async_callable  # noqa: E402
from trl_cpu.harness import make_trainer  # noqa: E402

from verl_avspo.trl.rewards import check_finite, checked_reward_funcs  # noqa: E402

ONE_STEP = {"max_steps": 1}


def test_numbers_and_none_pass_and_anything_else_is_refused_naming_the_function_sync_or_async():
    def plain(completions, **kwargs):
        return [1, 0.5, None, np.float32(0.25), torch.tensor(1.0), True]

    async def late(completions, **kwargs):
        return [0.0, {"score": 1}]

    model = torch.nn.Linear(1, 1)
    checked_plain, checked_late, same_model = checked_reward_funcs([plain, late, model], ["plain", "late", "model"])
    assert checked_plain(completions=[]) == plain(completions=[]) and checked_plain.__name__ == "plain"
    assert is_async_callable(checked_late) and same_model is model
    with pytest.raises(TypeError, match=r"^reward function 'late' returned a dict for completion 1 \(\{'score': 1\}\)"):
        asyncio.run(checked_late(completions=[]))


def test_an_infinite_reward_is_refused_naming_the_function_the_completion_and_the_value():
    check_finite(torch.tensor([[0.0, float("nan")], [1.0, 0.0]]), ["a", "b"])  # NaN: TRL's unscorable
    with pytest.raises(ValueError, match=r"^reward function 'b' returned inf for completion 1 of the generation batch"):
        check_finite(torch.tensor([[0.0, 1.0], [1.0, float("inf")]]), ["a", "b"])


def test_a_reward_function_that_returns_strings_stops_the_step_naming_it(tiny, tmp_path):
    def as_text(completions, **kwargs):
        return ["1.0"] * len(completions)

    trainer = make_trainer(tiny, tmp_path, reward_funcs=as_text, config=ONE_STEP)
    with pytest.raises(TypeError, match=r"^reward function 'as_text' returned a str for completion 0 \('1.0'\): TRL"):
        trainer.train()


@pytest.mark.parametrize("estimator", ["avspo", "grpo"])
def test_an_infinite_reward_stops_the_step_naming_the_function_and_the_value(tiny, tmp_path, estimator):
    def unbounded(completions, **kwargs):
        return [0.0, -float("inf")] + [1.0] * (len(completions) - 2)

    trainer = make_trainer(tiny, tmp_path, reward_funcs=unbounded, config=ONE_STEP, estimator=estimator)
    with pytest.raises(ValueError) as refused:
        trainer.train()
    assert str(refused.value).startswith(
        "reward function 'unbounded' returned -inf for completion 1 of the generation batch (1 infinite reward(s) in "
        "all): a completion's score must be finite."
    )
