"""``summary.md`` of a sandbox comparison: tables of mean ± std over seeds and verdicts computed
from the numbers, every estimator beside the **no-training row** (the warmed-up policy, its step-0
evaluation held for the whole run, 0 rollouts) and the rollouts it generated.

Inputs are the per-run metric frames of :func:`verl_avspo.tools.logs.read_metrics`. Step 0 of a run
carries the evaluation of the warmed-up policy (every run of a comparison starts from the same one), the
last logged step its final evaluation; training metrics (``acr/*``, ``train/rollouts_*``) exist from step 1 on.

The verdicts are gated on learning: an estimator can match GRPO's accuracy at fewer rollouts only where
GRPO itself beat not training, since not training matches nothing at no rollouts at all.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from verl_avspo.tools.markdown import render_table
from verl_avspo.tools.seed_stats import ALPHA, mean_std_cell, one_sided_t, paired_difference
from verl_avspo.tools.stats import FINAL_EVALUATIONS, early_acr, last_value, window_mean

__all__ = [
    "NO_TRAINING",
    "first_steps_column",
    "intrinsic_note",
    "learning_verdict",
    "no_training_curve",
    "no_training_runs",
    "render_summary",
    "run_statistics",
    "summary_tables",
    "verdicts",
]

BASELINE = "grpo"
# The row of the warmed-up policy that is not trained: its step-0 evaluation, 0 rollouts.
NO_TRAINING = "no training"
# Marks, in the collapse table, the estimators whose ACR is measured on an intrinsic reward.
INTRINSIC_MARK = "†"
# Marks, in the collapse table, the estimators whose effective ACR is over the groups left after some were dropped.
DROPPED_MARK = "‡"


def first_steps_column(first_steps: int) -> str:
    """The collapse table's header for the ACR over the first ``first_steps`` training steps."""
    return f"ACR, first {first_steps} steps" if first_steps > 1 else "ACR, step 1"


def _logged(frame: pd.DataFrame, column: str, step) -> float:
    """``column`` at ``step`` (NaN where the log has no such column or value)."""
    return float(frame.at[step, column]) if column in frame and step in frame.index else math.nan


def run_statistics(frame: pd.DataFrame, num_levels: int, pass_k: int, first_steps: int) -> dict[str, float]:
    """The numbers one run contributes to the summary: greedy accuracy, pass@k per level and mean@k (fractions),
    final (the mean of the last :data:`~verl_avspo.tools.stats.FINAL_EVALUATIONS` evaluations) and at step 0
    (``start_*``: the warmed-up policy before any update), the rollouts it generated (per training step and in
    all), and ACR rates averaged over all training steps and over the first ``first_steps``
    (:func:`verl_avspo.tools.stats.early_acr`)."""
    training = frame[frame["acr/rate"].notna()]
    stats = {"steps": float(len(training))}
    columns = {f"acc_level_{i}": f"eval/acc_level_{i}" for i in range(1, num_levels + 1)}
    columns.update({f"pass_level_{i}": f"eval/pass@{pass_k}_level_{i}" for i in range(1, num_levels + 1)})
    columns.update(acc_mean="eval/acc_mean", mean_at_k_mean=f"eval/mean@{pass_k}_mean")
    for key, column in columns.items():
        stats[f"start_{key}"] = _logged(frame, column, frame.index.min())
        final = window_mean(frame.get(column), FINAL_EVALUATIONS)
        stats[key] = math.nan if final is None else final
    generated = training["train/rollouts_generated"] if "train/rollouts_generated" in training else None
    stats["rollouts_per_step"] = math.nan if generated is None else generated.mean()
    total = last_value(frame.get("train/rollouts_cumulative"))
    stats["rollouts_total"] = math.nan if total is None else total
    stats["acr"] = training["acr/rate"].mean()
    stats["acr_effective"] = training["acr/effective"].mean()
    stats["all_correct"] = training["acr/all_correct"].mean()
    stats["all_wrong"] = training["acr/all_wrong"].mean()
    early = early_acr(training["acr/rate"], first_steps)
    stats["acr_first"] = math.nan if early is None else early.mean
    # Logs written before the entropy was logged have no column: NaN, shown as "n/a".
    stats["entropy"] = training["actor/entropy"].mean() if "actor/entropy" in training else math.nan
    # The training prompts at the end of the run (the run tracker's prompt history): how many were
    # seen, and the shares all-correct or all-wrong on every visit.
    for key in ("seen", "always_solved", "never_solved"):
        value = last_value(frame.get(f"prompts/{key}"))
        stats[f"prompts_{key}"] = math.nan if value is None else value
    return {key: float(value) for key, value in stats.items()}


