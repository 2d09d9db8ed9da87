"""The diagnosis of one run's advantage collapse, for ``verl-avspo report``: its line in the summary
table and its findings, each a sentence that says what the log shows and what to try.

- stalled windows, with the same monitor as the live alert (``core.alert``): the rule's signal above
  its threshold for ``window`` consecutive logged steps;
- ACR over the first 100 steps (:func:`verl_avspo.tools.stats.early_acr`), with the paper's accuracy
  fit marked as the paper's;
- whether all-correct or all-wrong groups dominate collapse, and what to try;
- for logs without our ``acr/*`` metrics (a plain verl GRPO run), what is missing and how to get it;
  a TRL run without them is diagnosed on TRL's own ``frac_reward_zero_std``, labelled as TRL's, with
  what that rate measures (:data:`verl_avspo.tools.stats.TRL_RATE_CAVEAT`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from verl_avspo.core.alert import ALERT_SIGNALS, HOST_ADVICE, REWARD_KEY, describe_rule, stalled_steps, stalled_windows
from verl_avspo.core.config import AlertConfig
from verl_avspo.tools.stats import (
    EARLY_STEPS,
    RATES,
    TRL_RATE_CAVEAT,
    TRL_ZERO_STD,
    VALIDATION_PREFIX,
    collapse_column,
    early_acr,
    last_value,
    latest_validation,
    rate_problem,
    score_column,
    step_coverage,
    window_mean,
)

__all__ = ["PAPER_FIT", "RunDiagnosis", "diagnose"]

_ACR_FIGURES = (
    "acr_source",
    "mean_acr",
    "acr_100",
    "acr_100_steps",
    "all_correct",
    "all_wrong",
    "effective",
    "avspo_triggered",
)
PAPER_FIT = (51.4, -29.6)  # MATH-500 accuracy (%) ≈ 51.4 − 29.6·ACR_100, the paper's own regression


@dataclass
class RunDiagnosis:
    """What the report says about one run: its line in the summary table, its findings (sentences)
    and the figures behind them (``values``, for ``report --json`` and ``--fail-on``)."""

    name: str
    steps: int
    row: dict[str, str] = field(default_factory=dict)  # the run's line in the summary table
    findings: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)


# Each framework whose logs are told apart here (verl's is the default), as its user reads the findings:
# how to get our metrics ("how") and AVSPO ("try_avspo") there, and how the settings the findings name are
# spelled ({} is the value).
_HOSTS = {
    "verl": {
        "how": (
            "To log it, train with `python -m verl_avspo.main_ppo algorithm.adv_estimator=grpo ...` (the plugin's "
            "trainer logs acr/* for any group estimator) or apply patches/03-acr-metrics.patch to verl."
        ),
        "try_avspo": "To try AVSPO on the same setup: algorithm.adv_estimator=avspo.",
        "group": "actor_rollout_ref.rollout.n",
        "apply_to": "algorithm.avspo.apply_to={}",
        "threshold_init": "algorithm.avspo.threshold_init",
        "preset": "algorithm.avspo.preset={}",
    },
    "openrlhf": {
        "how": (
            "To log it in OpenRLHF, train with `python -m verl_avspo.openrlhf` in place of "
            "`python -m openrlhf.cli.train_ppo_ray` (docs/integration.md section 7)."
        ),
        "try_avspo": "To try AVSPO on the same setup in OpenRLHF: --algo.advantage.estimator avspo.",
        "group": "--rollout.n_samples_per_prompt",
        "apply_to": "--avspo.apply_to {}",
        "threshold_init": "--avspo.threshold_init",
        "preset": "--avspo.preset {}",
    },
    "trl": {
        "how": (
            "To log acr/* (with the all-correct/all-wrong split, the effective rate and the stall alert) in TRL, "
            "train with verl_avspo.trl.AVSPOGRPOTrainer in place of trl.GRPOTrainer (docs/trl.md)."
        ),
        "try_avspo": "To try AVSPO on the same setup in TRL: verl_avspo.trl.AVSPOGRPOTrainer(..., estimator='avspo').",
        "group": "GRPOConfig.num_generations",
        "apply_to": "avspo={{'apply_to': '{}'}}",
        "threshold_init": "avspo={'threshold_init': ...}",
        "preset": "avspo={{'preset': '{}'}}",
    },
}


# Metric names only OpenRLHF's trainer logs (verl's are actor/pg_loss and critic/*, TRL's loss and reward_std).
_OPENRLHF_ONLY = ("policy_loss", "group_reward_std")


def _framework(frame: pd.DataFrame) -> str:
    """``trl`` for a TRL run's log (TRL's GRPO metrics, which verl and OpenRLHF do not log:
    ``frac_reward_zero_std``, ``rewards/<function>/mean``), ``openrlhf`` for OpenRLHF's (its
    ``policy_loss`` or ``group_reward_std``, under ``train/`` or not), else ``verl``."""
    if TRL_ZERO_STD in frame or any(str(column).startswith("rewards/") for column in frame):
        return "trl"
    if any(str(column).removeprefix("train/") in _OPENRLHF_ONLY for column in frame):
        return "openrlhf"
    return "verl"


def _missing_acr(name: str, frame: pd.DataFrame, framework: str) -> str:
    how = _HOSTS[framework]["how"]
    if any(column.startswith("critic/score/") for column in frame):
        return (
            f"{name}: no acr/* metrics. ACR cannot be recovered from critic/score/*: those are batch mean/max/min "
            "over responses, and the same mean arises with or without collapsed groups; ACR needs each group's "
            f"scores. {how}"
        )
    if framework == "trl":
        return f"{name}: neither acr/* nor TRL's {TRL_ZERO_STD} metrics; no collapse rate can be read. {how}"
    return f"{name}: neither acr/* nor critic/score/* metrics; is this a verl training log? {how}"


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def diagnose(name: str, frame: pd.DataFrame, alert: AlertConfig | None = None) -> RunDiagnosis:
    """The table row, the findings and their figures for one run; stalls are judged by ``alert``
    (default: the alert's defaults, the rule the trainers use). A log that starts late, has gaps or
    repeated steps says so first, and the findings about the whole run carry that caveat; a rate
    column with no value or values outside [0, 1] is reported and not used."""
    alert = alert or AlertConfig()
    diagnosis = RunDiagnosis(name, int(frame.shape[0]))
    coverage = step_coverage(frame)
    caveat = coverage.caveat()
    score = score_column(frame)
    score_at_end = None if score is None else last_value(frame[score])
    validation = latest_validation(frame)
    diagnosis.row = {
        "run": name,
        "steps": str(diagnosis.steps),
        "final score": _cell(score_at_end),
        "final val": ", ".join(f"{c.removeprefix(VALIDATION_PREFIX)} {v:.3f}" for c, v in sorted(validation.items()))
        or "—",
    }
    values = diagnosis.values
    values.update(
        {
            "coverage": asdict(coverage) | {"starts_late": coverage.starts_late, "missing": coverage.missing()},
            "score_metric": score,
            "final_score": score_at_end,
            "final_validation": validation,
        }
    )
    # Every run has every key (null when the log cannot give it), for report --json.
    values.update(dict.fromkeys(_ACR_FIGURES), stalled=None, stalls=[], longest_streak=None)
    if (said := coverage.describe()) is not None:
        diagnosis.findings.append(f"{name}: {said}.")
    problems = {column: problem for column in RATES if (problem := rate_problem(frame, column)) is not None}
    values["unusable_columns"] = problems
    diagnosis.findings += [f"{name}: {problem}." for problem in problems.values()]
    frame = frame.drop(columns=list(problems))
    framework = _framework(frame)
    host = _HOSTS[framework]
    collapse = collapse_column(frame)
    values["acr_source"] = collapse
    if collapse is None:
        if "acr/rate" not in problems:
            diagnosis.findings.append(_missing_acr(name, frame, framework))
        return diagnosis
    # TRL's rate stands in for ACR: every figure and finding of it says so.
    source, marker = "", ""
    if collapse == TRL_ZERO_STD:
        diagnosis.findings.append(
            f"{name}: no acr/* metrics; the collapse rate below is TRL's {TRL_ZERO_STD}, read as ACR. "
            f"{TRL_RATE_CAVEAT}. {_HOSTS['trl']['how']}"
        )
        frame = frame.assign(**{"acr/rate": frame[TRL_ZERO_STD]})
        source, marker = f" (read from TRL's {TRL_ZERO_STD})", " (TRL)"

    acr = frame["acr/rate"].dropna()
    first = early_acr(acr, EARLY_STEPS)
    correct = window_mean(frame.get("acr/all_correct"))
    wrong = window_mean(frame.get("acr/all_wrong"))
    effective = window_mean(frame.get("acr/effective"))
    values.update(
        {
            "mean_acr": float(acr.mean()),
            "acr_100": first.mean,
            "acr_100_steps": [first.first_step, first.last_step, first.steps],
            "all_correct": correct,
            "all_wrong": wrong,
            "effective": effective,
        }
    )
    diagnosis.row.update(
        {
            "mean ACR": f"{acr.mean():.3f}{marker}",
            "ACR_100": f"{first.mean:.3f}{marker}",
            "all correct": _cell(correct),
            "all wrong": _cell(wrong),
            "effective": _cell(effective),
        }
    )

    stall = _stall_finding(name, frame.loc[acr.index], alert, values, HOST_ADVICE[framework])
    diagnosis.findings.append(_with(stall, (caveat if values["stalled"] is False else "") + source))

    intercept, slope = PAPER_FIT
    diagnosis.findings.append(
        f"{name}: ACR{source} over steps {first.first_step}–{first.last_step} ({first.steps} logged; ACR_100) = "
        f"{first.mean:.3f}"
        + ("" if first.steps == EARLY_STEPS else f" (fewer than {EARLY_STEPS} logged steps)")
        + (
            f" (the log starts after step {EARLY_STEPS}, as a resumed run's does: its earliest steps)"
            if first.resumed
            else ""
        )
        + f". The paper's fit, acc ≈ 51.4 − 29.6·ACR_100 (MATH-500 %, R² = 0.617 over 245 of the paper's "
        f"configurations), would put it at {intercept + slope * first.mean:.1f}%. That fit is the paper's, for its "
        "models, data and settings; it is not a prediction for this run."
    )
    if correct is not None and wrong is not None:
        diagnosis.findings.append(_with(_dominance(name, correct, wrong, host), caveat))

    if "avspo/triggered" in frame:
        triggered = window_mean(frame["avspo/triggered"]) or 0.0
        threshold = window_mean(frame.get("avspo/threshold"))
        values["avspo_triggered"] = triggered
        if triggered == 0.0:
            diagnosis.findings.append(
                f"{name}: AVSPO never augmented a group: its signal never exceeded the threshold "
                f"(mean θ {_cell(threshold)}){caveat}. Lower {host['threshold_init']}, or use "
                f"{host['preset'].format('paper_code')} (threshold 0: every collapsed group, every step)."
            )
        elif effective is not None:
            diagnosis.findings.append(
                f"{name}: AVSPO augmented {triggered:.1%} of the groups per step on average; groups left with zero "
                f"advantage went from {acr.mean():.3f} (raw ACR) to {effective:.3f} (effective){caveat}."
            )
    elif "avspo/triggered" not in problems:
        diagnosis.findings.append(
            f"{name}: no avspo/* metrics, so this is not an AVSPO run (grpo or another estimator). " + host["try_avspo"]
        )
    return diagnosis


def _with(finding: str, caveat: str) -> str:
    """``finding`` (a sentence or more) with ``caveat`` before its final full stop."""
    return finding.removesuffix(".") + caveat + "."


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or adjacent (first, last) position spans as one."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def _stall_finding(name: str, frame: pd.DataFrame, alert: AlertConfig, values: dict[str, Any], advice: str) -> str:
    """Where the run stalled under ``alert``'s rule, each stall shown from the start of its streak
    of high values (stalls within one streak, or touching, as one), or the longest such streak if
    it never stalled. Records ``stalled`` (None: not checked), ``stalls`` and ``longest_streak``."""
    signal = ALERT_SIGNALS[alert.rule]
    # The rule's reward: our acr/reward_mean (the live alert's), else the framework's mean score.
    reward = REWARD_KEY if REWARD_KEY in frame and frame[REWARD_KEY].notna().any() else score_column(frame)
    needed = [signal] + ([reward or REWARD_KEY] if alert.rule == "acr_no_gain" else [])
    missing = [column for column in needed if column not in frame or frame[column].isna().all()]
    if missing:
        return f"{name}: stall rule `{alert.rule}` not checked: the log has no {' or '.join(missing)}."
    rows = frame[needed].rename(columns={reward: REWARD_KEY}).ffill().fillna(0.0)
    high = (rows[signal] > alert.threshold).tolist()
    streaks = stalled_windows(high)
    stalls = stalled_windows(stalled_steps(rows.to_dict("records"), alert))
    spans = _merged([(next(a for a, b in streaks if a <= first <= b), last) for first, last in stalls])
    rule = describe_rule(alert)
    values["longest_streak"] = max((last - first + 1 for first, last in streaks), default=0)
    values["stalled"] = bool(spans)
    values["stalls"] = [
        {"first_step": int(frame.index[a]), "last_step": int(frame.index[b]), "steps": b - a + 1} for a, b in spans
    ]
    if not spans:
        return (
            f"{name}: no stalled window (alert rule `{alert.rule}`: {rule}, over logged steps); longest streak "
            f"above {alert.threshold:.2f}: {values['longest_streak']} steps"
            + ("" if alert.rule != "acr_no_gain" or reward == REWARD_KEY else f"; reward read from {reward}")
            + "."
        )
    shown = ", ".join(f"steps {s['first_step']}–{s['last_step']} ({s['steps']} steps)" for s in values["stalls"])
    return (
        f"{name}: STALLED (alert rule `{alert.rule}`: {rule}, over logged steps) at {shown}; most "
        f"groups gave no gradient there. Try to {advice}."
    )


def _dominance(name: str, correct: float, wrong: float, spelled: dict[str, str]) -> str:
    """Which kind of collapsed group dominates, and what to try (settings ``spelled`` as the log's
    framework takes them: its entry of :data:`_HOSTS`)."""
    collapsed = correct + wrong
    if collapsed < 0.05:
        return f"{name}: little collapse (mean {collapsed:.3f}); groups almost always disagree."
    if wrong >= 2 * correct:
        return (
            f"{name}: all-wrong groups dominate collapse ({wrong:.3f} vs {correct:.3f} all-correct): the prompts are "
            "too hard for the policy. Try easier data (a pass-rate band around 30–50%), a larger "
            f"{spelled['group']}, or AVSPO with {spelled['apply_to'].format('all_wrong')} (a negative push that "
            "keeps diversity)."
        )
    if correct >= 2 * wrong:
        return (
            f"{name}: all-correct groups dominate collapse ({correct:.3f} vs {wrong:.3f} all-wrong): the prompts are "
            "too easy. Try harder data or drop prompts the policy already solves; AVSPO's push on all-correct groups "
            f"is positive and sharpens the policy ({spelled['apply_to'].format('all_correct')} isolates it)."
        )
    return (
        f"{name}: all-correct ({correct:.3f}) and all-wrong ({wrong:.3f}) groups both matter: the data mixes prompts "
        "far too easy and far too hard. Try a narrower pass-rate band, or AVSPO with "
        f"{spelled['apply_to'].format('both')}."
    )
