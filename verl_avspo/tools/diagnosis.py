"""The diagnosis of one run's advantage collapse, for ``verl-avspo report``: its line in the summary
table and its findings, in order (each made in its own module, what each metric means in
docs/diagnostics.md, linked rather than repeated):

1. which steps the log lacks (here);
2. collapse, from whatever the log holds, with its causes and the paper's fit
   (:mod:`~verl_avspo.tools.collapse_findings`, :mod:`~verl_avspo.tools.cause_findings`);
3. the reward's trend, the stalled windows under the live alert's rule and AVSPO's own figures
   (:mod:`~verl_avspo.tools.progress_findings`);
4. which of the log's keys the findings read, and the numeric ones they did not (here).
"""

from __future__ import annotations

from dataclasses import asdict

import pandas as pd

from verl_avspo.core.alert import REWARD_KEY, stall_advice
from verl_avspo.core.config import AlertConfig
from verl_avspo.tools.cause_findings import cause_findings
from verl_avspo.tools.collapse_findings import PAPER_FIT, collapse_findings, is_math_run
from verl_avspo.tools.collapse_measures import collapse_rate
from verl_avspo.tools.findings import DOCS, Finding, RunDiagnosis
from verl_avspo.tools.hosts import HOSTS, framework_of
from verl_avspo.tools.progress_findings import avspo_findings, stall_finding, trend_finding
from verl_avspo.tools.signals import causes, trend
from verl_avspo.tools.stats import (
    RATES,
    VALIDATION_PREFIX,
    latest_validation,
    rate_problem,
    score_column,
    step_coverage,
    training_rows,
)

__all__ = ["DOCS", "PAPER_FIT", "Finding", "RunDiagnosis", "diagnose"]

# What to try when a PPO run with a critic stalls: its estimator is not the problem, the reward's spread is.
_PPO_ADVICE = (
    "give the reward a spread to learn from: easier data (a pass-rate band around 30-50%), a longer response cap "
    "if answers are cut, a higher sampling temperature"
)
_SHOWN_KEYS = 12  # keys named in the coverage finding before "and N more"


