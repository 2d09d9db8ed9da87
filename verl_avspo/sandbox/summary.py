"""``summary.md`` of a sandbox comparison: tables of mean ± std over seeds and a verdict
computed from the numbers.

Inputs are the per-run metric frames of :func:`verl_avspo.tools.logs.read_metrics`. The last logged
step of a run carries its final evaluation; training metrics (``acr/*``) exist from step 1 on.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from verl_avspo.tools.markdown import render_table
from verl_avspo.tools.stats import early_acr, last_value, mean_std_cell, paired_difference

__all__ = ["first_steps_column", "intrinsic_note", "run_statistics", "summary_tables", "verdicts", "render_summary"]

BASELINE = "grpo"
# Marks, in the collapse table, the estimators whose ACR is measured on an intrinsic reward.
INTRINSIC_MARK = "†"


def first_steps_column(first_steps: int) -> str:
    """The collapse table's header for the ACR over the first ``first_steps`` training steps."""
    return f"ACR, first {first_steps} steps" if first_steps > 1 else "ACR, step 1"


def run_statistics(frame: pd.DataFrame, num_levels: int, pass_k: int, first_steps: int) -> dict[str, float]:
    """The numbers one run contributes to the summary: final greedy accuracy and pass@k per level
    (fractions), and ACR rates averaged over all training steps and over the first ``first_steps``
    (:func:`verl_avspo.tools.stats.early_acr`)."""
    final = frame.loc[frame.index.max()]
    training = frame[frame["acr/rate"].notna()]
    stats = {f"acc_level_{i}": final[f"eval/acc_level_{i}"] for i in range(1, num_levels + 1)}
    stats["acc_mean"] = final["eval/acc_mean"]
    for i in range(1, num_levels + 1):
        stats[f"pass_level_{i}"] = final[f"eval/pass@{pass_k}_level_{i}"]
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


def summary_tables(
    stats: Mapping[str, Sequence[dict[str, float]]],
    level_names: Sequence[str],
    pass_k: int,
    first_steps: int,
    intrinsic: Collection[str] = (),
) -> str:
    """Three markdown tables, one row per estimator: final greedy accuracy, final pass@k (both in
    percent) and advantage collapse (rates, and the mean token entropy of the sampled responses).
    Labels in ``intrinsic`` are marked in the collapse table, with :func:`intrinsic_note` below it."""
    levels = range(1, len(level_names) + 1)

    def row(label: str, keys: Sequence[str], scale: float, digits: int, mark: str = "") -> list[str]:
        return [f"`{label}`{mark}"] + [mean_std_cell([run[key] for run in stats[label]], digits, scale) for key in keys]

    accuracy = render_table(
        ["estimator", *level_names, "mean"],
        [row(label, [*(f"acc_level_{i}" for i in levels), "acc_mean"], 100, 1) for label in stats],
    )
    pass_at_k = render_table(
        ["estimator", *level_names], [row(label, [f"pass_level_{i}" for i in levels], 100, 1) for label in stats]
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
                label,
                ["acr", "acr_effective", "all_correct", "all_wrong", "acr_first", "entropy"],
                1,
                3,
                f" {INTRINSIC_MARK}" if label in intrinsic else "",
            )
            for label in stats
        ],
    )
    note = intrinsic_note([label for label in stats if label in intrinsic])
    return (
        f"### Final greedy accuracy (%)\n\n{accuracy}\n\n"
        f"### Final pass@{pass_k} (%, {pass_k} samples at temperature 1.0)\n\n{pass_at_k}\n\n"
        f"### Advantage collapse (mean over training steps)\n\n{collapse}\n"
        + (f"\n{note}\n" if note else "")
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


def verdicts(stats: Mapping[str, Sequence[dict[str, float]]], intrinsic: Collection[str] = ()) -> list[str]:
    """One sentence per estimator against GRPO, on the final mean greedy accuracy, paired by seed
    (runs with the same seed share the warm-up model and the prompt sequence). An estimator
    "beat" GRPO when its mean paired gain exceeds twice its standard error. The ACR of labels in
    ``intrinsic`` is said to be on their own reward."""
    if BASELINE not in stats:
        return [f"No `{BASELINE}` run in this comparison, so there is no baseline to compare against."]
    baseline = [run["acc_mean"] for run in stats[BASELINE]]
    sentences = []
    for label, runs in stats.items():
        if label == BASELINE:
            continue
        ours = [run["acc_mean"] for run in runs]
        gains = 100 * (np.asarray(ours) - np.asarray(baseline))
        head = (
            f"**`{label}` vs `{BASELINE}`**: final mean greedy accuracy {100 * np.mean(ours):.1f}% vs "
            f"{100 * np.mean(baseline):.1f}%"
        )
        collapse = (
            f" Its effective ACR was {np.mean([r['acr_effective'] for r in runs]):.3f} against a raw ACR of "
            f"{np.mean([r['acr'] for r in runs]):.3f}"
            + (" (on its intrinsic reward: not comparable)." if label in intrinsic else ".")
        )
        if len(gains) < 2:
            sentences.append(
                f"{head} ({gains.mean():+.1f} points) from a single seed, which gives no spread to judge a difference "
                f"by: run more seeds before concluding.{collapse}"
            )
            continue
        difference = paired_difference(gains)
        detail = (
            f" (paired difference {difference.cell(1)} points, mean ± standard error over {difference.seeds} "
            f"seeds; higher in {difference.higher} of {difference.seeds} seeds)"
        )
        if difference.mean > 2 * difference.standard_error:
            outcome = f": `{label}` beat `{BASELINE}` here."
        elif difference.mean < -2 * difference.standard_error:
            outcome = f": `{label}` did worse than `{BASELINE}` here."
        else:
            outcome = f": `{label}` did not beat `{BASELINE}` here; the difference is within twice its standard error."
        sentences.append(head + detail + outcome + collapse)
    return sentences


def render_summary(
    stats: Mapping[str, Sequence[dict[str, float]]],
    level_names: Sequence[str],
    pass_k: int,
    first_steps: int,
    setup: str,
    plots: Sequence[Path],
    intrinsic: Collection[str] = (),
) -> str:
    """The whole ``summary.md``; ``intrinsic``: the labels trained on an intrinsic reward."""
    images = "\n".join(f"![{path.stem}]({path.name})" for path in plots)
    findings = "\n".join(f"- {sentence}" for sentence in verdicts(stats, intrinsic))
    return (
        "# CPU sandbox: GRPO and AVSPO at the same rollout budget\n\n"
        f"{setup}\n\n## Result\n\n{findings}\n\n"
        f"{summary_tables(stats, level_names, pass_k, first_steps, intrinsic)}\n## Curves\n\n{images}\n"
    )
