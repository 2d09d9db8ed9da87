"""The diagnosis of one run's advantage collapse, for ``verl-avspo report``: its line in the summary
table and its findings, each a sentence that says what the log shows and what to try.

- stalled windows, with the same monitor as the live alert (``core.alert``): the rule's signal above
  its threshold for ``window`` consecutive logged steps;
- ACR over the first 100 steps (:func:`verl_avspo.tools.stats.early_acr`), with the paper's accuracy
  fit marked as the paper's;
- whether all-correct or all-wrong groups dominate collapse, and what to try;
- for logs without our ``acr/*`` metrics (a plain verl GRPO run), what is missing and how to get it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from verl_avspo.core.alert import ADVICE, ALERT_SIGNALS, REWARD_KEY, describe_rule, stalled_steps, stalled_windows
from verl_avspo.core.config import AlertConfig
from verl_avspo.tools.stats import EARLY_STEPS, VALIDATION_PREFIX, early_acr, last_value, latest_validation, window_mean

__all__ = ["PAPER_FIT", "SCORE", "RunDiagnosis", "diagnose"]

PAPER_FIT = (51.4, -29.6)  # MATH-500 accuracy (%) ≈ 51.4 − 29.6·ACR_100, the paper's own regression
SCORE = "critic/score/mean"  # verl's mean raw reward of the batch


@dataclass
class RunDiagnosis:
    """What the report says about one run."""

    name: str
    steps: int
    row: dict[str, str] = field(default_factory=dict)  # the run's line in the summary table
    findings: list[str] = field(default_factory=list)


def _missing_acr(name: str, frame: pd.DataFrame) -> str:
    how = (
        "To log it, train with `python -m verl_avspo.main_ppo algorithm.adv_estimator=grpo ...` (the plugin's "
        "trainer logs acr/* for any group estimator) or apply patches/03-acr-metrics.patch to verl."
    )
    if any(column.startswith("critic/score/") for column in frame):
        return (
            f"{name}: no acr/* metrics. ACR cannot be recovered from critic/score/*: those are batch mean/max/min "
            "over responses, and the same mean arises with or without collapsed groups; ACR needs each group's "
            f"scores. {how}"
        )
    return f"{name}: neither acr/* nor critic/score/* metrics; is this a verl training log? {how}"


def diagnose(name: str, frame: pd.DataFrame, alert: AlertConfig | None = None) -> RunDiagnosis:
    """The table row and the findings for one run; stalls are judged by ``alert`` (default: the
    alert's defaults, the rule the trainers use)."""
    alert = alert or AlertConfig()
    diagnosis = RunDiagnosis(name, int(frame.shape[0]))
    score_at_end = last_value(frame.get(SCORE))
    validation = sorted(latest_validation(frame).items())
    diagnosis.row = {
        "run": name,
        "steps": str(diagnosis.steps),
        "final score": "—" if score_at_end is None else f"{score_at_end:.3f}",
        "final val": ", ".join(f"{c.removeprefix(VALIDATION_PREFIX)} {v:.3f}" for c, v in validation) or "—",
    }
    if "acr/rate" not in frame or frame["acr/rate"].dropna().empty:
        diagnosis.findings.append(_missing_acr(name, frame))
        return diagnosis

    acr = frame["acr/rate"].dropna()
    first = early_acr(acr, EARLY_STEPS)
    acr_100 = first.mean
    correct = window_mean(frame.get("acr/all_correct")) or 0.0
    wrong = window_mean(frame.get("acr/all_wrong")) or 0.0
    effective = window_mean(frame.get("acr/effective"))
    diagnosis.row.update(
        {
            "mean ACR": f"{acr.mean():.3f}",
            "ACR_100": f"{acr_100:.3f}",
            "all correct": f"{correct:.3f}",
            "all wrong": f"{wrong:.3f}",
            "effective": "—" if effective is None else f"{effective:.3f}",
        }
    )

    diagnosis.findings.append(_stall_finding(name, frame.loc[acr.index], alert))

    intercept, slope = PAPER_FIT
    diagnosis.findings.append(
        f"{name}: ACR over steps {first.first_step}–{first.last_step} ({first.steps} logged; ACR_100) = {acr_100:.3f}"
        + ("" if first.steps == EARLY_STEPS else f" (fewer than {EARLY_STEPS} logged steps)")
        + (
            f" (the log starts after step {EARLY_STEPS}, as a resumed run's does: its earliest steps)"
            if first.resumed
            else ""
        )
        + f". The paper's fit, acc ≈ 51.4 − 29.6·ACR_100 (MATH-500 %, R² = 0.617 over 245 of the paper's "
        f"configurations), would put it at {intercept + slope * acr_100:.1f}%. That fit is the paper's, for its "
        "models, data and settings; it is not a prediction for this run."
    )
    if "acr/all_correct" in frame and "acr/all_wrong" in frame:
        diagnosis.findings.append(_dominance(name, correct, wrong))

    if "avspo/triggered" in frame:
        triggered = window_mean(frame["avspo/triggered"]) or 0.0
        threshold = window_mean(frame.get("avspo/threshold")) or 0.0
        if triggered == 0.0:
            diagnosis.findings.append(
                f"{name}: AVSPO never augmented a group: its signal never exceeded the threshold "
                f"(mean θ {threshold:.3f}). Lower algorithm.avspo.threshold_init, "
                "or use preset=paper_code (threshold 0: every collapsed group, every step)."
            )
        elif effective is not None:
            diagnosis.findings.append(
                f"{name}: AVSPO augmented {triggered:.1%} of the groups per step on average; groups left with zero "
                f"advantage went from {acr.mean():.3f} (raw ACR) to {effective:.3f} (effective)."
            )
    else:
        diagnosis.findings.append(
            f"{name}: no avspo/* metrics, so this is not an AVSPO run (grpo or another estimator). "
            "To try AVSPO on the same setup: algorithm.adv_estimator=avspo."
        )
    return diagnosis


def _stall_finding(name: str, frame: pd.DataFrame, alert: AlertConfig) -> str:
    """Where the run stalled under ``alert``'s rule, each stall shown from the start of its streak
    of high values, or the longest such streak if it never stalled."""
    signal = ALERT_SIGNALS[alert.rule]
    rows = frame.rename(columns={SCORE: REWARD_KEY}) if REWARD_KEY not in frame else frame
    needed = [signal] + ([REWARD_KEY] if alert.rule == "acr_no_gain" else [])
    missing = [column for column in needed if column not in rows or rows[column].isna().all()]
    if missing:
        return f"{name}: stall rule `{alert.rule}` not checked: the log has no {' or '.join(missing)}."
    rows = rows[needed].ffill().fillna(0.0)
    high = (rows[signal] > alert.threshold).tolist()
    streaks = stalled_windows(high)
    stalls = stalled_windows(stalled_steps(rows.to_dict("records"), alert))
    rule = describe_rule(alert)
    if not stalls:
        longest = max((last - first + 1 for first, last in streaks), default=0)
        return (
            f"{name}: no stalled window (alert rule `{alert.rule}`: {rule}, over logged steps); longest streak "
            f"above {alert.threshold:.2f}: {longest} steps."
        )
    spans = []
    for first, last in stalls:
        start = next(a for a, b in streaks if a <= first <= b)
        spans.append(f"steps {frame.index[start]}–{frame.index[last]} ({last - start + 1} steps)")
    return (
        f"{name}: STALLED (alert rule `{alert.rule}`: {rule}, over logged steps) at {', '.join(spans)}; most "
        f"groups gave no gradient there. Try to {ADVICE}."
    )


def _dominance(name: str, correct: float, wrong: float) -> str:
    """Which kind of collapsed group dominates, and what to try."""
    collapsed = correct + wrong
    if collapsed < 0.05:
        return f"{name}: little collapse (mean {collapsed:.3f}); groups almost always disagree."
    if wrong >= 2 * correct:
        return (
            f"{name}: all-wrong groups dominate collapse ({wrong:.3f} vs {correct:.3f} all-correct): the prompts are "
            "too hard for the policy. Try easier data (a pass-rate band around 30–50%), a larger "
            "actor_rollout_ref.rollout.n, or AVSPO with algorithm.avspo.apply_to=all_wrong (a negative push that "
            "keeps diversity)."
        )
    if correct >= 2 * wrong:
        return (
            f"{name}: all-correct groups dominate collapse ({correct:.3f} vs {wrong:.3f} all-wrong): the prompts are "
            "too easy. Try harder data or drop prompts the policy already solves; AVSPO's push on all-correct groups "
            "is positive and sharpens the policy (algorithm.avspo.apply_to=all_correct isolates it)."
        )
    return (
        f"{name}: all-correct ({correct:.3f}) and all-wrong ({wrong:.3f}) groups both matter: the data mixes prompts "
        "far too easy and far too hard. Try a narrower pass-rate band, or AVSPO with apply_to=both."
    )
