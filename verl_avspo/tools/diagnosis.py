"""The diagnosis of one run's advantage collapse, for ``verl-avspo report``: its line in the summary
table and its findings. A finding is a headline with a severity, its evidence as numbers and what to
do in the settings of the framework the log came from; what each metric means is in
docs/diagnostics.md, linked rather than repeated.

In order: which steps the log lacks; collapse, from whatever the log holds
(:func:`verl_avspo.tools.signals.collapse_rate`), and beside it its likely causes (completions cut at
the length cap, reward functions with no variance, PPO's clip fraction); the reward's trend over the
run; stalled windows, in training steps, with the live alert's monitor (``core.alert``); ACR over the
first 100 steps with the paper's fit (only for runs that long); which kind of collapsed group
dominates; AVSPO's own figures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from verl_avspo.core.alert import (
    ALERT_SIGNALS,
    REWARD_KEY,
    describe_rule,
    stall_advice,
    stalled_steps,
    stalled_windows,
)
from verl_avspo.core.config import AlertConfig
from verl_avspo.tools.hosts import HOSTS, framework_of
from verl_avspo.tools.signals import Cause, CollapseRate, Trend, causes, collapse_rate, per_step, trend
from verl_avspo.tools.stats import (
    EARLY_STEPS,
    RATES,
    VALIDATION_PREFIX,
    StepCoverage,
    early_acr,
    latest_validation,
    rate_problem,
    score_column,
    step_coverage,
    training_rows,
    window_mean,
)

__all__ = ["DOCS", "PAPER_FIT", "Finding", "RunDiagnosis", "diagnose"]

# What to try when a PPO run with a critic stalls: its estimator is not the problem, the reward's spread is.
_PPO_ADVICE = (
    "give the reward a spread to learn from: easier data (a pass-rate band around 30-50%), a longer response cap "
    "if answers are cut, a higher sampling temperature"
)
PAPER_FIT = (51.4, -29.6)  # MATH-500 accuracy (%) ≈ 51.4 − 29.6·ACR_100, the paper's own regression
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
    """What the report says about one run: its line in the summary table, its findings and the
    figures behind them (``values``, for ``report --json`` and ``--fail-on``)."""

    name: str
    steps: int
    row: dict[str, str] = field(default_factory=dict)  # the run's line in the summary table
    findings: list[Finding] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    heading: str = ""  # the run's name with its steps, rows and framework

    def text(self) -> str:
        """Every finding, as ``report`` prints them."""
        return "\n".join(str(finding) for finding in self.findings)


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _severity(collapsed: float) -> str:
    return "ALERT" if collapsed >= 0.5 else "WARN" if collapsed >= 0.2 else "INFO"


def diagnose(name: str, frame: pd.DataFrame, alert: AlertConfig | None = None) -> RunDiagnosis:
    """The table row, the findings and their figures for one run; stalls are judged by ``alert``
    (default: the alert's defaults, the rule the trainers use), in training steps."""
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
            "coverage": asdict(coverage) | {"starts_late": coverage.starts_late, "missing": coverage.missing()},
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
        stalls=[],
        longest_streak=None,
    )
    if (said := coverage.describe()) is not None:
        diagnosis.findings.append(Finding("WARN" if not coverage.complete else "INFO", f"Incomplete log: {said}"))
    problems = {column: problem for column in RATES if (problem := rate_problem(frame, column)) is not None}
    values["unusable_columns"] = problems
    diagnosis.findings += [Finding("WARN", f"Unusable column: {problem}") for problem in problems.values()]
    usable = set(frame.columns) - set(problems)
    collapse = collapse_rate(training, usable)
    if collapse is None:
        diagnosis.findings.append(
            Finding(
                "INFO",
                "No collapse measure in this log",
                [
                    "none of acr/rate, frac_reward_zero_std, reward_std, critic/score/max and /min is logged "
                    f"({DOCS}#what-the-report-reads-collapse-from)"
                ],
                [host["how"]] if not ppo else [],
            )
        )
        _cause_findings(diagnosis, causes(training, pd.Series(dtype=float)), host, collapsed=False)
    else:
        _collapse_findings(diagnosis, training, collapse, coverage, host, ppo, caveat)
    if rewards is not None:
        rows = int(training[score].notna().sum())
        diagnosis.findings.append(_trend_finding(rewards, score, rows, values.get("mean_acr")))
    if collapse is not None:
        frame_acr = training.assign(**{"acr/rate": collapse.rate})
        if collapse.all_wrong is not None:
            frame_acr = frame_acr.assign(**{"acr/all_wrong": collapse.all_wrong})
        advice = _PPO_ADVICE if ppo else stall_advice(host["temperature"], host["group"], host["use_avspo"])
        diagnosis.findings.append(_stall_finding(frame_acr, coverage, alert, values, advice, caveat))
        _avspo_findings(diagnosis, training, collapse, host, problems, caveat)
    return diagnosis


