"""One log file as one frame per run (one row per step, one column per metric), by its format:
verl's file-logger JSONL (also what the CPU sandbox writes, :func:`write_record`) or a custom loop's
flat ``{"step": N, <metric>: value}`` JSONL, TensorBoard event files, wandb CSV exports and a Hugging
Face Trainer's ``trainer_state.json`` (TRL's trainers; its ``logging_steps`` kept in
``attrs["logging_steps"]``) or a bare ``log_history`` list (a columnar ``{"step": [...], ...}`` JSON too),
and a run's console output (:func:`read_text_log`, through :mod:`verl_avspo.tools.console_logs`).
Finding the logs of a run, naming runs and merging a run's files is :mod:`verl_avspo.tools.logs`,
which re-exports the public names here.

A step must be a non-negative integer; a record with another step is skipped with a warning naming
the file and the record. A step logged twice with the same metric (a crashed attempt and its resume
appended to one log) keeps the last value, with a warning; the frame's ``attrs["repeated_steps"]``
lists those steps. A log cut off or partly corrupt keeps every record that can be read, with a
warning; a metric logged as text that spells a number (``"0.25"``) is read as one, with a warning.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from verl_avspo.core.log_record import FLAT_STEP_KEYS, is_step, parse_record, write_record
from verl_avspo.tools.console_logs import holds_console_metrics, read_console

__all__ = [
    "NotTrainerState",
    "is_metrics_log",
    "is_step",
    "merge_records",
    "parse_record",
    "read_text_log",
    "read_metrics",
    "read_tensorboard",
    "read_trainer_state",
    "read_wandb_csv",
    "is_trl_grpo",
    "step_list",
    "write_record",
]


class NotTrainerState(ValueError):
    """A JSON file that parses but holds no log history (a config, a JSON document of another kind)."""


def _number(value: Any) -> float | None:
    """``value`` as a float: a number, or a string that spells one (a metric logged as text); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _warn_repeated(path: Path, repeated: dict[int, str], differing: set[int]) -> None:
    """Warn that ``repeated`` (step -> where it was logged again) were logged more than once, saying
    which of them (``differing``) came back with other values."""
    if repeated:
        steps = step_list(sorted(repeated))
        same = len(repeated) - len(differing)
        said = (
            "every one with other values (a restarted run's new attempt?)"
            if not same
            else "each with the same values (duplicated lines)"
            if not differing
            else f"{len(differing)} with other values, {same} with the same"
        )
        warnings.warn(
            f"{path}: step(s) {steps} logged more than once, {said}, first at {next(iter(repeated.values()))}; "
            "kept the last value of each",
            stacklevel=4,
        )


def step_list(steps: Sequence[int], shown: int = 8) -> str:
    """``1, 2, 3`` or ``1, 2, ... (40 steps)``."""
    text = ", ".join(map(str, steps[:shown]))
    return text if len(steps) <= shown else f"{text}, ... ({len(steps)} steps)"


def merge_records(
    path: Path, records: Iterable[tuple[str, int, dict[str, Any]]], bad: list[str], unit: str, record: str, form: str
) -> pd.DataFrame:
    """One row per step from ``(where, step, data)`` records: several records of one step merged,
    a metric logged again for a step keeping its last value (with a warning), non-numeric values
    dropped. ``bad`` lists each ``unit`` that is no ``record`` (of the ``form`` shown), filled while
    ``records`` is read (``where (why)``): a warning when some could be read, a ValueError when none."""
    rows: dict[int, dict[str, float]] = {}
    repeated: dict[int, str] = {}
    differing: set[int] = set()
    as_text: set[str] = set()
    for where, step, data in records:
        numeric = {k: number for k, v in data.items() if (number := _number(v)) is not None}
        as_text.update(k for k, v in data.items() if isinstance(v, str) and k in numeric)
        row = rows.setdefault(step, {})
        again = row.keys() & numeric.keys()
        if again:
            repeated.setdefault(step, where)
            if any(row[k] != numeric[k] and not (math.isnan(row[k]) and math.isnan(numeric[k])) for k in again):
                differing.add(step)
        row.update(numeric)
    if not rows:
        if not bad:
            raise ValueError(f"{path} is empty: it holds no {record}s")
        raise ValueError(
            f"{path} holds no {record} {form}; unreadable: {bad[0]}"
            + (f" and {len(bad) - 1} more {unit}(s)" if len(bad) > 1 else "")
        )
    if bad:
        shown = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        warnings.warn(
            f"skipped {len(bad)} {unit}(s) that are not {record}s (a truncated or corrupt log), kept the "
            f"{len(rows)} step(s) that could be read: {shown}",
            stacklevel=4,
        )
    if as_text:
        warnings.warn(
            f"{path}: {len(as_text)} metric(s) logged as text ({', '.join(sorted(as_text)[:5])}): read as numbers",
            stacklevel=4,
        )
    _warn_repeated(path, repeated, differing)
    frame = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    frame.index.name = "step"
    frame.attrs["repeated_steps"] = sorted(repeated)
    frame.attrs["repeated_differing"] = sorted(differing)
    return frame


