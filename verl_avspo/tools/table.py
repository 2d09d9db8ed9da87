"""``verl-avspo table``: the paper-style results table from verl file-logger logs.

    verl-avspo table runs/                       # every run under runs/
    verl-avspo table runs/qwen2.5-math-1.5b_grpo runs/qwen2.5-math-1.5b_avspo
    verl-avspo table my_project/exp1.jsonl my_project/exp2.jsonl

One row per run, in markdown:

- **pass@1 per benchmark**, in percent: verl's ``val-core/<data_source>/acc/mean@N`` (``reward``
  when a scorer logs no ``acc``) at the latest validation. A run directory of the recipes holds
  ``metrics.jsonl`` (training, with validation every ``test_freq`` steps) and, after
  ``MODE=eval``, ``eval.jsonl`` (the final 2048-token evaluation); the latter wins.
  Any other ``<name>.jsonl`` is a run of its own, named by its stem.
- **avg**: the mean over the in-domain (math) benchmarks; "–" when the run lacks one of them.
- **ACR (final)**: ``acr/rate`` averaged over the last ``--final-window`` training steps (a row logged
  every N steps stands for its N steps);
  **ACR (first 100)**: averaged over steps 1..``--early-steps`` (the paper's ACR_100 predictor;
  a log resumed after that step: its earliest ``--early-steps`` logged steps, see
  :func:`verl_avspo.tools.stats.early_acr`).
- **effective ACR (final)**: ``acr/effective`` likewise: the share of groups still at zero
  advantage after the estimator (equal to ACR for GRPO; lower for AVSPO).

Logs of every kind ``verl-avspo report`` reads (TensorBoard, wandb CSV, TRL's
``trainer_state.json``; OpenRLHF's ``eval/eval_<data_source>_pass1`` counts as pass@1) are read the
same way (a log without ``acr/*`` gets its ACR columns from the collapse measure it holds,
:func:`verl_avspo.tools.signals.collapse_rate`, with a note), and runs are named as ``report`` names
them (:func:`verl_avspo.tools.logs.run_names`).
Under the table, a note per run says what its log lacks: steps (it starts after its first logging
step, has gaps, logged a step twice), ``acr/*`` or validation metrics, or a rate column that cannot be
used. **steps** is the last training step logged, as ``report`` counts it. A log that cannot be read is
named on stderr and makes the exit status 1, as does reading no run at all.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from verl_avspo.tools.collapse_measures import collapse_rate
from verl_avspo.tools.logs import caught_warnings, merge_frames, not_logs_summary, read_run_logs
from verl_avspo.tools.markdown import render_table
from verl_avspo.tools.signals import per_step
from verl_avspo.tools.stats import (
    EARLY_STEPS,
    RATES,
    early_acr,
    latest_validation,
    rate_problem,
    step_coverage,
    training_rows,
    validation_columns,
    window_mean,
)

__all__ = ["TableRow", "BENCHMARK_NAMES", "OUT_OF_DOMAIN", "table_rows", "table_row", "markdown_table", "notes"]

# data_source -> column title, in the paper's order; other data sources follow, sorted.
BENCHMARK_NAMES = {
    "math500": "MATH-500",
    "gsm8k": "GSM8K",
    "minerva_math": "Minerva",
    "olympiadbench": "OlympiadBench",
    "amc23": "AMC23",
    "aime2024": "AIME24",
    "mmlu_pro": "MMLU-Pro",
}
OUT_OF_DOMAIN = frozenset({"mmlu_pro"})
_VALIDATION = (
    "validation per benchmark (verl's val-core/<data_source>/acc/mean@N, OpenRLHF's eval/eval_<data_source>_pass1)"
)
# verl's validation, and OpenRLHF's (wandb and TensorBoard names).
_PASS_AT_1 = (
    re.compile(r"^val-core/(?P<source>.+)/(?P<var>acc|reward)/mean@\d+$"),
    re.compile(r"^eval/eval_(?P<source>.+)_(?P<var>pass)1$"),
)


@dataclass
class TableRow:
    """What the table shows for one run; pass@1 values are fractions, None when not logged."""

    name: str
    pass_at_1: dict[str, float] = field(default_factory=dict)
    acr_final: float | None = None
    acr_early: float | None = None
    effective_final: float | None = None
    steps: int = 0
    notes: list[str] = field(default_factory=list)  # what the log lacks, said under the table


def _latest_pass_at_1(frame: pd.DataFrame) -> dict[str, float]:
    """data_source -> latest validation accuracy; ``acc`` preferred over ``reward``."""
    found: dict[str, tuple[str, float]] = {}
    for column, value in latest_validation(frame).items():
        match = next((m for pattern in _PASS_AT_1 if (m := pattern.match(column))), None)
        if match is None:
            continue
        source, var = match["source"], match["var"]
        if source not in found or (var == "acc" and found[source][0] != "acc"):
            found[source] = (var, value)
    return {source: value for source, (_, value) in found.items()}


def table_row(
    name: str, frames: list[pd.DataFrame], final_window: int = 10, early_steps: int = EARLY_STEPS
) -> TableRow:
    """One run's row, from the frames of its log files in reading order (later files override
    earlier validation results; the training logs' ACR is read from their merged frame)."""
    row = TableRow(name)
    for frame in frames:
        row.pass_at_1.update(_latest_pass_at_1(frame))
    training = [frame for frame in frames if set(frame.columns) - set(validation_columns(frame))]
    frame = merge_frames(name, training or frames[:1])
    coverage = step_coverage(frame)
    row.steps = coverage.steps
    if (said := coverage.describe()) is not None:
        row.notes.append(said)
    problems = {column: problem for column in RATES if (problem := rate_problem(frame, column)) is not None}
    collapse = collapse_rate(training_rows(frame), set(frame.columns) - set(problems))
    if collapse is None:
        row.notes.append(
            f"no ACR: {problems['acr/rate']}"
            if "acr/rate" in problems
            else "no ACR: the log holds no collapse measure (acr/*, frac_reward_zero_std, reward_std, critic/score/max "
            "and min); `verl-avspo report` says how to log acr/*"
        )
        return row
    if collapse.kind == "regenerated":
        again = collapse.rate.dropna()
        row.notes.append(
            f"no ACR: {collapse.what}; it generated again on {int(again.sum())} of {len(again)} steps, evidence of "
            "collapse (a lower bound, docs/diagnostics.md)"
        )
        return row
    if collapse.source != "acr/rate":
        row.notes.append(f"ACR is {collapse.source}: {collapse.what} (docs/diagnostics.md)")
    rate = per_step(collapse.rate.to_frame("rate"), coverage.stride)["rate"]
    row.acr_final = window_mean(rate, last=final_window)
    early = early_acr(rate, early_steps)
    row.acr_early = None if early is None else early.mean
    if "acr/effective" in problems:
        row.notes.append(problems["acr/effective"])
    elif collapse.source == "acr/rate":
        effective = per_step(frame[["acr/effective"]], coverage.stride) if "acr/effective" in frame else None
        row.effective_final = None if effective is None else window_mean(effective["acr/effective"], last=final_window)
    return row


