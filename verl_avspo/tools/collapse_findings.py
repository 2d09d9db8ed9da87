"""The collapse finding of ``verl-avspo report``: how much of the run collapsed, from the measure the log
holds (:func:`verl_avspo.tools.collapse_measures.collapse_rate`), of which kind (all correct, all wrong), what to
do, and the paper's MATH-500 fit where the run is a math run (by its own names) or the user asks.
"""

from __future__ import annotations

import re

import pandas as pd

from verl_avspo.tools.cause_findings import cause_findings
from verl_avspo.tools.collapse_measures import CollapseRate
from verl_avspo.tools.findings import DOCS, Finding, RunDiagnosis, cell, severity
from verl_avspo.tools.signals import causes, per_step
from verl_avspo.tools.stats import EARLY_STEPS, StepCoverage, early_acr, window_mean

__all__ = ["MATH_NAMES", "PAPER_FIT", "collapse_findings", "is_math_run"]

PAPER_FIT = (51.4, -29.6)  # MATH-500 accuracy (%) ≈ 51.4 − 29.6·ACR_100, the paper's own regression
# A run is a math run by its own names (its name, its metrics' names: verl's val-core/<data_source>/...).
MATH_NAMES = re.compile(r"math|gsm8k|aime|amc\d|minerva|olympiad|numina|deepscaler|countdown", re.IGNORECASE)
_GRADIENTS = ("grad_norm", "train/grad_norm", "actor/grad_norm")
_LINK = f"{DOCS}#what-the-report-reads-collapse-from"


def is_math_run(name: str, frame: pd.DataFrame) -> bool:
    """Whether the run names itself a math run: its name or one of its metrics' names names a math data set."""
    return MATH_NAMES.search(name) is not None or any(MATH_NAMES.search(str(column)) for column in frame)


