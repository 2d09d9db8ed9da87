"""What the TRL adapter checks of the rewards TRL computes (docs/trl.md, "The one-line change").

TRL turns each reward function's list into a float tensor: a value that is no number fails there as
"too many dimensions 'str'", naming no function, and an infinite one passes and turns the group's
advantages into NaN. Both are refused at the step, naming the reward function, the completion and
the value: the first by wrapping each reward function (sync or async, as TRL tells them apart), the
second on the gathered rewards (every process holds the same, so every process stops alike).
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
from trl.trainer.utils import is_async_callable

from verl_avspo.trl.prompts import short_repr

__all__ = ["checked_reward_funcs", "check_finite"]


def _check_types(name: str, rewards: Any) -> None:
    for row, reward in enumerate(rewards):
        number = isinstance(reward, numbers.Real) or (isinstance(reward, torch.Tensor) and reward.numel() == 1)
        if reward is not None and not number:
            raise TypeError(
                f"reward function {name!r} returned a {type(reward).__name__} for completion {row} "
                f"({short_repr(reward)}): TRL needs one number per completion, or None for one the function "
                "cannot score. Return float(...) of each reward."
            )


def _checked(func: Callable, name: str) -> Callable:
    if is_async_callable(func):

        @functools.wraps(func)
        async def checked_async(*args: Any, **kwargs: Any) -> Any:
            rewards = await func(*args, **kwargs)
            _check_types(name, rewards)
            return rewards

        return checked_async

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        rewards = func(*args, **kwargs)
        _check_types(name, rewards)
        return rewards

    return checked


def checked_reward_funcs(funcs: Sequence[Any], names: Sequence[str]) -> list:
    """TRL's ``reward_funcs``, each function (not a reward model) refusing a value that is neither a
    number nor None (TypeError naming the function, the completion and the value)."""
    checked = zip(funcs, names, strict=True)
    return [func if isinstance(func, torch.nn.Module) else _checked(func, name) for func, name in checked]


def check_finite(rewards_per_func: torch.Tensor, names: Sequence[str]) -> None:
    """Refuse an infinite reward of TRL's (rows, functions) rewards (ValueError naming the function, the
    completion, the value and how many there are)."""
    infinite = torch.isinf(rewards_per_func).nonzero()
    if len(infinite):
        row, func = infinite[0].tolist()
        raise ValueError(
            f"reward function {names[func]!r} returned {rewards_per_func[row, func].item()} for completion {row} of "
            f"the generation batch ({len(infinite)} infinite reward(s) in all): a completion's score must be finite. "
            "Return a finite number (e.g. the low end of acr.reward_range for an answer the function rejects), or "
            "None for a completion it cannot score."
        )
