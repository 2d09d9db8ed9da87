"""Plots of the sandbox study for docs/results.md, from the runs of benchmarks/sandbox_study.sh.

Reads ``<study>/<mix>/runs/<estimator>/seed<k>.jsonl`` (verl's file-logger format) and writes, under
``--out``: ``final_accuracy.png`` (final mean greedy accuracy and pass@k per estimator and mix,
mean ± std over seeds) and, per mix, ACR, accuracy and token-entropy curves; prints a table per mix.

Usage: python benchmarks/study_plots.py runs/study --out docs/results
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from verl_avspo.tools.logs import read_metrics  # noqa: E402
from verl_avspo.tools.markdown import render_table  # noqa: E402
from verl_avspo.tools.plots import plot_metrics, save_png  # noqa: E402
from verl_avspo.tools.seed_stats import mean_std, mean_std_cell, paired_difference  # noqa: E402


def load(mix_dir: Path) -> dict[str, list]:
    """Estimator label (``avspo:beta_loo``) -> its per-seed metric frames, in seed order; each
    frame's ``attrs["seed"]`` is its seed, for pairing."""
    runs = {}
    for folder in sorted((mix_dir / "runs").iterdir()):
        runs[folder.name.replace("-", ":", 1)] = frames = []
        for path in sorted(folder.glob("seed*.jsonl"), key=lambda p: int(p.stem[4:])):
            frames.append(read_metrics(path))
            frames[-1].attrs["seed"] = int(path.stem[4:])
    return dict(sorted(runs.items(), key=lambda item: item[0] != "grpo"))  # grpo, the baseline, first


def paired_by_seed(frames: list, baseline: list, measure: Callable[[Any], float]) -> np.ndarray:
    """(seeds both ran,) ``measure`` of each run minus that of the baseline's run with the same seed,
    in seed order: a seed that only one side finished is left out rather than paired with another."""
    base = {frame.attrs["seed"]: measure(frame) for frame in baseline}
    return np.array([measure(frame) - base[frame.attrs["seed"]] for frame in frames if frame.attrs["seed"] in base])


def final_value(frame, column: str) -> float:
    """``column`` at the run's last step, in points."""
    return 100 * frame.loc[frame.index.max(), column]


def final(frames: list, column: str) -> np.ndarray:
    return np.array([final_value(frame, column) for frame in frames])


def pass_column(frame) -> list[str]:
    return [c for c in frame.columns if c.startswith("eval/pass@") and "_level_" in c]


def bar_chart(mixes: dict[str, dict[str, list]], path: Path) -> None:
    fig, axes = plt.subplots(1, len(mixes), figsize=(6 * len(mixes), 4.2), squeeze=False)
    for ax, (mix, runs) in zip(axes[0], mixes.items(), strict=True):
        labels = list(runs)
        acc = [final(runs[label], "eval/acc_mean") for label in labels]
        passes = []
        for label in labels:
            columns = pass_column(runs[label][0])
            passes.append(np.mean([final(runs[label], c) for c in columns], axis=0))
        x = np.arange(len(labels))
        # A single seed has no spread: its NaN std is drawn as no error bar.
        acc_mean, acc_std = np.nan_to_num(np.array([mean_std(a) for a in acc]).T)
        pass_mean, pass_std = np.nan_to_num(np.array([mean_std(p) for p in passes]).T)
        ax.bar(x - 0.2, acc_mean, 0.4, yerr=acc_std, label="greedy accuracy")
        ax.bar(x + 0.2, pass_mean, 0.4, yerr=pass_std, label="pass@k")
        ax.set_xticks(x, labels, rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{mix}: final, mean over levels (± std over seeds)")
        ax.set_ylabel("%")
        ax.set_ylim(0, 1.2 * max(pass_mean + pass_std))
        ax.legend(fontsize=8, loc="upper center", ncols=2)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)


def table(runs: dict[str, list]) -> str:
    """Markdown: per estimator, mean ± std over seeds of the final accuracy and pass@k (mean over
    levels), raw and effective ACR and token entropy (means over steps), and the paired accuracy
    difference to grpo (mean ± standard error over seeds)."""

    def over_steps(frames: list, column: str) -> np.ndarray:
        return np.array([frame[column].dropna().mean() for frame in frames])

    rows = []
    for label, frames in runs.items():
        acc = final(frames, "eval/acc_mean")
        passes = np.mean([final(frames, c) for c in pass_column(frames[0])], axis=0)
        gain = paired_by_seed(frames, runs["grpo"], lambda frame: final_value(frame, "eval/acc_mean"))
        delta = "—" if label == "grpo" else paired_difference(gain).cell(1)
        rows.append(
            [
                f"`{label}`",
                mean_std_cell(acc, 1),
                mean_std_cell(passes, 1),
                delta,
                *(mean_std_cell(over_steps(frames, c), 3) for c in ("acr/rate", "acr/effective", "actor/entropy")),
            ]
        )
    header = [
        "estimator",
        "accuracy (%)",
        "pass@k (%)",
        "Δ accuracy vs grpo (paired)",
        "raw ACR",
        "effective ACR",
        "entropy",
    ]
    return render_table(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="the --out folder of benchmarks/sandbox_study.sh")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    args = parser.parse_args(argv)
    mixes = {mix.name: load(mix) for mix in sorted(args.study.iterdir()) if (mix / "runs").is_dir()}
    args.out.mkdir(parents=True, exist_ok=True)
    bar_chart(mixes, args.out / "final_accuracy.png")
    for mix, runs in mixes.items():
        verifier = {label: frames for label, frames in runs.items() if label not in ("intuitor", "rent")}
        plot_metrics(
            verifier,
            ["acr/rate", "acr/effective"],
            args.out / f"{mix}_acr.png",
            f"{mix}: advantage collapse (mean over seeds, 5-step rolling mean)",
            "fraction of groups",
            smooth=5,
            column_labels={"acr/rate": "raw ACR", "acr/effective": "effective ACR"},
            band=False,
        )
        plot_metrics(
            runs,
            ["eval/acc_mean"],
            args.out / f"{mix}_accuracy.png",
            f"{mix}: held-out greedy accuracy, mean over levels (band: ± std over seeds)",
            "accuracy",
        )
        plot_metrics(
            runs,
            ["actor/entropy"],
            args.out / f"{mix}_entropy.png",
            f"{mix}: token entropy of the sampling policy (5-step rolling mean)",
            "nats",
            smooth=5,
            band=False,
        )
        print(f"## {mix}\n\n{table(runs)}\n")
    print(f"wrote {', '.join(sorted(p.name for p in args.out.glob('*.png')))} under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
