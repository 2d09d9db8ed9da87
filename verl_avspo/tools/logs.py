"""Reading metric logs, the one reader of ``verl-avspo report``, ``verl-avspo table`` and the sandbox.

verl's ``trainer.logger=[file]`` writes one JSON object per line, ``{"step": N, "data": {...}}``,
to ``VERL_FILE_LOGGER_PATH``; the CPU sandbox writes the same format (:func:`write_record`). Also
read: TensorBoard event files (verl's and OpenRLHF's ``tensorboard`` loggers; OpenRLHF's
``train/acr/*`` read as ``acr/*``) and wandb CSV exports (a run's history, or a chart panel's CSV of
one or more runs). Every reader returns one frame per run: one row per step, one column per metric.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import pandas as pd

__all__ = [
    "write_record",
    "keep_history",
    "read_metrics",
    "find_logs",
    "is_metrics_log",
    "run_name",
    "read_run",
    "collect_runs",
]

# Files named after what they hold rather than after their run, so named after their folder: the
# recipes' runs/<run>/metrics.jsonl (training) and eval.jsonl (final evaluation), and TensorBoard's.
_NAMED_BY_FOLDER = ("metrics.jsonl", "eval.jsonl", "events.out.tfevents")


def write_record(stream: IO[str], step: int, data: dict[str, Any]) -> None:
    """Append one verl-style record."""
    stream.write(json.dumps({"step": int(step), "data": data}) + "\n")


def _record(line: str) -> tuple[int, dict[str, Any]]:
    """(step, data) of one file-logger line. Raises ValueError (or a subclass) if it is not one."""
    record = json.loads(line)
    if not isinstance(record, dict) or not isinstance(record.get("data"), dict) or "step" not in record:
        raise ValueError("not of the form {'step': N, 'data': {...}}")
    return int(record["step"]), record["data"]


def keep_history(path: str | Path, resumed_step: int) -> int:
    """Rewrite a verl JSONL log for a run resumed at ``resumed_step``: keep its records of steps up
    to and including ``resumed_step``, in their order, and drop later ones, which the attempt that
    stopped after its last checkpoint wrote and the resumed run writes again. Returns how many
    records were kept; a missing file keeps none and is not created.

    A line that is not a record (the last line of a killed run) is dropped with a warning naming
    the file and the line. The file is replaced in one rename, so a crash here leaves either the
    old or the new file whole.
    """
    path = Path(path)
    if not path.exists():
        return 0
    kept: list[str] = []
    bad: list[str] = []
    with path.open(errors="replace") as stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                step, _ = _record(line)
            except (ValueError, TypeError) as err:
                bad.append(f"{path}:{number} ({str(err).splitlines()[0][:80]})")
                continue
            if step <= resumed_step:
                kept.append(line if line.endswith("\n") else line + "\n")
    if bad:
        warnings.warn(
            f"dropped {len(bad)} line(s) that are not verl file-logger records: {'; '.join(bad[:3])}", stacklevel=2
        )
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(kept))
    os.replace(partial, path)
    return len(kept)


def read_metrics(path: str | Path) -> pd.DataFrame:
    """One row per step, one column per metric, from a verl JSONL log.

    Several records for the same step (verl logs validation separately) are merged; non-numeric
    values are dropped. A line that is not a record (the last line of a killed run, a corrupt one)
    is skipped with a warning naming the file and the line, so every readable step is kept.

    Raises:
        ValueError: the file is empty, or not one line of it is a record.
    """
    path = Path(path)
    rows: dict[int, dict[str, float]] = {}
    bad: list[str] = []
    with path.open(errors="replace") as stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                step, data = _record(line)
            except (ValueError, TypeError) as err:  # json.JSONDecodeError is a ValueError
                bad.append(f"{path}:{number} ({str(err).splitlines()[0][:80]})")
                continue
            numeric = {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            rows.setdefault(step, {}).update(numeric)
    if not rows:
        if not bad:
            raise ValueError(f"{path} is empty: it holds no verl file-logger records")
        raise ValueError(
            f"{path} holds no verl file-logger record {{'step': N, 'data': {{...}}}}; unreadable: {bad[0]}"
            + (f" and {len(bad) - 1} more line(s)" if len(bad) > 1 else "")
        )
    if bad:
        shown = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        warnings.warn(
            f"skipped {len(bad)} line(s) that are not verl file-logger records (a truncated or corrupt log), kept the "
            f"{len(rows)} step(s) that could be read: {shown}",
            stacklevel=2,
        )
    frame = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    frame.index.name = "step"
    return frame


def is_metrics_log(path: str | Path, lines: int = 20) -> bool:
    """Whether a JSONL file holds file-logger records: judged by its first line that parses as
    JSON (a corrupt first line is passed over), within its first ``lines`` non-empty lines; a file
    none of whose first lines parses counts as a log, so that reading it reports the problem. Run
    directories also hold other JSONL, such as verl's dumps of validation generations."""
    with Path(path).open(errors="replace") as stream:
        candidates = list(itertools.islice((line for line in stream if line.strip()), lines))
    for line in candidates:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        return isinstance(record, dict) and {"step", "data"} <= set(record)
    return bool(candidates)


def find_logs(paths: list[str | Path]) -> list[Path]:
    """Expand directories to the metric logs (``*.jsonl`` file-logger records) under them; keep
    files named explicitly as given, so a malformed one is reported rather than skipped."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found.extend(log for log in sorted(path.rglob("*.jsonl")) if is_metrics_log(log))
        elif path.exists():
            found.append(path)
        else:
            raise FileNotFoundError(f"no such log file or directory: {path}")
    return found


def run_name(path: str | Path) -> str:
    """The run a log belongs to: its folder for the recipes' ``metrics.jsonl`` and ``eval.jsonl`` and
    for TensorBoard event files, else its file name without suffix (verl's file logger writes
    ``<experiment_name>.jsonl``)."""
    path = Path(path)
    return path.parent.name if path.name.startswith(_NAMED_BY_FOLDER) else path.stem


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

    A run is named by :func:`run_name`, or by its own name in a wandb panel CSV; clashing names get
    their parent folder as a prefix. In directories,
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
    labels = list(names) if names else [run_name(f) for f in files]
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
        for panel_run, frame in found.items():
            runs[label if panel_run is None else panel_run] = frame
    if unreadable and not runs:
        raise ValueError("no log could be read: " + " | ".join(unreadable))
    for problem in unreadable:
        warnings.warn(f"skipped a log that cannot be read, the other runs are reported: {problem}", stacklevel=2)
    return runs
