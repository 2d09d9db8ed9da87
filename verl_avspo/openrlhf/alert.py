"""The stall alert in OpenRLHF's trainer: verl's rules (``algorithm.avspo.alert.*``, here
``--avspo.alert.*``), computed by the same monitor (:mod:`verl_avspo.core.alert`).

Each step the trainer logs (``BasePPOTrainer.save_logs_and_checkpoints``), :meth:`StallAlert.observe`
feeds the step's ``acr/*`` to the monitor and adds ``acr/stalled`` to what OpenRLHF logs; the first
stalled step logs a warning with advice. With ``action: stop`` the adapter then saves a checkpoint
of that step and ends the run as if the prompts were exhausted (:mod:`verl_avspo.openrlhf.trainer_wrap`).
The monitor's state travels in the checkpoint's client states, so a resumed run keeps its streak.
"""

from __future__ import annotations

import logging
from typing import Any

from verl_avspo.core.alert import StagnationMonitor
from verl_avspo.core.config import AlertConfig

__all__ = ["ADVICE", "STATE_KEY", "StallAlert"]

logger = logging.getLogger(__name__)

# The checkpoint client state that holds the monitor (beside ``verl_avspo``, AVSPO's controller).
STATE_KEY = "verl_avspo_stagnation"
ADVICE = (
    "raise the sampling temperature (--rollout.temperature), use a larger group (--rollout.n_samples_per_prompt), "
    "train on easier data (a pass-rate band around 30-50%), or use --algo.advantage.estimator avspo"
)


class StallAlert:
    """The stagnation monitor of one OpenRLHF trainer."""

    def __init__(self, config: AlertConfig):
        self.monitor = StagnationMonitor(config)

    @property
    def stops(self) -> bool:
        return self.monitor.config.action == "stop"

    def observe(self, metrics: dict[str, Any], step: int) -> bool:
        """Feed one step's logged metrics (a step without ``acr/rate`` is skipped) and add
        ``acr/stalled`` to them. Returns True on the step at which the run becomes stalled."""
        if "acr/rate" not in metrics:
            return False
        newly_stalled = self.monitor.update(metrics)
        metrics["acr/stalled"] = float(self.monitor.stalled)
        if newly_stalled:
            rule = f"--avspo.alert.rule {self.monitor.config.rule}"
            logger.warning(self.monitor.message(step, rule_setting=rule, advice=ADVICE))
        return newly_stalled

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.monitor.load_state_dict(state)
