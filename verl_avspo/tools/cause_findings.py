"""The causes of collapse a log shows (:func:`verl_avspo.tools.signals.causes`) as findings, with the fix in
the settings of the log's framework. A cause is called "Likely cause of collapse" only beside a collapse
of WARN or more and only where the log ties the two (more of the cause on the rows where collapse is
high); otherwise it is a finding of its own.
"""

from __future__ import annotations

from dataclasses import asdict

from verl_avspo.tools.findings import Finding, RunDiagnosis
from verl_avspo.tools.signals import Cause

__all__ = ["cause_findings"]


def cause_findings(diagnosis: RunDiagnosis, found: list[Cause], host: dict[str, str], collapsed: bool) -> None:
    """Each cause as a finding; ``collapsed``: the run's collapse is WARN or more."""
    fixes = {
        "truncation": [f"raise {host['length']}, {host['length_more']}"],
        "never_rewarded": [
            "check that the reward function parses the completions' answers (a format it never finds scores 0)",
            "or train on prompts the policy can sometimes solve",
        ],
        "saturated": [f"lower {host['weights']}: a reward every completion earns adds nothing to any group's spread"],
        "clip": [host["clip"]],
    }
    diagnosis.values["causes"] = [asdict(cause) for cause in found]
    for cause in found:
        diagnosis.used.update(column for column in cause.columns if column)
        headline = cause.headline[0].upper() + cause.headline[1:]
        if collapsed and cause.likely:
            headline = "Likely cause of collapse: " + cause.headline
        diagnosis.findings.append(Finding(cause.severity, headline, list(cause.evidence), fixes[cause.kind]))
