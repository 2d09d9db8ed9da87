"""Group statistics and advantage-collapse detection (docs/method.md §1-2).

Framework-free: torch and numpy only, so the same code serves verl, OpenRLHF or a notebook.

A *group* is the set of responses sampled for one prompt (verl's ``uid``). Everything here is
vectorised with segment operations over the group id of each sample; no Python loop touches
samples or groups.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = [
    "GroupStats",
    "Collapse",
    "DroppedGroups",
    "group_ids",
    "group_stats",
    "detect_collapse",
    "effective_collapse_rate",
    "acr_metrics",
    "Measurement",
    "measure",
    "measure_collapse",
    "non_finite_problem",
    "FINITE_REWARD_FIX",
]

FINITE_REWARD_FIX = (
    "Fix the reward function so it always returns a finite number (for example 0.0 for an unparseable answer)."
)


def non_finite_problem(scores: torch.Tensor, index: Any) -> str | None:
    """What is wrong with (bs,) ``scores`` that hold NaN or inf: how many of each, in which groups
    (the first 5 of ``index``'s labels); None when every score is finite."""
    finite = torch.isfinite(scores)
    if bool(finite.all()):
        return None
    bad = (~finite).nonzero().squeeze(1).tolist()
    num_nan = int(torch.isnan(scores).sum())
    uids = sorted({str(index[i]) for i in bad})
    return (
        f"{len(bad)} response score(s) are not finite ({num_nan} NaN, {len(bad) - num_nan} inf) in group(s) "
        f"uid={uids[:5]}{' ...' if len(uids) > 5 else ''}"
    )


def group_ids(index: Any, device: torch.device | str | None = None) -> tuple[torch.Tensor, int]:
    """Map any per-sample group label array to contiguous ids.

    Args:
        index: (bs,) labels: a numpy array (verl passes dtype object of str), a list, or a tensor
            of ints.
        device: where the ids should live.

    Returns:
        ids: (bs,) int64 tensor with values in [0, num_groups).
        num_groups: number of distinct labels.
    """
    if index is None:
        raise ValueError(
            "group index is missing: a group estimator needs the per-sample prompt id (verl's "
            "non_tensor_batch['uid']). Make sure the batch carries 'uid'."
        )
    if isinstance(index, torch.Tensor):
        if index.dtype.is_floating_point or index.dtype == torch.bool:
            raise ValueError(f"group index must hold integer or string labels, got a {index.dtype} tensor")
        uniq, inverse = torch.unique(index.reshape(-1), return_inverse=True)
        return inverse.to(device=device, dtype=torch.long), int(uniq.numel())
    labels = np.asarray(index)
    if labels.ndim != 1:
        raise ValueError(f"group index must be 1-D (one label per response), got shape {labels.shape}")
    try:
        inverse = _sorted_codes(labels) if labels.dtype == object else np.unique(labels, return_inverse=True)[1]
    except TypeError:  # labels of mixed types cannot be sorted: compare their string forms
        _, inverse = np.unique(labels.astype(str), return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.size else 0
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device), num_groups


def _sorted_codes(labels: np.ndarray) -> np.ndarray:
    """``np.unique(labels, return_inverse=True)[1]`` for an object array such as verl's uid strings.

    np.unique sorts all bs labels with Python comparisons; hashing each label once and sorting only
    the distinct ones gives the same codes several times faster (benchmarks/bench_advantage.py).
    """
    items = labels.tolist()
    code = {label: i for i, label in enumerate(sorted(dict.fromkeys(items)))}
    return np.fromiter(map(code.__getitem__, items), dtype=np.int64, count=len(items))


@dataclass(frozen=True)
class GroupStats:
    """Per-group statistics of per-response scores. All tensors are (num_groups,) float64 except
    ``ids`` (bs,) and ``count`` (num_groups,) int64."""

    ids: torch.Tensor
    count: torch.Tensor
    mean: torch.Tensor
    # Sum of squared deviations from the group mean: kept because augmented statistics
    # (AVSPO) are exact updates of it.
    sq_dev: torch.Tensor
    std_population: torch.Tensor
    std_unbiased: torch.Tensor
    min: torch.Tensor
    max: torch.Tensor

    @property
    def num_groups(self) -> int:
        return int(self.count.numel())


def group_stats(scores: torch.Tensor, ids: torch.Tensor, num_groups: int) -> GroupStats:
    """Segment statistics of ``scores`` (bs,) grouped by ``ids`` (bs,).

    Computed in float64 with a two-pass (centred) variance, so that a group of identical scores
    has exactly zero spread. ``std_unbiased`` is NaN for singleton groups (undefined), the same as
    ``torch.std`` of one element.
    """
    x = scores.detach().reshape(-1).to(torch.float64)
    count = torch.bincount(ids, minlength=num_groups)
    n = count.to(torch.float64)
    mean = torch.zeros(num_groups, dtype=torch.float64, device=x.device).index_add_(0, ids, x) / n.clamp(min=1)
    dev = x - mean[ids]
    sq_dev = torch.zeros_like(mean).index_add_(0, ids, dev * dev)
    std_population = (sq_dev / n.clamp(min=1)).sqrt()
    std_unbiased = torch.where(count > 1, sq_dev / (n - 1).clamp(min=1), torch.nan).sqrt()
    fill = torch.full_like(mean, torch.inf)
    gmin = fill.scatter_reduce(0, ids, x, reduce="amin")
    gmax = (-fill).scatter_reduce(0, ids, x, reduce="amax")
    return GroupStats(ids, count, mean, sq_dev, std_population, std_unbiased, gmin, gmax)


@dataclass(frozen=True)
class DroppedGroups:
    """Groups generated for a step that a filter removed before the measured batch (verl's DAPO
    ``algorithm.filter_groups``): they count in the step's ACR, measured before filtering."""

    collapsed: Mapping[float, int] = field(default_factory=dict)  # {shared score: number of groups}
    surplus: int = 0  # groups with a reward spread, generated then discarded as over-sampling

    def __bool__(self) -> bool:
        return bool(self.surplus) or any(self.collapsed.values())

    @classmethod
    def of(cls, scores: torch.Tensor, tau: float = 1e-6) -> DroppedGroups:
        """The groups of (num_groups, G) ``scores`` a filter dropped: the collapsed ones (docs/method.md §2)
        by shared score, the others as surplus."""
        num_groups, size = scores.shape
        ids = torch.arange(num_groups, device=scores.device).repeat_interleave(size)
        stats = group_stats(scores.reshape(-1), ids, num_groups)
        collapsed = detect_collapse(stats, tau).collapsed
        values, counts = torch.unique(stats.min[collapsed], return_counts=True)  # min: a member, exactly
        return cls(dict(zip(values.tolist(), counts.tolist(), strict=True)), int((~collapsed).sum()))


@dataclass(frozen=True)
class Collapse:
    """Which groups collapsed, per group (num_groups,) bool, and the counts behind the batch rates
    (docs/method.md §2). The per-group tensors describe the measured batch; the counts may also include groups
    a filter dropped (:meth:`including`)."""

    eligible: torch.Tensor  # groups with n >= 2: the ACR denominator
    collapsed: torch.Tensor
    all_correct: torch.Tensor
    all_wrong: torch.Tensor
    num_eligible: int
    num_singletons: int
    num_all_correct: int
    num_all_wrong: int
    reward_mean: float  # mean score over the eligible groups of the measured batch (each group weighted equally)

    # The rates: the one place they are computed, whatever the route (estimator, trainers, hook, OpenRLHF).
    @property
    def rate(self) -> float:
        return (self.num_all_correct + self.num_all_wrong) / max(self.num_eligible, 1)

    @property
    def all_correct_rate(self) -> float:
        return self.num_all_correct / max(self.num_eligible, 1)

    @property
    def all_wrong_rate(self) -> float:
        return self.num_all_wrong / max(self.num_eligible, 1)

    def including(self, dropped: DroppedGroups | None, reward_range: tuple[float, float] = (0.0, 1.0)) -> Collapse:
        """The counts of the groups generated for the step: this batch's plus ``dropped``. A dropped
        collapsed group is all-correct when its shared score is at or above the range's midpoint."""
        if not dropped:
            return self
        midpoint = 0.5 * (reward_range[0] + reward_range[1])
        correct = sum(int(count) for value, count in dropped.collapsed.items() if float(value) >= midpoint)
        wrong = sum(int(count) for count in dropped.collapsed.values()) - correct
        return dataclasses.replace(
            self,
            num_eligible=self.num_eligible + correct + wrong + int(dropped.surplus),
            num_all_correct=self.num_all_correct + correct,
            num_all_wrong=self.num_all_wrong + wrong,
        )


def detect_collapse(stats: GroupStats, tau: float = 1e-6, reward_range: tuple[float, float] = (0.0, 1.0)) -> Collapse:
    """Collapse detection on raw scores: a group with n >= 2 is collapsed iff its population std
    is below ``tau``. Collapsed groups at or above the midpoint of ``reward_range`` are
    all-correct, below it all-wrong. Singletons are excluded from the denominator."""
    eligible = stats.count >= 2
    collapsed = eligible & (stats.std_population < tau)
    midpoint = 0.5 * (reward_range[0] + reward_range[1])
    all_correct = collapsed & (stats.mean >= midpoint)
    all_wrong = collapsed & ~all_correct
    # One host sync for the three counts and the mean score.
    sums = [eligible.sum(), all_correct.sum(), all_wrong.sum(), (stats.mean * eligible).sum()]
    *counts, score_sum = torch.stack(sums).to(torch.float64).tolist()
    num_eligible, num_correct, num_wrong = map(int, counts)
    return Collapse(
        eligible=eligible,
        collapsed=collapsed,
        all_correct=all_correct,
        all_wrong=all_wrong,
        num_eligible=num_eligible,
        num_singletons=stats.num_groups - num_eligible,
        num_all_correct=num_correct,
        num_all_wrong=num_wrong,
        reward_mean=score_sum / max(num_eligible, 1),
    )


def effective_collapse_rate(
    advantages: torch.Tensor, ids: torch.Tensor, count: torch.Tensor, tau: float = 1e-6
) -> float:
    """Fraction of groups with n >= 2 whose final advantages all satisfy |A| <= tau.

    Args:
        advantages: (bs,) per-response scalar advantages, or (bs, L) token advantages (a response
            counts by its largest |A| over tokens).
        ids: (bs,) group id of each response; count: (num_groups,) responses per group
            (``GroupStats.ids`` / ``.count`` of the same batch).
    """
    magnitude = advantages.detach().abs()
    if magnitude.dim() == 2:
        magnitude = magnitude.amax(dim=-1)
    magnitude = magnitude.to(torch.float64)
    largest = torch.zeros(count.numel(), dtype=torch.float64, device=magnitude.device)
    largest = largest.scatter_reduce(0, ids.to(magnitude.device), magnitude, reduce="amax")
    eligible = count.to(magnitude.device) >= 2
    num_eligible = int(eligible.sum())
    if num_eligible == 0:
        return 0.0
    return int((eligible & (largest <= tau)).sum()) / num_eligible


def acr_metrics(collapse: Collapse, effective_rate: float | None, prefix: str = "acr/") -> dict[str, float]:
    """The per-step ACR metrics as logged by every integration (``effective`` only when known).

    Names avoid the substrings ``max``, ``min``, ``sum`` and ``total`` because verl's
    MetricsAggregator picks a reduction from them; all of these are meant to be averaged.
    """
    metrics = {
        f"{prefix}rate": collapse.rate,
        f"{prefix}all_correct": collapse.all_correct_rate,
        f"{prefix}all_wrong": collapse.all_wrong_rate,
        f"{prefix}groups": float(collapse.num_eligible),
        f"{prefix}singletons": float(collapse.num_singletons),
        # The stall rule acr_no_gain reads it (core.alert).
        f"{prefix}reward_mean": collapse.reward_mean,
    }
    if effective_rate is not None:
        metrics[f"{prefix}effective"] = effective_rate
    return metrics


@dataclass(frozen=True)
class Measurement:
    """One batch's raw scores, measured: its group statistics and collapse, and the groups a filter
    dropped before it (counted in the step's rates). Made once per step (``core.run_tracker``)."""

    scores: torch.Tensor  # (bs,) raw per-response scores
    index: Any  # (bs,) group labels
    stats: GroupStats
    collapse: Collapse  # of this batch only
    dropped: DroppedGroups | None
    mean_score: float  # J_t: the mean score over the batch's responses
    reward_range: tuple[float, float]

    @property
    def step_collapse(self) -> Collapse:
        """The step's counts: this batch's and the dropped groups'."""
        return self.collapse.including(self.dropped, self.reward_range)

    def same_batch(self, scores: torch.Tensor, index: Any) -> bool:
        """Whether (``scores``, ``index``) are this batch's, response for response."""
        if len(index) != len(self.index) or scores.shape != self.scores.shape:
            return False
        same_scores = torch.equal(scores.detach().to(self.scores.device, torch.float64), self.scores.to(torch.float64))
        return same_scores and bool(
            np.array_equal(np.asarray(index, dtype=object), np.asarray(self.index, dtype=object))
        )


def measure(
    scores: torch.Tensor,
    index: Any,
    tau: float = 1e-6,
    reward_range: tuple[float, float] = (0.0, 1.0),
    dropped: DroppedGroups | None = None,
) -> Measurement:
    """Measure a batch's raw scores: group statistics, collapse (docs/method.md §2) and the mean score.

    NaN or inf scores are measured as they are (their groups count as not collapsed and
    ``acr/reward_mean`` is NaN) with a warning: the metrics never stop a run, the estimator decides.
    """
    problem = non_finite_problem(scores, index)
    if problem:
        warnings.warn(
            f"{problem}: ACR counts their groups as not collapsed and acr/reward_mean is NaN. {FINITE_REWARD_FIX}",
            stacklevel=2,
        )
    ids, num_groups = group_ids(index, device=scores.device)
    stats = group_stats(scores, ids, num_groups)
    collapse = detect_collapse(stats, tau, reward_range)
    mean_score = float(scores.detach().to(torch.float64).mean()) if scores.numel() else 0.0
    return Measurement(scores.detach(), index, stats, collapse, dropped, mean_score, tuple(reward_range))


def measure_collapse(
    scores: torch.Tensor,
    index: Any,
    advantages: torch.Tensor | None = None,
    tau: float = 1e-6,
    reward_range: tuple[float, float] = (0.0, 1.0),
    dropped: DroppedGroups | None = None,
) -> dict[str, float]:
    """One batch's ACR metrics at once (a log, a notebook, a test): :func:`measure`, then the rates.
    Training hosts use ``core.run_tracker.RunTracker``, which also runs the alert and keeps state.

    Args:
        scores: (bs,) raw per-response scores, before any estimator.
        index: (bs,) group labels.
        advantages: (bs,) or (bs, L) final advantages of the same responses, for ``acr/effective``;
            omitted if None.
        dropped: groups generated for the step that a filter removed before this batch; the rates
            and ``acr/groups`` then count them too (ACR before filtering).
    """
    measured = measure(scores, index, tau, reward_range, dropped)
    stats = measured.stats
    effective = None if advantages is None else effective_collapse_rate(advantages, stats.ids, stats.count, tau)
    return acr_metrics(measured.step_collapse, effective)
