"""One row of a verl-style metrics log (verl's ``file`` logger, JSONL): ``{"step": N, "data": {...}}``, and
reading a custom loop's flat ``{"step": N, <metric>: value}`` row.

Its own module so that the hosts that keep such a log (``verl_plugin.file_log``, which keeps a resumed run's
rows) and the tools that read it (``tools.log_formats``) share the format without one importing the other.
Standard library only.
"""

from __future__ import annotations

import json
from typing import IO, Any

__all__ = ["FLAT_STEP_KEYS", "is_step", "parse_record", "write_record"]


def write_record(stream: IO[str], step: int, data: dict[str, Any]) -> None:
    """Append one verl-style record."""
    stream.write(json.dumps({"step": int(step), "data": data}) + "\n")


def is_step(value: Any) -> bool:
    """Whether ``value`` is a training step: a non-negative integer (``2.0`` counts, ``1.7``, ``true``,
    ``-1`` and ``"3"`` do not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return float(value).is_integer() and value >= 0


# A flat JSONL record (a custom training loop's ``json.dumps({"step": N, <metric>: value, ...})`` per
# line) names its step by one of these keys, preferred first.
FLAT_STEP_KEYS = ("step", "global_step", "training/global_step")


def parse_record(line: str | bytes) -> tuple[int, dict[str, Any]]:
    """(step, data) of one JSONL line: verl's file logger's ``{"step": N, "data": {...}}``, or a flat
    ``{"step": N, <metric>: value, ...}`` (:data:`FLAT_STEP_KEYS`). Raises ValueError (or a subclass)
    if it is neither."""
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError("not of the form {'step': N, 'data': {...}} or {'step': N, <metric>: value, ...}")
    if isinstance(record.get("data"), dict) and "step" in record:
        step, data = record["step"], record["data"]
    else:
        key = next((key for key in FLAT_STEP_KEYS if key in record), None)
        if key is None:
            raise ValueError("not of the form {'step': N, 'data': {...}} or {'step': N, <metric>: value, ...}")
        step, data = record[key], {k: v for k, v in record.items() if k not in FLAT_STEP_KEYS}
    if not is_step(step):
        raise ValueError(f"step {json.dumps(step)} is not a non-negative integer")
    return int(step), data
