"""What ``verl-avspo report`` hands to CI and scripts: the ``--fail-on`` conditions (:data:`FAIL_CONDITIONS`,
``NAME>X`` against :data:`FAIL_VALUES`) that hold for a run (exit status 3), those that could not be checked
(``--fail-on stalled`` on a run too short for the rule: exit status :data:`UNCHECKED`, not a pass), and the
``--json`` document of every finding and figure.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from verl_avspo.core.alert import describe_rule
from verl_avspo.core.config import AlertConfig
from verl_avspo.tools.findings import RunDiagnosis

__all__ = [
    "FAIL_CONDITIONS",
    "FAIL_VALUES",
    "UNCHECKED",
    "fail_on",
    "failed_conditions",
    "report_json",
    "unchecked_conditions",
]

UNCHECKED = 4  # the exit status when a --fail-on condition could not be checked for a run (and none held)

# --fail-on NAME: the run property that makes the exit status 3.
FAIL_CONDITIONS = {
    "stalled": "the stall rule found a stalled window",
    "incomplete": "the log starts after its first logging step, has gaps, logged a step twice, or ends before the "
    "steps its progress bar planned",
    "no-acr": "the log holds no collapse measure (docs/diagnostics.md#what-the-report-reads-collapse-from)",
    "unusable": "a rate column holds no value or values outside [0, 1]",
    "unreadable": "a log file given or found could not be read (the message lists the files)",
}
# --fail-on NAME>X or NAME<X: a figure of the run (RunDiagnosis.values) above or below X.
FAIL_VALUES = ("mean_acr", "acr_100", "all_correct", "all_wrong", "effective", "final_score", "avspo_triggered")
_FAIL_COMPARISON = re.compile(rf"^(?P<name>{'|'.join(FAIL_VALUES)})(?P<sign>[<>])(?P<bound>[-+.0-9eE]+)$")


def _holds(condition: str, diagnosis: RunDiagnosis) -> bool:
    values = diagnosis.values
    if condition == "stalled":
        return bool(values.get("stalled"))
    if condition == "incomplete":
        coverage = values["coverage"]
        return bool(coverage["starts_late"] or coverage["gaps"] or coverage["repeated"] or coverage["ends_early"])
    if condition == "no-acr":
        return values["acr_source"] is None
    if condition == "unusable":
        return bool(values["unusable_columns"])
    match = _FAIL_COMPARISON.match(condition)
    value = values.get(match["name"])
    if value is None:  # not logged: the condition cannot hold (--fail-on no-acr catches a missing acr/*)
        return False
    bound = float(match["bound"])
    return value > bound if match["sign"] == ">" else value < bound


def failed_conditions(
    conditions: list[str], diagnoses: list[RunDiagnosis], unreadable: list[str] | None = None
) -> dict[str, list[str]]:
    """Each ``--fail-on`` condition that holds -> the runs it holds for (for ``unreadable``: the
    problems of the logs that could not be read)."""
    held = {
        condition: list(unreadable or [])
        if condition == "unreadable"
        else [d.name for d in diagnoses if _holds(condition, d)]
        for condition in conditions
    }
    return {condition: runs for condition, runs in held.items() if runs}


def unchecked_conditions(conditions: list[str], diagnoses: list[RunDiagnosis]) -> dict[str, list[str]]:
    """``--fail-on stalled`` -> the runs the stall rule could not be checked on, with why (a log too
    short for the rule's history, or without a collapse measure): a CI gate must not read them as passes."""
    if "stalled" not in conditions:
        return {}
    runs = [f"{d.name} ({d.values['stall_unchecked']})" for d in diagnoses if d.values.get("stalled") is None]
    return {"stalled": runs} if runs else {}


def _plain(value: Any) -> Any:
    """``value`` as strict JSON: NaN and infinities as null, tuples as lists."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def report_json(
    diagnoses: list[RunDiagnosis],
    files: list[Path],
    alert: AlertConfig,
    failed: dict[str, list[str]],
    unreadable: list[str] | None = None,
    skipped: list[str] | None = None,
    unchecked: dict[str, list[str]] | None = None,
) -> str:
    """Everything the report found, as JSON: the stall rule, per run its table row, findings and
    figures (``RunDiagnosis.values``), the files written and the ``--fail-on`` conditions that hold."""
    document = {
        "rule": {
            "rule": alert.rule,
            "window": alert.window,
            "threshold": alert.threshold,
            "description": describe_rule(alert),
        },
        "runs": [
            {
                "name": d.name,
                "steps": d.steps,
                "row": d.row,
                "findings": [asdict(finding) for finding in d.findings],
                **d.values,
            }
            for d in diagnoses
        ],
        "unreadable": list(unreadable or []),
        "not_logs": list(skipped or []),
        "files": [str(path) for path in files],
        "failed": failed,
        "unchecked": unchecked or {},
    }
    return json.dumps(_plain(document), indent=2, allow_nan=False)


def fail_on(value: str) -> str:
    """``--fail-on``'s argument type: a condition of :data:`FAIL_CONDITIONS` or ``NAME>X`` / ``NAME<X``."""
    if value not in FAIL_CONDITIONS and not _FAIL_COMPARISON.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a condition: use one of {', '.join(FAIL_CONDITIONS)}, or NAME>X / NAME<X with NAME "
            f"one of {', '.join(FAIL_VALUES)} (for example acr_100>0.5)"
        )
    return value
