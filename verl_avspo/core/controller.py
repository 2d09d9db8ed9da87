"""The adaptive controller: AVSPO's state across training steps (docs/method.md §3, steps 2, 3 and 7).

Framework-free. It owns the step count, the threshold θ_t, the EMA of ACR, the previous mean
score J_{t-1} and the RNG of the ``random`` strategy, and it round-trips all of them through
``state_dict`` / ``load_state_dict`` so a resumed run continues bit-identically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from verl_avspo.core.config import ACRConfig, AVSPOConfig

__all__ = ["AdaptiveController", "Decision"]


@dataclass(frozen=True)
class Decision:
    """What the controller decided for one step."""

    step: int  # 1-based index of the step this decision is for
    signal: float  # s_t: ACR_t or its EMA
    threshold: float  # θ_t, compared with s_t
    triggered: bool  # s_t > θ_t: augment this step's eligible collapsed groups


class AdaptiveController:
    """Tracks s_t and θ_t. Call :meth:`observe` once per training step."""

    def __init__(self, config: AVSPOConfig, acr: ACRConfig):
        """``config`` drives θ and the RNG; ``acr`` is what the ACR it observes was measured with."""
        self.config = config
        self.acr = acr
        self.step = 0
        self.threshold = config.threshold_init
        self.ema: float | None = None
        self.previous_mean_score: float | None = None
        self.generator = torch.Generator().manual_seed(config.seed)

    def observe(self, acr: float, mean_score: float) -> Decision:
        """Take this step's raw ACR and mean raw score J_t; return the decision for this step and
        move θ to θ_{t+1} = clip(θ_t + eta·sign(ΔJ)·(s_t − θ_t), bounds)."""
        cfg = self.config
        if cfg.acr_signal == "ema":
            self.ema = acr if self.ema is None else cfg.ema_beta * self.ema + (1 - cfg.ema_beta) * acr
            signal = self.ema
        else:
            signal = acr
        self.step += 1
        decision = Decision(self.step, signal, self.threshold, signal > self.threshold)

        delta = 0.0 if self.previous_mean_score is None else mean_score - self.previous_mean_score
        if cfg.adaptive_threshold and delta != 0.0:  # sign(0) = 0: θ holds still
            lo, hi = cfg.threshold_bounds
            moved = self.threshold + cfg.eta * math.copysign(1.0, delta) * (signal - self.threshold)
            self.threshold = min(max(moved, lo), hi)
        self.previous_mean_score = mean_score
        return decision

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "threshold": self.threshold,
            "ema": self.ema,
            "previous_mean_score": self.previous_mean_score,
            "rng_state": self.generator.get_state(),
            "config": self._settings(),
        }

    def _settings(self) -> dict[str, Any]:
        # What a resume must not change: the estimator's settings and the collapse test its ACR and
        # virtual values depend on (the alert may change).
        return {**self.config.to_dict(), **self.acr.measurement()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved, current = state.get("config"), self._settings()
        if saved is not None and saved != current:
            changed = sorted(k for k in current if saved.get(k) != current[k])
            raise ValueError(
                f"AVSPO checkpoint was written with different settings ({', '.join(changed)}); "
                "resume with the same algorithm.avspo config, or start a fresh run."
            )
        self.step = int(state["step"])
        self.threshold = float(state["threshold"])
        self.ema = None if state["ema"] is None else float(state["ema"])
        self.previous_mean_score = None if state["previous_mean_score"] is None else float(state["previous_mean_score"])
        self.generator.set_state(state["rng_state"])
