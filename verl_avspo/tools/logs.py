"""Reading and writing metric logs in the format of verl's ``file`` logger.

verl's ``trainer.logger=[file]`` writes one JSON object per line, ``{"step": N, "data": {...}}``,
to ``VERL_FILE_LOGGER_PATH``. The CPU sandbox writes the same format, so ``verl-avspo report`` and
``verl-avspo table`` read both.
"""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path
from typing import IO, Any

import pandas as pd

__all__ = ["write_record", "read_metrics", "find_logs", "is_metrics_log"]


def write_record(stream: IO[str], step: int, data: dict[str, Any]) -> None:
    """Append one verl-style record."""
    stream.write(json.dumps({"step": int(step), "data": data}) + "\n")


def _record(line: str) -> tuple[int, dict[str, Any]]:
    """(step, data) of one file-logger line. Raises ValueError (or a subclass) if it is not one."""
    record = json.loads(line)
    if not isinstance(record, dict) or not isinstance(record.get("data"), dict) or "step" not in record:
        raise ValueError("not of the form {'step': N, 'data': {...}}")
    return int(record["step"]), record["data"]


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
