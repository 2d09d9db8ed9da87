"""``verl-avspo report``: plots and a diagnosis of advantage collapse from existing training logs.

Reads verl's ``file`` logger (JSONL, ``{"step": N, "data": {...}}``), TensorBoard event files
(verl's and OpenRLHF's ``tensorboard`` loggers; OpenRLHF's ``train/acr/*`` read as ``acr/*``) and
wandb CSV exports (a run's history, or a chart panel's CSV of one or more runs). Several runs are
drawn side by side. A truncated or corrupt log keeps every readable step, with a warning naming the
file and the lines dropped. Writes one PNG per figure and ``summary.md`` to ``--out``, and prints the diagnosis:

- stalled windows, with the same monitor as the live alert (``core.alert``): ``--rule``'s signal
  above ``--threshold`` for ``--window`` consecutive logged steps;
- ACR over the first 100 steps, with the paper's accuracy fit marked as the paper's;
- whether all-correct or all-wrong groups dominate collapse, and what to try;
- for logs without our ``acr/*`` metrics (a plain verl GRPO run), what is missing and how to get it.
"""

from __future__ import annotations

import argparse
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from verl_avspo.core.alert import ADVICE, ALERT_SIGNALS, REWARD_KEY, describe_rule, stalled_steps, stalled_windows
from verl_avspo.core.config import ALERT_RULES, AlertConfig
from verl_avspo.tools.logs import find_logs, read_metrics
from verl_avspo.tools.plots import plot_metrics

__all__ = ["FIGURES", "RunSummary", "read_run", "collect_runs", "summarise", "write_report", "configure", "run"]

PAPER_FIT = (51.4, -29.6)  # MATH-500 accuracy (%) ≈ 51.4 − 29.6·ACR_100, the paper's own regression
SCORE = "critic/score/mean"  # verl's mean raw reward of the batch
VALIDATION_PREFIX = "val-core/"  # verl's headline validation metrics, e.g. val-core/<data_source>/acc/mean@1

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


