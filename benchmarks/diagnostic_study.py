"""The paper's diagnostic claims, tested in the CPU sandbox (docs/diagnostics_results.md).

A grid of GRPO runs over the paper's three factors (difficulty mix x group size G x sampling
temperature, several seeds). For each run: ACR over the first fifth of the steps (the sandbox's
ACR_100: the paper's 100 of 500 steps), its all-correct and all-wrong parts, the initial and
final held-out accuracy and the gain. Then

- line fits and R² of final accuracy, and of the gain, against each early-ACR measure, beside
  the paper's R² = 0.617 (acc ≈ 51.4 − 29.6·ACR_100);
- precision and recall of each stall rule of ``algorithm.acr.alert.rule`` (run over the logs by
  ``core.alert.stalled_steps``, the monitor the trainers use) against runs whose accuracy stalled.

Usage:
    python benchmarks/diagnostic_study.py --out runs/diagnostics             # run the grid, then analyse
    python benchmarks/diagnostic_study.py --out runs/diagnostics --analyse   # analyse existing logs only
    python benchmarks/diagnostic_study.py ... --figures docs/diagnostics     # also write the plots there
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import time
from pathlib import Path

import matplotlib

from verl_avspo.sandbox.kernels import pin_kernels

pin_kernels()  # the sandbox's one code path (verl_avspo/sandbox/kernels.py): before torch loads
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from verl_avspo.core.alert import ALERT_SIGNALS, stalled_steps  # noqa: E402
from verl_avspo.core.config import AlertConfig  # noqa: E402
from verl_avspo.tools.logs import read_metrics  # noqa: E402
from verl_avspo.tools.markdown import render_table  # noqa: E402
from verl_avspo.tools.plots import save_png  # noqa: E402
from verl_avspo.tools.stats import early_acr, early_window  # noqa: E402

MIXES = {"easy": "1+1,2+1,1*1", "default": "1+1,2+1,2+2,2*1", "hard": "2+2,2*1,3+2,1+1"}
PAPER_R2 = 0.617
# A run "stalled" when its held-out accuracy rose by less than this over the run (points): about
# the binomial standard error of a mean over 3-4 levels of 64 problems.
STALL_GAIN = 3.0
PREDICTORS = {"acr_early": "raw ACR", "all_wrong_early": "all-wrong ACR", "all_correct_early": "all-correct ACR"}


def run_name(mix: str, group_size: int, temperature: float, seed: int) -> str:
    return f"{mix}_G{group_size}_T{temperature:g}_seed{seed}"


def run_grid(args: argparse.Namespace) -> None:
    from verl_avspo.sandbox.config import SandboxConfig
    from verl_avspo.sandbox.estimators import parse_estimators
    from verl_avspo.sandbox.loop import train

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    (grpo,) = parse_estimators("grpo")
    grid = list(itertools.product(args.mixes, args.group_sizes, args.temperatures, range(args.seeds)))
    started = time.monotonic()
    for mix, group_size, temperature, seed in grid:
        log = args.out / "runs" / f"{run_name(mix, group_size, temperature, seed)}.jsonl"
        if log.exists() and len(log.read_text().splitlines()) == args.steps + 1:
            continue  # already done: the grid resumes
        config = SandboxConfig(
            levels=MIXES[mix],
            steps=args.steps,
            group_size=group_size,
            temperature=temperature,
            eval_every=args.eval_every,
            pass_k=1,  # the study reads greedy accuracy only
        )
        train(config, grpo, seed, log, args.cache_dir)
    print(f"{len(grid)} runs in {args.out / 'runs'} ({time.monotonic() - started:.0f} s this call)")


def run_statistics(frame: pd.DataFrame, steps: int) -> dict[str, float]:
    first = early_window(steps)
    accuracy = frame["eval/acc_mean"].dropna()
    final = accuracy[accuracy.index > steps - steps // 5]  # evaluations in the last fifth
    return {
        "acr_early": early_acr(frame["acr/rate"], first).mean,
        "all_wrong_early": early_acr(frame["acr/all_wrong"], first).mean,
        "all_correct_early": early_acr(frame["acr/all_correct"], first).mean,
        "acr_mean": frame.loc[1:, "acr/rate"].mean(),
        "acc_initial": 100 * accuracy.loc[0],
        "acc_final": 100 * final.mean(),
        "gain": 100 * (final.mean() - accuracy.loc[0]),
    }


def fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares line y ≈ a + b·x and its R² (NaN where x does not vary)."""
    if np.ptp(x) == 0:
        return float(y.mean()), 0.0, float("nan")
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (intercept + slope * x)
    return float(intercept), float(slope), float(1 - residual.var() / y.var())


