"""``verl-avspo report``: plots and a diagnosis of advantage collapse from existing training logs.

Reads verl's ``file`` logger (JSONL), TensorBoard event files and wandb CSV exports
(:func:`verl_avspo.tools.logs.collect_runs`). Several runs are drawn side by side. A truncated or
corrupt log keeps every readable step, with a warning naming the file and the lines dropped. Writes
one PNG per figure and ``summary.md`` to ``--out``, and prints the diagnosis of each run
(:mod:`verl_avspo.tools.diagnosis`): stalled windows under ``--rule``, ``--threshold`` and
``--window`` (the live alert's monitor), ACR over the first 100 steps, which kind of collapsed group
dominates, and what a log without ``acr/*`` metrics lacks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from verl_avspo.core.alert import describe_rule
from verl_avspo.core.config import ALERT_RULES, AlertConfig, SettingsError, resolve_alert
from verl_avspo.tools.diagnosis import SCORE, RunDiagnosis, diagnose
from verl_avspo.tools.logs import collect_runs
from verl_avspo.tools.markdown import render_table
from verl_avspo.tools.plots import plot_metrics
from verl_avspo.tools.stats import VALIDATION_PREFIX

__all__ = ["FIGURES", "write_report", "configure", "run"]

# file name -> (columns, legend labels, title, y label); "val-core/" means every such column.
FIGURES: dict[str, tuple[tuple[str, ...], dict[str, str], str, str]] = {
    "acr.png": (
        ("acr/rate", "acr/effective"),
        {"acr/rate": "raw ACR", "acr/effective": "effective"},
        "Advantage collapse rate: raw scores vs final advantages",
        "fraction of groups",
    ),
    "acr_split.png": (
        ("acr/all_correct", "acr/all_wrong"),
        {"acr/all_correct": "all correct", "acr/all_wrong": "all wrong"},
        "Collapsed groups by kind",
        "fraction of groups",
    ),
    "threshold.png": (
        ("avspo/threshold", "avspo/signal"),
        {"avspo/threshold": "threshold θ", "avspo/signal": "signal s"},
        "AVSPO adaptive threshold and collapse signal",
        "rate",
    ),
    "reward.png": ((SCORE,), {SCORE: "mean score"}, "Mean training reward", "score"),
    "accuracy.png": ((VALIDATION_PREFIX,), {}, "Validation accuracy", "accuracy"),
}


def _figure_columns(columns: tuple[str, ...], runs: dict[str, pd.DataFrame]) -> list[str]:
    if columns == (VALIDATION_PREFIX,):
        return sorted({c for frame in runs.values() for c in frame if c.startswith(VALIDATION_PREFIX)})
    return [c for c in columns if any(c in frame and frame[c].notna().any() for frame in runs.values())]


def write_report(
    runs: dict[str, pd.DataFrame], out: str | Path, alert: AlertConfig | None = None, smooth: int = 1
) -> tuple[list[RunDiagnosis], list[Path]]:
    """Write the figures and ``summary.md`` to ``out``. Returns the runs' diagnoses and the files."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    alert = alert or AlertConfig()
    diagnoses = [diagnose(name, frame, alert) for name, frame in runs.items()]
    figures, skipped = [], []
    for filename, (columns, labels, title, ylabel) in FIGURES.items():
        present = _figure_columns(columns, runs)
        if not present:
            skipped.append(f"{filename} (no run logs {', '.join(columns)})")
            continue
        figures.append(plot_metrics(runs, present, out / filename, title, ylabel, smooth, labels))

    keys = list(dict.fromkeys(key for diagnosis in diagnoses for key in diagnosis.row))
    lines = [
        "# Advantage collapse report",
        "",
        f"Runs: {', '.join(runs)}. Stall rule `{alert.rule}`: {describe_rule(alert)} (logged steps).",
        "",
        render_table(keys, [[diagnosis.row.get(key, "—") for key in keys] for diagnosis in diagnoses]),
        "",
        "ACR is measured on raw scores; *effective* is the fraction of groups whose final advantages are all zero.",
        "",
        "## Diagnosis",
        "",
        *(f"- {finding}" for diagnosis in diagnoses for finding in diagnosis.findings),
        "",
        "## Figures",
        "",
        *(f"![{path.stem}]({path.name})" for path in figures),
    ]
    if skipped:
        lines += ["", "Not drawn: " + "; ".join(skipped) + "."]
    summary_path = out / "summary.md"
    summary_path.write_text("\n".join(lines) + "\n")
    return diagnoses, [*figures, summary_path]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", help="verl JSONL logs, TensorBoard event files, wandb CSV exports, or dirs")
    parser.add_argument("--out", default="avspo-report", help="output folder (default: avspo-report)")
    parser.add_argument("--name", action="append", help="a run's name, once per log in order (default: file names)")
    defaults = AlertConfig()
    parser.add_argument(
        "--rule",
        choices=ALERT_RULES,
        default=defaults.rule,
        help=f"stall rule, as algorithm.avspo.alert.rule (default {defaults.rule}; acr is the paper's)",
    )
    parser.add_argument(
        "--window", type=int, default=defaults.window, help=f"stall rule: consecutive steps (default {defaults.window})"
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=defaults.threshold,
        help=f"stall rule: the rule's rate above this (default {defaults.threshold})",
    )
    parser.add_argument("--smooth", type=int, default=1, help="rolling-mean window of the plots, in steps")


def run(args: argparse.Namespace) -> int:
    # The stall rule is the live alert's, checked by the same resolver (before --out is created).
    try:
        alert = resolve_alert({"rule": args.rule, "window": args.window, "threshold": args.threshold})
    except SettingsError as err:
        flags = "\n".join(f"  {problem}" for problem in err.problems)
        raise SystemExit(
            f"verl-avspo report: --rule, --window and --threshold are algorithm.avspo.alert's keys:\n{flags}"
        ) from None
    if args.smooth < 1:
        raise SystemExit(f"--smooth must be >= 1 (1 plots the raw values); got {args.smooth}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise SystemExit(
            f"verl-avspo report: --out {args.out} is an existing file; --out names a folder for the figures and "
            "summary.md. Give a new or existing folder, for example --out avspo-report"
        )
    try:
        runs = collect_runs(args.logs, args.name)
        diagnoses, files = write_report(runs, args.out, alert, args.smooth)
    except (OSError, ValueError) as err:  # OSError: a log or --out that cannot be read or written
        raise SystemExit(f"verl-avspo report: {err}") from None
    for diagnosis in diagnoses:
        print(f"== {diagnosis.name} ({diagnosis.steps} steps)")
        for finding in diagnosis.findings:
            print(f"  - {finding.removeprefix(diagnosis.name + ': ')}")
    print("\nwrote: " + ", ".join(str(path) for path in files))
    return 0