# A flat record's step under another name than core.log_record's FLAT_STEP_KEYS (custom loops, wandb dumps).
_MORE_STEP_KEYS = ("iteration", "iter", "train/step", "trainer/global_step", "_step")


def _record(line: str) -> tuple[int, dict[str, Any]]:
    """(step, data) of one JSONL line (:func:`parse_record`, or a flat record whose step is under one of
    :data:`_MORE_STEP_KEYS`)."""
    try:
        return parse_record(line)
    except json.JSONDecodeError:
        raise
    except (ValueError, TypeError):
        record = json.loads(line)
        key = next((key for key in _MORE_STEP_KEYS if isinstance(record, dict) and key in record), None)
        if key is None or not is_step(record[key]):
            raise
        return int(record[key]), {k: v for k, v in record.items() if k != key}


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
    bad: list[str] = []

    def records():
        with path.open(errors="replace") as stream:
            for number, line in enumerate(stream, 1):
                if not line.strip():
                    continue
                try:
                    step, data = _record(line)
                except (ValueError, TypeError) as err:  # json.JSONDecodeError is a ValueError
                    bad.append(f"{path}:{number} ({str(err).splitlines()[0][:80]})")
                    continue
                yield f"{path}:{number}", step, data

    return merge_records(
        path, records(), bad, "line", "metrics record", "({'step': N, 'data': {...}} or {'step': N, <metric>: value})"
    )


def read_text_log(path: str | Path) -> pd.DataFrame:
    """A log of text lines: JSONL metrics records (:func:`read_metrics`) or, when its first line is no
    JSON object and it holds console metrics, a run's console output
    (:func:`verl_avspo.tools.console_logs.read_console`; the planned steps in ``attrs["planned_steps"]``).

    Raises:
        ValueError: the file is empty or holds neither.
    """
    path = Path(path)
    text = path.read_text(errors="replace")
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        json_lines = isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        json_lines = False
    if json_lines or not holds_console_metrics(text):
        return read_metrics(path)
    found = read_console(path, text)
    frame = merge_records(
        path, found.records, found.problems, "line", "console metrics line", "(verl's step:N lines, printed dicts)"
    )
    if found.planned is not None:
        frame.attrs["planned_steps"] = found.planned
    return frame


_STEP_KEYS = ("step", "global_step", *_MORE_STEP_KEYS)


