"""What a run's log says besides collapse (:mod:`verl_avspo.tools.collapse_measures`): the reward's :func:`trend`
over the run and the :func:`causes` of collapse the log shows (docs/diagnostics.md), each cause with
whether the log ties it to collapse (more of it on the rows where collapse is high), and
:func:`per_step`, the rows of a log in training steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from verl_avspo.tools.collapse_measures import SPREADS, ZERO

__all__ = ["Cause", "Trend", "causes", "per_step", "trend"]


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
    trend test over all rows and over the last third (``recent_*``, from 12 rows: under 12, tau 0 and p 0,
    not judged), the final value (the mean of the last fifth), the last row and the best row."""

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
    def said(self) -> str:
        """The direction in words that agree with the numbers: ``rose`` or ``fell`` (p < 0.05), ``rose, not
        significant`` or ``fell, not significant`` (the last fifth differs from the first by 2% or more),
        else ``flat``."""
        if self.direction != "flat":
            return self.direction
        change = self.final - self.first
        if abs(change) < 0.02 * max(abs(self.first), abs(self.final), 1e-12):
            return "flat"
        return f"{'rose' if change > 0 else 'fell'}, not significant (p {self.p_value:.2g})"

    @property
    def stopped(self) -> bool:
        """The reward rose over the run but shows no trend over its last third."""
        return self.direction == "rose" and self.recent_p_value >= 0.05

    @property
    def lost(self) -> bool:
        """The reward rose over the run and then fell over its last third (p < 0.05): a gain given back."""
        return self.direction == "rose" and self.recent_p_value < 0.05 and self.recent_tau < 0


def _mann_kendall(values: np.ndarray) -> tuple[float, float]:
    """Kendall's tau of ``values`` against their order, and the two-sided p-value of the Mann-Kendall
    test (normal approximation, with the variance corrected for ties). Each row against the later ones,
    row by row: O(n) memory for the thousands of rows of a console log."""
    n = len(values)
    s = float(sum(np.sign(values[i + 1 :] - values[i]).sum() for i in range(n - 1)))
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
        recent_tau if len(values) >= 12 else 0.0,
        recent_p if len(values) >= 12 else 0.0,
    )


# Fractions of completions cut at the length cap: TRL's, verl's.
_TRUNCATION = ("completions/clipped_ratio", "response_length/clip_ratio")
# Mean completion lengths: TRL's, verl's, Tinker's (tokens per turn of single-turn episodes).
_MEAN_LENGTHS = ("completions/mean_length", "response_length/mean", "env/all/ac_tokens_per_turn")
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
    likely: bool = False  # the log ties it to collapse: more of it on the rows where collapse is high
    columns: tuple[str, ...] = ()  # the log's keys it was read from


def _tie(values: pd.Series, collapsed: pd.Series) -> tuple[bool, str | None]:
    """Whether the log ties ``values`` (a cause's measure per row) to collapse (``collapsed`` per row): it
    is higher on the rows where collapse is high (at least half the groups, or else above its median) than
    on the others, by a tenth or more; and the evidence line that says so, or says why not."""
    both = pd.concat([values.rename("cause"), collapsed.rename("collapse")], axis=1, join="inner").dropna()
    if both.empty:
        return False, None
    rate = both["collapse"]
    high, said = rate >= 0.5, "rows with most groups collapsed"
    if high.all() or not high.any():
        high, said = rate > rate.median(), "rows with more collapse (above its median)"
    if not (high.any() and (~high).any()):
        return False, "collapse is the same on every row: the log cannot tell whether this drives it"
    on, off = float(both["cause"][high].mean()), float(both["cause"][~high].mean())
    likely = on > off + max(0.01, 0.1 * abs(off))
    return likely, f"{on:.2f} on {said} vs {off:.2f} on the others" + (
        "" if likely else ": no more of it where collapse is, so not called its cause"
    )


