"""The sandbox's calibration (docs/sandbox_calibration.md): GRPO runs of named settings x seeds, one row
per run in a CSV, and the table that decides whether the setting is an instrument that sees learning
(issue "An instrument that sees learning").

``run SETTING --seeds ...`` trains GRPO on ``SETTING`` (:data:`SETTINGS`: overrides of the sandbox's
defaults, ``SandboxConfig``) for each seed, one after the other on one thread, and appends one row per
run to ``--csv`` (replaced atomically; a row of the same setting and seed is replaced): the held-out
greedy accuracy at step 0 (``acc_0``), its final (the mean of the last five evaluations), at the
half-way evaluation, the sampled accuracy (mean@8) and pass@8 at the start and the end, the raw ACR
over the run, the seconds the run took (its warm-up included where it was not cached) and the curve.

``report`` prints, per setting: the seeds, mean start and final, the gain (final − start, mean over
seeds, with the lower end of its two-sided 95% t interval), the mean curve's gain at half-way as a share
of its final gain, the seed SD of the final, the mean raw ACR, mean@8 start and end, seconds per run.

Usage: python benchmarks/sandbox_calibration.py run disjoint --seeds 1000 1001
       python benchmarks/sandbox_calibration.py report
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from verl_avspo.sandbox.kernels import pin_kernels

pin_kernels()  # before torch loads, as the `verl-avspo sandbox` command does

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from rollouts_saved_report import LAST_EVALUATIONS  # noqa: E402

from verl_avspo.core.files import write_text  # noqa: E402
from verl_avspo.sandbox.config import SandboxConfig  # noqa: E402
from verl_avspo.sandbox.estimators import parse_estimators  # noqa: E402
from verl_avspo.sandbox.loop import evaluate, train  # noqa: E402
from verl_avspo.sandbox.policy import CharTokenizer, build_model, supervised_warm_up  # noqa: E402
from verl_avspo.sandbox.task import ArithmeticTask, parse_levels  # noqa: E402
from verl_avspo.tools.logs import read_metrics  # noqa: E402
from verl_avspo.tools.seed_stats import paired_t  # noqa: E402
from verl_avspo.tools.stats import window_mean  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "docs" / "results" / "sandbox_calibration.csv"

# The sandbox's defaults before the calibration (make demo at 80cafa3), which every setting of SETTINGS
# overrides; the warm-up's own pool and the sampler's KV cache, which have no switch, are in all of them. Every
# default a calibration changed is pinned here, so that a setting means what it meant when its rows were run.
BEFORE: dict = {
    "levels": "1+1,2+1,2+2,2*1",
    "steps": 60,
    "prompts_per_step": 16,
    "group_size": 8,
    "lr": 2e-4,
    "lr_warmup_steps_ratio": 0.0,
    "eval_size": 64,
    "eval_every": 5,
    "policy": {"sft_steps": 1000},
}

# Every setting tried, in the order tried, as overrides of BEFORE (``policy``: of PolicyConfig()). Never
# edit a setting that has rows in the CSV: add a new name.
SETTINGS: dict[str, dict] = {
    # The demo's levels, 200 held-out problems where a level has them, 150 steps evaluated every 10.
    "demo_disjoint_150": {"eval_size": 200, "steps": 150, "eval_every": 10},
    # A shorter warm-up: more room between greedy accuracy and pass@8.
    "demo_disjoint_150_sft500": {"eval_size": 200, "steps": 150, "eval_every": 10, "policy": {"sft_steps": 500}},
    "demo_disjoint_150_lr5e-4": {"eval_size": 200, "steps": 150, "eval_every": 10, "lr": 5e-4},
    # Without 1+1 (100 problems: 20 held out, each 1.25 points of the mean).
    "three_150": {"levels": "2+1,2+2,2*1", "eval_size": 200, "steps": 150, "eval_every": 10},
    # A slower rate over more steps; groups of 16.
    "demo_disjoint_300_lr1e-4": {"eval_size": 200, "steps": 300, "eval_every": 20, "lr": 1e-4},
    "demo_disjoint_150_g16": {"eval_size": 200, "steps": 150, "eval_every": 10, "group_size": 16},
    "sft500_g16_200": {
        "eval_size": 200,
        "steps": 200,
        "eval_every": 10,
        "group_size": 16,
        "policy": {"sft_steps": 500},
    },
    # Groups of 16 for 32 prompts a step; a larger policy (4 layers x 128).
    "demo_disjoint_150_g16_p32": {
        "eval_size": 200,
        "steps": 150,
        "eval_every": 10,
        "group_size": 16,
        "prompts_per_step": 32,
    },
    "big_150_g16": {
        "eval_size": 200,
        "steps": 150,
        "eval_every": 10,
        "group_size": 16,
        "lr": 1e-4,
        "policy": {"hidden_size": 128, "num_layers": 4, "intermediate_size": 512},
    },
    # Groups of 16 at half the rate: slower, to keep rising past half-way.
    "demo_disjoint_150_g16_lr1e-4": {"eval_size": 200, "steps": 150, "eval_every": 10, "group_size": 16, "lr": 1e-4},
    # The first calibration's kept setting (demo_disjoint_150_g16) as the defaults were then, validated on seeds
    # 2000-2009 (rows named "defaults" and "defaults_epochs" until the second calibration changed the defaults).
    "defaults_150": {"eval_size": 200, "steps": 150, "eval_every": 10, "group_size": 16},
    "defaults_150_epochs": {"eval_size": 200, "steps": 150, "eval_every": 10, "group_size": 16, "train_set": 160},
    # The warm-up probe (``warm-up``): the rule levels alone, greedy accuracy, mean@8 and pass@8 along it.
    "rules4_probe": {"levels": "2+2,3+2,3+3,2*1", "eval_size": 200, "policy": {"sft_steps": 1500}},
    # Second calibration (after the validation of the defaults above): a shorter warm-up leaves more room
    # between greedy accuracy and pass@8; more steps to use it.
    "sft500_g16_300": {
        "eval_size": 200,
        "steps": 300,
        "eval_every": 20,
        "group_size": 16,
        "policy": {"sft_steps": 500},
    },
    # Its epochs mode over a fixed set that a small level no longer caps (task.level_shares): 960 prompts
    # (40 of 1+1, the rest even), each seen 5 times in 300 x 16 draws; 480, each 10 times.
    "sft500_g16_300_epochs960": {
        "eval_size": 200,
        "steps": 300,
        "eval_every": 20,
        "group_size": 16,
        "train_set": 960,
        "policy": {"sft_steps": 500},
    },
    "sft500_g16_300_epochs480": {
        "eval_size": 200,
        "steps": 300,
        "eval_every": 20,
        "group_size": 16,
        "train_set": 480,
        "policy": {"sft_steps": 500},
    },
    # Half the rate, to keep sft700_g16_300's curve rising past half-way; and 3+1 in place of 2*1, which RL
    # never moved (11-14% greedy from start to end in every run above): a level that needs the addition rule.
    "sft700_g16_300_lr1e-4": {
        "eval_size": 200,
        "steps": 300,
        "eval_every": 20,
        "group_size": 16,
        "lr": 1e-4,
        "policy": {"sft_steps": 700},
    },
    "add4_sft700_g16_300": {
        "levels": "1+1,2+1,2+2,3+1",
        "eval_size": 200,
        "steps": 300,
        "eval_every": 20,
        "group_size": 16,
        "policy": {"sft_steps": 700},
    },
    # sft700_g16_300's epochs mode over 480 prompts (40 of 1+1, 147 a level else): each seen 10 times.
    "sft700_g16_300_epochs480": {
        "eval_size": 200,
        "steps": 300,
        "eval_every": 20,
        "group_size": 16,
        "train_set": 480,
        "policy": {"sft_steps": 700},
    },
    # After the second validation: 8 prompts a step, half the data per update, to keep the curve rising past
    # half-way at half the cost of a step.
    "sft700_g16_p8_300": {
        "eval_size": 200,
        "steps": 300,
        "eval_every": 20,
        "group_size": 16,
        "prompts_per_step": 8,
        "policy": {"sft_steps": 700},
    },
    # A third of the rate: slower still, for the curve to rise past half-way.
    "sft700_g16_300_lr7e-5": {
        "eval_size": 200,
        "steps": 300,
        "eval_every": 20,
        "group_size": 16,
        "lr": 7e-5,
        "policy": {"sft_steps": 700},
    },
    "sft700_g16_300": {
        "eval_size": 200,
        "steps": 300,
        "eval_every": 20,
        "group_size": 16,
        "policy": {"sft_steps": 700},
    },
    # Third calibration: the rate ramped up from 0 over the first steps (verl's lr_warmup_steps_ratio), so that the
    # fast early gains (1+1's 40 RL prompts, learned in 40 steps at any constant rate) come later.
    "sft700_g16_300_warm150": {
        "eval_size": 200,
        "steps": 300,
        "eval_every": 20,
        "group_size": 16,
        "lr_warmup_steps_ratio": 0.5,
        "policy": {"sft_steps": 700},
    },
    # The ramp over longer runs, so that the plateau the constant rate reaches by step 180 falls in the last
    # five evaluations: warm150 gained 15.6 over 300 steps (the constant rate 17.8) with a half-way share of 0.76.
    "sft700_g16_360_warm150": {
        "eval_size": 200,
        "steps": 360,
        "eval_every": 20,
        "group_size": 16,
        "lr_warmup_steps_ratio": 150 / 360,
        "policy": {"sft_steps": 700},
    },
    "sft700_g16_400_warm200": {
        "eval_size": 200,
        "steps": 400,
        "eval_every": 20,
        "group_size": 16,
        "lr_warmup_steps_ratio": 0.5,
        "policy": {"sft_steps": 700},
    },
    # sft700_g16_360_warm150's epochs mode over 480 prompts (each seen 12 times).
    "sft700_g16_360_warm150_epochs480": {
        "eval_size": 200,
        "steps": 360,
        "eval_every": 20,
        "group_size": 16,
        "lr_warmup_steps_ratio": 150 / 360,
        "train_set": 480,
        "policy": {"sft_steps": 700},
    },
    # Larger sets, each prompt seen 8 and 6 times: the 480-prompt set was fitted by half-way (share 0.94, 1.01).
    "sft700_g16_360_warm150_epochs720": {
        "eval_size": 200,
        "steps": 360,
        "eval_every": 20,
        "group_size": 16,
        "lr_warmup_steps_ratio": 150 / 360,
        "train_set": 720,
        "policy": {"sft_steps": 700},
    },
    "sft700_g16_360_warm150_epochs960": {
        "eval_size": 200,
        "steps": 360,
        "eval_every": 20,
        "group_size": 16,
        "lr_warmup_steps_ratio": 150 / 360,
        "train_set": 960,
        "policy": {"sft_steps": 700},
    },
    # After the third validation (epochs mode at 960: half-way share 0.850008, at the limit): the largest set that
    # 360 x 16 draws visit 5 times.
    "sft700_g16_360_warm150_epochs1152": {
        "eval_size": 200,
        "steps": 360,
        "eval_every": 20,
        "group_size": 16,
        "lr_warmup_steps_ratio": 150 / 360,
        "train_set": 1152,
        "policy": {"sft_steps": 700},
    },
    # After the 1152-prompt validation (half-way share 0.88): prompts that recur are learned sooner, so the epochs
    # mode's rise comes earlier than the default mode's at the same ramp; a longer ramp over 960 prompts.
    "sft700_g16_360_warm180_epochs960": {
        "eval_size": 200,
        "steps": 360,
        "eval_every": 20,
        "group_size": 16,
        "lr_warmup_steps_ratio": 0.5,
        "train_set": 960,
        "policy": {"sft_steps": 700},
    },
    "sft700_g16_360_warm216_epochs960": {
        "eval_size": 200,
        "steps": 360,
        "eval_every": 20,
        "group_size": 16,
        "lr_warmup_steps_ratio": 0.6,
        "train_set": 960,
        "policy": {"sft_steps": 700},
    },
    # Half the rate over half again as many steps: lr1e-4's curve still rose at step 280.
    "sft700_g16_450_lr1e-4": {
        "eval_size": 200,
        "steps": 450,
        "eval_every": 30,
        "group_size": 16,
        "lr": 1e-4,
        "policy": {"sft_steps": 700},
    },
}

# The second calibration's validation (seeds 3000-3009) of its kept setting and epochs mode, rows named "defaults"
# and "defaults_epochs" until the third calibration changed the defaults.
SETTINGS["defaults_300"] = SETTINGS["sft700_g16_300"]
SETTINGS["defaults_300_epochs"] = SETTINGS["sft700_g16_300_epochs480"]

# The settings at the sandbox's defaults as they are now (sft700_g16_360_warm150, kept by the third calibration),
# as overrides of SandboxConfig(): the validation seeds, and the epochs modes validated: 960 prompts (40 of 1+1,
# 306-307 a level else; each seen 6 times), then 1152 (each seen 5 times), the one kept.
AT_DEFAULTS: dict[str, dict] = {
    "defaults": {},
    "defaults_epochs960": {"train_set": 960},
    "defaults_epochs1152": {"train_set": 1152},
}

MEASURES = ["acc_0", "final", "gain", "acc_half", "acr", "mean8_0", "mean8_final", "pass8_0", "seconds"]


def config_of(name: str) -> SandboxConfig:
    if name in AT_DEFAULTS:
        return replace(SandboxConfig(), **AT_DEFAULTS[name])
    overrides = {**BEFORE, **SETTINGS[name]}
    defaults = SandboxConfig()
    policy = replace(defaults.policy, **{**BEFORE["policy"], **SETTINGS[name].get("policy", {})})
    return replace(defaults, **{**overrides, "policy": policy})


def measure(frame: pd.DataFrame, steps: int) -> dict[str, float]:
    """One run's row from its metrics (read_metrics: one row per step)."""
    evals = frame.dropna(subset=["eval/acc_mean"])
    acc = evals["eval/acc_mean"] * 100
    half = acc.index[acc.index >= steps / 2][0]
    final = window_mean(acc, LAST_EVALUATIONS)  # the studies' final accuracy (rollouts_saved_report.run_row)
    return {
        "acc_0": acc.iloc[0],
        "final": final,
        "gain": final - acc.iloc[0],
        "acc_half": acc[half],
        "acr": frame["acr/rate"].mean(),
        "mean8_0": evals["eval/mean@8_mean"].iloc[0] * 100,
        "mean8_final": window_mean(evals["eval/mean@8_mean"], LAST_EVALUATIONS) * 100,
        "pass8_0": evals.filter(like="eval/pass@8_level").iloc[0].mean() * 100,
        "curve": " ".join(f"{step}={value:.2f}" for step, value in acc.items()),
    }