def table_rows(
    paths: list[str | Path],
    final_window: int = 10,
    early_steps: int = EARLY_STEPS,
    unreadable: list[str] | None = None,
    skipped: list[str] | None = None,
) -> list[TableRow]:
    """The rows of the runs under ``paths``, named and grouped as :func:`verl_avspo.tools.logs.read_run_logs`
    does (with the recipes' ``eval.jsonl``); the logs that cannot be read are appended to ``unreadable``,
    the files of a folder that are not logs to ``skipped``."""
    runs = read_run_logs(paths, evaluations=True, unreadable=unreadable, skipped=skipped)
    return [table_row(name, frames, final_window, early_steps) for name, frames in runs.items()]


def _benchmarks(rows: list[TableRow]) -> list[str]:
    seen = {source for row in rows for source in row.pass_at_1}
    return [b for b in BENCHMARK_NAMES if b in seen] + sorted(seen - set(BENCHMARK_NAMES))


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "–" if value is None or math.isnan(value) else f"{value * scale:.{digits}f}"


def markdown_table(rows: list[TableRow], early_steps: int = EARLY_STEPS) -> str:
    benchmarks = _benchmarks(rows)
    in_domain = [b for b in benchmarks if b not in OUT_OF_DOMAIN]
    out_of_domain = [b for b in benchmarks if b in OUT_OF_DOMAIN]
    header = ["run", *(BENCHMARK_NAMES.get(b, b) for b in in_domain), "avg"]
    header += [BENCHMARK_NAMES.get(b, b) for b in out_of_domain]
    header += ["ACR (final)", f"ACR (first {early_steps})", "effective ACR (final)", "steps"]
    cells_of_rows = []
    for s in rows:
        scores = [s.pass_at_1.get(b) for b in in_domain]
        average = None if not scores or None in scores else sum(scores) / len(scores)
        cells = [s.name, *(_fmt(v, 100, 1) for v in scores), _fmt(average, 100, 1)]
        cells += [_fmt(s.pass_at_1.get(b), 100, 1) for b in out_of_domain]
        cells += [_fmt(s.acr_final), _fmt(s.acr_early), _fmt(s.effective_final), str(s.steps) if s.steps else "–"]
        cells_of_rows.append(cells)
    return render_table(header, cells_of_rows)