def no_training_runs(stats: Mapping[str, Sequence[dict[str, float]]]) -> list[dict[str, float]]:
    """The no-training row, one entry per seed: the step-0 evaluation of the first estimator's runs (every
    run of a seed starts from the same warmed-up policy and evaluates it alike), held as the final one, at 0
    rollouts; [] when the runs carry no step-0 evaluation."""
    runs = next(iter(stats.values()), [])
    if not runs or any(math.isnan(run.get("start_acc_mean", math.nan)) for run in runs):
        return []
    return [
        {
            **{key[len("start_") :]: value for key, value in run.items() if key.startswith("start_")},
            "rollouts_per_step": 0.0,
            "rollouts_total": 0.0,
        }
        for run in runs
    ]


def no_training_curve(runs: Sequence[pd.DataFrame]) -> list[pd.DataFrame]:
    """The no-training row as curves to plot beside the runs: per seed, ``eval/acc_mean`` held at its step-0
    value at every step the run evaluated."""
    curves = []
    for frame in runs:
        evaluated = frame["eval/acc_mean"].dropna()
        curves.append(pd.DataFrame({"eval/acc_mean": evaluated.iloc[0]}, index=evaluated.index))
    return curves


def intrinsic_note(labels: Collection[str]) -> str:
    """The footnote that says why these estimators' raw ACR cannot be compared ("" if none)."""
    if not labels:
        return ""
    names = ", ".join(f"`{label}`" for label in labels)
    return (
        f"{INTRINSIC_MARK} {names} train on an intrinsic reward computed from the policy's own logits (self-certainty, "
        "negative entropy), and their ACR is measured on that reward. It is continuous, so their groups collapse only "
        "when they repeat one answer: their raw ACR is not comparable with that of the estimators trained on the "
        "verifier's 0/1 reward (as the paper notes). Their accuracy is still the verifier's."
    )


def _dropped_note(dropped: Mapping[str, str]) -> str:
    """The footnote that says whose effective ACR is low because groups were dropped, not given a signal."""
    if not dropped:
        return ""
    parts = "; ".join(f"`{label}` dropped its {what}" for label, what in dropped.items())
    return (
        f"{DROPPED_MARK} Effective ACR over the groups trained on, after dropping collapsed ones ({parts}): a "
        "dropped group is not given a signal, as AVSPO's virtual rewards give one; it still counts in the raw ACR."
    )


def _cell(runs: Sequence[dict[str, float]], key: str, digits: int, scale: float = 1.0) -> str:
    return mean_std_cell([run.get(key, math.nan) for run in runs], digits, scale)


