"""What a run's log says about collapse and about its likely causes, from whatever metrics the log holds
(docs/diagnostics.md#what-the-report-reads-collapse-from). ``verl-avspo report`` and ``verl-avspo table``
read collapse from :func:`collapse_rate`; the report puts the reward's :func:`trend` and the
:func:`causes` of collapse beside it.

Collapse, preferred first: ``acr/rate`` (ours: the fraction of groups whose scores are all equal);
TRL's ``frac_reward_zero_std``; a step whose reward spread is 0 (TRL's ``reward_std``: every group of
that step collapsed, so 1 there and 0 elsewhere is a lower bound on ACR per step; OpenRLHF's
``group_reward_std`` likewise); verl's
``critic/score/max == critic/score/min`` (the same lower bound, split into all-correct and all-wrong
by the value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = [
    "Cause",
    "CollapseRate",
    "Trend",
    "causes",
    "collapse_rate",
    "per_step",
    "trend",
]

_ZERO = 1e-8  # a reward spread this small is none (TRL's own tolerance for frac_reward_zero_std)
# Reward spreads that are 0 only when every group of the step is collapsed.
_SPREADS = ("reward_std", "train/reward_std", "group_reward_std", "train/group_reward_std")


@dataclass
class CollapseRate:
    """A run's collapse per logged step, and what it is: ``source`` names the metric, ``what`` says in a
    few words what its values mean, ``lower_bound`` whether it only counts steps where every group
    collapsed. ``all_correct`` and ``all_wrong`` split it where the log tells them apart."""

    rate: pd.Series
    source: str
    what: str
    lower_bound: bool = False
    all_correct: pd.Series | None = None
    all_wrong: pd.Series | None = None


def _trl_release(frame: pd.DataFrame) -> str | None:
    """``older`` for a TRL log of the releases before ``completions/*`` (``completion_length``, per-function
    ``rewards/<name>``, ``reward_std`` the mean of the per-group stds), ``recent`` for later ones
    (``completions/mean_length``, ``rewards/<name>/mean``, ``reward_std`` the std of the whole batch),
    None when the log does not say."""
    columns = {str(column).removeprefix("train/") for column in frame}
    if "completions/mean_length" in columns or any(c.startswith("rewards/") and c.endswith("/mean") for c in columns):
        return "recent"
    if "completion_length" in columns:
        return "older"
    return None


def collapse_rate(frame: pd.DataFrame, usable: set[str] | None = None) -> CollapseRate | None:
    """The run's collapse from the first source the log holds (the module's docstring lists them),
    among columns in ``usable`` when given (a rate column with values outside [0, 1] is not); None
    when the log holds none."""

    def has(column: str) -> bool:
        return column in frame and frame[column].notna().any() and (usable is None or column in usable)

    if has("acr/rate"):
        split = {k: frame[f"acr/{k}"] for k in ("all_correct", "all_wrong") if has(f"acr/{k}")}
        return CollapseRate(frame["acr/rate"], "acr/rate", "the fraction of groups whose scores are all equal", **split)
    if has("frac_reward_zero_std"):
        return CollapseRate(
            frame["frac_reward_zero_std"],
            "frac_reward_zero_std",
            "TRL's fraction of completions whose reward std is 0 (ACR with scale_rewards 'group' or 'none')",
        )
    spread = next((column for column in _SPREADS if has(column)), None)
    if spread is not None:
        meaning = (
            "OpenRLHF's mean of per-group reward stds"
            if spread.endswith("group_reward_std")
            else {
                "older": "older TRL's mean of per-group reward stds",
                "recent": "TRL's std of the batch's rewards",
                None: "TRL's reward_std (the mean of per-group stds before TRL's completions/* metrics, the batch's "
                "std after)",
            }[_trl_release(frame)]
        )
        values = frame[spread].dropna()
        equal = values.abs() <= _ZERO
        reward = next((frame[c].reindex(values.index) for c in ("reward", "train/reward") if c in frame), None)
        return CollapseRate(
            equal.astype(float),
            f"{spread} == 0",
            f"steps where {meaning} is 0, i.e. every group collapsed (a lower bound on ACR per step)",
            lower_bound=True,
            all_wrong=None if reward is None else (equal & (reward.abs() <= _ZERO)).astype(float),
        )
    if has("critic/score/max") and has("critic/score/min"):
        scores = frame[["critic/score/max", "critic/score/min"]].dropna()
        equal = (scores["critic/score/max"] - scores["critic/score/min"]).abs() <= _ZERO
        value = scores["critic/score/max"]
        return CollapseRate(
            equal.astype(float),
            "critic/score/max == critic/score/min",
            "steps where every response scored the same, i.e. every group collapsed (a lower bound on ACR per step)",
            lower_bound=True,
            all_correct=(equal & (value >= 1 - _ZERO)).astype(float),
            all_wrong=(equal & (value <= _ZERO)).astype(float),
        )
    return None


def per_step(frame: pd.DataFrame, interval: int) -> pd.DataFrame:
    """``frame`` with one row per training step: a row logged every ``interval`` steps stands for the
    steps since the row before it (TRL's ``logging_steps`` averages them), so a stall window and every
    count are in training steps whatever the logging interval. Steps of a gap stay NaN."""
    if interval <= 1 or frame.empty:
        return frame
    first, last = int(frame.index.min()), int(frame.index.max())
    steps = pd.RangeIndex(max(1, first - interval + 1), last + 1, name=frame.index.name)
    return frame.reindex(steps).bfill(limit=interval - 1)


@dataclass(frozen=True)
class Trend:
    """The reward over the run: the means of its first and last fifths of logged rows, a Mann-Kendall
    trend test over all rows and over the last third (``recent_*``, from 12 rows), the final value (the
    mean of the last fifth), the last row and the best row."""

    first: float
    final: float
    last: float
    rows: int  # rows in each fifth
    tau: float
    p_value: float
    best: float
    best_step: int
    recent_from: int  # the first step of the last third
    recent_tau: float
    recent_p_value: float

    @property
    def direction(self) -> str:
        """``rose``, ``fell`` or ``flat`` (no trend at p < 0.05)."""
        if self.p_value >= 0.05:
            return "flat"
        return "rose" if self.tau > 0 else "fell"

    @property
    def stopped(self) -> bool:
        """The reward rose over the run but shows no trend over its last third."""
        return self.direction == "rose" and self.recent_p_value >= 0.05


def _mann_kendall(values: np.ndarray) -> tuple[float, float]:
    """Kendall's tau of ``values`` against their order, and the two-sided p-value of the Mann-Kendall
    test (normal approximation, with the variance corrected for ties)."""
    n = len(values)
    signs = np.sign(values[None, :] - values[:, None])[np.triu_indices(n, 1)]
    s = float(signs.sum())
    _, ties = np.unique(values, return_counts=True)
    variance = (n * (n - 1) * (2 * n + 5) - float(np.sum(ties * (ties - 1) * (2 * ties + 5)))) / 18
    tau = s / (n * (n - 1) / 2)
    if variance <= 0:
        return tau, 1.0
    z = (s - math.copysign(1, s)) / math.sqrt(variance) if s else 0.0
    return tau, math.erfc(abs(z) / math.sqrt(2))


def trend(series: pd.Series | None) -> Trend | None:
    """The :class:`Trend` of ``series`` (a run's mean reward per logged row; no trend under 4 rows); None
    when it holds no value."""
    values = pd.Series(dtype=float) if series is None else series.dropna()
    if values.empty:
        return None
    fifth = max(1, len(values) // 5)
    tau, p_value = _mann_kendall(values.to_numpy(dtype=float)) if len(values) >= 4 else (0.0, 1.0)
    recent = values.iloc[-max(1, len(values) // 3) :]
    recent_tau, recent_p = _mann_kendall(recent.to_numpy(dtype=float)) if len(recent) >= 4 else (0.0, 1.0)
    return Trend(
        float(values.iloc[:fifth].mean()),
        float(values.iloc[-fifth:].mean()),
        float(values.iloc[-1]),
        fifth,
        tau,
        p_value,
        float(values.max()),
        int(values.idxmax()),
        int(recent.index[0]),
        recent_tau,
        recent_p if len(values) >= 12 else 0.0,
    )


# Fractions of completions cut at the length cap: TRL's, verl's.
_TRUNCATION = ("completions/clipped_ratio", "response_length/clip_ratio")
# Fractions of tokens whose PPO ratio was clipped: verl's, TRL's.
_CLIP_FRACTION = ("actor/pg_clipfrac", "clip_ratio/region_mean")


@dataclass(frozen=True)
class Cause:
    """A likely cause of collapse the log shows: its ``kind`` (``truncation``, ``never_rewarded``,
    ``saturated``, ``clip``), a severity (``ALERT``, ``WARN``, ``INFO``), a headline and the evidence."""

    kind: str
    severity: str
    headline: str
    evidence: tuple[str, ...]


def _fifth(series: pd.Series) -> pd.Series:
    return series.iloc[-max(1, len(series) // 5) :]


def _truncation(frame: pd.DataFrame, collapsed: pd.Series) -> Cause | None:
    """Completions cut at the length cap (TRL's ``completions/clipped_ratio``, verl's
    ``response_length/clip_ratio``; else a mean length within 5% of TRL's ``completions/max_length``):
    ALERT from half of them (overall or over the last fifth), WARN from a tenth, INFO from 5%."""
    column = next((c for c in _TRUNCATION if c in frame and frame[c].notna().any()), None)
    lengths = next((c for c in ("completions/mean_length", "response_length/mean") if c in frame), None)
    if column is None:
        if lengths is None or "completions/max_length" not in frame:
            return None
        pair = frame[[lengths, "completions/max_length"]].dropna()
        cap = float(pair["completions/max_length"].max())
        ratio = (pair[lengths] >= 0.95 * cap).astype(float) if cap > 0 else pd.Series(dtype=float)
        measured = f"rows with {lengths} within 5% of the longest completion ({cap:.0f})"
    else:
        ratio = frame[column].dropna()
        measured = column
    if ratio.empty:
        return None
    level = max(float(ratio.mean()), float(_fifth(ratio).mean()))
    if level < 0.05:
        return None
    evidence = [f"{measured}: mean {ratio.mean():.2f}, last fifth {_fifth(ratio).mean():.2f}, max {ratio.max():.2f}"]
    if lengths is not None and frame[lengths].notna().sum() > 1:
        mean_length = frame[lengths].dropna()
        evidence.append(f"{lengths}: {mean_length.iloc[0]:.0f} → {mean_length.iloc[-1]:.0f}")
    high = collapsed.reindex(ratio.index).dropna() >= 0.5
    if high.any() and (~high).any():
        evidence.append(
            f"{ratio[high[high].index].mean():.2f} on rows with most groups collapsed vs "
            f"{ratio[high[~high].index].mean():.2f} on the others"
        )
    jump = ratio.diff()
    if len(ratio) > 1 and jump.max() >= 0.5:
        step = int(jump.idxmax())
        evidence.append(f"rose from {ratio.loc[:step].iloc[-2]:.2f} to {ratio[step]:.2f} at step {step}")
    severity = "ALERT" if level >= 0.5 else "WARN" if level >= 0.1 else "INFO"
    headline = (
        f"{ratio.mean():.0%} of completions cut at the length cap on average ({_fifth(ratio).mean():.0%} over the "
        "last fifth)"
    )
    return Cause("truncation", severity, headline, tuple(evidence))


def causes(frame: pd.DataFrame, collapsed: pd.Series) -> list[Cause]:
    """The likely causes of collapse that the log shows: completions cut at the length cap (a cut
    answer scores 0, so all-wrong groups follow), reward functions that never vary (never rewarded, or
    saturated), and a high PPO clip fraction. ``collapsed`` is the run's collapse per logged row
    (:class:`CollapseRate`), to compare the rows with and without collapse."""
    found = [cause] if (cause := _truncation(frame, collapsed)) is not None else []
    found += _constant_rewards(frame)
    clip = next((c for c in _CLIP_FRACTION if c in frame and frame[c].notna().any()), None)
    if clip is not None:
        values = frame[clip].dropna()
        if values.max() >= 0.2:
            evidence = [f"{clip}: mean {values.mean():.3f}, max {values.max():.3f} at step {int(values.idxmax())}"]
            evidence.append(f"first above 0.2 at step {int(values[values >= 0.2].index[0])}")
            headline = f"PPO clip fraction reached {values.max():.2f}: the policy moved far in one update"
            found.append(Cause("clip", "WARN", headline, tuple(evidence)))
    return found


def _constant_rewards(frame: pd.DataFrame) -> list[Cause]:
    """Reward functions that give the groups no signal: TRL's ``rewards/<name>/std`` (its spread within
    each step) 0 on at least 90% of the rows or on average under 2% of the total reward's
    (``reward_std``), or (older TRL, no std) ``rewards/<name>`` constant over the run. One at 0 is never
    earned (a correctness reward no completion earns, a parser that never matches, a penalty never
    triggered); one at another value is saturated (a format reward every completion earns)."""
    found = []
    columns = [str(c).removeprefix("train/") for c in frame]
    names = sorted(
        {
            c.removeprefix("rewards/").removesuffix("/mean").removesuffix("/std")
            for c in columns
            if c.startswith("rewards/")
        }
    )
    total = next((frame[c].dropna() for c in _SPREADS if c in frame), pd.Series(dtype=float))
    total_spread = float(total.mean()) if len(total) else 0.0
    for name in names:
        mean = next((frame[c].dropna() for c in (f"rewards/{name}/mean", f"rewards/{name}") if c in frame), None)
        std = frame[f"rewards/{name}/std"].dropna() if f"rewards/{name}/std" in frame else None
        if mean is None or len(mean) < 5:
            continue
        if std is not None and len(std):
            flat = std.abs() <= _ZERO
            share = float(std.mean()) / total_spread if total_spread > _ZERO else None
            if flat.mean() < 0.9 and (share is None or share >= 0.02):
                continue
            evidence = (
                f"rewards/{name}/std 0 on {int(flat.sum())} of {len(std)} rows, mean {std.mean():.3f}"
                + ("" if share is None else f" ({share:.1%} of reward_std's mean {total_spread:.3f})")
                + f"; rewards/{name}/mean {mean.min():.3f}–{mean.max():.3f}"
            )
        elif std is None and float(mean.max() - mean.min()) <= _ZERO:
            evidence = f"rewards/{name}: {mean.iloc[0]:g} on all {len(mean)} rows"
        else:
            continue
        value = float(mean.median())
        if abs(value) <= 0.01 * max(1.0, float(mean.abs().max())):
            headline = f"reward function {name} gives no signal: about 0 on every step (never earned or triggered)"
            found.append(Cause("never_rewarded", "WARN", headline, (evidence,)))
        else:
            headline = f"reward function {name} gives no signal: saturated at {value:g}"
            found.append(Cause("saturated", "WARN", headline, (evidence,)))
    return found