def _columns(state: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A columnar JSON log (``{"step": [1, 2], "reward": [0.1, 0.2]}``) as a list of records; None when
    ``state`` is not one."""
    key = next((k for k in _STEP_KEYS if isinstance(state.get(k), list)), None)
    if key is None:
        return None
    columns = {k: v for k, v in state.items() if isinstance(v, list) and len(v) == len(state[key])}
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]


_LOG_HISTORY = re.compile(r'"log_history"\s*:\s*\[')


def _log_history_until_cut(path: Path, text: str) -> list[Any]:
    """The complete entries of a cut-off ``trainer_state.json``'s ``log_history``, in order: each JSON
    object up to the first that does not parse (where the file was cut)."""
    start = _LOG_HISTORY.search(text)
    if start is None:
        raise ValueError(f"{path} is not a readable trainer_state.json: it has no log_history (cut off before it?)")
    decoder, position, entries = json.JSONDecoder(), start.end(), []
    while True:
        position = len(text) - len(text[position:].lstrip(" \t\r\n,"))
        if position >= len(text) or text[position] == "]":
            return entries
        try:
            entry, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return entries
        entries.append(entry)


def read_trainer_state(path: str | Path) -> pd.DataFrame:
    """One row per step from a Hugging Face Trainer's ``trainer_state.json`` (TRL's trainers write it
    into every checkpoint folder): its ``log_history``, whose entries are ``{"step": N, <metric>:
    value, ...}``, training and evaluation (``eval_*``) ones at the same step merged. The entry that
    sums up training (``train_runtime``, ``train_loss``, ...) and the ``epoch`` that the Trainer adds
    to every entry are left out. A file cut off (a run killed while saving) keeps every complete
    entry, with a warning; an entry without a valid step is skipped with a warning.

    Raises:
        ValueError: the file has no ``log_history``, or no entry of it can be read.
    """
    path = Path(path)
    text = path.read_text(errors="replace")
    try:
        state = json.loads(text)
    except json.JSONDecodeError as err:
        state = None
        entries = _log_history_until_cut(path, text)
        warnings.warn(
            f"{path} is cut off or corrupt ({err.msg} at line {err.lineno}): read the {len(entries)} complete "
            "log_history entries before that point",
            stacklevel=2,
        )
    else:
        if isinstance(state, list):  # a bare log_history: json.dump(trainer.state.log_history, ...)
            state = {"log_history": state}
        elif isinstance(state, dict) and "log_history" not in state and (columns := _columns(state)) is not None:
            state = {"log_history": columns}  # a custom loop's {"step": [...], <metric>: [...]}
        if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
            raise NotTrainerState(
                f"{path} is not a Hugging Face trainer_state.json (a dict with a log_history list) nor a bare "
                "log_history list"
            )
        entries = state["log_history"]
    bad: list[str] = []

    def records():
        for number, entry in enumerate(entries):
            where = f"{path}: log_history[{number}]"
            key = next((k for k in _STEP_KEYS if isinstance(entry, dict) and k in entry), "step")
            if not isinstance(entry, dict) or not is_step(entry.get(key)):
                step = entry.get(key) if isinstance(entry, dict) else None
                bad.append(f"{where} (step {json.dumps(step)} is not a non-negative integer)")
            elif "train_runtime" not in entry:
                yield where, int(entry[key]), {k: v for k, v in entry.items() if k not in (key, "epoch")}

    frame = merge_records(path, records(), bad, "log_history entry", "step record", "{'step': N, <metric>: value, ...}")
    interval = state.get("logging_steps") if isinstance(state, dict) else None
    if is_step(interval) and interval >= 1:
        frame.attrs["logging_steps"] = int(interval)
    return frame


def is_trl_grpo(frame: pd.DataFrame) -> bool:
    """Whether ``frame`` holds TRL GRPO metrics: its reward (``reward``, ``reward_std``) with
    per-function ``rewards/<name>`` or a completion length, in either release's names."""
    columns = [str(column).removeprefix("train/") for column in frame]
    return "frac_reward_zero_std" in columns or (
        "reward" in columns
        and any(c.startswith("rewards/") or c in ("completion_length", "completions/mean_length") for c in columns)
    )


def is_metrics_log(path: str | Path, lines: int = 20) -> bool:
    """Whether a JSONL file holds metrics records (verl's file logger's, or flat ones with a step key,
    :data:`FLAT_STEP_KEYS`): judged by its first line that parses as JSON (a corrupt first line is
    passed over), within its first ``lines`` non-empty lines; a file
    none of whose first lines parses counts as a log, so that reading it reports the problem. Run
    directories also hold other JSONL, such as verl's dumps of validation generations."""
    with Path(path).open(errors="replace") as stream:
        candidates = list(itertools.islice((line for line in stream if line.strip()), lines))
    for line in candidates:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        return isinstance(record, dict) and any(key in record for key in FLAT_STEP_KEYS)
    return bool(candidates)


def read_tensorboard(path: Path) -> pd.DataFrame:
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
_STEP_COLUMNS = ("step", "train/global_step", "_step", "Step", "global_step", "iteration", "iter", "Iteration")
# A wandb chart panel's CSV export: "Step", then "<run> - <metric>" with its "__MIN"/"__MAX" bands.
_PANEL_COLUMN = re.compile(r"^(?P<run>.+) - (?P<metric>.+?)(?P<band>__MIN|__MAX)?$")


def read_wandb_csv(path: Path) -> dict[str | None, pd.DataFrame]:
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


def _as_metrics_frame(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """``frame`` indexed by step, sorted; rows whose step is not a non-negative integer are dropped
    with a warning naming the file and the steps."""
    if frame.empty:
        raise ValueError(f"{path} holds no numeric metrics")
    valid = [is_step(step) for step in frame.index]
    if not all(valid):
        dropped = [str(step) for step, ok in zip(frame.index, valid, strict=True) if not ok]
        warnings.warn(
            f"{path}: skipped {len(dropped)} row(s) whose step is not a non-negative integer "
            f"({step_list(dropped)}), kept the {sum(valid)} other(s)",
            stacklevel=3,
        )
        frame = frame[valid]
    frame = frame.sort_index()
    frame.index = frame.index.astype(int)
    frame.index.name = "step"
    return frame