def summary_tables(
    stats: Mapping[str, Sequence[dict[str, float]]],
    level_names: Sequence[str],
    pass_k: int,
    first_steps: int,
    intrinsic: Collection[str] = (),
    dropped: Mapping[str, str] | None = None,
) -> str:
    """Markdown tables, one row per estimator: final greedy accuracy (with the rollouts generated, per step
    and in all, and the no-training row), final pass@k (both in percent) and advantage collapse (rates, and
    the mean token entropy of the sampled responses). Labels in ``intrinsic`` are marked in the collapse
    table, with :func:`intrinsic_note` below it; labels of ``dropped`` (label -> what it dropped) too."""
    levels = range(1, len(level_names) + 1)
    dropped = {label: what for label, what in (dropped or {}).items() if label in stats}
    untrained = no_training_runs(stats)
    rows = {
        **({f"*{NO_TRAINING}*": untrained} if untrained else {}),
        **{f"`{label}`": runs for label, runs in stats.items()},
    }

    def row(name: str, runs, keys: Sequence[str], scale: float, digits: int, mark: str = "") -> list[str]:
        return [f"{name}{mark}"] + [_cell(runs, key, digits, scale) for key in keys]

    accuracy = render_table(
        ["estimator", *level_names, "mean", f"mean@{pass_k} (sampled)", "rollouts per step", "rollouts in all"],
        [
            row(name, runs, [*(f"acc_level_{i}" for i in levels), "acc_mean", "mean_at_k_mean"], 100, 1)
            + [_cell(runs, "rollouts_per_step", 1), _cell(runs, "rollouts_total", 0)]
            for name, runs in rows.items()
        ],
    )
    pass_at_k = render_table(
        ["estimator", *level_names],
        [row(name, runs, [f"pass_level_{i}" for i in levels], 100, 1) for name, runs in rows.items()],
    )
    collapse = render_table(
        [
            "estimator",
            "ACR (raw)",
            "effective ACR",
            "all-correct",
            "all-wrong",
            first_steps_column(first_steps),
            "token entropy (nats)",
        ],
        [
            row(
                f"`{label}`",
                runs,
                ["acr", "acr_effective", "all_correct", "all_wrong", "acr_first", "entropy"],
                1,
                3,
                f" {INTRINSIC_MARK}" if label in intrinsic else f" {DROPPED_MARK}" if label in dropped else "",
            )
            for label, runs in stats.items()
        ],
    )
    notes = [
        note
        for note in (intrinsic_note([label for label in stats if label in intrinsic]), _dropped_note(dropped))
        if note
    ]
    held = (
        f"*{NO_TRAINING}*: the warmed-up policy, not trained (its step-0 evaluation held, 0 rollouts). "
        if untrained
        else ""
    )
    return (
        f"### Final greedy accuracy (%) and rollouts generated\n\nmean@{pass_k}: the share of {pass_k} samples at "
        f"temperature 1.0 that are correct. {held}Rollouts per step: the mean over the "
        f"training steps of `train/rollouts_generated`; in all: `train/rollouts_cumulative` at the end.\n\n"
        f"{accuracy}\n\n"
        f"### Final pass@{pass_k} (%, {pass_k} samples at temperature 1.0)\n\n{pass_at_k}\n\n"
        f"### Advantage collapse (mean over training steps)\n\n{collapse}\n"
        + "".join(f"\n{note}\n" for note in notes)
        + _prompts_table(stats)
    )


def _prompts_table(stats: Mapping[str, Sequence[dict[str, float]]]) -> str:
    """The training prompts at the end of the run: seen, always solved, never solved ("" when no run
    logged its prompt history)."""
    if all(math.isnan(run["prompts_seen"]) for runs in stats.values() for run in runs):
        return ""
    table = render_table(
        ["estimator", "prompts seen", "always solved", "never solved"],
        [
            [f"`{label}`"]
            + [
                mean_std_cell([run[key] for run in runs], digits)
                for key, digits in (("prompts_seen", 0), ("prompts_always_solved", 3), ("prompts_never_solved", 3))
            ]
            for label, runs in stats.items()
        ],
    )
    return (
        "\n### Training prompts at the end of the run\n\nShares of the prompts seen that were all-correct "
        f"(always solved) or all-wrong (never solved) on every visit.\n\n{table}\n"
    )


