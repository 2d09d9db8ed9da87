"""The numbers read off a run's metric frame (one row per logged step, as :mod:`verl_avspo.tools.logs`
returns): early ACR, window means, last values, the latest validation, which steps the log covers
and whether a rate column can be used (the numbers over seeds are :mod:`verl_avspo.tools.seed_stats`'s).
``verl-avspo report``, ``verl-avspo table``, the sandbox's ``summary.md`` and the study scripts of
``benchmarks/`` all compute them here, and the names each framework logs a quantity under
(:data:`SCORE_NAMES`, :data:`VALIDATION_NAMES`) are listed here once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

__all__ = [
    "EARLY_STEPS",
    "FINAL_EVALUATIONS",
    "RATES",
    "TRL_ZERO_STD",
    "SCORE_NAMES",
    "VALIDATION_NAMES",
    "VALIDATION_PREFIX",
    "EarlyACR",
    "StepCoverage",
    "early_acr",
    "early_window",
    "last_value",
    "latest_validation",
    "rate_problem",
    "score_column",
    "step_coverage",
    "training_rows",
    "validation_columns",
    "window_mean",
]

EARLY_STEPS = 100  # the paper's ACR_100: ACR over the first 100 training steps
VALIDATION_PREFIX = "val-core/"  # verl's headline validation metrics, e.g. val-core/<data_source>/acc/mean@1

# The one table of metric-name aliases: each quantity the tools read, under the names the
# frameworks log it, preferred first.
SCORE_NAMES = (  # a training step's mean reward
    "critic/score/mean",  # verl: the batch's mean raw score
    "train/reward_mean",  # the CPU sandbox
    "reward",  # OpenRLHF: the trained experiences' mean reward; TRL: the generated batch's mean reward
    "train/reward",  # the same, as OpenRLHF's and the Hugging Face Trainer's wandb and TensorBoard loggers name it
    "rollout/reward_mean",  # OpenRLHF 0.11: the mean reward of every generated sample
    "train/rollout/reward_mean",
    "env/all/reward/total",  # Tinker's cookbook: the mean total reward of the batch's episodes
    # custom loops' common names
    "reward_mean",
    "mean_reward",
    "train/mean_reward",
    "avg_reward",
    "reward/mean",
    "score/mean",
    "mean_score",
)
VALIDATION_NAMES = re.compile(  # held-out accuracy
    r"^(val-core/.+"  # verl: val-core/<data_source>/<acc or reward>/mean@N
    r"|eval/acc_mean"  # the CPU sandbox: greedy accuracy, mean over levels
    r"|eval/eval_.+_pass1"  # OpenRLHF: eval/eval_<data_source>_pass1 (wandb and TensorBoard)
    r"|eval_reward|eval/reward)$"  # TRL: the evaluation set's mean reward (trainer_state.json; wandb)
)
# TRL's collapse rate: the fraction of completions whose reward std is 0 (docs/diagnostics.md).
TRL_ZERO_STD = "frac_reward_zero_std"
# Fractions (of groups; TRL's of completions): a value outside [0, 1] is not one of these metrics.
RATES = ("acr/rate", "acr/all_correct", "acr/all_wrong", "acr/effective", "avspo/triggered", TRL_ZERO_STD)


class EarlyACR(NamedTuple):
    """ACR over a run's first steps, and which logged steps it averages."""

    mean: float
    first_step: int
    last_step: int
    steps: int  # how many logged steps were averaged
    resumed: bool  # the log starts after step ``early_steps``: its earliest logged steps were used


