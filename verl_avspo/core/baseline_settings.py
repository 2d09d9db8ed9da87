"""Settings of the paper's other baselines in verl: DCPO (``algorithm.dcpo``) and the intrinsic
rewards of INTUITOR and RENT (``algorithm.intrinsic``). Framework-free (no torch, no verl).
Every bad key is reported, not only the first.

``resolve_dcpo`` / ``resolve_intrinsic`` take any mapping (a plain dict or verl's DictConfig; a
key set to ``None`` means "not given") and return a frozen, validated settings object. Every error
names the key, the value, what is allowed and how to fix it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from verl_avspo.core.validation import Problems, given_settings

__all__ = [
    "INTRINSIC_REWARDS",
    "DCPOConfig",
    "IntrinsicConfig",
    "resolve_dcpo",
    "resolve_intrinsic",
    "dcpo_settings",
    "intrinsic_settings",
]

# none: the verifier's reward; self_certainty: INTUITOR; negative_entropy: RENT.
INTRINSIC_REWARDS = ("none", "self_certainty", "negative_entropy")


@dataclass(frozen=True)
class DCPOConfig:
    """DCPO's smooth advantage standardization (``verl_avspo.core.dcpo``). Its per-prompt history is keyed
    by the run's prompt identity, which the host passes every step (``RunTracker.set_prompt_keys``)."""

    epsilon: float = 1e-6
    """Added to the group and cumulative stds before dividing (verl's GRPO uses 1e-6)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class IntrinsicConfig:
    """The reward the advantages are computed from (``verl_avspo.core.intrinsic``)."""

    reward: str = "none"
    """``none`` (the verifier's), ``self_certainty`` (INTUITOR) or ``negative_entropy`` (RENT)."""
    last_tokens: int | None = None
    """RENT only: average the entropy over each response's last this many tokens (None: all of them)."""

    @property
    def enabled(self) -> bool:
        return self.reward != "none"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dcpo_epsilon(epsilon: Any) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon) or epsilon < 0:
        raise ValueError(
            f"algorithm.dcpo.epsilon={epsilon!r} is invalid: expected a finite number >= 0 added to the stds "
            "before dividing. Set algorithm.dcpo.epsilon=1e-6 (verl's GRPO value)."
        )
    return float(epsilon)


def resolve_dcpo(raw: Mapping[str, Any] | None) -> DCPOConfig:
    """Validated DCPO settings from ``algorithm.dcpo`` (absent or null keys take the defaults).

    Raises:
        SettingsError (a ValueError): one message per bad key.
    """
    problems = Problems()
    allowed = [f.name for f in fields(DCPOConfig)]
    given = given_settings(raw, "algorithm.dcpo", allowed, problems, example="algorithm.dcpo.epsilon=1e-6")
    settings = DCPOConfig(**given)
    epsilon = problems.check(_dcpo_epsilon, settings.epsilon)
    problems.raise_any()
    return DCPOConfig(epsilon=epsilon)


def _intrinsic_reward(reward: Any) -> str:
    if reward not in INTRINSIC_REWARDS:
        raise ValueError(
            f"algorithm.intrinsic.reward={reward!r} is invalid: expected one of "
            f"{', '.join(INTRINSIC_REWARDS)} (self_certainty: INTUITOR, negative_entropy: RENT). "
            "Set algorithm.intrinsic.reward=none to train on the verifier's reward."
        )
    return reward


def _last_tokens(last: Any, reward: str | None) -> int | None:
    if last is None:
        return None
    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise ValueError(
            f"algorithm.intrinsic.last_tokens={last!r} is invalid: expected a positive integer (the number of "
            "final response tokens whose entropy RENT averages) or null for every token."
        )
    if reward is not None and reward != "negative_entropy":
        raise ValueError(
            f"algorithm.intrinsic.last_tokens={last} only applies to algorithm.intrinsic.reward=negative_entropy "
            f"(RENT), not {reward}. Remove it, or set algorithm.intrinsic.reward=negative_entropy."
        )
    return last


def resolve_intrinsic(raw: Mapping[str, Any] | None) -> IntrinsicConfig:
    """Validated intrinsic-reward settings from ``algorithm.intrinsic``.

    Raises:
        SettingsError (a ValueError): one message per bad key.
    """
    problems = Problems()
    allowed = [f.name for f in fields(IntrinsicConfig)]
    example = "algorithm.intrinsic.reward=negative_entropy"
    settings = IntrinsicConfig(**given_settings(raw, "algorithm.intrinsic", allowed, problems, example=example))
    reward = problems.check(_intrinsic_reward, settings.reward)
    problems.check(_last_tokens, settings.last_tokens, reward)
    problems.raise_any()
    return settings


def dcpo_settings(algorithm_config: Any) -> DCPOConfig:
    """DCPO settings of verl's ``config.algorithm`` (``dcpo`` may be absent)."""
    return resolve_dcpo(None if algorithm_config is None else algorithm_config.get("dcpo", None))


def intrinsic_settings(algorithm_config: Any) -> IntrinsicConfig:
    """Intrinsic-reward settings of verl's ``config.algorithm`` (``intrinsic`` may be absent)."""
    return resolve_intrinsic(None if algorithm_config is None else algorithm_config.get("intrinsic", None))