def _judged(gains: np.ndarray) -> tuple[str, str]:
    """Paired gains (points, one per seed) -> (their description, "above" or "below" where a one-sided paired
    t-test that way gives p < :data:`~verl_avspo.tools.seed_stats.ALPHA`, else "within"); ("…", "single") from one
    seed. The studies' report script judges with the same test."""
    if len(gains) < 2:
        return f"{gains.mean():+.1f} points from a single seed", "single"
    difference = paired_difference(gains)
    _, above = one_sided_t(difference)
    detail = (
        f"paired difference {difference.cell(1)} points, mean ± standard error over {difference.seeds} seeds; "
        f"higher in {difference.higher} of {difference.seeds} seeds; one-sided paired t-test p = "
        f"{min(above, 1 - above):.2g}"
    )
    if above < ALPHA:
        return detail, "above"
    if 1 - above < ALPHA:
        return detail, "below"
    return detail, "within"


def learning_verdict(stats: Mapping[str, Sequence[dict[str, float]]]) -> tuple[str, bool]:
    """The gate of the other verdicts: did GRPO beat not training (final − step-0 accuracy, paired by seed,
    one-sided paired t-test at :data:`~verl_avspo.tools.seed_stats.ALPHA`)? Returns the sentence ("" without a
    ``grpo`` run) and whether it did."""
    untrained = no_training_runs(stats)
    if BASELINE not in stats:
        return "", False  # verdicts() says there is no baseline
    if not untrained:
        return (
            f"The `{BASELINE}` runs logged no step-0 evaluation, so nothing shows that training helped at all.",
            False,
        )
    final = np.array([run["acc_mean"] for run in stats[BASELINE]])
    start = np.array([run["acc_mean"] for run in untrained])
    detail, side = _judged(100 * (final - start))
    head = (
        f"**`{BASELINE}` vs {NO_TRAINING}**: final mean greedy accuracy {100 * final.mean():.1f}% against "
        f"{100 * start.mean():.1f}% for the warmed-up policy not trained ({detail})"
    )
    if side == "above":
        return f"{head}: `{BASELINE}` learned here, so the comparisons below can tell a cheaper or better method.", True
    outcome = {
        "single": ", which gives no spread to judge by: run more seeds.",
        "below": f": `{BASELINE}` ended below not training.",
        "within": f": `{BASELINE}` did not beat not training (p ≥ {ALPHA:g}).",
    }[side]
    return (
        f"{head}{outcome} So no estimator below can be said to match GRPO's accuracy with fewer rollouts: not "
        "training matches it too, at none.",
        False,
    )


def verdicts(
    stats: Mapping[str, Sequence[dict[str, float]]],
    intrinsic: Collection[str] = (),
    dropped: Mapping[str, str] | None = None,
    learned: bool = True,
) -> list[str]:
    """One sentence per estimator against GRPO, on the final mean greedy accuracy, paired by seed
    (runs with the same seed share the warm-up model and the prompt sequence), and the rollouts each
    generated. An estimator "beat" GRPO (or did worse) when a one-sided paired t-test that way gives p below
    :data:`~verl_avspo.tools.seed_stats.ALPHA`. The ACR of labels in ``intrinsic`` is said to be on their own
    reward; that of ``dropped`` (label -> what it dropped) over the groups left. ``learned``: whether GRPO
    beat not training (:func:`learning_verdict`); where it did not, no fewer rollouts are called a saving."""
    if BASELINE not in stats:
        return [f"No `{BASELINE}` run in this comparison, so there is no baseline to compare against."]
    dropped = dropped or {}
    baseline = [run["acc_mean"] for run in stats[BASELINE]]
    theirs = _mean(stats[BASELINE], "rollouts_total")
    sentences = []
    for label, runs in stats.items():
        if label == BASELINE:
            continue
        ours = [run["acc_mean"] for run in runs]
        head = (
            f"**`{label}` vs `{BASELINE}`**: final mean greedy accuracy {100 * np.mean(ours):.1f}% vs "
            f"{100 * np.mean(baseline):.1f}%"
        )
        detail, side = _judged(100 * (np.asarray(ours) - np.asarray(baseline)))
        if side == "single":
            outcome = f" ({detail}), which gives no spread to judge a difference by: run more seeds before concluding."
        else:
            outcome = (
                f" ({detail})"
                + {
                    "above": f": `{label}` beat `{BASELINE}` here.",
                    "below": f": `{label}` did worse than `{BASELINE}` here.",
                    "within": f": `{label}` did not beat `{BASELINE}` here, nor did worse (p ≥ {ALPHA:g} each way).",
                }[side]
            )
        acr_note = (
            " (on its intrinsic reward: not comparable)."
            if label in intrinsic
            else f" (its {dropped[label]} were dropped, not given a signal)."
            if label in dropped
            else "."
        )
        collapse = (
            f" Its effective ACR was {np.mean([r['acr_effective'] for r in runs]):.3f} against a raw ACR of "
            f"{np.mean([r['acr'] for r in runs]):.3f}{acr_note}"
        )
        sentences.append(head + outcome + _rollouts_sentence(label, runs, theirs, learned) + collapse)
    return sentences


