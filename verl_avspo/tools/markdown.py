"""Markdown tables, as ``verl-avspo report``, ``verl-avspo table``, the sandbox's ``summary.md`` and the study
scripts of ``benchmarks/`` print them."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["render_table"]


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table: ``header``, the separator line, one line per row of cells (no trailing newline)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
