"""docs/method.md's closed forms that the e2e tests check a real run's logs against, written here
apart from the package's code (``core.controller``) so that a test can tell the two apart."""

from __future__ import annotations

import math


def next_threshold(
    theta: float, signal: float, mean_score: float, previous_mean_score: float | None, eta: float, bounds
) -> float:
    """θ_{t+1} = clip(θ_t + eta·sign(J_t − J_{t−1})·(s_t − θ_t), bounds) (docs/method.md §3); θ holds
    still on the first step (no J_{t−1}) and when the mean score did not change."""
    if previous_mean_score is None or mean_score == previous_mean_score:
        return theta
    moved = theta + math.copysign(eta, mean_score - previous_mean_score) * (signal - theta)
    return min(max(moved, bounds[0]), bounds[1])