def run(name: str, seeds: list[int], csv: Path, cache_dir: Path, logs: Path) -> None:
    config = config_of(name)
    (grpo,) = parse_estimators("grpo")
    rows = []
    for seed in seeds:
        log = logs / name / f"seed{seed}.jsonl"
        started = time.monotonic()
        train(config, grpo, seed, log, cache_dir)
        seconds = time.monotonic() - started
        row = {"setting": name, "seed": seed, "steps": config.steps, **measure(read_metrics(log), config.steps)}
        row["seconds"] = seconds
        rows.append(row)
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        old = pd.read_csv(csv) if csv.exists() else pd.DataFrame(columns=["setting", "seed"])
        old = old[~((old["setting"] == name) & (old["seed"] == seed))]
        table = pd.concat([old, pd.DataFrame([row])], ignore_index=True)
        write_text(csv, table.to_csv(index=False, float_format="%.3f"))


def warm_up_curve(name: str, every: int) -> None:
    """Print the held-out greedy accuracy, mean@8 and pass@8 per level along the setting's warm-up, every
    ``every`` steps: where to stop it (pass@8 far above greedy accuracy, as a pretrained LLM's)."""
    config = config_of(name)
    task = ArithmeticTask(parse_levels(config.levels), config.eval_size, config.warm_up_share)
    tokenizer = CharTokenizer()
    model = build_model(config.policy, tokenizer)
    names = [level.name for level in task.levels]
    print("| step | " + " | ".join(f"{n} greedy / mean@8 / pass@8" for n in names) + " |", flush=True)

    def show(step: int) -> None:
        if step % every:
            return
        model.eval()
        metrics = evaluate(model, tokenizer, task, config.pass_k, 0)
        model.train()
        cells = [
            " / ".join(f"{100 * metrics[f'eval/{m}_level_{i + 1}']:.0f}" for m in ("acc", "mean@8", "pass@8"))
            for i in range(len(names))
        ]
        print(f"| {step} | " + " | ".join(cells) + " |", flush=True)

    supervised_warm_up(model, tokenizer, task, config.policy, after_step=show)