def early_window(total_steps: int | None = None) -> int:
    """How many first training steps early ACR averages: the one rule for every caller.

    The paper's ACR_100 averages the first 100 of 500 training steps. A log of unknown length
    (``report``, ``table``: a run may still be going) keeps the paper's 100 (:data:`EARLY_STEPS`);
    a run of known length ``total_steps`` (the sandbox, ``benchmarks/diagnostic_study.py``) keeps
    the paper's proportion, its first fifth, and at least one step.
    """
    if total_steps is None:
        return EARLY_STEPS
    return max(1, total_steps // 5)


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


# A run's final accuracy is the mean of its last FINAL_EVALUATIONS held-out evaluations, not the last one
# alone: one evaluation of a small level moves by a problem's worth between neighbouring steps.
FINAL_EVALUATIONS = 5


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


def score_column(frame: pd.DataFrame) -> str | None:
    """The column that holds the run's mean training reward (the first of :data:`SCORE_NAMES` with
    a value); None when the log has none."""
    return next((name for name in SCORE_NAMES if name in frame and frame[name].notna().any()), None)


def validation_columns(frame: pd.DataFrame) -> list[str]:
    """The frame's validation metrics (:data:`VALIDATION_NAMES`), in its column order."""
    return [column for column in frame if VALIDATION_NAMES.match(str(column))]


def latest_validation(frame: pd.DataFrame) -> dict[str, float]:
    """Each validation metric (:func:`validation_columns`) -> its latest logged value, in the
    frame's column order; metrics never logged are left out."""
    found = {column: last_value(frame[column]) for column in validation_columns(frame)}
    return {column: value for column, value in found.items() if value is not None}


def rate_problem(frame: pd.DataFrame, column: str) -> str | None:
    """Why ``column``, a fraction of groups (:data:`RATES`), cannot be used: it holds no value, or
    values outside [0, 1]. None when it is absent or fine."""
    if column not in frame:
        return None
    values = frame[column].dropna()
    if values.empty:
        return f"{column} is in the log but holds no value (every row is NaN), so it is not used"
    outside = values[(values < 0) | (values > 1)]  # inf too; NaN was dropped
    if outside.empty:
        return None
    shown = ", ".join(f"{value:g} at step {step}" for step, value in outside.iloc[:3].items())
    return (
        f"{column} holds {len(outside)} value(s) outside [0, 1] ({shown}{', ...' if len(outside) > 3 else ''}): "
        + (
            "TRL logs it as a fraction of completions"
            if column == TRL_ZERO_STD
            else "verl-avspo logs it as a fraction of groups"
        )
        + ", so this column comes from something else and is not used"
    )


@dataclass(frozen=True)
class StepCoverage:
    """Which steps a log holds: where it starts and ends, its usual step between rows, the gaps in
    it and the steps it logged more than once (:func:`step_coverage`)."""

    first: int
    last: int
    rows: int
    stride: int  # steps between rows: TRL's logging_steps where the log says it, else the most common step apart
    gaps: tuple[tuple[int, int], ...]  # (logged step, next logged step) around each gap
    irregular: bool  # rows at uneven steps (a sampled export): gaps are not listed
    repeated: tuple[int, ...]
    repeated_differing: tuple[int, ...] = ()  # of ``repeated``, those logged again with other values
    planned: int | None = None  # the steps the run's progress bar planned (console logs)
    zero_based: bool = False  # its first training step is 0 (a reward logged there): Tinker's numbering

    @property
    def ends_early(self) -> bool:
        """The log ends before the steps its progress bar planned: a run stopped, cut off or still going."""
        return self.planned is not None and self.last < self.planned

    @property
    def starts_late(self) -> bool:
        """The log starts after its first logging step: a resumed run whose earlier rows were lost."""
        return self.first > max(1, self.stride)

    @property
    def steps(self) -> int:
        """The training steps the log reaches (its last training step; one more when it counts its training
        steps from 0, as Tinker's does): what ``report``, ``table`` and ``--json`` call a run's steps,
        whatever its logging interval."""
        return self.last + self.zero_based

    def said(self) -> str:
        """``200 steps`` or ``200 steps, 40 rows logged every 5``."""
        rows = f"{self.rows} row{'' if self.rows == 1 else 's'}"
        return f"{self.steps} steps" + (f", {rows} logged every {self.stride}" if self.stride > 1 else "")

    @property
    def complete(self) -> bool:
        return not (self.starts_late or self.gaps or self.irregular or self.repeated or self.ends_early)

    def _gap_spans(self) -> list[str]:
        spans = [_span(a + self.stride, b - self.stride) for a, b in self.gaps]
        return spans[:5] + ([f"{len(spans) - 5} more gaps"] if len(spans) > 5 else [])

    def missing(self) -> str:
        """What is missing, in a few words: ``steps 1–3 and 8–9 missing``."""
        spans = ([_span(1, self.first - self.stride)] if self.starts_late else []) + self._gap_spans()
        if spans:
            return f"steps {_and(spans)} missing"
        return "rows at irregular steps" if self.irregular else ""

    def describe(self) -> str | None:
        """The log's coverage in a sentence for ``report`` and ``table``; None when complete."""
        said = []
        if self.starts_late:
            said.append(
                f"the log starts at step {self.first}"
                + (f" (rows every {self.stride} steps)" if self.stride > 1 else "")
                + f": steps {_span(1, self.first - self.stride)} are not in it (a resumed run whose earlier rows "
                "were lost?)"
            )
        if self.gaps:
            said.append(f"it has {len(self.gaps)} gap(s): steps {_and(self._gap_spans())} missing")
        if self.irregular:
            said.append("its rows are at irregular steps (a sampled export, such as wandb's run.history()?)")
        if self.repeated:
            shown = _and([str(step) for step in self.repeated[:8]]) + (" ..." if len(self.repeated) > 8 else "")
            differing = len(self.repeated_differing)
            how = (
                "each time with the same values (duplicated lines)"
                if not differing
                else "with other values the second time (a restarted run's new attempt?)"
                if differing == len(self.repeated)
                else f"{differing} of them with other values the second time (a restarted run?), the rest with the same"
            )
            said.append(f"step(s) {shown} were logged more than once, {how}: the last value of each is used")
        if self.ends_early:
            said.append(
                f"it ends at step {self.last} of the {self.planned} its progress bar planned (a run stopped, cut "
                "off or still going)"
            )
        return "; ".join(said) or None

    def caveat(self) -> str:
        """A clause for a finding about the whole run when steps are missing ("" otherwise)."""
        if not (self.starts_late or self.gaps):
            return ""
        return f" (judged on the logged steps {_span(self.first, self.last)} only; {self.missing()})"


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}–{last}"


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