def collapse_findings(
    diagnosis: RunDiagnosis,
    frame: pd.DataFrame,
    collapse: CollapseRate,
    coverage: StepCoverage,
    host: dict[str, str],
    ppo: bool,
    caveat: str,
    paper_fit: bool,
) -> None:
    """The collapse finding, its causes (:mod:`~verl_avspo.tools.cause_findings`), the PPO note and the
    paper's fit (``paper_fit``: shown for a run of 100 steps or more)."""
    values = diagnosis.values
    diagnosis.used.update(collapse.columns)
    rate = collapse.rate.dropna()
    values["acr_source"] = collapse.source
    values["collapse"] = {"source": collapse.source, "what": collapse.what, "lower_bound": collapse.lower_bound}
    if collapse.kind == "regenerated":
        _regenerated(diagnosis, frame, collapse, host)
        return
    mean = float(rate.mean())
    last = window_mean(rate, last=max(1, len(rate) // 5))
    first = early_acr(per_step(rate.to_frame("rate"), coverage.stride)["rate"], EARLY_STEPS)
    correct = None if collapse.all_correct is None else window_mean(collapse.all_correct)
    wrong = None if collapse.all_wrong is None else window_mean(collapse.all_wrong)
    effective = window_mean(frame.get("acr/effective")) if collapse.source == "acr/rate" else None
    values.update(
        {
            "mean_acr": mean,
            "acr_100": None if first is None else first.mean,
            "acr_100_steps": None if first is None else [first.first_step, first.last_step, first.steps],
            "all_correct": correct,
            "all_wrong": wrong,
            "effective": effective,
        }
    )
    if effective is not None:
        diagnosis.used.add("acr/effective")
    marker = "" if collapse.source == "acr/rate" else " *"
    diagnosis.row.update(
        {
            "mean ACR": f"{mean:.3f}{marker}",
            "ACR_100": "—" if first is None or coverage.steps < EARLY_STEPS else f"{first.mean:.3f}{marker}",
            "all correct": cell(correct),
            "all wrong": cell(wrong),
            "effective": cell(effective),
        }
    )
    if collapse.lower_bound:
        collapsed = int((rate >= 1).sum())
        headline = (
            f"Every group collapsed on {collapsed} of {len(rate)} logged rows ({collapse.source})"
            if collapsed
            else f"No step where every group collapsed ({collapse.source} on none of {len(rate)} rows)"
        )
        evidence = [f"{collapse.source}: {collapse.what} ({_LINK})"]
        if not collapsed:
            evidence.append("groups collapsed on their own (part of a step) are not visible in this measure")
    else:
        headline = f"Collapse: {mean:.0%} of groups on average, {last:.0%} over the last fifth ({collapse.source})"
        evidence = [
            f"{collapse.source}: {collapse.what} ({_LINK})",
            f"rows with rate ≥ 0.5: {int((rate >= 0.5).sum())} of {len(rate)}",
        ]
    if correct is not None or wrong is not None:
        evidence.append(f"all-correct {cell(correct)}, all-wrong {cell(wrong)} (mean per row)")
    gradient = next((c for c in _GRADIENTS if c in frame), None)
    full, others = rate[rate >= 1].index, rate[rate < 1].index
    if gradient is not None and len(full) and len(others):
        diagnosis.used.add(gradient)
        evidence.append(
            f"{gradient} median {frame.loc[full, gradient].median():.2g} on the {len(full)} rows where every group "
            f"collapsed vs {frame.loc[others, gradient].median():.2g} on the others"
        )
    if first is not None and coverage.steps >= EARLY_STEPS:
        evidence.append(
            f"ACR_100 (steps {first.first_step}–{first.last_step}) {first.mean:.3f}"
            + (f" (the log starts after step {EARLY_STEPS}: its earliest steps)" if first.resumed else "")
        )
    level = severity(mean if not collapse.lower_bound else max(mean, 0.2 if mean > 0 else 0))
    found = causes(frame, rate)
    actions = [] if level == "INFO" else _actions(correct, wrong, host, ppo)
    if level != "INFO" and any(c.kind == "truncation" and c.likely for c in found) and (wrong or 0) >= (correct or 0):
        actions.insert(
            0,
            f"completions are cut at the length cap and a cut answer scores 0: raise {host['length']}, "
            f"{host['length_more']}",
        )
    diagnosis.findings.append(Finding(level, headline + caveat, evidence, actions))
    cause_findings(diagnosis, found, host, level != "INFO")
    if ppo:
        diagnosis.findings.append(
            Finding(
                "INFO",
                "This run is PPO with a critic (critic/vf_loss logged), not a group estimator",
                [f"its advantages come from the value function; collapse here means no reward spread ({_LINK})"],
                ["keep the estimator; act on the causes above (the reward's spread), not on GRPO/AVSPO settings"],
            )
        )
    if paper_fit and first is not None and coverage.steps >= EARLY_STEPS and not collapse.lower_bound:
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


def _regenerated(diagnosis: RunDiagnosis, frame: pd.DataFrame, collapse: CollapseRate, host: dict[str, str]) -> None:
    """DAPO's dynamic sampling: collapse shows only as the steps that had to generate again."""
    column = collapse.columns[0]
    batches = frame[column].dropna()
    again = collapse.rate.dropna()
    share = float(again.mean())
    diagnosis.row.update({"mean ACR": "—", "ACR_100": "—", "all correct": "—", "all wrong": "—", "effective": "—"})
    diagnosis.findings.append(
        Finding(
            "WARN" if share >= 0.5 else "INFO",
            f"Collapsed groups filtered out before logging (DAPO's dynamic sampling): generated again on "
            f"{int(again.sum())} of {len(again)} steps",
            [
                f"{column}: mean {batches.mean():.2f}, max {batches.max():.0f}; {collapse.what} ({_LINK})",
                "a lower bound on collapse, not a rate: with gen_batch_size g × train_batch_size, a step that needed "
                "k batches lost more than 1 − 1/(g(k−1)) of its first k−1 batches' groups to the filter",
            ],
            [
                "each extra batch is rollouts spent on groups that teach nothing: "
                + ("log acr/* to see the rate (" + host["how"] + ")" if host["label"] == "verl" else host["how"]),
            ]
            if share >= 0.5
            else [],
        )
    )
    cause_findings(diagnosis, causes(frame, collapse.rate), host, share >= 0.5)


def _actions(correct: float | None, wrong: float | None, host: dict[str, str], ppo: bool) -> list[str]:
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
