"""Accuracy per step and per rollout, from the comparison runs of benchmarks/rollout_study.sh.

Reads ``<compare>/<mix>/runs/<estimator>/seed<k>.jsonl`` (every evaluation record carries
``train/rollouts_cumulative``) and prints, per mix, one table:

- final held-out greedy accuracy at equal training steps (the last step), mean ± std over seeds,
  and the paired difference to GRPO (mean ± standard error over seeds);
- accuracy at equal rollouts: each run's accuracy curve against its cumulative rollouts, linearly
  interpolated at the *budget*, the smallest final cumulative rollout count of any run of the mix
  (the equal-rollout estimators' 60 x 128 = 7680; a run that re-samples reaches it earlier);
- the rollouts generated per step and the fraction of steps that hit the re-sampling cap;
- then each equal-rollout estimator against ``dapo_resample``, paired by seed, at equal steps and
  at equal rollouts.

It writes ``<prefix><mix>_accuracy_per_rollout.png`` under ``--out``: held-out accuracy against
cumulative rollouts generated, mean over seeds with a ± std band, on the range every seed of an
estimator reached.

With ``--pairs treated:baseline,...`` it also prints the pre-registered test of docs/results.md
("Skipping prompts predicted to collapse"): for each pair and mix, the accuracy at the mix's budget,
paired by seed, one-sided paired t-test (treated > baseline, ``tools.seed_stats.paired_t``) with the
two-sided 95% CI, and Holm's adjustment over every pair and mix tested, at ``--alpha``.

Usage: python benchmarks/rollout_plots.py runs/rollout_study/compare --out docs/results
       python benchmarks/rollout_plots.py runs/rollout_study/skip --out docs/results --prefix skip_ \
           --pairs grpo+skip:grpo,avspo+skip:avspo
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from verl_avspo.tools.markdown import render_table  # noqa: E402
from verl_avspo.tools.plots import save_png  # noqa: E402
from verl_avspo.tools.seed_stats import mean_std, mean_std_cell, paired_difference, paired_t  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from study_plots import load, paired_by_seed  # noqa: E402

ACC, ROLLOUTS = "eval/acc_mean", "train/rollouts_cumulative"


def curve(frame) -> tuple[np.ndarray, np.ndarray]:
    """One run's evaluations: (cumulative rollouts, accuracy in points), in step order."""
    evals = frame[frame[ACC].notna()]
    return evals[ROLLOUTS].to_numpy(float), 100 * evals[ACC].to_numpy(float)


def at_rollouts(frame, budget: float) -> float:
    """Accuracy (points) at ``budget`` cumulative rollouts, linearly interpolated between evaluations."""
    rollouts, accuracy = curve(frame)
    if budget > rollouts[-1]:
        raise ValueError(f"budget {budget:g} is past this run's last evaluation at {rollouts[-1]:g} rollouts")
    return float(np.interp(budget, rollouts, accuracy))


def _delta(frames: list, baseline: list, measure: Callable[[Any], float]) -> str:
    difference = paired_difference(paired_by_seed(frames, baseline, measure))
    return f"{difference.cell(1)} ({difference.higher} of {difference.seeds})"


def last_accuracy(frame) -> float:
    """Accuracy (points) at the run's last evaluation."""
    return float(curve(frame)[1][-1])


def finished(runs: dict[str, list]) -> dict[str, list]:
    """The runs that reached the mix's last step; a run still in progress is left out, with a warning."""
    last = max(frame.index.max() for frames in runs.values() for frame in frames)
    kept = {label: [f for f in frames if f.index.max() == last] for label, frames in runs.items()}
    for label, frames in runs.items():
        if len(kept[label]) < len(frames):
            logging.warning(
                "%s: %d of %d runs are unfinished and left out", label, len(frames) - len(kept[label]), len(frames)
            )
    return {label: frames for label, frames in kept.items() if frames}