def _read_tensorboard(path: Path) -> pd.DataFrame:
    """Scalars of one TensorBoard event file, as a frame like ``read_metrics`` returns."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as err:
        raise ValueError(f"{path} is a TensorBoard event file; reading it needs `pip install tensorboard`") from err
    events = EventAccumulator(str(path), size_guidance={"scalars": 0})
    events.Reload()
    columns = {
        tag: pd.Series({event.step: event.value for event in events.Scalars(tag)}, dtype=float)
        for tag in events.Tags()["scalars"]
    }
    return _as_metrics_frame(pd.DataFrame(columns), path)


# A wandb chart panel's CSV export: "Step", then "<run> - <metric>" with its "__MIN"/"__MAX" bands.
_PANEL_COLUMN = re.compile(r"^(?P<run>.+) - (?P<metric>.+?)(?P<band>__MIN|__MAX)?$")


def _read_csv(path: Path) -> dict[str | None, pd.DataFrame]:
    """A wandb export: a run history (``run.history().to_csv(...)``, the UI's "Export CSV" of a
    run's table), one row per step, keyed None; or a chart panel's CSV ("Download CSV" on a panel),
    whose ``<run> - <metric>`` columns give one frame per run, keyed by run name (bands dropped)."""
    try:
        frame = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a readable CSV: {str(err).splitlines()[0]}") from None
    step = next((name for name in ("step", "_step", "Step", "global_step") if name in frame), None)
    if step is None:
        raise ValueError(f"{path} has no step column (step, _step, Step or global_step); columns: {list(frame)[:8]}")
    numeric = frame.set_index(step).apply(pd.to_numeric, errors="coerce").dropna(axis=1, how="all")
    numeric = numeric[numeric.index.notna()]
    panel = {column: _PANEL_COLUMN.match(column) for column in numeric}
    if not any(match is not None for match in panel.values()):
        return {None: _as_metrics_frame(numeric.groupby(level=0).last(), path)}
    runs: dict[str | None, pd.DataFrame] = {}
    for run_name in dict.fromkeys(match["run"] for match in panel.values() if match is not None):
        columns = {
            column: match["metric"]
            for column, match in panel.items()
            if match is not None and match["run"] == run_name and not match["band"]
        }
        runs[run_name] = _as_metrics_frame(numeric[list(columns)].rename(columns=columns).groupby(level=0).last(), path)
    return runs


# OpenRLHF's wandb and TensorBoard loggers put its training metrics, ours included, under "train/".
_FRAMEWORK_PREFIXES = ("train/",)
_OUR_PREFIXES = ("acr/", "avspo/")


def _standard_names(frame: pd.DataFrame) -> pd.DataFrame:
    """``train/acr/rate`` -> ``acr/rate`` (and ``avspo/*``), unless the plain name is also logged."""
    renames = {}
    for column in frame.columns:
        for prefix in _FRAMEWORK_PREFIXES:
            plain = column.removeprefix(prefix)
            if column.startswith(prefix) and plain.startswith(_OUR_PREFIXES) and plain not in frame:
                renames[column] = plain
    return frame.rename(columns=renames)


def _as_metrics_frame(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    if frame.empty:
        raise ValueError(f"{path} holds no numeric metrics")
    frame = frame.sort_index()
    frame.index = frame.index.astype(int)
    frame.index.name = "step"
    return frame


def _read_runs(path: Path) -> dict[str | None, pd.DataFrame]:
    """The runs of one log: None -> its metrics, or, for a wandb panel CSV, run name -> metrics."""
    if path.name.startswith("events.out.tfevents"):
        runs = {None: _read_tensorboard(path)}
    elif path.suffix == ".csv":
        runs = _read_csv(path)
    else:
        runs = {None: read_metrics(path)}
    return {name: _standard_names(frame) for name, frame in runs.items()}


def read_run(path: str | Path) -> pd.DataFrame:
    """Metrics of one log, by its kind: ``*.jsonl`` (verl file logger), ``events.out.tfevents.*``
    (TensorBoard) or ``*.csv`` (wandb export: a run history, or a chart panel holding one run).
    OpenRLHF's ``train/acr/*`` and ``train/avspo/*`` are read as ``acr/*`` and ``avspo/*``."""
    path = Path(path)
    runs = _read_runs(path)
    if len(runs) > 1:
        raise ValueError(
            f"{path} is a wandb panel export of {len(runs)} runs ({', '.join(map(str, runs))}); "
            "read it with collect_runs"
        )
    return next(iter(runs.values()))


def collect_runs(paths: Sequence[str | Path], names: Sequence[str] | None = None) -> dict[str, pd.DataFrame]:
    """Run name -> metrics, for files and directories (searched for all three kinds of log).

    A run is named after its file (verl's file logger writes ``<experiment_name>.jsonl``), or after
    its folder for TensorBoard files and the recipes' ``runs/<run>/metrics.jsonl``, or by its own
    name in a wandb panel CSV; clashing names get their parent folder as a prefix. In directories,
    the recipes' ``eval.jsonl`` (a final evaluation, no training steps) is skipped. A log that
    cannot be read is skipped with a warning when other logs can be; if none can, this raises.
    """
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(f for f in find_logs([path]) if f.name != "eval.jsonl")
            files.extend(sorted(path.rglob("events.out.tfevents.*")) + sorted(path.rglob("*.csv")))
        else:
            files.extend(find_logs([path]))
    if not files:
        raise ValueError(f"no logs (*.jsonl, events.out.tfevents.*, *.csv) found in {[str(p) for p in paths]}")
    if names is not None and len(names) != len(files):
        raise ValueError(f"--name was given {len(names)} time(s) for {len(files)} log(s): {[str(f) for f in files]}")
    by_folder = ("metrics.jsonl", "events.out.tfevents")
    labels = list(names) if names else [f.parent.name if f.name.startswith(by_folder) else f.stem for f in files]
    clashing = {label for label in labels if labels.count(label) > 1}
    labels = [
        f"{file.parent.name}/{label}" if label in clashing and not names else label
        for file, label in zip(files, labels, strict=True)
    ]
    runs: dict[str, pd.DataFrame] = {}
    unreadable: list[str] = []
    for label, file in zip(labels, files, strict=True):
        try:
            found = _read_runs(file)
        except ValueError as err:
            unreadable.append(str(err))
            continue
        for run_name, frame in found.items():
            runs[label if run_name is None else run_name] = frame
    if unreadable and not runs:
        raise ValueError("no log could be read: " + " | ".join(unreadable))
    for problem in unreadable:
        warnings.warn(f"skipped a log that cannot be read, the other runs are reported: {problem}", stacklevel=2)
    return runs


@dataclass
class RunSummary:
    """What the report says about one run."""

    name: str
    steps: int
    row: dict[str, str] = field(default_factory=dict)  # the run's line in the summary table
    findings: list[str] = field(default_factory=list)


def _mean(frame: pd.DataFrame, column: str) -> float | None:
    values = frame[column].dropna() if column in frame else pd.Series(dtype=float)
    return float(values.mean()) if len(values) else None


def _last(frame: pd.DataFrame, column: str) -> float | None:
    values = frame[column].dropna() if column in frame else pd.Series(dtype=float)
    return float(values.iloc[-1]) if len(values) else None


def _missing_acr(name: str, frame: pd.DataFrame) -> str:
    how = (
        "To log it, train with `python -m verl_avspo.main_ppo algorithm.adv_estimator=grpo ...` (the plugin's "
        "trainer logs acr/* for any group estimator) or apply patches/verl-0.9.1-avspo.patch to verl."
    )
    if any(column.startswith("critic/score/") for column in frame):
        return (
            f"{name}: no acr/* metrics. ACR cannot be recovered from critic/score/*: those are batch mean/max/min "
            "over responses, and the same mean arises with or without collapsed groups; ACR needs each group's "
            f"scores. {how}"
        )
    return f"{name}: neither acr/* nor critic/score/* metrics; is this a verl training log? {how}"


def summarise(name: str, frame: pd.DataFrame, alert: AlertConfig | None = None) -> RunSummary:
    """The table row and the findings for one run; stalls are judged by ``alert`` (default: the
    alert's defaults, the rule the trainers use)."""
    alert = alert or AlertConfig()
    summary = RunSummary(name, int(frame.shape[0]))
    score_at_end = _last(frame, SCORE)
    validation = sorted(column for column in frame if column.startswith(VALIDATION_PREFIX))
    summary.row = {
        "run": name,
        "steps": str(summary.steps),
        "final score": "—" if score_at_end is None else f"{score_at_end:.3f}",
        "final val": ", ".join(f"{c.removeprefix(VALIDATION_PREFIX)} {_last(frame, c):.3f}" for c in validation) or "—",
    }
    if "acr/rate" not in frame or frame["acr/rate"].dropna().empty:
        summary.findings.append(_missing_acr(name, frame))
        return summary

    acr = frame["acr/rate"].dropna()
    first = acr[acr.index <= 100]  # by step number, as `verl-avspo table` does
    if first.empty:  # a log that starts late (a resumed run): its earliest 100 logged steps
        first = acr.iloc[:100]
    acr_100 = float(first.mean())
    correct, wrong = _mean(frame, "acr/all_correct") or 0.0, _mean(frame, "acr/all_wrong") or 0.0
    effective = _mean(frame, "acr/effective")
    summary.row.update(
        {
            "mean ACR": f"{acr.mean():.3f}",
            "ACR_100": f"{acr_100:.3f}",
            "all correct": f"{correct:.3f}",
            "all wrong": f"{wrong:.3f}",
            "effective": "—" if effective is None else f"{effective:.3f}",
        }
    )

    summary.findings.append(_stall_finding(name, frame.loc[acr.index], alert))

    intercept, slope = PAPER_FIT
    summary.findings.append(
        f"{name}: ACR over steps {first.index[0]}–{first.index[-1]} ({len(first)} logged; ACR_100) = {acr_100:.3f}"
        + ("" if len(first) == 100 else " (fewer than 100 logged steps)")
        + f". The paper's fit, acc ≈ 51.4 − 29.6·ACR_100 (MATH-500 %, R² = 0.617 over 245 of the paper's "
        f"configurations), would put it at {intercept + slope * acr_100:.1f}%. That fit is the paper's, for its "
        "models, data and settings; it is not a prediction for this run."
    )
    if "acr/all_correct" in frame and "acr/all_wrong" in frame:
        summary.findings.append(_dominance(name, correct, wrong))

    if "avspo/triggered" in frame:
        triggered = _mean(frame, "avspo/triggered") or 0.0
        if triggered == 0.0:
            summary.findings.append(
                f"{name}: AVSPO never augmented a group: its signal never exceeded the threshold "
                f"(mean θ {_mean(frame, 'avspo/threshold') or 0.0:.3f}). Lower algorithm.avspo.threshold_init, "
                "or use preset=paper_code (threshold 0: every collapsed group, every step)."
            )
        elif effective is not None:
            summary.findings.append(
                f"{name}: AVSPO augmented {triggered:.1%} of the groups per step on average; groups left with zero "
                f"advantage went from {acr.mean():.3f} (raw ACR) to {effective:.3f} (effective)."
            )
    else:
        summary.findings.append(
            f"{name}: no avspo/* metrics, so this is not an AVSPO run (grpo or another estimator). "
            "To try AVSPO on the same setup: algorithm.adv_estimator=avspo."
        )
    return summary


def _stall_finding(name: str, frame: pd.DataFrame, alert: AlertConfig) -> str:
    """Where the run stalled under ``alert``'s rule, each stall shown from the start of its streak
    of high values, or the longest such streak if it never stalled."""
    signal = ALERT_SIGNALS[alert.rule]
    rows = frame.rename(columns={SCORE: REWARD_KEY}) if REWARD_KEY not in frame else frame
    needed = [signal] + ([REWARD_KEY] if alert.rule == "acr_no_gain" else [])
    missing = [column for column in needed if column not in rows or rows[column].isna().all()]
    if missing:
        return f"{name}: stall rule `{alert.rule}` not checked: the log has no {' or '.join(missing)}."
    rows = rows[needed].ffill().fillna(0.0)
    high = (rows[signal] > alert.threshold).tolist()
    streaks = stalled_windows(high)
    stalls = stalled_windows(stalled_steps(rows.to_dict("records"), alert))
    rule = describe_rule(alert)
    if not stalls:
        longest = max((last - first + 1 for first, last in streaks), default=0)
        return (
            f"{name}: no stalled window (alert rule `{alert.rule}`: {rule}, over logged steps); longest streak "
            f"above {alert.threshold:.2f}: {longest} steps."
        )
    spans = []
    for first, last in stalls:
        start = next(a for a, b in streaks if a <= first <= b)
        spans.append(f"steps {frame.index[start]}–{frame.index[last]} ({last - start + 1} steps)")
    return (
        f"{name}: STALLED (alert rule `{alert.rule}`: {rule}, over logged steps) at {', '.join(spans)}; most "
        f"groups gave no gradient there. Try to {ADVICE}."
    )


def _dominance(name: str, correct: float, wrong: float) -> str:
    """Which kind of collapsed group dominates, and what to try."""
    collapsed = correct + wrong
    if collapsed < 0.05:
        return f"{name}: little collapse (mean {collapsed:.3f}); groups almost always disagree."
    if wrong >= 2 * correct:
        return (
            f"{name}: all-wrong groups dominate collapse ({wrong:.3f} vs {correct:.3f} all-correct): the prompts are "
            "too hard for the policy. Try easier data (a pass-rate band around 30–50%), a larger "
            "actor_rollout_ref.rollout.n, or AVSPO with algorithm.avspo.apply_to=all_wrong (a negative push that "
            "keeps diversity)."
        )
    if correct >= 2 * wrong:
        return (
            f"{name}: all-correct groups dominate collapse ({correct:.3f} vs {wrong:.3f} all-wrong): the prompts are "
            "too easy. Try harder data or drop prompts the policy already solves; AVSPO's push on all-correct groups "
            "is positive and sharpens the policy (algorithm.avspo.apply_to=all_correct isolates it)."
        )
    return (
        f"{name}: all-correct ({correct:.3f}) and all-wrong ({wrong:.3f}) groups both matter: the data mixes prompts "
        "far too easy and far too hard. Try a narrower pass-rate band, or AVSPO with apply_to=both."
    )


def _figure_columns(columns: tuple[str, ...], runs: dict[str, pd.DataFrame]) -> list[str]:
    if columns == (VALIDATION_PREFIX,):
        return sorted({c for frame in runs.values() for c in frame if c.startswith(VALIDATION_PREFIX)})
    return [c for c in columns if any(c in frame and frame[c].notna().any() for frame in runs.values())]


def write_report(
    runs: dict[str, pd.DataFrame], out: str | Path, alert: AlertConfig | None = None, smooth: int = 1
) -> tuple[list[RunSummary], list[Path]]:
    """Write the figures and ``summary.md`` to ``out``. Returns the run summaries and the files."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    alert = alert or AlertConfig()
    summaries = [summarise(name, frame, alert) for name, frame in runs.items()]
    figures, skipped = [], []
    for filename, (columns, labels, title, ylabel) in FIGURES.items():
        present = _figure_columns(columns, runs)
        if not present:
            skipped.append(f"{filename} (no run logs {', '.join(columns)})")
            continue
        figures.append(plot_metrics(runs, present, out / filename, title, ylabel, smooth, labels))

    keys = list(dict.fromkeys(key for summary in summaries for key in summary.row))
    lines = [
        "# Advantage collapse report",
        "",
        f"Runs: {', '.join(runs)}. Stall rule `{alert.rule}`: {describe_rule(alert)} (logged steps).",
        "",
        "| " + " | ".join(keys) + " |",
        "|" + "---|" * len(keys),
        *("| " + " | ".join(summary.row.get(key, "—") for key in keys) + " |" for summary in summaries),
        "",
        "ACR is measured on raw scores; *effective* is the fraction of groups whose final advantages are all zero.",
        "",
        "## Diagnosis",
        "",
        *(f"- {finding}" for summary in summaries for finding in summary.findings),
        "",
        "## Figures",
        "",
        *(f"![{path.stem}]({path.name})" for path in figures),
    ]
    if skipped:
        lines += ["", "Not drawn: " + "; ".join(skipped) + "."]
    summary_path = out / "summary.md"
    summary_path.write_text("\n".join(lines) + "\n")
    return summaries, [*figures, summary_path]


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
    if args.window < 1 or not 0.0 <= args.threshold <= 1.0:
        raise SystemExit(f"--window must be >= 1 and --threshold in [0, 1]; got {args.window} and {args.threshold}")
    if args.smooth < 1:  # checked before --out is created
        raise SystemExit(f"--smooth must be >= 1 (1 plots the raw values); got {args.smooth}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise SystemExit(
            f"verl-avspo report: --out {args.out} is an existing file; --out names a folder for the figures and "
            "summary.md. Give a new or existing folder, for example --out avspo-report"
        )
    try:
        runs = collect_runs(args.logs, args.name)
        alert = AlertConfig(window=args.window, threshold=args.threshold, rule=args.rule)
        summaries, files = write_report(runs, args.out, alert, args.smooth)
    except (OSError, ValueError) as err:  # OSError: a log or --out that cannot be read or written
        raise SystemExit(f"verl-avspo report: {err}") from None
    for summary in summaries:
        print(f"== {summary.name} ({summary.steps} steps)")
        for finding in summary.findings:
            print(f"  - {finding.removeprefix(summary.name + ': ')}")
    print("\nwrote: " + ", ".join(str(path) for path in files))
    return 0
