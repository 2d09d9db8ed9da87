"""Stagnation alert: a run whose collapse stays high has stopped learning (docs/method.md §2).

Framework-free. :class:`StagnationMonitor` is the streaming form used during training;
:func:`stalled_steps` runs the same monitor over a log. A rule names the signal that must stay
strictly above ``threshold`` for ``window`` consecutive steps (``algorithm.acr.alert.rule``):

- ``acr``: the raw ACR, the paper's rule ("ACR > 0.35 for more than 50 consecutive steps");
- ``all_wrong``: the all-wrong part of ACR only. All-correct groups are prompts the policy has
  solved, which is success, not stagnation; ``docs/diagnostics_results.md`` measures both rules.
- ``acr_no_gain``: the raw ACR, and in addition the mean training reward over the last ``window``
  steps is no higher than over the ``window`` steps before them (high collapse *and* no progress).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from verl_avspo.core.config import AlertConfig

__all__ = [
    "NEUTRAL_ADVICE",
    "stall_advice",
    "ALERT_SIGNALS",
    "REWARD_KEY",
    "StagnationMonitor",
    "describe_rule",
    "stalled_steps",
    "stalled_windows",
]


def stall_advice(temperature: str, group_size: str, avspo: str) -> str:
    """What to try when a run stalls (the live alert's message, ``verl-avspo report``'s stall finding), with
    the host's own spellings of its sampling temperature, its group size and the switch to AVSPO."""
    return (
        f"raise the sampling temperature ({temperature}), use a larger group ({group_size}), "
        f"train on easier data (a pass-rate band around 30-50%), or use {avspo}"
    )


# The advice of a tracker whose host passes none: it names no host's settings.
NEUTRAL_ADVICE = stall_advice("the generator's temperature", "the group size", "the avspo estimator")

# The metric each rule compares with the threshold.
ALERT_SIGNALS = {"acr": "acr/rate", "all_wrong": "acr/all_wrong", "acr_no_gain": "acr/rate"}
# The step's mean verifier reward, which ``acr_no_gain`` also reads.
REWARD_KEY = "acr/reward_mean"

_DESCRIPTIONS = {
    "acr": "ACR above {threshold:.2f} for {window} consecutive steps",
    "all_wrong": "the all-wrong part of ACR above {threshold:.2f} for {window} consecutive steps",
    "acr_no_gain": (
        "ACR above {threshold:.2f} for {window} consecutive steps, and a mean reward over them no higher than over "
        "the {window} steps before"
    ),
}


def describe_rule(config: AlertConfig) -> str:
    """The stall condition of ``config`` in words."""
    return _DESCRIPTIONS[config.rule].format(threshold=config.threshold, window=config.window)


class StagnationMonitor:
    """Counts consecutive steps whose rule signal is above the threshold; reports the step at
    which a run first stalls."""

    def __init__(self, config: AlertConfig):
        self.config = config
        self.streak = 0
        self.stalled = False
        self.rewards: deque[float] = deque(maxlen=2 * config.window)

    @property
    def signal(self) -> str:
        return ALERT_SIGNALS[self.config.rule]

    def update(self, metrics: Mapping[str, float]) -> bool:
        """Feed one step's metrics (``acr/rate``, ``acr/all_wrong`` and, for ``acr_no_gain``,
        ``acr/reward_mean``). Returns True on the step a run becomes stalled; ``stalled`` stays
        True while the condition lasts and resets when the streak breaks."""
        self.streak = self.streak + 1 if metrics[self.signal] > self.config.threshold else 0
        if self.config.rule == "acr_no_gain":
            self.rewards.append(float(metrics[REWARD_KEY]))
        was_stalled = self.stalled
        self.stalled = self.streak >= self.config.window and self._no_gain()
        return self.stalled and not was_stalled

    def _no_gain(self) -> bool:
        """Whether the mean reward of the last window is no higher than the window's before it
        (False until two windows were seen: no progress cannot be told yet)."""
        if self.config.rule != "acr_no_gain":
            return True
        window = self.config.window
        if len(self.rewards) < 2 * window:
            return False
        rewards = list(self.rewards)
        return sum(rewards[window:]) <= sum(rewards[:window])

    def message(self, step: int, rule_setting: str, advice: str) -> str:
        """The warning for a run stalled at ``step``; ``rule_setting`` (``<the rule's setting>=<rule>``)
        and ``advice`` spell the settings the way the host's user gives them."""
        return (
            f"advantage collapse: {describe_rule(self.config)} (now step {step}, {rule_setting}); most groups give "
            f"no gradient. Try to {advice}."
        )

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak, "stalled": self.stalled, "rewards": list(self.rewards)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = int(state["streak"])
        self.stalled = bool(state["stalled"])
        self.rewards = deque(state.get("rewards", ()), maxlen=2 * self.config.window)


def stalled_steps(rows: Iterable[Mapping[str, float]], config: AlertConfig) -> list[bool]:
    """``acr/stalled`` for each step of a log, as the training-time monitor would have logged it."""
    monitor = StagnationMonitor(config)
    flags = []
    for metrics in rows:
        monitor.update(metrics)
        flags.append(monitor.stalled)
    return flags


def stalled_windows(flags: Iterable[bool]) -> list[tuple[int, int]]:
    """Maximal runs of True in ``flags``, as (first, last) positions, inclusive."""
    runs: list[tuple[int, int]] = []
    start = None
    for position, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = position
        elif not flag and start is not None:
            runs.append((start, position - 1))
            start = None
    return runs