def _collapse_findings(
    diagnosis: RunDiagnosis,
    frame: pd.DataFrame,
    collapse: CollapseRate,
    coverage: StepCoverage,
    host: dict[str, str],
    ppo: bool,
    caveat: str,
) -> None:
    values = diagnosis.values
    rate = collapse.rate.dropna()
    mean = float(rate.mean())
    last = window_mean(rate, last=max(1, len(rate) // 5))
    first = early_acr(per_step(rate.to_frame("rate"), coverage.stride)["rate"], EARLY_STEPS)
    correct = None if collapse.all_correct is None else window_mean(collapse.all_correct)
    wrong = None if collapse.all_wrong is None else window_mean(collapse.all_wrong)
    effective = window_mean(frame.get("acr/effective")) if collapse.source == "acr/rate" else None
    values.update(
        {
            "acr_source": collapse.source,
            "collapse": {"source": collapse.source, "what": collapse.what, "lower_bound": collapse.lower_bound},
            "mean_acr": mean,
            "acr_100": None if first is None else first.mean,
            "acr_100_steps": None if first is None else [first.first_step, first.last_step, first.steps],
            "all_correct": correct,
            "all_wrong": wrong,
            "effective": effective,
        }
    )
    marker = "" if collapse.source == "acr/rate" else " *"
    diagnosis.row.update(
        {
            "mean ACR": f"{mean:.3f}{marker}",
            "ACR_100": "—" if first is None or coverage.steps < EARLY_STEPS else f"{first.mean:.3f}{marker}",
            "all correct": _cell(correct),
            "all wrong": _cell(wrong),
            "effective": _cell(effective),
        }
    )
    link = f"{DOCS}#what-the-report-reads-collapse-from"
    if collapse.lower_bound:
        collapsed = int((rate >= 1).sum())
        headline = (
            f"Every group collapsed on {collapsed} of {len(rate)} logged rows ({collapse.source})"
            if collapsed
            else f"No step where every group collapsed ({collapse.source} on none of {len(rate)} rows)"
        )
        evidence = [f"{collapse.source}: {collapse.what} ({link})"]
        if not collapsed:
            evidence.append("groups collapsed on their own (part of a step) are not visible in this measure")
    else:
        headline = f"Collapse: {mean:.0%} of groups on average, {last:.0%} over the last fifth ({collapse.source})"
        evidence = [
            f"{collapse.source}: {collapse.what} ({link})",
            f"rows with rate ≥ 0.5: {int((rate >= 0.5).sum())} of {len(rate)}",
        ]
    if correct is not None or wrong is not None:
        evidence.append(f"all-correct {_cell(correct)}, all-wrong {_cell(wrong)} (mean per row)")
    gradient = next((c for c in ("grad_norm", "train/grad_norm", "actor/grad_norm") if c in frame), None)
    full = rate[rate >= 1].index
    others = rate[rate < 1].index
    if gradient is not None and len(full) and len(others):
        evidence.append(
            f"{gradient} median {frame.loc[full, gradient].median():.2g} on the {len(full)} rows where every group "
            f"collapsed vs {frame.loc[others, gradient].median():.2g} on the others"
        )
    if first is not None and coverage.steps >= EARLY_STEPS:
        evidence.append(
            f"ACR_100 (steps {first.first_step}–{first.last_step}) {first.mean:.3f}"
            + (f" (the log starts after step {EARLY_STEPS}: its earliest steps)" if first.resumed else "")
        )
    severity = _severity(mean if not collapse.lower_bound else max(mean, 0.2 if mean > 0 else 0))
    found = causes(frame, rate)
    actions = [] if severity == "INFO" else _collapse_actions(correct, wrong, host, ppo)
    if severity != "INFO" and any(cause.kind == "truncation" for cause in found) and (wrong or 0) >= (correct or 0):
        actions.insert(
            0,
            f"completions are cut at the length cap and a cut answer scores 0: raise {host['length']}, "
            f"{host['length_more']}",
        )
    diagnosis.findings.append(Finding(severity, headline + caveat, evidence, actions))
    _cause_findings(diagnosis, found, host, severity != "INFO")
    if ppo:
        diagnosis.findings.append(
            Finding(
                "INFO",
                "This run is PPO with a critic (critic/vf_loss logged), not a group estimator",
                [f"its advantages come from the value function; collapse here means no reward spread ({link})"],
                ["keep the estimator; act on the causes above (the reward's spread), not on GRPO/AVSPO settings"],
            )
        )
    if first is not None and coverage.steps >= EARLY_STEPS and not collapse.lower_bound:
        intercept, slope = PAPER_FIT
        diagnosis.findings.append(
            Finding(
                "INFO",
                f"Paper's fit at this ACR_100: {intercept + slope * first.mean:.1f}% MATH-500 (the paper's, not a "
                "prediction for this run)",
                [
                    f"acc ≈ 51.4 − 29.6·ACR_100, fit on the paper's math runs (MATH-500 accuracy, R² 0.617 over 245 "
                    f"configurations); ACR_100 here {first.mean:.3f} ({DOCS})"
                ],
            )
        )


def _cause_findings(diagnosis: RunDiagnosis, found: list[Cause], host: dict[str, str], collapsed: bool) -> None:
    """Each cause as a finding, in the log's framework's settings; "Likely cause of collapse" beside a
    collapse of WARN or more."""
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
        prefix = "Likely cause of collapse: " if collapsed else ""
        headline = prefix + cause.headline if collapsed else cause.headline[0].upper() + cause.headline[1:]
        diagnosis.findings.append(Finding(cause.severity, headline, list(cause.evidence), fixes[cause.kind]))


def _collapse_actions(correct: float | None, wrong: float | None, host: dict[str, str], ppo: bool) -> list[str]:
    if ppo:
        return []
    if correct is None and wrong is not None and wrong >= 0.1:
        return [
            f"all-wrong collapse ({wrong:.0%} of rows with every group scoring 0): the prompts are too hard or the "
            "reward never matches; train on easier data (pass rates around 30–50%)",
            host["how"] + ", to tell all-correct from all-wrong groups",
        ]
    if correct is None or wrong is None:
        return [host["how"] + ", to tell all-correct from all-wrong groups", host["try_avspo"]]
    if correct + wrong < 0.05:
        return []
    if wrong >= 2 * correct:
        return [
            "all-wrong groups dominate: the prompts are too hard; train on easier data (pass rates around 30–50%)",
            f"use a larger group ({host['group']})",
            f"or AVSPO with {host['apply_to'].format('all_wrong')}",
        ]
    if correct >= 2 * wrong:
        return [
            "all-correct groups dominate: the prompts are too easy; use harder data or drop prompts already solved",
            f"AVSPO's push on all-correct groups sharpens the policy ({host['apply_to'].format('all_correct')})",
        ]
    return [
        "both kinds matter: narrow the data's pass-rate band",
        f"or AVSPO with {host['apply_to'].format('both')}",
    ]


def _trend_finding(rewards: Trend, score: str | None, rows: int, collapse: float | None) -> Finding:
    """The reward's trend over the run. A reward that did not rise over 10 rows or more, or rose and then
    stopped (flat over the last third, every row of it after the best), is a WARN (no gain), said as
    such beside high collapse (mean 0.2 or more)."""
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
    no_gain = (direction != "rose" and rows >= 10) or rewards.stopped
    if rewards.stopped:
        evidence.append(
            f"since step {rewards.recent_from} (the last third): tau {rewards.recent_tau:+.2f}, "
            f"p {rewards.recent_p_value:.3g}"
        )
        text = f"Gain stopped: reward rose {rewards.first:.3f} → {rewards.final:.3f}, no trend since step "
        text += str(rewards.recent_from)
    elif no_gain:
        said = "fell" if direction == "fell" else "flat (no trend at p < 0.05)"
        text = f"No gain: reward {said}: {rewards.first:.3f} → {rewards.final:.3f}"
    else:
        text = f"Reward {direction}: {rewards.first:.3f} → {rewards.final:.3f}"
    if no_gain and collapse is not None and collapse >= 0.2:
        text += " while collapse is high"
    return Finding("WARN" if no_gain else "INFO", text, evidence)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or adjacent (first, last) position spans as one."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def _stall_finding(
    frame: pd.DataFrame, coverage: StepCoverage, alert: AlertConfig, values: dict[str, Any], advice: str, caveat: str
) -> Finding:
    """Where the run stalled under ``alert``'s rule, in training steps (a row logged every N steps stands
    for its N steps), each stall shown from the start of its streak of high values, or the longest
    streak if it never stalled. Records ``stalled`` (None: not checked), ``stalls`` and
    ``longest_streak``."""
    signal = ALERT_SIGNALS[alert.rule]
    rule = f"`{alert.rule}`: {describe_rule(alert)}"
    reward = REWARD_KEY if REWARD_KEY in frame and frame[REWARD_KEY].notna().any() else score_column(frame)
    needed = [signal] + ([reward or REWARD_KEY] if alert.rule == "acr_no_gain" else [])
    missing = [column for column in needed if column not in frame or frame[column].isna().all()]
    if missing:
        return Finding("INFO", f"Stall rule {rule} not checked: the log has no {' or '.join(missing)}")
    history = 2 * alert.window if alert.rule == "acr_no_gain" else alert.window
    if coverage.steps < history:
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


def _avspo_findings(
    diagnosis: RunDiagnosis,
    frame: pd.DataFrame,
    collapse: CollapseRate,
    host: dict[str, str],
    problems: dict[str, str],
    caveat: str,
) -> None:
    if "avspo/triggered" in frame and "avspo/triggered" not in problems:
        triggered = window_mean(frame["avspo/triggered"]) or 0.0
        threshold = window_mean(frame.get("avspo/threshold"))
        effective = diagnosis.values["effective"]
        diagnosis.values["avspo_triggered"] = triggered
        if triggered == 0.0:
            diagnosis.findings.append(
                Finding(
                    "WARN",
                    f"AVSPO never augmented a group{caveat}",
                    [f"avspo/triggered 0 on every step; mean threshold θ {_cell(threshold)}"],
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
