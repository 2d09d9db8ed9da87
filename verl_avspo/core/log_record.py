"""One row of a verl-style metrics log (verl's ``file`` logger, JSONL): ``{"step": N, "data": {...}}``.

Its own module so that the hosts that keep such a log (``verl_plugin.file_log``, which keeps a resumed run's
rows) and the tools that read it (``tools.log_formats``) share the format without one importing the other.
Standard library only.
"""

from __future__ import annotations

import json
from typing import IO, Any

__all__ = ["is_step", "parse_record", "write_record"]


def write_record(stream: IO[str], step: int, data: dict[str, Any]) -> None:
    """Append one verl-style record."""
    stream.write(json.dumps({"step": int(step), "data": data}) + "\n")


def is_step(value: Any) -> bool:
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
    if not is_step(record["step"]):
        raise ValueError(f"step {json.dumps(record['step'])} is not a non-negative integer")
    return int(record["step"]), record["data"]