def table(runs: dict[str, list]) -> tuple[str, float]:
    """The mix's markdown table and its rollout budget."""
    budget = min(curve(frame)[0][-1] for frames in runs.values() for frame in frames)
    at_budget = functools.partial(at_rollouts, budget=budget)
    header = [
        "estimator",
        "accuracy at the last step (%)",
        "Δ vs grpo at equal steps",
        f"accuracy at {budget:.0f} rollouts (%)",
        "Δ vs grpo at equal rollouts",
        "rollouts per step",
        "steps at the cap",
    ]
    rows = []
    for label, frames in runs.items():
        steps = np.array([last_accuracy(f) for f in frames])
        equal = np.array([at_budget(f) for f in frames])
        per_step = np.array([f["train/rollouts_generated"].mean() for f in frames])
        capped = (
            f"{np.mean([f['train/resample_capped'].mean() for f in frames]):.3f}"
            if "train/resample_capped" in frames[0]
            else "—"
        )
        first = label == "grpo"
        rows.append(
            [
                f"`{label}`",
                mean_std_cell(steps, 1),
                "—" if first else _delta(frames, runs["grpo"], last_accuracy),
                mean_std_cell(equal, 1),
                "—" if first else _delta(frames, runs["grpo"], at_budget),
                mean_std_cell(per_step, 0),
                capped,
            ]
        )
    return render_table(header, rows), budget


def versus(runs: dict[str, list], budget: float, resampler: str = "dapo_resample") -> str:
    """Markdown lines: each equal-rollout estimator against the re-sampling one, paired by seed, at
    equal steps and at equal rollouts ("" without a re-sampling run)."""
    if resampler not in runs:
        return ""
    theirs = runs[resampler]
    at_budget = functools.partial(at_rollouts, budget=budget)
    lines = []
    for label, frames in runs.items():
        if label in ("grpo", resampler):
            continue
        lines.append(
            f"- `{label}` − `{resampler}` (paired, ± s.e.): {_delta(frames, theirs, last_accuracy)} at equal steps, "
            f"{_delta(frames, theirs, at_budget)} at {budget:.0f} rollouts"
        )
    return "\n".join(lines)


