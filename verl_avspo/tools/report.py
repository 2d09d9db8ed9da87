"""``verl-avspo report``: plots and a diagnosis of advantage collapse from existing training logs.

Reads verl's ``file`` logger (JSONL; flat ``{"step": N, ...}`` JSONL too), console logs (verl's, the
Trainer's printed dicts, OpenRLHF's), TensorBoard event files, wandb CSV exports and TRL's
``trainer_state.json`` or a bare ``log_history`` list (:func:`verl_avspo.tools.logs.collect_runs`). Several
runs are drawn side by side. A truncated or corrupt log keeps every readable step, with a warning naming
the file and the lines dropped (printed as a plain line); a file that cannot be read at all is named with
the reason in the text and counts for ``--fail-on unreadable``; every other file of a folder is named
as not a log, with the reason. Writes one
PNG per figure and ``summary.md`` to ``--out`` (each through :func:`verl_avspo.core.files.atomic_write`),
and prints the diagnosis of each run (:mod:`verl_avspo.tools.diagnosis`): findings with a severity, their
evidence and what to do. ``--json`` writes all of it machine-readable; ``--fail-on`` sets the exit status
for CI (:data:`FAIL_CONDITIONS`).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from verl_avspo.core.acr_config import ACR_SECTION
from verl_avspo.core.alert import describe_rule
from verl_avspo.core.config import ALERT_RULES, AlertConfig, SettingsError, resolve_alert
from verl_avspo.core.files import FileWriteError, write_text
from verl_avspo.tools.diagnosis import DOCS, RunDiagnosis, diagnose
from verl_avspo.tools.logs import TRAINER_STATE, caught_warnings, collect_runs, not_logs_summary
from verl_avspo.tools.markdown import render_table
from verl_avspo.tools.report_gates import (
    FAIL_CONDITIONS,
    FAIL_VALUES,
    UNCHECKED,
    fail_on,
    failed_conditions,
    report_json,
    unchecked_conditions,
)
from verl_avspo.tools.stats import SCORE_NAMES, TRL_ZERO_STD, score_column, validation_columns

__all__ = ["FIGURES", "configure", "run", "write_report"]


# A figure of each run's own score column, of validation columns, or of TRL's per-function mean rewards.
_SCORE, _VALIDATION, _REWARD_FUNCTIONS = "score", "validation", "reward functions"
_REWARD_FUNCTION = re.compile(
    r"^rewards/(?:[^/]+/mean|[^/]+)$"
)  # TRL: rewards/<function>/mean; older: rewards/<function>
_WANTED = {
    _SCORE: f"a mean reward ({', '.join(SCORE_NAMES)})",
    _VALIDATION: "validation metrics (val-core/*, eval/acc_mean, eval/eval_*_pass1, eval_reward)",
    _REWARD_FUNCTIONS: "TRL's rewards/<function>/mean (older TRL: rewards/<function>)",
}
# file name -> (columns, legend labels, title, y label).
FIGURES: dict[str, tuple[tuple[str, ...], dict[str, str], str, str]] = {
    "acr.png": (
        ("acr/rate", "acr/effective", TRL_ZERO_STD),
        {"acr/rate": "raw ACR", "acr/effective": "effective ACR", TRL_ZERO_STD: f"TRL's {TRL_ZERO_STD}"},
        "Advantage collapse rate",
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
    "reward.png": ((_SCORE,), {}, "Mean training reward", "score"),
    "reward_functions.png": ((_REWARD_FUNCTIONS,), {}, "Mean reward of each reward function (TRL)", "reward"),
    "reward_std.png": (
        ("reward_std",),
        {},
        "TRL's reward_std (older TRL: mean of per-group stds; later: the batch's std)",
        "std",
    ),
    "accuracy.png": ((_VALIDATION,), {}, "Validation accuracy", "accuracy"),
}
_LOG_SUFFIXES = (".jsonl", ".csv")  # --json must not overwrite a log


def _figure_columns(
    columns: tuple[str, ...], runs: dict[str, pd.DataFrame]
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The frames to draw and the columns present; each run's score is drawn from its own column
    (verl, the sandbox and OpenRLHF name it differently)."""
    if columns == (_SCORE,):
        scores = {name: score_column(frame) for name, frame in runs.items()}
        frames = {
            name: runs[name][[column]].rename(columns={column: _SCORE}) for name, column in scores.items() if column
        }
        return frames, [_SCORE] if frames else []
    if columns == (_VALIDATION,):
        return runs, sorted({c for frame in runs.values() for c in validation_columns(frame)})
    if columns == (_REWARD_FUNCTIONS,):
        return runs, sorted({c for frame in runs.values() for c in frame if _REWARD_FUNCTION.match(str(c))})
    return runs, [c for c in columns if any(c in frame and frame[c].notna().any() for frame in runs.values())]