# Every evaluation metric, headline or not: verl's val-core/* and val-aux/*, TRL's eval_*, OpenRLHF's and
# the sandbox's eval/*.
_EVALUATION = re.compile(r"^(val-|eval_|eval/|train/eval)")


def training_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``frame`` that log training, not only a validation (verl validates at the step a run
    starts or resumes from, step 0 before training; TRL logs evaluations in rows of their own)."""
    evaluation = [column for column in frame if _EVALUATION.match(str(column))]
    training = frame.drop(columns=evaluation).dropna(how="all")
    return training if len(training) else frame


def step_coverage(frame: pd.DataFrame) -> StepCoverage:
    """Which training steps ``frame`` (a run's metrics, indexed by step) holds. Rows are ``stride``
    steps apart: TRL's ``logging_steps`` where the log says it (``attrs["logging_steps"]``), else the
    most common step between rows; a larger step between two rows is a gap, unless more than a tenth
    of them differ from the stride (an unevenly sampled export: ``irregular``)."""
    steps = np.asarray(sorted(training_rows(frame).index), dtype=int)
    repeated = tuple(frame.attrs.get("repeated_steps", ()))
    score = score_column(frame)
    zero_based = bool(steps.size and steps[0] == 0 and score is not None and pd.notna(frame[score].get(0)))
    seen = (tuple(frame.attrs.get("repeated_differing", ())), frame.attrs.get("planned_steps"), zero_based)
    differences = np.diff(steps)
    logged = frame.attrs.get("logging_steps")
    if differences.size == 0:
        return StepCoverage(int(steps[0]), int(steps[-1]), len(steps), logged or 1, (), False, repeated, *seen)
    values, counts = np.unique(differences, return_counts=True)
    stride = logged or int(values[np.argmax(counts)])
    off = differences != stride
    irregular = bool(off.sum() > max(2, differences.size // 10))
    gaps = () if irregular else tuple((int(steps[i]), int(steps[i + 1])) for i in np.flatnonzero(differences > stride))
    return StepCoverage(int(steps[0]), int(steps[-1]), len(steps), stride, gaps, irregular, repeated, *seen)