def prompt_table(runs: dict[str, list]) -> str:
    """Markdown table of the prompt metrics, mean ± std over seeds ("" when the runs logged none): the
    raw ACR and ``prompts/collapsed_before`` averaged over steps, and the share of the candidate rollouts
    that the skip rule skipped (skipped / (skipped + generated))."""
    if not any("prompts/collapsed_before" in frames[0] for frames in runs.values()):
        return ""
    rows = []
    for label, frames in runs.items():
        skipped = "—"
        if "prompts/rollouts_skipped" in frames[0]:
            shares = [
                f["prompts/rollouts_skipped"].sum()
                / (f["prompts/rollouts_skipped"].sum() + f["train/rollouts_generated"].sum())
                for f in frames
            ]
            skipped = mean_std_cell(np.array(shares), 3)
        acr = np.array([f["acr/rate"].mean() for f in frames])
        before = np.array([f["prompts/collapsed_before"].mean() for f in frames])
        rows.append([f"`{label}`", mean_std_cell(acr, 3), mean_std_cell(before, 3), skipped])
    header = ["estimator", "raw ACR", "groups collapsed on every earlier visit", "candidate rollouts skipped"]
    return render_table(header, rows)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order."""
    order = np.argsort(p_values)
    adjusted, running = np.empty(len(p_values)), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted.tolist()


def pair_tests(budgets: dict[str, tuple[dict[str, list], float]], pairs: list[tuple[str, str]], alpha: float) -> str:
    """Markdown lines: the pre-registered paired test of each (treated, baseline) pair on each mix, at
    the mix's budget, Holm-adjusted over all of them, with the decision rule's verdict."""
    rows = []
    for mix, (runs, budget) in budgets.items():
        for treated, baseline in pairs:
            if treated not in runs or baseline not in runs:
                continue
            diffs = paired_by_seed(runs[treated], runs[baseline], functools.partial(at_rollouts, budget=budget))
            rows.append((mix, treated, baseline, budget, paired_t(np.asarray(diffs))))
    adjusted = holm([test["p"] for *_, test in rows])
    lines = []
    for (mix, treated, baseline, budget, t), p_holm in zip(rows, adjusted, strict=True):
        if p_holm < alpha:
            verdict = "helps"
        elif t["ci_high"] < 0:
            verdict = "hurts"
        else:
            verdict = "no detectable effect"
        lines.append(
            f"- {mix}: `{treated}` − `{baseline}` at {budget:.0f} rollouts: {t['mean']:+.2f} ± {t['se']:.2f} "
            f"(s.e., n = {t['n']}), 95% CI [{t['ci_low']:+.2f}, {t['ci_high']:+.2f}], one-sided t = {t['t']:.2f}, "
            f"p = {t['p']:.4f}, Holm-adjusted p = {p_holm:.4f}: **{verdict}**"
        )
    return "\n".join(lines)


def late_pairs(budgets: dict[str, tuple[dict[str, list], float]], pairs: list[tuple[str, str]], first_step: int) -> str:
    """Markdown lines, exploratory (not pre-registered, no verdict): each pair's paired difference in
    the mean accuracy over the evaluations from ``first_step`` on, with the two-sided 95% CI; a check
    of whether a difference at the budget is carried by the last evaluation alone."""
    lines = []
    for mix, (runs, _) in budgets.items():
        for treated, baseline in pairs:
            if treated not in runs or baseline not in runs:
                continue

            def late(frame):
                return 100 * float(frame.loc[first_step:, ACC].dropna().mean())

            t = paired_t(np.asarray(paired_by_seed(runs[treated], runs[baseline], late)))
            lines.append(
                f"- {mix}: `{treated}` − `{baseline}`, mean accuracy over the evaluations from step {first_step}: "
                f"{t['mean']:+.2f} ± {t['se']:.2f} (s.e., n = {t['n']}), "
                f"95% CI [{t['ci_low']:+.2f}, {t['ci_high']:+.2f}]"
            )
    return "\n".join(lines)


def plot(runs: dict[str, list], budget: float, title: str, path: Path) -> None:
    plot_curves({label: [curve(f) for f in frames] for label, frames in runs.items()}, title, path, budget=budget)


def plot_curves(
    curves: dict[str, list[tuple[np.ndarray, np.ndarray]]],
    title: str,
    path: Path,
    budget: float | None = None,
    targets: Sequence[float] = (),
    untrained: float | None = None,
) -> None:
    """Held-out accuracy against cumulative rollouts: per label, the mean of its runs' curves
    ((rollouts, accuracy in points) each) with a ± std band, on the range every run reached; a dotted
    vertical line at ``budget``, a dashed horizontal one at each of ``targets`` and a dash-dotted one at
    ``untrained`` (the no-training row: the warmed-up policy's accuracy, at any number of rollouts) where given."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, runs in curves.items():
        grid = np.linspace(0, min(r[-1] for r, _ in runs), 60)
        values = np.array([np.interp(grid, r, a) for r, a in runs])
        mean, std = mean_std(values)
        (line,) = ax.plot(grid, mean, label=label)
        ax.fill_between(grid, mean - std, mean + std, color=line.get_color(), alpha=0.15)
    xlabel = "cumulative rollouts generated"
    if budget is not None:
        ax.axvline(budget, color="grey", linestyle=":", linewidth=1)
        xlabel += " (dotted: the equal-rollout budget)"
    for target in targets:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    if targets:
        xlabel += " (dashed: the target accuracy)" if len(targets) == 1 else " (dashed: the target accuracies)"
    if untrained is not None:
        ax.axhline(untrained, color="black", linestyle="-.", linewidth=1, label="no training (0 rollouts)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("held-out greedy accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("compare", type=Path, help="the compare/ folder of benchmarks/rollout_study.sh")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--prefix", default="", help="prefix of the plots' file names (default none)")
    parser.add_argument(
        "--pairs", default="", help="treated:baseline pairs for the pre-registered paired test, comma-separated"
    )
    parser.add_argument("--alpha", type=float, default=0.05, help="familywise level of the pair tests (Holm)")
    parser.add_argument(
        "--late-from", type=int, default=None, help="also the pairs' exploratory mean accuracy from this step on"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    budgets = {}
    for mix in sorted(p for p in args.compare.iterdir() if (p / "runs").is_dir()):
        runs = finished(load(mix))
        text, budget = table(runs)
        budgets[mix.name] = (runs, budget)
        seeds = ", ".join(f"{label} {len(frames)}" for label, frames in runs.items())
        path = args.out / f"{args.prefix}{mix.name}_accuracy_per_rollout.png"
        plot(runs, budget, f"{mix.name}: held-out accuracy per rollout (mean, band ± std over seeds)", path)
        print(f"## {mix.name} (seeds: {seeds}; budget = {budget:.0f} rollouts)\n\n{text}\n\n{versus(runs, budget)}\n")
        prompts = prompt_table(runs)
        if prompts:
            print(f"{prompts}\n")
    if args.pairs:
        pairs = [tuple(pair.split(":", 1)) for pair in args.pairs.split(",")]
        print(f"## Pre-registered tests (alpha = {args.alpha:g}, Holm)\n\n{pair_tests(budgets, pairs, args.alpha)}\n")
        if args.late_from is not None:
            print(f"## Exploratory: late-window means\n\n{late_pairs(budgets, pairs, args.late_from)}\n")
    print(f"wrote the {args.prefix}*_accuracy_per_rollout.png plots under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
