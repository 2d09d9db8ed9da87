"""ACR's settings: the collapse test, the reward range and the stall alert (docs/configuration.md).

Framework-free. They apply to every group estimator (grpo, rloo, avspo, ...), so they have a section
of their own, ``algorithm.acr`` in verl (``--acr.*`` in OpenRLHF), apart from AVSPO's
``algorithm.avspo``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from verl_avspo.core.validation import Problems, choice, fail, given_settings, integer, number, pair

__all__ = [
    "AlertConfig",
    "ACRConfig",
    "ALERT_ACTIONS",
    "ALERT_RULES",
    "ALERT_KEYS",
    "ACR_KEYS",
    "ACR_SECTION",
    "resolve_alert",
    "resolve_acr",
]

ALERT_ACTIONS = ("warn", "stop")
ALERT_RULES = ("acr", "all_wrong", "acr_no_gain")  # core.alert: what each one watches
# Where verl users set them.
ACR_SECTION = "algorithm.acr"


@dataclass(frozen=True)
class AlertConfig:
    """Stagnation alert: ``window`` consecutive steps with the ``rule``'s signal above
    ``threshold`` (``verl_avspo.core.alert``)."""

    window: int = 50
    """Consecutive steps the rule's rate must stay above ``threshold`` before the alert fires."""
    threshold: float = 0.35
    """The rate the rule's signal must stay strictly above, in [0, 1]."""
    action: str = "warn"
    """``warn``: log once with advice and set ``acr/stalled``; ``stop``: also checkpoint and end the run."""
    rule: str = "acr_no_gain"
    """What is watched: ``acr_no_gain`` (docs/diagnostics_results.md's best), ``acr`` (the paper's) or ``all_wrong``."""


@dataclass(frozen=True)
class ACRConfig:
    """The ACR metrics' settings and the stagnation alert (``algorithm.acr``), read with every group
    estimator, AVSPO or not."""

    tau: float = 1e-6
    """A group is collapsed iff the population std of its scores is below this; also the |A| bound of acr/effective."""
    reward_range: tuple[float, float] = (0.0, 1.0)
    """The verifier's (low, high): its midpoint splits all-correct from all-wrong; R in the virtual values."""
    alert: AlertConfig = field(default_factory=AlertConfig)
    """The stagnation alert (``algorithm.acr.alert.*``)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def measurement(self) -> dict[str, Any]:
        """The settings that decide what is measured (``tau``, ``reward_range``): a resumed run must keep
        them, while the alert, which only watches the measurements, may change."""
        return {"tau": self.tau, "reward_range": self.reward_range}


ACR_KEYS = tuple(f.name for f in fields(ACRConfig))
ALERT_KEYS = tuple(f.name for f in fields(AlertConfig))


def resolve_alert(mapping: Mapping[str, Any] | None, section: str = f"{ACR_SECTION}.alert") -> AlertConfig:
    """Validate an ``alert`` section (``section`` names it in the messages).

    Raises:
        SettingsError: listing every bad key.
    """
    problems = Problems()
    example = f"{section}.window=50 (allowed: {', '.join(ALERT_KEYS)})"
    alert = replace(AlertConfig(), **given_settings(mapping, section, ALERT_KEYS, problems, example=example))
    problems.check(integer, f"{section}.window", alert.window, 1)
    threshold = problems.check(number, f"{section}.threshold", alert.threshold, 0.0, 1.0)
    problems.check(choice, f"{section}.action", alert.action, ALERT_ACTIONS)
    problems.check(choice, f"{section}.rule", alert.rule, ALERT_RULES)
    problems.raise_any()
    return replace(alert, threshold=threshold)


def _is_given(value: Any) -> bool:
    """Set to something: not None, and for a section (``alert``) some key of it not None."""
    if isinstance(value, Mapping):
        return any(_is_given(v) for v in value.values())
    return value is not None


def resolve_acr(mapping: Mapping[str, Any] | None, *, section: str = ACR_SECTION) -> ACRConfig:
    """Validate ACR's section ``mapping`` (``algorithm.acr``; None or missing keys: the defaults);
    ``section`` names it in the messages, as the host's user spells it.

    Raises:
        SettingsError (a ValueError): one message per bad key, naming the key, the value and the fix.
    """
    problems = Problems()
    given = given_settings(mapping, section, ACR_KEYS, problems, example=f"{section}.tau=1e-6")
    given = {key: value for key, value in given.items() if _is_given(value)}  # an all-null alert is not given
    values = {**asdict(ACRConfig()), **given}
    tau = problems.check(number, f"{section}.tau", values["tau"], 0.0, math.inf, low_open=True)
    reward_range = problems.check(pair, f"{section}.reward_range", values["reward_range"])
    if tau is not None and reward_range is not None:
        problems.check(_check_tau_scale, f"{section}.tau", tau, reward_range)
    alert = values["alert"]
    if not isinstance(alert, AlertConfig):
        alert = problems.check(resolve_alert, alert, f"{section}.alert")
    problems.raise_any()
    return ACRConfig(tau=tau, reward_range=reward_range, alert=alert)


# A tau above this fraction of the reward range's width counts groups with clearly different scores as collapsed
# (0/1 rewards: a group of 128 with one success has a population std of 0.088).
TAU_WARN_FRACTION = 0.1


def _check_tau_scale(key: str, tau: float, reward_range: tuple[float, float]) -> None:
    """``tau`` against the reward range: refused from half its width up (no group of scores within the
    range has a population std above that, so every group would count as collapsed), with a warning
    above :data:`TAU_WARN_FRACTION` of it (tau is a tolerance for equal scores, 1e-6 by default)."""
    low, high = reward_range
    width = high - low
    if tau >= width / 2:
        fail(
            key,
            tau,
            f"a group's scores within reward_range [{low}, {high}] have a population std of at most {width / 2}, "
            "so every group would count as collapsed; tau is the tolerance for equal scores (default 1e-6): set it "
            "far below the range's width, or set reward_range to your verifier's [low, high]",
        )
    if tau > TAU_WARN_FRACTION * width:
        warnings.warn(
            f"{key}={tau} is {tau / width:.0%} of reward_range [{low}, {high}]: groups whose scores differ by up to "
            f"about {2 * tau:g} count as collapsed (no learning signal). tau is the tolerance for equal scores "
            "(default 1e-6); keep it far below the smallest reward difference your verifier gives.",
            UserWarning,
            stacklevel=4,  # resolve_acr's caller
        )
