"""Stagnation alert: a run whose ACR stays high has stopped learning (SPEC §2, §4).

Framework-free. :class:`StagnationMonitor` is the streaming form used during training;
:func:`stalled_windows` is the offline form used on logs. Both use the same rule: ``window``
consecutive steps with ACR strictly above ``threshold``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl_avspo.core.config import AlertConfig

__all__ = ["StagnationMonitor", "stalled_windows", "ADVICE"]

ADVICE = (
    "raise the sampling temperature, use a larger group (actor_rollout_ref.rollout.n), "
    "train on easier data (a pass-rate band around 30-50%), or use algorithm.adv_estimator=avspo"
)


class StagnationMonitor:
    """Counts consecutive high-ACR steps; reports the step at which a run first stalls."""

    def __init__(self, config: AlertConfig):
        self.config = config
        self.streak = 0
        self.stalled = False

    def update(self, acr: float) -> bool:
        """Feed one step's raw ACR. Returns True exactly once: on the step the streak reaches
        ``window``. ``stalled`` stays True while the streak lasts and resets when ACR drops."""
        self.streak = self.streak + 1 if acr > self.config.threshold else 0
        newly = self.streak == self.config.window
        self.stalled = self.streak >= self.config.window
        return newly

    def message(self, step: int) -> str:
        cfg = self.config
        return (
            f"advantage collapse: ACR has been above {cfg.threshold:.2f} for {cfg.window} consecutive steps "
            f"(now step {step}); most groups give no gradient. Try to {ADVICE}."
        )

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak, "stalled": self.stalled}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = int(state["streak"])
        self.stalled = bool(state["stalled"])


def stalled_windows(acr: Sequence[float], window: int = 50, threshold: float = 0.35) -> list[tuple[int, int]]:
    """Maximal runs of at least ``window`` consecutive values above ``threshold``, as
    (first, last) positions, inclusive."""
    runs: list[tuple[int, int]] = []
    start = None
    for position, value in enumerate([*acr, float("-inf")]):
        if value > threshold:
            start = position if start is None else start
        elif start is not None:
            if position - start >= window:
                runs.append((start, position - 1))
            start = None
    return runs
