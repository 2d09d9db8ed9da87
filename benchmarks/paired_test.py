"""The pre-registered paired test of docs/results.md ("Confirmation"): is an estimator's final
held-out accuracy higher than GRPO's, paired by seed?

Reads ``<out>/runs/<estimator>/seed<k>.jsonl`` of one ``verl-avspo sandbox`` run and compares the
final ``eval/acc_mean`` (in points) of ``--estimator`` against ``--baseline`` seed by seed:

- primary: one-sided paired t-test (H1: mean difference > 0), with the two-sided 95% confidence
  interval of the mean difference;
- secondary: one-sided exact Wilcoxon signed-rank test (zeros dropped, tied ranks averaged) and
  one-sided exact sign test.

Usage: python benchmarks/paired_test.py runs/confirm --estimator avspo --baseline grpo --alpha 0.05
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from verl_avspo.tools.logs import read_metrics
from verl_avspo.tools.seed_stats import paired_t

__all__ = ["final_accuracy", "wilcoxon_signed_rank", "sign_test", "report"]


def final_accuracy(out: Path, label: str) -> dict[int, float]:
    """Seed -> final greedy accuracy (points, mean over levels) of one estimator's runs."""
    folder = out / "runs" / label.replace(":", "-")
    accuracies = {}
    for path in sorted(folder.glob("seed*.jsonl"), key=lambda p: int(p.stem[4:])):
        frame = read_metrics(path)
        accuracies[int(path.stem[4:])] = 100 * float(frame.loc[frame.index.max(), "eval/acc_mean"])
    if not accuracies:
        raise SystemExit(f"paired_test: no seed*.jsonl under {folder}: run verl-avspo sandbox with {label} first")
    return accuracies


def wilcoxon_signed_rank(diffs: np.ndarray) -> dict[str, float]:
    """Exact one-sided Wilcoxon signed-rank test of a positive shift: W+ (the sum of the ranks of
    |d| over positive d, zeros dropped, ties averaged) and P(W+ >= observed) under H0, by counting
    all 2^n sign patterns with a dynamic programme over the (doubled, integer) ranks."""
    d = diffs[diffs != 0]
    if len(d) == 0:
        return {"n": 0, "w_plus": 0.0, "p": 1.0}
    magnitudes = np.abs(d)
    order = magnitudes.argsort()
    ranks = np.empty(len(d))
    ranks[order] = np.arange(1, len(d) + 1)
    for value in np.unique(magnitudes):  # tied |d| share their mean rank
        ranks[magnitudes == value] = ranks[magnitudes == value].mean()
    doubled = np.rint(2 * ranks).astype(int)
    counts = np.zeros(doubled.sum() + 1)
    counts[0] = 1
    for r in doubled:
        counts[r:] = counts[r:] + counts[:-r]
    observed = int(doubled[d > 0].sum())
    return {"n": len(d), "w_plus": observed / 2, "p": float(counts[observed:].sum() / counts.sum())}


def sign_test(diffs: np.ndarray) -> dict[str, float]:
    """Exact one-sided sign test: P(at least this many positive differences | p = 1/2), zeros dropped."""
    wins, n = int((diffs > 0).sum()), int((diffs != 0).sum())
    return {"wins": wins, "n": n, "p": sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n if n else 1.0}


def report(out: Path, estimator: str, baseline: str, alpha: float) -> str:
    """Markdown lines: the per-seed differences, the three tests and the verdict at ``alpha``."""
    treated, control = final_accuracy(out, estimator), final_accuracy(out, baseline)
    if sorted(treated) != sorted(control):
        raise SystemExit(f"paired_test: {estimator} has seeds {sorted(treated)}, {baseline} {sorted(control)}")
    seeds = sorted(treated)
    diffs = np.array([treated[s] - control[s] for s in seeds])
    t, w, sign = paired_t(diffs), wilcoxon_signed_rank(diffs), sign_test(diffs)
    verdict = "confirmed" if t["p"] < alpha else "not confirmed"
    return "\n".join(
        [
            f"- seeds {seeds[0]}..{seeds[-1]} ({len(seeds)}); `{baseline}` {np.mean(list(control.values())):.1f}%, "
            f"`{estimator}` {np.mean(list(treated.values())):.1f}%",
            f"- per-seed difference (points): {', '.join(f'{x:+.1f}' for x in diffs)}",
            f"- mean difference {t['mean']:+.2f} ± {t['se']:.2f} (s.e.), 95% CI [{t['ci_low']:+.2f}, "
            f"{t['ci_high']:+.2f}]",
            f"- primary, one-sided paired t-test: t = {t['t']:.2f}, df = {t['n'] - 1}, p = {t['p']:.4f}",
            f"- secondary, one-sided exact Wilcoxon signed-rank: W+ = {w['w_plus']:g} (n = {w['n']} non-zero), "
            f"p = {w['p']:.4f}",
            f"- secondary, one-sided exact sign test: higher in {sign['wins']} of {sign['n']} non-tied seeds, "
            f"p = {sign['p']:.4f}",
            f"- at alpha = {alpha:g}: **{verdict}**",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the --out folder of one verl-avspo sandbox run")
    parser.add_argument("--estimator", default="avspo")
    parser.add_argument("--baseline", default="grpo")
    parser.add_argument("--alpha", type=float, default=0.05)
    args = parser.parse_args(argv)
    print(report(args.out, args.estimator, args.baseline, args.alpha))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
