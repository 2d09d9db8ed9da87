"""Reading metric logs, the one reader of ``verl-avspo report``, ``verl-avspo table`` and the sandbox.

verl's ``trainer.logger=[file]`` writes one JSON object per line, ``{"step": N, "data": {...}}``,
to ``VERL_FILE_LOGGER_PATH``; the CPU sandbox writes the same format (:func:`write_record`). Also
read: TensorBoard event files (verl's and OpenRLHF's ``tensorboard`` loggers; OpenRLHF's
``train/acr/*`` read as ``acr/*``) and wandb CSV exports (a run's history, or a chart panel's CSV of
one or more runs). Every reader returns one frame per run: one row per step, one column per metric.
A step must be a non-negative integer; a record with another step is skipped with a warning naming
the file and line. A step logged twice with the same metric (a crashed attempt and its resume
appended to one log, or a run's successive TensorBoard files) keeps the last value, with a warning;
the frame's ``attrs["repeated_steps"]`` lists those steps.
"""

from __future__ import annotations

import itertools
import json
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import pandas as pd

__all__ = [
    "write_record",
    "parse_record",
    "read_metrics",
    "find_logs",
    "is_metrics_log",
    "run_names",
    "read_run",
    "read_run_logs",
    "merge_frames",
    "collect_runs",
]

# Files named after what they hold rather than after their run, so named after their folder: the
# recipes' runs/<run>/metrics.jsonl (training) and eval.jsonl (final evaluation), and TensorBoard's.
_NAMED_BY_FOLDER = ("metrics.jsonl", "eval.jsonl", "events.out.tfevents")


def write_record(stream: IO[str], step: int, data: dict[str, Any]) -> None:
    """Append one verl-style record."""
    stream.write(json.dumps({"step": int(step), "data": data}) + "\n")


