"""Reading and writing metric logs in the format of verl's ``file`` logger.

verl's ``trainer.logger=[file]`` writes one JSON object per line, ``{"step": N, "data": {...}}``,
to ``VERL_FILE_LOGGER_PATH``. The CPU sandbox writes the same format, so ``verl-avspo report`` and
``verl-avspo table`` read both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

import pandas as pd

__all__ = ["write_record", "read_metrics", "find_logs", "is_metrics_log"]


def write_record(stream: IO[str], step: int, data: dict[str, Any]) -> None:
    """Append one verl-style record."""
    stream.write(json.dumps({"step": int(step), "data": data}) + "\n")


def read_metrics(path: str | Path) -> pd.DataFrame:
    """One row per step, one column per metric, from a verl JSONL log.

    Several records for the same step (verl logs validation separately) are merged; non-numeric
    values are dropped. Raises ValueError with the line number on a malformed line.
    """
    path = Path(path)
    rows: dict[int, dict[str, float]] = {}
    with path.open() as stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step, data = int(record["step"]), record["data"]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise ValueError(
                    f"{path}:{number} is not a verl file-logger record {{'step': N, 'data': {{...}}}}: {err}"
                ) from err
            numeric = {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            rows.setdefault(step, {}).update(numeric)
    frame = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    frame.index.name = "step"
    return frame


def is_metrics_log(path: str | Path) -> bool:
    """Whether a JSONL file starts with a file-logger record. Run directories also hold other
    JSONL, such as verl's dumps of validation generations under ``validation/``."""
    with Path(path).open() as stream:
        first = next((line for line in stream if line.strip()), "")
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and {"step", "data"} <= set(record)


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
