"""The numbers over seeds: mean ± sample std, paired differences (mean ± standard error, one value per seed)
and the one-sided paired t-test at :data:`ALPHA`. The sandbox's ``summary.md`` and the study scripts of
``benchmarks/`` judge every comparison over seeds here, so that a verdict and a study ask the same question
the same way. Per-run numbers read off a metric frame are :mod:`verl_avspo.tools.stats`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

__all__ = [
    "ALPHA",
    "PairedDifference",
    "mean_std",
    "mean_std_cell",
    "one_sided_t",
    "paired_difference",
    "paired_t",
    "student_t_sf",
]


def mean_std(values: Sequence[float] | np.ndarray) -> tuple[np.ndarray | float, np.ndarray | float]:
    """Mean and sample standard deviation (``ddof=1``) over seeds.

    ``values``: shape ``(seeds,)``, or ``(seeds, points)`` for curves. Returns two floats, or two
    arrays of shape ``(points,)``; the std is NaN for a single seed (numpy warns).
    """
    values = np.asarray(values, dtype=float)
    return values.mean(axis=0), values.std(axis=0, ddof=1)


def mean_std_cell(values: Sequence[float] | np.ndarray, digits: int, scale: float = 1.0) -> str:
    """A table cell ``"mean ± std"`` (:func:`mean_std` of ``values``, shape ``(seeds,)``) times
    ``scale``, both with ``digits`` decimals. The mean alone for a single seed (no spread to show),
    and ``"n/a"`` when a value is NaN (a metric that a run did not log)."""
    if any(math.isnan(value) for value in values):
        return "n/a"
    if len(values) < 2:
        return f"{float(np.mean(values)) * scale:.{digits}f}"
    mean, std = mean_std(values)
    return f"{mean * scale:.{digits}f} ± {std * scale:.{digits}f}"


class PairedDifference(NamedTuple):
    """Per-seed differences between two estimators, summarised over seeds."""

    mean: float
    standard_error: float  # sample std (ddof=1) / sqrt(seeds): NaN for a single seed
    higher: int  # seeds whose difference is positive
    seeds: int

    def cell(self, digits: int) -> str:
        """``"+mean ± standard error"``, both with ``digits`` decimals; the mean alone for a single
        seed (no spread to show, as :func:`mean_std_cell`) and ``"n/a"`` for none (no seed in common)."""
        if self.seeds == 0:
            return "n/a"
        if self.seeds == 1:
            return f"{self.mean:+.{digits}f}"
        return f"{self.mean:+.{digits}f} ± {self.standard_error:.{digits}f}"


def paired_difference(differences: Sequence[float] | np.ndarray) -> PairedDifference:
    """Mean and standard error over seeds of ``differences`` (shape ``(seeds,)``: one estimator's
    value less the other's, seed by seed; how to pair the seeds is the caller's choice)."""
    differences = np.asarray(differences, dtype=float)
    seeds = len(differences)
    if seeds == 0:
        return PairedDifference(math.nan, math.nan, 0, 0)
    mean, std = mean_std(differences)
    return PairedDifference(float(mean), float(std) / math.sqrt(seeds), int((differences > 0).sum()), seeds)


# The level of every one-sided paired test here: the sandbox summary's verdicts and the studies' registered
# tests (benchmarks/rollouts_saved_report.py) ask the same question the same way.
ALPHA = 0.05


def student_t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (regularised incomplete beta)."""
    import mpmath  # torch's sympy brings it; imported here so that reading logs does not pay for it

    tail = 0.5 * float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True))
    return tail if t >= 0 else 1.0 - tail


def _t_quantile(q: float, df: int) -> float:
    """The t with P(T <= t) = q, by bisection on the survival function."""
    low, high = -1e3, 1e3
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if 1.0 - student_t_sf(mid, df) < q else (low, mid)
    return (low + high) / 2


def one_sided_t(difference: PairedDifference) -> tuple[float, float]:
    """(t, p) of the one-sided paired t-test of a mean ``difference`` > 0 (``1 - p`` tests < 0); needs at least
    2 seeds. Without the interval: a verdict that needs only p does not pay :func:`paired_t`'s bisection."""
    mean, se = difference.mean, difference.standard_error
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    return t, student_t_sf(t, difference.seeds - 1) if math.isfinite(t) else float(t < 0)


def paired_t(differences: Sequence[float] | np.ndarray, confidence: float = 0.95) -> dict[str, float]:
    """One-sided paired t-test of mean(``differences``) > 0 (``p``; ``1 - p`` tests < 0) and the two-sided
    ``confidence`` interval of the mean difference (``ci_low``, ``ci_high``); needs at least 2 seeds."""
    difference = paired_difference(differences)
    n, mean, se = difference.seeds, difference.mean, difference.standard_error
    t, p = one_sided_t(difference)
    half = _t_quantile(0.5 + confidence / 2, n - 1) * se
    return {"n": n, "mean": mean, "se": se, "t": t, "p": p, "ci_low": mean - half, "ci_high": mean + half}
