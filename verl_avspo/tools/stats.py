"""The numbers read off a run's metric frame (one row per logged step, as :mod:`verl_avspo.tools.logs`
returns): early ACR, window means, last values and the latest validation; and the numbers over
seeds: mean ± std and paired differences (mean ± standard error). ``verl-avspo report``,
``verl-avspo table``, the sandbox's ``summary.md`` and the study scripts of ``benchmarks/`` all
compute them here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

__all__ = [
    "EARLY_STEPS",
    "VALIDATION_PREFIX",
    "EarlyACR",
    "PairedDifference",
    "early_acr",
    "last_value",
    "latest_validation",
    "mean_std",
    "mean_std_cell",
    "paired_difference",
    "window_mean",
]

EARLY_STEPS = 100  # the paper's ACR_100: ACR over the first 100 training steps
VALIDATION_PREFIX = "val-core/"  # verl's headline validation metrics, e.g. val-core/<data_source>/acc/mean@1


class EarlyACR(NamedTuple):
    """ACR over a run's first steps, and which logged steps it averages."""

    mean: float
    first_step: int
    last_step: int
    steps: int  # how many logged steps were averaged
    resumed: bool  # the log starts after step ``early_steps``: its earliest logged steps were used


def early_acr(acr: pd.Series, early_steps: int = EARLY_STEPS) -> EarlyACR | None:
    """ACR over the first ``early_steps`` training steps (docs/method.md §2, the paper's ACR_100).

    The one definition: the mean of ``acr`` (``acr/rate`` or one of its parts, indexed by step, NaN
    where not logged) over the logged steps numbered up to ``early_steps`` (training starts at step
    1). A log that starts later (a run resumed from a checkpoint) has no such step; it gets the mean
    over its earliest ``early_steps`` logged steps instead, with ``resumed`` set so that callers say
    so. A short or sparse log averages what it has (``steps`` says how many). None only when
    ``acr`` holds no value at all.
    """
    acr = acr.dropna()
    if acr.empty:
        return None
    first = acr[acr.index <= early_steps]
    resumed = first.empty
    if resumed:
        first = acr.iloc[:early_steps]
    return EarlyACR(float(first.mean()), int(first.index[0]), int(first.index[-1]), len(first), resumed)


def window_mean(series: pd.Series | None, last: int | None = None) -> float | None:
    """Mean of the logged values of ``series``, over its last ``last`` of them (all when None);
    None when it holds none."""
    if series is None:
        return None
    values = series.dropna()
    if last is not None:
        values = values.iloc[-last:]
    return float(values.mean()) if len(values) else None


def last_value(series: pd.Series | None) -> float | None:
    """The last logged value of ``series``; None when it holds none."""
    values = pd.Series(dtype=float) if series is None else series.dropna()
    return float(values.iloc[-1]) if len(values) else None


def latest_validation(frame: pd.DataFrame) -> dict[str, float]:
    """Each validation metric (``val-core/...`` column) -> its latest logged value, in the frame's
    column order; metrics never logged are left out."""
    found = {column: last_value(frame[column]) for column in frame if column.startswith(VALIDATION_PREFIX)}
    return {column: value for column, value in found.items() if value is not None}


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