def report(csv: Path) -> str:
    table = pd.read_csv(csv)
    lines = [
        "| setting | seeds | start | final | gain (95% low) | half-way share | SD final | raw ACR | mean@8 start→end "
        "| s/run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in table.groupby("setting", sort=False):
        n = len(runs)
        gain = runs["gain"].mean()
        # A single seed has no interval and no spread.
        low = f" ({paired_t(runs['gain'].to_numpy())['ci_low']:+.1f})" if n > 1 else ""
        spread = f"{runs['final'].std(ddof=1):.1f}" if n > 1 else "–"
        half = (runs["acc_half"] - runs["acc_0"]).mean() / gain if gain else float("nan")
        seeds = f"{runs['seed'].min()}–{runs['seed'].max()} ({n})" if n > 1 else f"{runs['seed'].min()}"
        lines.append(
            f"| {name} | {seeds} | {runs['acc_0'].mean():.1f} | {runs['final'].mean():.1f} | {gain:+.1f}{low} "
            f"| {half:.2f} | {spread} | {runs['acr'].mean():.2f} "
            f"| {runs['mean8_0'].mean():.1f}→{runs['mean8_final'].mean():.1f} | {runs['seconds'].median():.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="train GRPO on a setting for each seed and add the rows to the CSV")
    run_parser.add_argument("setting", choices=sorted({**SETTINGS, **AT_DEFAULTS}))
    run_parser.add_argument("--seeds", type=int, nargs="+", required=True)
    run_parser.add_argument("--cache-dir", type=Path, default=Path("runs/sandbox_cache"))
    run_parser.add_argument("--logs", type=Path, default=Path("runs/calibration"), help="the runs' JSONL logs")
    curve_parser = sub.add_parser("warm-up", help="print the held-out accuracies along a setting's warm-up")
    curve_parser.add_argument("setting", choices=sorted({**SETTINGS, **AT_DEFAULTS}))
    curve_parser.add_argument("--every", type=int, default=100)
    for command in (run_parser, sub.add_parser("report", help="print the table of the CSV")):
        command.add_argument("--csv", type=Path, default=CSV)
    args = parser.parse_args(argv)
    if args.command == "warm-up":
        torch.set_num_threads(1)
        warm_up_curve(args.setting, args.every)
        return 0
    if args.command == "run":
        torch.set_num_threads(1)
        run(args.setting, args.seeds, args.csv, args.cache_dir, args.logs)
    print(report(args.csv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