def notes(rows: list[TableRow]) -> str:
    """What each run's log lacks, a Markdown list ("" when nothing is missing)."""
    lines = [f"- {row.name}: {note}." for row in rows for note in row.notes]
    lacking = [row.name for row in rows if not row.pass_at_1]
    if lacking:
        which = "no run logs" if len(lacking) == len(rows) else f"{', '.join(lacking)}: no"
        lines.append(f"- {which} {_VALIDATION}, so no pass@1.")
    return "\n".join(["Notes:", *lines]) if lines else ""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        help="run directories, folders of runs, verl JSONL logs, TensorBoard or wandb CSV files, trainer_state.json",
    )
    parser.add_argument("--final-window", type=int, default=10, help="steps averaged for the final ACR (default 10)")
    parser.add_argument(
        "--early-steps",
        type=int,
        default=EARLY_STEPS,
        help=f"steps averaged for the early ACR (default {EARLY_STEPS}, the paper's ACR_{EARLY_STEPS})",
    )


def run(args: argparse.Namespace) -> int:
    if args.final_window < 1 or args.early_steps < 1:
        print(
            "verl-avspo table: --final-window and --early-steps are step counts and must be at least 1; "
            f"got {args.final_window} and {args.early_steps}",
            file=sys.stderr,
        )
        return 2
    unreadable: list[str] = []
    skipped: list[str] = []
    with caught_warnings() as warned:
        try:
            rows = table_rows(args.paths, args.final_window, args.early_steps, unreadable, skipped)
        except (OSError, ValueError) as err:
            rows, unreadable = None, [str(err)]
    for message in warned:
        print(f"verl-avspo table: warning: {message}", file=sys.stderr)
    if rows is None:
        print(f"verl-avspo table: {unreadable[0]}", file=sys.stderr)
        return 1
    for line in not_logs_summary(skipped):
        print(f"verl-avspo table: not a log, not read: {line}", file=sys.stderr)
    if not rows:
        print(f"verl-avspo table: no run could be read from {', '.join(map(str, args.paths))}", file=sys.stderr)
        return 1
    print(markdown_table(rows, args.early_steps))
    if said := notes(rows):
        print("\n" + said)
    for problem in unreadable:
        print(f"verl-avspo table: not read: {problem}", file=sys.stderr)
    return 1 if unreadable else 0