def rules(window: int, threshold: float) -> dict[str, AlertConfig]:
    return {rule: AlertConfig(window=window, threshold=threshold, rule=rule) for rule in ALERT_SIGNALS}


def precision_recall(fired: pd.Series, stalled: pd.Series) -> dict[str, float]:
    """Precision, recall, F1 and balanced accuracy (mean of recall and specificity: 0.5 for a rule
    that always fires, or never)."""
    hits = int((fired & stalled).sum())
    precision = hits / fired.sum() if fired.sum() else float("nan")
    recall = hits / stalled.sum() if stalled.sum() else float("nan")
    specificity = int((~fired & ~stalled).sum()) / (~stalled).sum() if (~stalled).sum() else float("nan")
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    return {
        "fired": int(fired.sum()),
        "hits": hits,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "balanced_accuracy": (recall + specificity) / 2,
    }


def analyse(args: argparse.Namespace) -> str:
    rows, logs = [], {}
    for log in sorted((args.out / "runs").glob("*.jsonl")):
        mix, group, temperature, seed = log.stem.split("_")
        frame = read_metrics(log)
        if frame.index.max() < args.steps:
            logging.warning("skipping %s: %s of %s steps (unfinished)", log.name, frame.index.max(), args.steps)
            continue
        logs[log.stem] = frame
        rows.append(
            {
                "run": log.stem,
                "mix": mix,
                "G": int(group[1:]),
                "T": float(temperature[1:]),
                "seed": int(seed[4:]),
                **run_statistics(frame, args.steps),
            }
        )
    table = pd.DataFrame(rows).set_index("run")
    table["stalled"] = table["gain"] < STALL_GAIN
    window = max(1, args.steps // 10)  # the paper's 50 of 500 steps
    for rule, config in rules(window, args.threshold).items():
        table[f"alert_{rule}"] = [
            any(stalled_steps(logs[name].loc[1:].to_dict("records"), config)) for name in table.index
        ]
    table.to_csv(args.out / "runs.csv")

    early = early_window(args.steps)
    lines = [f"{len(table)} GRPO runs, {args.steps} steps each; early window: steps 1–{early}.", ""]
    rows, fits = [], {}
    for outcome, label in (("acc_final", "final accuracy"), ("gain", "accuracy gain")):
        for predictor, name in PREDICTORS.items():
            a, b, r2 = fit(table[predictor].to_numpy(), table[outcome].to_numpy())
            fits[outcome, predictor] = (a, b, r2)
            rows.append([f"{label} (points)", f"{name}, first {early} steps", f"{a:.1f} {b:+.1f}·x", f"{r2:.3f}"])
    rows.append(["MATH-500 accuracy (paper)", "raw ACR_100", "51.4 − 29.6·x", f"{PAPER_R2}"])
    lines.append(render_table(["outcome", "predictor", "fit", "R²"], rows))
    # Within a mix every run starts from the same warmed-up policy, so the gain is the final
    # accuracy less a constant: one R² serves both.
    lines += ["", "Within one difficulty mix: R² of final accuracy (and of the gain), with the slope:", ""]
    rows = []
    for mix, part in table.groupby("mix"):
        cells = []
        for predictor in PREDICTORS:
            _, slope, r2 = fit(part[predictor].to_numpy(), part["acc_final"].to_numpy())
            cells.append(f"{r2:.2f} ({slope:+.1f}·x)")
        rows.append([mix, f"{len(part)}", *cells])
    lines.append(render_table(["mix", "runs", *PREDICTORS.values()], rows))
    lines += ["", f"Stalled runs (gain < {STALL_GAIN:g} points): {int(table['stalled'].sum())} of {len(table)}.", ""]
    rows, scores = [], {}
    table["alert_always"] = True  # the reference: a rule that fires on every run
    for rule in [*ALERT_SIGNALS, "always"]:
        pr = precision_recall(table[f"alert_{rule}"], table["stalled"])
        scores[rule] = pr
        name = f"`{rule}`" if rule in ALERT_SIGNALS else "(fires on every run)"
        rows.append(
            [name, f"{pr['fired']}", *(f"{pr[key]:.2f}" for key in ("precision", "recall", "f1", "balanced_accuracy"))]
        )
    header = [f"rule (threshold {args.threshold:g}, window {window})", "fired", "precision", "recall", "F1"]
    lines.append(render_table([*header, "balanced accuracy"], rows))
    thresholds = np.round(np.arange(0.35, 0.951, 0.05), 2)
    lines += ["", f"F1 / balanced accuracy of each rule by threshold (window {window}):", ""]
    rows, sweep = [], {}
    for rule in ALERT_SIGNALS:
        row = []
        for threshold in thresholds:
            config = AlertConfig(window=window, threshold=float(threshold), rule=rule)
            fired = pd.Series(
                [any(stalled_steps(logs[name].loc[1:].to_dict("records"), config)) for name in table.index],
                index=table.index,
            )
            row.append(precision_recall(fired, table["stalled"]))
        sweep[rule] = dict(zip(thresholds.tolist(), row, strict=True))
        rows.append([f"`{rule}`", *(f"{v['f1']:.2f} / {v['balanced_accuracy']:.2f}" for v in row)])
    lines.append(render_table(["rule", *(f"{t:g}" for t in thresholds)], rows))
    lines += ["", "Sensitivity of F1 to the stall definition (gain below N points):", ""]
    rows = []
    for gain in (2.0, 3.0, 5.0):
        stalled = table["gain"] < gain
        f1 = [precision_recall(table[f"alert_{r}"], stalled)["f1"] for r in ALERT_SIGNALS]
        rows.append([f"{gain:g}", f"{int(stalled.sum())}", *(f"{v:.2f}" for v in f1)])
    lines.append(render_table(["N", "stalled", *(f"`{r}`" for r in ALERT_SIGNALS)], rows))
    lines += ["", "Means by factor:", ""]
    for factor in ("mix", "G", "T"):
        columns = ["acr_early", "all_wrong_early", "all_correct_early", "acc_final", "gain"]
        means = table.groupby(factor)[columns].mean()
        rows = [[f"{key}", *(f"{v:.3f}" for v in row)] for key, row in means.iterrows()]
        lines += [render_table([factor, *columns], rows), ""]
    report = "\n".join(lines)
    (args.out / "analysis.md").write_text(report)
    (args.out / "fits.json").write_text(
        json.dumps({f"{o}~{p}": v for (o, p), v in fits.items()} | {"rules": scores, "sweep": sweep}, indent=2)
    )
    if args.figures:
        plot(table, fits, args.figures, early)
    return report


def plot(table: pd.DataFrame, fits: dict, folder: Path, early: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    colours = {"easy": "tab:green", "default": "tab:blue", "hard": "tab:red"}
    for outcome, label in (("acc_final", "final greedy accuracy (%)"), ("gain", "accuracy gain over the run (points)")):
        figure, axes = plt.subplots(1, len(PREDICTORS), figsize=(4.2 * len(PREDICTORS), 3.6), sharey=True)
        for axis, (predictor, name) in zip(axes, PREDICTORS.items(), strict=True):
            for mix, part in table.groupby("mix"):
                axis.scatter(part[predictor], part[outcome], s=14 + part["G"], c=colours.get(mix), label=mix, alpha=0.7)
            a, b, r2 = fits[outcome, predictor]
            xs = np.linspace(table[predictor].min(), table[predictor].max(), 2)
            axis.plot(xs, a + b * xs, "k--", lw=1)
            axis.set_title(f"{name}: R² = {r2:.2f}")
            axis.set_xlabel(f"{name}, first {early} steps")
        axes[0].set_ylabel(label)
        axes[0].legend(title="mix (size: G)", fontsize=8)
        figure.tight_layout()
        save_png(figure, folder / f"{outcome}_vs_early_acr.png", dpi=110)
        plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/diagnostics"))
    parser.add_argument("--figures", type=Path, default=None, help="also write the plots to this folder")
    parser.add_argument("--analyse", action="store_true", help="analyse the existing logs only")
    parser.add_argument("--mixes", type=lambda s: s.split(","), default=list(MIXES))
    parser.add_argument("--group-sizes", type=lambda s: [int(v) for v in s.split(",")], default=[4, 8, 16])
    parser.add_argument("--temperatures", type=lambda s: [float(v) for v in s.split(",")], default=[0.7, 1.0, 1.4])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--threshold", type=float, default=0.35, help="the stall rules' threshold (paper: 0.35)")
    parser.add_argument("--cache-dir", type=Path, default=Path("runs/sandbox_cache"))
    args = parser.parse_args()
    if not args.analyse:
        run_grid(args)
    print(analyse(args))


if __name__ == "__main__":
    main()