def write_report(
    runs: dict[str, pd.DataFrame],
    out: str | Path,
    alert: AlertConfig | None = None,
    smooth: int = 1,
    unreadable: list[str] | None = None,
    paper_fit: bool | None = None,
    notes: list[str] | None = None,
    draw: bool = True,
) -> tuple[list[RunDiagnosis], list[Path]]:
    """Write the figures (none when not ``draw``: matplotlib is then not imported) and ``summary.md`` to
    ``out`` (the logs that could not be read, ``unreadable``, and the reading's ``notes``, named in it).
    Returns the runs' diagnoses and the files. ``paper_fit``: as
    :func:`~verl_avspo.tools.diagnosis.diagnose`."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FileWriteError(err.errno or 0, f"cannot create the folder --out {out}: {err.strerror or err}") from None
    alert = alert or AlertConfig()
    diagnoses = [diagnose(name, frame, alert, paper_fit) for name, frame in runs.items()]
    figures, skipped = [], [] if draw else ["every figure (--no-figures)"]
    for filename, (columns, labels, title, ylabel) in FIGURES.items() if draw else ():
        frames, present = _figure_columns(columns, runs)
        if not present:
            skipped.append(f"{filename} (no run logs {_WANTED.get(columns[0], ', '.join(columns))})")
            continue
        if columns == (_REWARD_FUNCTIONS,):  # the legend names each function
            labels = {c: c.removeprefix("rewards/").removesuffix("/mean") for c in present}
        if len(present) == 1 and present[0] in labels:  # the legend then names runs only: the title says what
            title = f"{title} ({labels[present[0]]})"
        from verl_avspo.tools.plots import plot_metrics  # matplotlib (0.3 s here) only where a figure is drawn

        figures.append(plot_metrics(frames, present, out / filename, title, ylabel, smooth, labels))

    keys = list(dict.fromkeys(key for diagnosis in diagnoses for key in diagnosis.row))
    lines = [
        "# Advantage collapse report",
        "",
        f"Runs: {', '.join(runs)}. Stall rule `{alert.rule}`: {describe_rule(alert)} (training steps).",
        "",
        render_table(keys, [[diagnosis.row.get(key, "—") for key in keys] for diagnosis in diagnoses]),
        "",
        "ACR is measured on raw scores; *effective* is the fraction of groups whose final advantages are all zero; "
        "a figure marked * is read from another collapse measure than acr/rate (each run's collapse finding names "
        f"it; verl-avspo's {DOCS}, section 'What the report reads collapse from', says what each means). "
        "*final score* is the mean of the last fifth of the logged rows.",
        "",
        *(
            ["## Logs that could not be read", "", *(f"- {problem}" for problem in unreadable), ""]
            if unreadable
            else []
        ),
        *(["## Reading the logs", "", *(f"- {note}" for note in notes), ""] if notes else []),
        "## Diagnosis",
        "",
    ]
    for diagnosis in diagnoses:
        lines += [f"### {diagnosis.heading}", "", "```text", diagnosis.text(), "```", ""]
    lines += ["## Figures", "", *(f"![{path.stem}]({path.name})" for path in figures)]
    if skipped:
        lines += ["", "Not drawn: " + "; ".join(skipped) + "."]
    summary_path = write_text(out / "summary.md", "\n".join(lines) + "\n")
    return diagnoses, [*figures, summary_path]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        f"exit status {UNCHECKED} when --fail-on stalled could not be checked for a run (too short for the rule, "
        "or no collapse measure) and no condition held. --fail-on conditions (exit status 3 when one holds for a "
        "run): "
        + "; ".join(f"{name}: {meaning}" for name, meaning in FAIL_CONDITIONS.items())
        + f"; 'NAME>X' or 'NAME<X' (quoted in a shell): the run's figure NAME ({', '.join(FAIL_VALUES)}) above or "
        "below X."
    )
    parser.add_argument(
        "logs",
        nargs="+",
        help=f"verl JSONL logs, console logs, TensorBoard event files, wandb CSV exports, TRL's {TRAINER_STATE}, "
        "or dirs",
    )
    parser.add_argument("--out", default="avspo-report", help="output folder (default: avspo-report)")
    parser.add_argument(
        "--name", action="append", help="a run's name, once per run in order (default: from the logs' paths)"
    )
    defaults = AlertConfig()
    parser.add_argument(
        "--rule",
        choices=ALERT_RULES,
        default=defaults.rule,
        help=f"stall rule, as the live alert's rule setting (default {defaults.rule}; acr is the paper's)",
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
    parser.add_argument(
        "--no-figures",
        dest="figures",
        action="store_false",
        help="write summary.md and the findings without the PNG figures (about half the time: for CI and scripts)",
    )
    parser.add_argument(
        "--paper-fit",
        action="store_true",
        default=None,
        help="show the paper's MATH-500 fit at each run's ACR_100 (default: only for runs named as math runs)",
    )
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="also write every finding and figure as JSON to FILE ('-': stdout; the text then goes to stderr)",
    )
    parser.add_argument(
        "--fail-on",
        action="append",
        default=[],
        type=fail_on,
        metavar="CONDITION",
        help="exit with status 3 if CONDITION holds for any run (repeatable; the conditions are listed below)",
    )


def run(args: argparse.Namespace) -> int:
    # The stall rule is the live alert's, checked by the same resolver (before --out is created).
    try:
        alert = resolve_alert({"rule": args.rule, "window": args.window, "threshold": args.threshold})
    except SettingsError as err:
        flags = "\n".join(f"  {problem.replace(f'{ACR_SECTION}.alert.', '--')}" for problem in err.problems)
        raise SystemExit(f"verl-avspo report: --rule, --window and --threshold set the stall rule:\n{flags}") from None
    if args.smooth < 1:
        raise SystemExit(f"--smooth must be >= 1 (1 plots the raw values); got {args.smooth}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise SystemExit(
            f"verl-avspo report: --out {args.out} is an existing file; --out names a folder for the figures and "
            "summary.md. Give a new or existing folder, for example --out avspo-report"
        )
    json_path = None if args.json in (None, "-") else Path(args.json)
    if json_path is not None and (
        json_path.is_dir() or json_path.suffix in _LOG_SUFFIXES or json_path.name == TRAINER_STATE
    ):
        raise SystemExit(
            f"verl-avspo report: --json {args.json} names a folder or a log; --json names the JSON file to write "
            "(or '-' for stdout), for example --json report.json"
        )
    unreadable: list[str] = []
    skipped: list[str] = []
    with caught_warnings() as warned:
        try:
            runs = collect_runs(args.logs, args.name, unreadable, skipped)
        except (OSError, ValueError) as err:  # OSError: a log that cannot be read
            runs, error = None, err
    if runs is None:
        raise SystemExit(f"verl-avspo report: {error}") from None
    notes = [f"warning: {message}" for message in warned] + [
        f"not a log, not read: {line}" for line in not_logs_summary(skipped)
    ]
    try:
        with caught_warnings() as warned:
            diagnoses, files = write_report(
                runs, args.out, alert, args.smooth, unreadable, args.paper_fit, notes, args.figures
            )
        failed = failed_conditions(args.fail_on, diagnoses, unreadable)
        unchecked = unchecked_conditions(args.fail_on, diagnoses)
        if json_path is not None:
            document = report_json(diagnoses, files, alert, failed, unreadable, skipped, unchecked)
            files.append(write_text(json_path, document + "\n"))
    except (OSError, ValueError) as err:  # OSError: --out that cannot be written
        raise SystemExit(f"verl-avspo report: {err}") from None
    text = sys.stderr if args.json == "-" else sys.stdout
    for note in notes + [f"warning: {message}" for message in warned]:
        print(f"-- {note}", file=text)
    for problem in unreadable:
        print(f"!! not read: {problem}", file=text)
    for diagnosis in diagnoses:
        print(f"== {diagnosis.heading}", file=text)
        for finding in diagnosis.findings:
            print("\n".join(f"  {line}" for line in finding.lines()), file=text)
    print(f"\nwrote: {', '.join(str(path) for path in files)}; metrics explained in {DOCS}", file=text)
    if args.json == "-":
        print(report_json(diagnoses, files, alert, failed, unreadable, skipped, unchecked))
    for condition, names in failed.items():
        print(f"verl-avspo report: --fail-on {condition} holds for {', '.join(names)}", file=sys.stderr)
    for condition, names in unchecked.items():
        print(
            f"verl-avspo report: --fail-on {condition} could not be checked for {', '.join(names)}: exit status "
            f"{UNCHECKED} (not a pass)",
            file=sys.stderr,
        )
    if failed:
        return 3
    return UNCHECKED if unchecked else 0
