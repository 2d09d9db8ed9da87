"""Beta-prior pseudo-counts and posterior-mean baselines: AVSPO's ``strategy: beta`` (docs/method.md §6).

Framework-free (torch only). Rewards are first mapped to x in [0, 1] through ``reward_range``. A
Beta(a, b) prior adds a + b pseudo-responses, a of them successes, to every group. The baseline of
response i is a posterior mean of the success rate:

- ``loo``: b_i = (a + S_g − x_i) / (a + b + n_g − 1), from the *other* responses of the group only,
  so b_i does not depend on r_i and the policy gradient stays unbiased;
- ``group``: b_i = (a + S_g) / (a + b + n_g), from the whole group (it depends on r_i, as the
  paper's virtual-sample statistics do); kept for comparison.

S_g is the sum of x over the group. The scale is the posterior std sqrt(b_i (1 − b_i)) of the same
posterior, which is bounded away from 0 because both pseudo-counts are at least ½.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl_avspo.core.config import BASELINES, PRIORS

__all__ = ["PSEUDO_COUNT_FLOOR", "BetaPrior", "fit_beta_prior", "beta_prior", "beta_baseline"]

# Each pseudo-count of the fitted prior is at least Jeffreys' ½: with no information the fit is
# Jeffreys, and the posterior std (the scale) stays bounded away from 0.
PSEUDO_COUNT_FLOOR = 0.5
_FIXED = {"jeffreys": (0.5, 0.5), "laplace": (1.0, 1.0)}


@dataclass(frozen=True)
class BetaPrior:
    """Beta(a, b) on a group's success rate: a successes and b failures of pseudo-responses."""

    a: float
    b: float

    @property
    def strength(self) -> float:
        return self.a + self.b

    @property
    def mean(self) -> float:
        return self.a / (self.a + self.b)


def fit_beta_prior(successes: torch.Tensor, counts: torch.Tensor, strength_max: float) -> BetaPrior:
    """Empirical-Bayes Beta prior by the method of moments on the batch's group success rates.

    Over the G groups with n_g ≥ 2 and their success rates m_g = S_g / n_g:
    μ = mean m_g; the between-prompt variance of the true rates is
    σ² = Var(m_g) − mean(m_g (1 − m_g) / (n_g − 1)) (sample variance, minus the binomial noise it
    contains); the strength is ν = μ(1 − μ)/σ² − 1, taken as ``strength_max`` when σ² ≤ 0 (no spread
    beyond noise) and clipped to [0, ``strength_max``]; then a = max(μν, ½), b = max((1 − μ)ν, ½).
    With fewer than two such groups nothing is known about the spread: ν = 0, which gives Jeffreys.

    Args:
        successes: (num_groups,) float64, S_g = sum of x in [0, 1] over each group.
        counts: (num_groups,) int64, n_g.
        strength_max: the cap on ν = a + b before the floors.
    """
    eligible = counts >= 2
    n = counts[eligible].to(torch.float64)
    rates = successes[eligible] / n
    groups = int(rates.numel())
    if groups < 2:
        return BetaPrior(PSEUDO_COUNT_FLOOR, PSEUDO_COUNT_FLOOR)
    mean = rates.mean()
    spread = rates.var(correction=1) - (rates * (1 - rates) / (n - 1)).mean()
    mean, spread = (float(v) for v in torch.stack([mean, spread]).tolist())
    strength = mean * (1 - mean) / spread - 1 if spread > 0 else strength_max
    strength = min(max(strength, 0.0), strength_max)
    return BetaPrior(max(mean * strength, PSEUDO_COUNT_FLOOR), max((1 - mean) * strength, PSEUDO_COUNT_FLOOR))


def beta_prior(kind: str, successes: torch.Tensor, counts: torch.Tensor, strength_max: float) -> BetaPrior:
    """The prior named by ``kind``: ``jeffreys`` Beta(½, ½), ``laplace`` Beta(1, 1), or ``fitted``
    (:func:`fit_beta_prior`; the batch statistics are read only for it)."""
    if kind == "fitted":
        return fit_beta_prior(successes, counts, strength_max)
    if kind not in _FIXED:
        raise ValueError(f"unknown Beta prior {kind!r}; allowed: {', '.join(PRIORS)}")
    return BetaPrior(*_FIXED[kind])


def beta_baseline(
    x: torch.Tensor, ids: torch.Tensor, successes: torch.Tensor, counts: torch.Tensor, prior: BetaPrior, baseline: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior-mean baseline and posterior std of every response.

    Args:
        x: (bs,) float64 rewards mapped to [0, 1].
        ids: (bs,) int64 group of each response.
        successes: (num_groups,) float64, S_g = sum of x over the group.
        counts: (num_groups,) int64, n_g.
        prior: Beta(a, b) with a, b > 0.
        baseline: ``loo`` (leave response i out) or ``group`` (the whole group).

    Returns:
        baseline: (bs,) float64 b_i, strictly inside (0, 1).
        scale: (bs,) float64 sqrt(b_i (1 − b_i)) > 0.
    """
    group_successes = successes[ids]
    size = counts[ids].to(torch.float64)
    if baseline == "loo":
        mean = (prior.a + group_successes - x) / (prior.strength + size - 1)
    elif baseline == "group":
        mean = (prior.a + group_successes) / (prior.strength + size)
    else:
        raise ValueError(f"unknown Beta baseline {baseline!r}; allowed: {', '.join(BASELINES)}")
    return mean, (mean * (1 - mean)).sqrt()
