"""What a run's log says about collapse and about its likely causes, from whatever metrics the log holds
(docs/diagnostics.md#what-the-report-reads-collapse-from). ``verl-avspo report`` and ``verl-avspo table``
read collapse from :func:`collapse_rate`; the report puts the reward's :func:`trend` and the
:func:`causes` of collapse beside it.

Collapse, preferred first: ``acr/rate`` (ours: the fraction of groups whose scores are all equal);
TRL's ``frac_reward_zero_std``; a step whose reward spread is 0 (TRL's ``reward_std``: every group of
that step collapsed, so 1 there and 0 elsewhere is a lower bound on ACR per step); verl's
``critic/score/max == critic/score/min`` (the same lower bound, split into all-correct and all-wrong
by the value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = [
    "CollapseRate",
    "Trend",
    "causes",
    "collapse_rate",
    "per_step",
    "trend",
]

_ZERO = 1e-8  # a reward spread this small is none (TRL's own tolerance for frac_reward_zero_std)
# Reward spreads that are 0 only when every group of the step is collapsed.
_SPREADS = ("reward_std", "train/reward_std")


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
    if "completions/mean_length" in frame or any(
        str(c).endswith("/mean") for c in frame if str(c).startswith("rewards/")
    ):
        return "recent"
    if "completion_length" in frame:
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
        release = _trl_release(frame)
        meaning = {
            "older": "older TRL's mean of per-group reward stds",
            "recent": "TRL's std of the batch's rewards",
            None: "TRL's reward_std (the mean of per-group stds before TRL's completions/* metrics, the batch's "
            "std after)",
        }[release]
        values = frame[spread].dropna()
        return CollapseRate(
            (values.abs() <= _ZERO).astype(float),
            f"{spread} == 0",
            f"steps where {meaning} is 0, i.e. every group collapsed (a lower bound on ACR per step)",
            lower_bound=True,
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
    trend test over all rows, the final value (the mean of the last fifth) and the last row."""

    first: float
    final: float
    last: float
    rows: int  # rows in each fifth
    tau: float
    p_value: float

    @property
    def direction(self) -> str:
        """``rose``, ``fell`` or ``flat`` (no trend at p < 0.05)."""
        if self.p_value >= 0.05:
            return "flat"
        return "rose" if self.tau > 0 else "fell"


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
    """The :class:`Trend` of ``series`` (a run's mean reward per logged row); None with fewer than 2 rows."""
    values = pd.Series(dtype=float) if series is None else series.dropna()
    if len(values) < 2:
        return None
    fifth = max(1, len(values) // 5)
    tau, p_value = _mann_kendall(values.to_numpy(dtype=float)) if len(values) >= 4 else (0.0, 1.0)
    return Trend(
        float(values.iloc[:fifth].mean()),
        float(values.iloc[-fifth:].mean()),
        float(values.iloc[-1]),
        fifth,
        tau,
        p_value,
    )


# Fractions of completions cut at the length cap: TRL's, verl's.
_TRUNCATION = ("completions/clipped_ratio", "response_length/clip_ratio")
# Fractions of tokens whose PPO ratio was clipped: verl's, TRL's.
_CLIP_FRACTION = ("actor/pg_clipfrac", "clip_ratio/region_mean")


def _first_at(series: pd.Series, bound: float) -> int | None:
    above = series[series >= bound]
    return None if above.empty else int(above.index[0])


def causes(frame: pd.DataFrame, collapsed: pd.Series) -> list[tuple[str, list[str]]]:
    """The likely causes of collapse that the log shows, each as (headline, evidence lines):
    completions cut at the length cap (a cut answer scores 0, so all-wrong groups follow), reward
    functions with no variance, and a high PPO clip fraction. ``collapsed`` is the run's collapse per
    logged step (:class:`CollapseRate`), to compare the steps with and without collapse."""
    found: list[tuple[str, list[str]]] = []
    truncation = next((c for c in _TRUNCATION if c in frame and frame[c].notna().any()), None)
    if truncation is not None:
        ratio = frame[truncation].dropna()
        evidence = [f"{truncation}: mean {ratio.mean():.2f}, last {ratio.iloc[-1]:.2f}, max {ratio.max():.2f}"]
        high = collapsed.reindex(ratio.index).dropna() >= 0.5
        if high.any() and (~high).any():
            evidence.append(
                f"{ratio[high[high].index].mean():.2f} on steps with most groups collapsed vs "
                f"{ratio[high[~high].index].mean():.2f} on the others"
            )
        jump = ratio.diff()
        if len(ratio) > 1 and jump.max() >= 0.5:
            step = int(jump.idxmax())
            before = ratio.loc[:step].iloc[-2]
            evidence.append(f"rose from {before:.2f} to {ratio[step]:.2f} at step {step}")
        if ratio.mean() >= 0.2 or ratio.iloc[-max(1, len(ratio) // 5) :].mean() >= 0.5:
            share = ratio.mean()
            found.append(
                (f"{share:.0%} of completions cut at the length cap on average (max {ratio.max():.0%})", evidence)
            )
    elif {"completions/mean_length", "completions/max_length"} <= set(frame.columns):
        lengths = frame[["completions/mean_length", "completions/max_length"]].dropna()
        cap = float(lengths["completions/max_length"].max())
        near = lengths["completions/mean_length"] >= 0.95 * cap
        if cap > 0 and near.mean() >= 0.5:
            found.append(
                (
                    f"completions at the length cap: the mean length is within 5% of the longest ({cap:.0f}) on "
                    f"{near.sum()} of {len(near)} rows",
                    [
                        f"completions/mean_length {lengths['completions/mean_length'].min():.0f}–"
                        f"{lengths['completions/mean_length'].max():.0f}, completions/max_length {cap:.0f}"
                    ],
                )
            )
    found += _saturated(frame)
    clip = next((c for c in _CLIP_FRACTION if c in frame and frame[c].notna().any()), None)
    if clip is not None:
        values = frame[clip].dropna()
        if values.max() >= 0.2:
            evidence = [f"{clip}: mean {values.mean():.3f}, max {values.max():.3f} at step {int(values.idxmax())}"]
            if (step := _first_at(values, 0.2)) is not None:
                evidence.append(f"first above 0.2 at step {step}")
            found.append(
                (f"PPO clip fraction reached {values.max():.2f}: the policy moved far in one update", evidence)
            )
    return found


def _saturated(frame: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """Reward functions whose value never varies: TRL's ``rewards/<name>/std`` 0 on at least 90% of rows,
    or (older TRL, no std) ``rewards/<name>`` or ``rewards/<name>/mean`` constant over the run."""
    found = []
    names = sorted(
        {
            str(c).removeprefix("rewards/").removesuffix("/mean").removesuffix("/std")
            for c in frame
            if str(c).startswith("rewards/")
        }
    )
    for name in names:
        mean = next((frame[c].dropna() for c in (f"rewards/{name}/mean", f"rewards/{name}") if c in frame), None)
        std = frame[f"rewards/{name}/std"].dropna() if f"rewards/{name}/std" in frame else None
        if mean is None or mean.empty:
            continue
        if std is not None and len(std) and (std.abs() <= _ZERO).mean() >= 0.9:
            share = (std.abs() <= _ZERO).mean()
            found.append(
                (
                    f"reward function {name} gives no signal: its std is 0 on {share:.0%} of steps",
                    [
                        f"rewards/{name}/mean {mean.min():.3f}–{mean.max():.3f}, rewards/{name}/std 0 on "
                        f"{int((std.abs() <= _ZERO).sum())} of {len(std)} rows"
                    ],
                )
            )
        elif std is None and len(mean) >= 5 and float(mean.max() - mean.min()) <= _ZERO:
            found.append(
                (
                    f"reward function {name} gives no signal: it is {mean.iloc[0]:g} on every logged step",
                    [f"rewards/{name}: {mean.iloc[0]:g} on all {len(mean)} rows"],
                )
            )
    return found
