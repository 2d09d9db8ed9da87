"""What ``verl-avspo report`` says about a run, as data: a :class:`Finding` (a headline with a severity, its
evidence as numbers and what to do) and a run's :class:`RunDiagnosis` (its findings, its line in the
summary table and the figures behind them). The modules that make findings
(:mod:`~verl_avspo.tools.collapse_findings`, :mod:`~verl_avspo.tools.cause_findings`,
:mod:`~verl_avspo.tools.progress_findings`) fill a :class:`RunDiagnosis`; :mod:`~verl_avspo.tools.diagnosis`
runs them in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DOCS", "SEVERITIES", "Finding", "RunDiagnosis", "cell", "severity"]

DOCS = "docs/diagnostics.md"  # where every metric the findings name is explained
SEVERITIES = ("ALERT", "WARN", "INFO")


@dataclass
class Finding:
    """One thing the report says about a run: a headline with a severity (``ALERT``, ``WARN``,
    ``INFO``), the evidence as numbers and the steps to take."""

    severity: str
    headline: str
    evidence: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The finding as text lines: the headline, then its evidence and numbered actions, indented."""
        lines = [f"[{self.severity}] {self.headline}"]
        lines += [f"    · {line}" for line in self.evidence]
        lines += [f"    {number}. {action}" for number, action in enumerate(self.actions, 1)]
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())


@dataclass
class RunDiagnosis:
    """What the report says about one run: its line in the summary table, its findings, the figures
    behind them (``values``, for ``report --json`` and ``--fail-on``) and the log's keys they read
    (``used``)."""

    name: str
    steps: int
    row: dict[str, str] = field(default_factory=dict)  # the run's line in the summary table
    findings: list[Finding] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    heading: str = ""  # the run's name with its steps, rows and framework
    used: set[str] = field(default_factory=set)

    def text(self) -> str:
        """Every finding, as ``report`` prints them."""
        return "\n".join(str(finding) for finding in self.findings)


def cell(value: float | None) -> str:
    """A figure in the summary table: three decimals, or a dash when the log cannot give it."""
    return "—" if value is None else f"{value:.3f}"


def severity(collapsed: float) -> str:
    """The severity of a collapse of ``collapsed`` (a mean fraction of groups)."""
    return "ALERT" if collapsed >= 0.5 else "WARN" if collapsed >= 0.2 else "INFO"
