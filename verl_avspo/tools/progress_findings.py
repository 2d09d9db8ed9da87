"""What changed over a run, for ``verl-avspo report``: the reward's trend (:func:`trend_finding`), the
stalled windows under the live alert's rule, in training steps (:func:`stall_finding`), and AVSPO's own
figures (:func:`avspo_findings`).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from verl_avspo.core.alert import ALERT_SIGNALS, REWARD_KEY, describe_rule, stalled_steps, stalled_windows
from verl_avspo.core.config import AlertConfig
from verl_avspo.tools.collapse_measures import CollapseRate
from verl_avspo.tools.findings import Finding, RunDiagnosis, cell
from verl_avspo.tools.signals import Trend, per_step
from verl_avspo.tools.stats import StepCoverage, score_column, window_mean

__all__ = ["avspo_findings", "stall_finding", "trend_finding"]


def trend_finding(
    rewards: Trend, score: str | None, rows: int, collapse: float | None, ceiling: bool = False
) -> Finding:
    """The reward's trend over the run. A WARN where the log shows a problem: a reward that did not rise
    over 10 rows or more ("No gain", said as such beside high collapse, mean 0.2 or more), or rose and
    then fell over the last third (p < 0.05: "Gain lost"). A rise whose last third has no trend ("Gain
    stopped") is INFO, with the best row's step: the run gained (p < 0.05 over all rows), and no trend
    over a third of the rows is an absence of evidence, not a fall. It cannot tell a plateau from a
    slower rise (a third of the rows, a third of the power: of 100-step runs of 8 completions a step that
    rise and then level off, the test reads a third as stopped and most as no gain at all), and a reward
    that rose and levelled off is how a run converges. No statistic of the public logs separates such a
    stop that is a problem from one that is not (docs/diagnostics_results.md, "Against rldoctor on logs from the
    wild"), so the report tells it and does not alarm. A reward between 0 and 1 whose last fifth averages
    0.95 or more is at its ceiling (``ceiling``, INFO): nothing is left to gain on this data. The words
    follow the numbers: a fall that is not significant is "fell, not significant", never "flat"."""
    direction = rewards.direction
    evidence = [
        f"{score}: first fifth {rewards.first:.3f} → last fifth {rewards.final:.3f} ({rewards.rows} row(s) each); "
        f"last row {rewards.last:.3f}; best {rewards.best:.3f} at step {rewards.best_step}",
        f"Mann-Kendall trend test over {rows} rows: tau {rewards.tau:+.2f}, p {rewards.p_value:.3g}",
    ]
    if rows < 4:
        return Finding(
            "INFO", f"Reward over {rows} row(s): {rewards.final:.3f}, too few rows for a trend", evidence[:1]
        )
    no_gain = direction != "rose" and rows >= 10
    if rewards.stopped or rewards.lost:
        evidence.append(
            f"since step {rewards.recent_from} (the last third): tau {rewards.recent_tau:+.2f}, "
            f"p {rewards.recent_p_value:.3g}"
        )
    if rewards.lost:
        text = f"Gain lost: reward rose {rewards.first:.3f} → {rewards.final:.3f} over the run, then fell since "
        text += f"step {rewards.recent_from}"
    elif rewards.stopped:
        text = f"Gain stopped: reward rose {rewards.first:.3f} → {rewards.final:.3f}, no trend since step "
        text += str(rewards.recent_from)
        evidence.append("no trend is not a fall: a plateau after a rise, or a rise too slow for a third of the rows")
    elif no_gain:
        text = f"No gain: reward {rewards.said}: {rewards.first:.3f} → {rewards.final:.3f}"
    else:
        text = f"Reward {rewards.said}: {rewards.first:.3f} → {rewards.final:.3f}"
    told = no_gain or rewards.stopped or rewards.lost
    if told and ceiling:
        evidence.append("a reward between 0 and 1 at 0.95 or more over the last fifth: the training prompts are solved")
        return Finding("INFO", f"Reward at its ceiling: {rewards.final:.3f} of 1 over the last fifth", evidence)
    if told and collapse is not None and collapse >= 0.2:
        text += " while collapse is high"
    if told and rewards.best_step < rewards.recent_from:
        evidence.append(f"best at step {rewards.best_step}: its checkpoint, if saved, is the one to keep")
    return Finding("WARN" if no_gain or rewards.lost else "INFO", text, evidence)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or adjacent (first, last) position spans as one."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def stall_finding(
    frame: pd.DataFrame, coverage: StepCoverage, alert: AlertConfig, values: dict[str, Any], advice: str, caveat: str
) -> Finding:
    """Where the run stalled under ``alert``'s rule, in training steps (a row logged every N steps stands
    for its N steps), each stall shown from the start of its streak of high values, or the longest
    streak if it never stalled. Records ``stalled`` (None: not checked, with ``stall_unchecked`` saying
    why), ``stalls`` and ``longest_streak``."""
    signal = ALERT_SIGNALS[alert.rule]
    rule = f"`{alert.rule}`: {describe_rule(alert)}"
    reward = REWARD_KEY if REWARD_KEY in frame and frame[REWARD_KEY].notna().any() else score_column(frame)
    needed = [signal] + ([reward or REWARD_KEY] if alert.rule == "acr_no_gain" else [])
    missing = [column for column in needed if column not in frame or frame[column].isna().all()]
    if missing:
        values["stall_unchecked"] = f"the log has no {' or '.join(missing)}"
        return Finding("INFO", f"Stall rule {rule} not checked: {values['stall_unchecked']}")
    history = 2 * alert.window if alert.rule == "acr_no_gain" else alert.window
    if coverage.steps < history:
        values["stall_unchecked"] = f"the rule needs {history} steps of history and the log has {coverage.steps}"
        return Finding(
            "INFO",
            f"Stall rule not checked: it needs {history} steps of history and the log has {coverage.steps}",
            [f"rule {rule}"],
            ["lower --window to judge a shorter run"],
        )
    steps = per_step(frame[needed].rename(columns={reward: REWARD_KEY}), coverage.stride)
    rows = steps.ffill().fillna(0.0)
    high = (rows[signal] > alert.threshold).tolist()
    streaks = stalled_windows(high)
    stalls = stalled_windows(stalled_steps(rows.to_dict("records"), alert))
    spans = _merged([(next(a for a, b in streaks if a <= first <= b), last) for first, last in stalls])
    values["longest_streak"] = max((last - first + 1 for first, last in streaks), default=0)
    values["stalled"] = bool(spans)
    values["stalls"] = [
        {"first_step": int(rows.index[a]), "last_step": int(rows.index[b]), "steps": b - a + 1} for a, b in spans
    ]
    if not spans:
        return Finding(
            "INFO",
            f"No stalled window{caveat}",
            [f"rule {rule}; longest streak above {alert.threshold:.2f}: {values['longest_streak']} steps"]
            + ([] if alert.rule != "acr_no_gain" or reward == REWARD_KEY else [f"reward read from {reward}"]),
        )
    shown = ", ".join(f"steps {s['first_step']}–{s['last_step']} ({s['steps']} steps)" for s in values["stalls"])
    return Finding(
        "ALERT",
        f"Stalled at {shown}: most groups gave no gradient there",
        [f"rule {rule}"],
        [f"try to {advice}"],
    )


def avspo_findings(
    diagnosis: RunDiagnosis,
    frame: pd.DataFrame,
    collapse: CollapseRate,
    host: dict[str, str],
    problems: dict[str, str],
    caveat: str,
) -> None:
    """Whether AVSPO augmented groups (``avspo/triggered``) and what that did to the groups at zero advantage."""
    if "avspo/triggered" not in frame or "avspo/triggered" in problems:
        return
    diagnosis.used.update(column for column in ("avspo/triggered", "avspo/threshold") if column in frame)
    triggered = window_mean(frame["avspo/triggered"]) or 0.0
    threshold = window_mean(frame.get("avspo/threshold"))
    effective = diagnosis.values["effective"]
    diagnosis.values["avspo_triggered"] = triggered
    if triggered == 0.0:
        diagnosis.findings.append(
            Finding(
                "WARN",
                f"AVSPO never augmented a group{caveat}",
                [f"avspo/triggered 0 on every step; mean threshold θ {cell(threshold)}"],
                [
                    f"lower {host['threshold_init']}",
                    f"or use {host['preset'].format('paper_code')} (threshold 0: every collapsed group)",
                ],
            )
        )
    elif effective is not None:
        diagnosis.findings.append(
            Finding(
                "INFO",
                f"AVSPO augmented {triggered:.1%} of the groups per step{caveat}",
                [f"groups at zero advantage: {collapse.rate.mean():.3f} raw → {effective:.3f} effective"],
            )
        )