def _mean(runs: Sequence[dict[str, float]], key: str) -> float:
    """The mean of ``key`` over ``runs`` (NaN where a run did not log it)."""
    return float(np.mean([run.get(key, math.nan) for run in runs])) if runs else math.nan


def _rollouts_sentence(label: str, runs: Sequence[dict[str, float]], theirs: float, learned: bool) -> str:
    """What ``label`` generated against GRPO's ``theirs`` rollouts in all ("" where either is not logged)."""
    ours = _mean(runs, "rollouts_total")
    if math.isnan(ours) or math.isnan(theirs) or not theirs:
        return ""
    per_step = np.mean([run["rollouts_per_step"] for run in runs])
    sentence = (
        f" It generated {ours:.0f} rollouts ({per_step:.1f} a step), {ours / theirs:.2f}× `{BASELINE}`'s {theirs:.0f}"
    )
    if ours < theirs and not learned:
        return f"{sentence}; `{BASELINE}` did not beat not training here, so this is no saving at its accuracy."
    return f"{sentence}."


def _title(stats: Mapping[str, Sequence[dict[str, float]]], untrained: bool) -> str:
    """The summary's title: what ran, and how long."""
    names = [f"`{label}`" for label in stats]
    if untrained:
        names.append(NO_TRAINING)
    runs = next(iter(stats.values()), [])
    steps = int(runs[0]["steps"]) if runs and not math.isnan(runs[0].get("steps", math.nan)) else None
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    length = f", {len(runs)} seed{'s' if len(runs) != 1 else ''}" + (
        f" × {steps} step{'s' if steps != 1 else ''}" if steps else ""
    )
    return f"CPU sandbox: {listed}{length}"


def render_summary(
    stats: Mapping[str, Sequence[dict[str, float]]],
    level_names: Sequence[str],
    pass_k: int,
    first_steps: int,
    setup: str,
    plots: Sequence[Path],
    intrinsic: Collection[str] = (),
    dropped: Mapping[str, str] | None = None,
) -> str:
    """The whole ``summary.md``; ``intrinsic``: the labels trained on an intrinsic reward; ``dropped``: label
    -> the collapsed groups it dropped rather than trained on (its effective ACR is over the rest)."""
    images = "\n".join(f"![{path.stem}]({path.name})" for path in plots)
    gate, learned = learning_verdict(stats)
    sentences = ([gate] if gate else []) + verdicts(stats, intrinsic, dropped, learned)
    findings = "\n".join(f"- {sentence}" for sentence in sentences)
    return (
        f"# {_title(stats, bool(no_training_runs(stats)))}\n\n"
        f"{setup}\n\n## Result\n\n{findings}\n\n"
        f"{summary_tables(stats, level_names, pass_k, first_steps, intrinsic, dropped)}\n## Curves\n\n{images}\n"
    )