def diagnose(
    name: str, frame: pd.DataFrame, alert: AlertConfig | None = None, paper_fit: bool | None = None
) -> RunDiagnosis:
    """The table row, the findings and their figures for one run; stalls are judged by ``alert``
    (default: the alert's defaults, the rule the trainers use), in training steps. The paper's MATH-500
    fit is shown with ``paper_fit``, or, when None, for a run that names itself a math run
    (:func:`~verl_avspo.tools.collapse_findings.is_math_run`)."""
    alert = alert or AlertConfig()
    coverage = step_coverage(frame)
    framework = framework_of(frame)
    host = HOSTS[framework]
    ppo = "critic/vf_loss" in frame or "critic/value_loss" in frame
    diagnosis = RunDiagnosis(name, coverage.steps)
    diagnosis.heading = f"{name} ({coverage.said()}; {host['label']}{' PPO with a critic' if ppo else ''} log)"
    caveat = coverage.caveat()
    training = training_rows(frame)
    score = score_column(training)
    rewards = trend(training[score] if score else None)
    validation = latest_validation(frame)
    diagnosis.used.update(validation)
    diagnosis.row = {
        "run": name,
        "steps": str(coverage.steps),
        "final score": "—" if rewards is None else f"{rewards.final:.3f} (last {rewards.last:.3f})",
        "final val": ", ".join(f"{c.removeprefix(VALIDATION_PREFIX)} {v:.3f}" for c, v in sorted(validation.items()))
        or "—",
    }
    values = diagnosis.values
    values.update(
        {
            "framework": framework,
            "ppo_with_critic": ppo,
            "coverage": asdict(coverage)
            | {"starts_late": coverage.starts_late, "ends_early": coverage.ends_early, "missing": coverage.missing()},
            "score_metric": score,
            "final_score": None if rewards is None else rewards.final,
            "last_score": None if rewards is None else rewards.last,
            "trend": None if rewards is None else asdict(rewards) | {"direction": rewards.direction},
            "final_validation": validation,
            "collapse": None,
            "causes": [],
        }
    )
    # Every run has every key (null when the log cannot give it), for report --json.
    values.update(
        dict.fromkeys(("acr_source", "mean_acr", "acr_100", "acr_100_steps", "all_correct", "all_wrong", "effective")),
        avspo_triggered=None,
        stalled=None,
        stall_unchecked=None,
        stalls=[],
        longest_streak=None,
    )
    if (said := coverage.describe()) is not None:
        diagnosis.findings.append(Finding("WARN" if not coverage.complete else "INFO", f"Incomplete log: {said}"))
    problems = {column: problem for column in RATES if (problem := rate_problem(frame, column)) is not None}
    values["unusable_columns"] = problems
    diagnosis.findings += [Finding("WARN", f"Unusable column: {problem}") for problem in problems.values()]
    collapse = collapse_rate(training, set(frame.columns) - set(problems))
    if collapse is None:
        diagnosis.findings.append(
            Finding(
                "INFO",
                "No collapse measure in this log",
                [
                    "none of acr/rate, Tinker's by_group/frac_all_good and frac_all_bad, frac_reward_zero_std, "
                    "skipped_groups and n_groups, reward_std, critic/score/max and /min is logged "
                    f"({DOCS}#what-the-report-reads-collapse-from)"
                ],
                [host["how"]] if not ppo else [],
            )
        )
        cause_findings(diagnosis, causes(training, pd.Series(dtype=float)), host, collapsed=False)
        values["stall_unchecked"] = "the log has no collapse measure"
    else:
        fit = is_math_run(name, frame) if paper_fit is None else paper_fit
        collapse_findings(diagnosis, training, collapse, coverage, host, ppo, caveat, fit)
    if rewards is not None:
        diagnosis.used.add(score)
        rows = int(training[score].notna().sum())
        scores = training[score].dropna()
        ceiling = bool(scores.min() >= 0 and scores.max() <= 1 and rewards.final >= 0.95)
        diagnosis.findings.append(trend_finding(rewards, score, rows, values.get("mean_acr"), ceiling))
    if collapse is not None and collapse.kind != "regenerated":
        frame_acr = training.assign(**{"acr/rate": collapse.rate})
        if collapse.all_wrong is not None:
            frame_acr = frame_acr.assign(**{"acr/all_wrong": collapse.all_wrong})
        advice = _PPO_ADVICE if ppo else stall_advice(host["temperature"], host["group"], host["use_avspo"])
        diagnosis.findings.append(stall_finding(frame_acr, coverage, alert, values, advice, caveat))
        if REWARD_KEY in frame:
            diagnosis.used.add(REWARD_KEY)
        avspo_findings(diagnosis, training, collapse, host, problems, caveat)
    elif collapse is not None:
        values["stall_unchecked"] = "DAPO's filter drops collapsed groups before they are logged"
    diagnosis.findings.append(_keys_finding(diagnosis, frame))
    return diagnosis


def _keys_finding(diagnosis: RunDiagnosis, frame: pd.DataFrame) -> Finding:
    """Which of the log's keys the findings read, and its numeric keys they did not (``values["keys"]``)."""
    numeric = [str(column) for column in frame if pd.api.types.is_numeric_dtype(frame[column])]
    used = [column for column in numeric if column in diagnosis.used]
    unused = [column for column in numeric if column not in diagnosis.used]
    diagnosis.values["keys"] = {"used": used, "not_used": unused}

    def named(columns: list[str]) -> str:
        shown = ", ".join(columns[:_SHOWN_KEYS])
        return shown + (f" and {len(columns) - _SHOWN_KEYS} more" if len(columns) > _SHOWN_KEYS else "")

    evidence = [f"read: {named(used) or 'none'}"]
    if unused:
        evidence.append(f"not read: {named(unused)} (--json lists them all)")
    return Finding("INFO", f"Log keys: {len(used)} of {len(numeric)} numeric keys read by the findings", evidence)
