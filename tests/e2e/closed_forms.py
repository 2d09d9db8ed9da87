"""What the e2e tests check a real run's logs against, written here apart from the package's code
(``core.collapse``, ``core.controller``) so that a test can tell the two apart: the metric names the docs
promise on every step, and docs/method.md's closed forms."""

from __future__ import annotations

import math

# Logged by every route on every step of a group estimator (README.md's metrics table).
ACR_KEYS = ("acr/rate", "acr/all_correct", "acr/all_wrong", "acr/effective", "acr/groups", "acr/stalled")
# Logged on every step of an avspo run.
AVSPO_KEYS = ("avspo/threshold", "avspo/signal", "avspo/triggered", "avspo/virtual_k")
# The per-prompt history's, on every step of a group estimator where the route knows each group's prompt.
PROMPT_KEYS = ("prompts/seen", "prompts/always_solved", "prompts/never_solved", "prompts/collapsed_before")


def next_threshold(
    theta: float, signal: float, mean_score: float, previous_mean_score: float | None, eta: float, bounds
) -> float:
    """θ_{t+1} = clip(θ_t + eta·sign(J_t − J_{t−1})·(s_t − θ_t), bounds) (docs/method.md §3); θ holds
    still on the first step (no J_{t−1}) and when the mean score did not change."""
    if previous_mean_score is None or mean_score == previous_mean_score:
        return theta
    moved = theta + math.copysign(eta, mean_score - previous_mean_score) * (signal - theta)
    return min(max(moved, bounds[0]), bounds[1])