def _is_step(value: Any) -> bool:
    """Whether ``value`` is a training step: a non-negative integer (``2.0`` counts, ``1.7``, ``true``,
    ``-1`` and ``"3"`` do not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return float(value).is_integer() and value >= 0


def parse_record(line: str | bytes) -> tuple[int, dict[str, Any]]:
    """(step, data) of one file-logger line. Raises ValueError (or a subclass) if it is not one."""
    record = json.loads(line)
    if not isinstance(record, dict) or not isinstance(record.get("data"), dict) or "step" not in record:
        raise ValueError("not of the form {'step': N, 'data': {...}}")
    if not _is_step(record["step"]):
        raise ValueError(f"step {json.dumps(record['step'])} is not a non-negative integer")
    return int(record["step"]), record["data"]


def _warn_repeated(path: Path, repeated: dict[int, str]) -> None:
    """Warn that ``repeated`` (step -> where it was logged again) were logged more than once."""
    if repeated:
        steps = _step_list(sorted(repeated))
        warnings.warn(
            f"{path}: step(s) {steps} logged more than once with the same metrics (a crashed attempt and its resume "
            f"in one log?), first at {next(iter(repeated.values()))}; kept the last value of each",
            stacklevel=3,
        )


def _step_list(steps: Sequence[int], shown: int = 8) -> str:
    """``1, 2, 3`` or ``1, 2, ... (40 steps)``."""
    text = ", ".join(map(str, steps[:shown]))
    return text if len(steps) <= shown else f"{text}, ... ({len(steps)} steps)"


def read_metrics(path: str | Path) -> pd.DataFrame:
    """One row per step, one column per metric, from a verl JSONL log.

    Several records for the same step (verl logs validation separately) are merged; a metric logged
    again for a step keeps its last value, with a warning (see the module's docstring); non-numeric
    values are dropped. A line that is not a record (the last line of a killed run, a corrupt one,
    a step such as ``1.7``, ``true`` or ``-1``) is skipped with a warning naming the file and the
    line, so every readable step is kept.

    Raises:
        ValueError: the file is empty, or not one line of it is a record.
    """
    path = Path(path)
    rows: dict[int, dict[str, float]] = {}
    bad: list[str] = []
    repeated: dict[int, str] = {}
    with path.open(errors="replace") as stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                step, data = parse_record(line)
            except (ValueError, TypeError) as err:  # json.JSONDecodeError is a ValueError
                bad.append(f"{path}:{number} ({str(err).splitlines()[0][:80]})")
                continue
            numeric = {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            row = rows.setdefault(step, {})
            if step not in repeated and not row.keys().isdisjoint(numeric):
                repeated[step] = f"{path}:{number}"
            row.update(numeric)
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
    _warn_repeated(path, repeated)
    frame = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    frame.index.name = "step"
    frame.attrs["repeated_steps"] = sorted(repeated)
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


def _run_path(path: Path) -> Path:
    """The run a log belongs to, as a path: its folder for the recipes' ``metrics.jsonl`` and
    ``eval.jsonl`` and for TensorBoard event files, else the file without its suffix (verl's file
    logger writes ``<project>/<experiment_name>.jsonl``, the sandbox ``runs/<estimator>/seed<N>.jsonl``)."""
    path = path.absolute()
    return path.parent if path.name.startswith(_NAMED_BY_FOLDER) else path.with_suffix("")


def run_names(paths: Sequence[str | Path]) -> list[str]:
    """The name of each log's run, as ``report`` and ``table`` show it: the last part of its run path
    (see :func:`_run_path`), with as many parent folders as it takes to tell different runs apart
    (``projA/exp`` and ``projB/exp``; ``grpo/seed0`` and ``avspo/seed0``). Logs of one run (a recipe
    folder's ``metrics.jsonl`` and ``eval.jsonl``, a run's TensorBoard files) share its name."""
    runs = [_run_path(Path(path)) for path in paths]
    depth = dict.fromkeys(runs, 1)
    while True:
        names = {run: "/".join(run.parts[-depth[run] :]) for run in depth}
        counts = Counter(names.values())
        clashing = [run for run in depth if counts[names[run]] > 1 and depth[run] < len(run.parts) - 1]
        if not clashing:
            return [names[run] for run in runs]
        for run in clashing:
            depth[run] += 1


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


# The training step of a wandb export, preferred first: OpenRLHF logs its own step as
# train/global_step (wandb's _step counts its log calls, evaluations included).
_STEP_COLUMNS = ("step", "train/global_step", "_step", "Step", "global_step")
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
    step = next((name for name in _STEP_COLUMNS if name in frame), None)
    if step is None:
        raise ValueError(f"{path} has no step column ({', '.join(_STEP_COLUMNS)}); columns: {list(frame)[:8]}")
    if step == "train/global_step" and "eval/global_step" in frame:  # OpenRLHF's evaluation rows
        frame[step] = frame[step].fillna(frame["eval/global_step"])
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
    """``frame`` indexed by step, sorted; rows whose step is not a non-negative integer are dropped
    with a warning naming the file and the steps."""
    if frame.empty:
        raise ValueError(f"{path} holds no numeric metrics")
    valid = [_is_step(step) for step in frame.index]
    if not all(valid):
        dropped = [str(step) for step, ok in zip(frame.index, valid, strict=True) if not ok]
        warnings.warn(
            f"{path}: skipped {len(dropped)} row(s) whose step is not a non-negative integer "
            f"({_step_list(dropped)}), kept the {sum(valid)} other(s)",
            stacklevel=3,
        )
        frame = frame[valid]
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


def _log_files(paths: Sequence[str | Path], evaluations: bool) -> list[Path]:
    """The logs of all three kinds named by ``paths`` (files, or directories searched), each once."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(log for log in find_logs([path]) if evaluations or log.name != "eval.jsonl")
            files.extend(sorted(path.rglob("events.out.tfevents.*")) + sorted(path.rglob("*.csv")))
        else:
            files.extend(find_logs([path]))
    unique: dict[Path, Path] = {}
    for file in files:
        unique.setdefault(file.absolute(), file)
    return list(unique.values())


def read_run_logs(
    paths: Sequence[str | Path], names: Sequence[str] | None = None, evaluations: bool = False
) -> dict[str, list[pd.DataFrame]]:
    """Run name -> its metric frames, one per log file, the recipes' ``eval.jsonl`` last; for files
    and directories (searched for all three kinds of log).

    A run is named by :func:`run_names` (one name for all the logs of one run), or by its own name
    in a wandb panel CSV, or by ``names`` (one per run, in order). In directories the recipes'
    ``eval.jsonl`` (a final evaluation, no training steps) is read only with ``evaluations``. A
    log that cannot be read is skipped with a warning when other logs can be; if none can, this
    raises.
    """
    files = _log_files(paths, evaluations)
    if not files:
        raise ValueError(f"no logs (*.jsonl, events.out.tfevents.*, *.csv) found in {[str(p) for p in paths]}")
    grouped: dict[str, list[Path]] = {}
    for label, file in zip(run_names(files), files, strict=True):
        grouped.setdefault(label, []).append(file)
    if names is not None:
        if len(names) != len(grouped):
            raise ValueError(f"--name was given {len(names)} time(s) for {len(grouped)} run(s): {list(grouped)}")
        grouped = dict(zip(names, grouped.values(), strict=True))
    runs: dict[str, list[pd.DataFrame]] = {}
    unreadable: list[str] = []
    for label, group in grouped.items():
        for file in sorted(group, key=lambda log: log.name == "eval.jsonl"):
            try:
                found = _read_runs(file)
            except ValueError as err:
                unreadable.append(str(err))
                continue
            for panel_run, frame in found.items():
                name = label if panel_run is None else panel_run
                if panel_run is not None and panel_run in grouped:  # a panel's run named like another log's
                    name = f"{label}/{panel_run}"
                runs.setdefault(name, []).append(frame)
    if unreadable and not runs:
        raise ValueError("no log could be read: " + " | ".join(unreadable))
    for problem in unreadable:
        warnings.warn(f"skipped a log that cannot be read, the other runs are reported: {problem}", stacklevel=2)
    return runs


def merge_frames(name: str, frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """One run's frames (its log files, in reading order) as one frame: a metric logged at the same
    step by several files keeps the last value, with a warning; ``attrs["repeated_steps"]`` lists
    the steps logged more than once, within a file or across files."""
    if len(frames) == 1:
        return frames[0]
    stacked = pd.concat(frames)
    merged = stacked.groupby(level=0).last()
    across = stacked.notna().groupby(level=0).sum()
    across_steps = across.index[(across > 1).any(axis=1)].tolist()
    if across_steps:
        warnings.warn(
            f"run {name}: step(s) {_step_list(across_steps)} logged by more than one of its files (attempts of a "
            "resumed run?); kept the last value of each",
            stacklevel=2,
        )
    within = {step for frame in frames for step in frame.attrs.get("repeated_steps", ())}
    merged.attrs["repeated_steps"] = sorted(within.union(across_steps))
    return merged


def collect_runs(paths: Sequence[str | Path], names: Sequence[str] | None = None) -> dict[str, pd.DataFrame]:
    """Run name -> metrics, as :func:`read_run_logs` finds and names them, each run's logs merged
    (:func:`merge_frames`)."""
    return {name: merge_frames(name, frames) for name, frames in read_run_logs(paths, names).items()}