def _fifth(series: pd.Series) -> pd.Series:
    return series.iloc[-max(1, len(series) // 5) :]


def _truncation(frame: pd.DataFrame, collapsed: pd.Series) -> Cause | None:
    """Completions cut at the length cap (TRL's ``completions/clipped_ratio``, verl's
    ``response_length/clip_ratio``; else a mean length within 5% of TRL's ``completions/max_length``; else,
    with no cap logged, rows whose mean length equals the run's longest, on 3 rows or more, after a first
    fifth below 80% of it: lengths that ran up to one maximum and stayed there are every completion at that
    length, the cap): ALERT from half of them (overall or over the last fifth), WARN from a tenth, INFO
    from 5%."""
    column = next((c for c in _TRUNCATION if c in frame and frame[c].notna().any()), None)
    lengths = next((c for c in _MEAN_LENGTHS if c in frame and frame[c].notna().any()), None)
    if column is None:
        if lengths is None:
            return None
        if "completions/max_length" in frame:
            pair = frame[[lengths, "completions/max_length"]].dropna()
            cap = float(pair["completions/max_length"].max())
            ratio = (pair[lengths] >= 0.95 * cap).astype(float) if cap > 0 else pd.Series(dtype=float)
            measured = f"rows with {lengths} within 5% of the longest completion ({cap:.0f})"
        else:  # no cap logged: lengths that ran up to one longest mean and stayed there on 3 rows or more
            mean = frame[lengths].dropna()
            at_cap = mean == mean.max()
            if at_cap.sum() < 3 or float(mean.iloc[: max(1, len(mean) // 5)].mean()) >= 0.8 * float(mean.max()):
                return None  # a length that hardly varied (short answers) says nothing about a cap
            ratio = at_cap.astype(float)
            measured = f"rows whose {lengths} is {mean.max():.0f}, the longest of the run (every completion that long)"
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
    likely, tied = _tie(ratio, collapsed)
    if tied is not None:
        evidence.append(tied)
    jump = ratio.diff()
    if len(ratio) > 1 and jump.max() >= 0.5:
        step = int(jump.idxmax())
        evidence.append(f"rose from {ratio.loc[:step].iloc[-2]:.2f} to {ratio[step]:.2f} at step {step}")
    severity = "ALERT" if level >= 0.5 else "WARN" if level >= 0.1 else "INFO"
    headline = (
        f"{ratio.mean():.0%} of completions cut at the length cap on average ({_fifth(ratio).mean():.0%} over the "
        "last fifth)"
    )
    used = ((column,) if column else ("completions/max_length",)) + ((lengths,) if lengths else ())
    return Cause("truncation", severity, headline, tuple(evidence), likely, used)


def causes(frame: pd.DataFrame, collapsed: pd.Series) -> list[Cause]:
    """The causes of collapse that the log shows: completions cut at the length cap (a cut answer scores
    0, so all-wrong groups follow), reward functions that never vary (never rewarded, or saturated), and
    a high PPO clip fraction. ``collapsed`` is the run's collapse per logged row, to compare the rows
    with and without collapse: a cut or clip fraction higher where collapse is high is ``likely``."""
    found = [cause] if (cause := _truncation(frame, collapsed)) is not None else []
    found += _constant_rewards(frame)
    clip = next((c for c in _CLIP_FRACTION if c in frame and frame[c].notna().any()), None)
    if clip is not None:
        values = frame[clip].dropna()
        if values.max() >= 0.2:
            evidence = [f"{clip}: mean {values.mean():.3f}, max {values.max():.3f} at step {int(values.idxmax())}"]
            evidence.append(f"first above 0.2 at step {int(values[values >= 0.2].index[0])}")
            likely, tied = _tie(values, collapsed)
            evidence += [tied] if tied is not None else []
            headline = f"PPO clip fraction reached {values.max():.2f}: the policy moved far in one update"
            found.append(Cause("clip", "WARN", headline, tuple(evidence), likely, (clip,)))
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
    total = next((frame[c].dropna() for c in SPREADS if c in frame), pd.Series(dtype=float))
    total_spread = float(total.mean()) if len(total) else 0.0
    for name in names:
        mean = next((frame[c].dropna() for c in (f"rewards/{name}/mean", f"rewards/{name}") if c in frame), None)
        std = frame[f"rewards/{name}/std"].dropna() if f"rewards/{name}/std" in frame else None
        if mean is None or len(mean) < 5:
            continue
        if std is not None and len(std):
            flat = std.abs() <= ZERO
            share = float(std.mean()) / total_spread if total_spread > ZERO else None
            if flat.mean() < 0.9 and (share is None or share >= 0.02):
                continue
            evidence = (
                f"rewards/{name}/std 0 on {int(flat.sum())} of {len(std)} rows, mean {std.mean():.3f}"
                + ("" if share is None else f" ({share:.1%} of reward_std's mean {total_spread:.3f})")
                + f"; rewards/{name}/mean {mean.min():.3f}–{mean.max():.3f}"
            )
        elif std is None and float(mean.max() - mean.min()) <= ZERO:
            evidence = f"rewards/{name}: {mean.iloc[0]:g} on all {len(mean)} rows"
        else:
            continue
        value = float(mean.median())
        if abs(value) <= 0.01 * max(1.0, float(mean.abs().max())):
            headline = f"reward function {name} gives no signal: about 0 on every step (never earned or triggered)"
            found.append(
                Cause(
                    "never_rewarded",
                    "WARN",
                    headline,
                    (evidence,),
                    columns=(mean.name, std.name if std is not None else mean.name),
                )
            )
        else:
            headline = f"reward function {name} gives no signal: saturated at {value:g}"
            found.append(
                Cause(
                    "saturated",
                    "WARN",
                    headline,
                    (evidence,),
                    columns=(mean.name, std.name if std is not None else mean.name),
                )
            )
    return found
