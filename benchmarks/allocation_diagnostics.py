"""Where the rollout allocator's rollouts went, per level, in one sandbox run: a diagnostic beside the
instrument study of docs/results.md (not registered, deciding nothing). It reruns one of the study's
``+alloc`` runs (same settings and seed, so the same run: its final accuracy is printed to check against the
study's CSV) and records, for every candidate prompt of every step, its level, the rollouts the allocator
planned, whether it got a pilot and whether the pilot was extended (a pilot extended is a prompt the history
predicted to collapse that did not), and the pass rate of each group trained on.

It prints, per level: candidates, the share given a pilot, the share of pilots extended, the rollouts beyond G
and the share of them that went to groups whose pass rate turned out within ``extra_band`` of 1/2; and the
share of all the run's rollouts that went beyond G.

Usage: python benchmarks/allocation_diagnostics.py --estimator grpo+alloc --seed 6000 [--train-set 960]
"""

from __future__ import annotations

import argparse
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from verl_avspo.core.run_tracker import RunTracker
from verl_avspo.sandbox.config import SandboxConfig
from verl_avspo.sandbox.estimators import parse_estimators
from verl_avspo.sandbox.loop import train
from verl_avspo.sandbox.sampling import group_sizes
from verl_avspo.sandbox.task import Level
from verl_avspo.tools.logs import read_metrics
from verl_avspo.tools.markdown import render_table
from verl_avspo.tools.stats import FINAL_EVALUATIONS, window_mean


def level_of(prompt: str) -> str:
    """The level's name (``2+1``) of a sandbox prompt (``12+7=``): the operands' digit counts and the operator."""
    for op in "+*":
        if op in prompt:
            left, right = prompt.rstrip("=").split(op)
            return Level(len(left), op, len(right)).name
    raise ValueError(f"not a sandbox prompt: {prompt!r}")


def record(config: SandboxConfig, estimator: str, seed: int, cache_dir: Path | None) -> tuple[pd.DataFrame, float]:
    """Train one run, recording every candidate: (step, level, planned rollouts, pilot, extended, trained, pass
    rate of its trained group or NaN). Returns the records and the run's final accuracy (points)."""
    (spec,) = parse_estimators(estimator)
    rows, step_plans = [], {}
    allocate, extend = RunTracker.allocate_prompts, RunTracker.extend_pilots

    def allocate_prompts(self, keys, group_size):
        plan = allocate(self, keys, group_size)
        step_plans["current"] = (list(keys), plan)
        return plan

    def extend_pilots(self, allocation, spread):
        added = extend(self, allocation, spread)
        step_plans["added"] = added
        return added

    def on_rollout(step, _model, batch):
        keys, plan = step_plans.pop("current")
        added = step_plans.pop("added")
        sizes = group_sizes(batch.uids)
        starts = torch.cumsum(sizes, 0) - sizes
        rates = iter((batch.scores[s : s + n].float().mean().item() for s, n in zip(starts, sizes, strict=True)))
        for key, rollouts, pilot, more in zip(
            keys, plan.rollouts.tolist(), plan.pilot.tolist(), added.tolist(), strict=True
        ):
            trained = rollouts > 0 and (not pilot or more > 0)
            rows.append(
                {
                    "step": step,
                    "level": level_of(key),
                    "rollouts": rollouts + more,
                    "pilot": pilot,
                    "extended": pilot and more > 0,
                    "trained": trained,
                    "pass_rate": next(rates) if trained else np.nan,
                }
            )

    # The loop's on_rollout sees only the groups trained on; the plan and the extensions are read by wrapping
    # the tracker's two allocator calls for this run (restored after it), which changes nothing they return.
    RunTracker.allocate_prompts, RunTracker.extend_pilots = allocate_prompts, extend_pilots
    try:
        with tempfile.TemporaryDirectory() as folder:
            log = Path(folder) / "run.jsonl"
            train(config, spec, seed, log, cache_dir, on_rollout=on_rollout)
            final = 100 * window_mean(read_metrics(log)["eval/acc_mean"], FINAL_EVALUATIONS)
    finally:
        RunTracker.allocate_prompts, RunTracker.extend_pilots = allocate, extend
    return pd.DataFrame(rows), final


def level_table(records: pd.DataFrame, group_size: int, band: float) -> str:
    """Per level and in all: where the pilots and the rollouts beyond G went."""
    groups = defaultdict(list)
    for level, part in [*records.groupby("level", sort=True), ("all", records)]:
        pilots = part[part["pilot"]]
        beyond = (part["rollouts"] - group_size).clip(lower=0)
        near_half = (part["pass_rate"] - 0.5).abs() <= band
        groups[level] = [
            f"{len(part):,}",
            f"{part['pilot'].mean():.3f}",
            f"{pilots['extended'].mean():.3f}" if len(pilots) else "—",
            f"{pilots.loc[pilots['extended'], 'pass_rate'].mean():.3f}" if pilots["extended"].any() else "—",
            f"{int(beyond.sum()):,}",
            f"{beyond[near_half].sum() / beyond.sum():.3f}" if beyond.sum() else "—",
            f"{part['rollouts'].sum():,}",
        ]
    header = [
        "level",
        "candidates",
        "share given a pilot",
        "share of pilots extended",
        "pass rate of extended pilots (G)",
        "rollouts beyond G",
        f"of them, in groups with pass rate within {band:g} of 1/2",
        "rollouts in all",
    ]
    return render_table(
        header, [[f"`{level}`" if level != "all" else "all", *cells] for level, cells in groups.items()]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--estimator", default="grpo+alloc", help="an +alloc arm, e.g. grpo+alloc=0.5")
    parser.add_argument("--seed", type=int, default=6000)
    parser.add_argument("--train-set", type=int, default=None, help="the epochs mode's training set (960)")
    parser.add_argument("--steps", type=int, default=SandboxConfig().steps)
    parser.add_argument("--cache-dir", type=Path, default=Path("runs/sandbox_cache"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    config = SandboxConfig(train_set=args.train_set, steps=args.steps)
    (spec,) = parse_estimators(args.estimator)
    if spec.budget_share is None:
        raise SystemExit(
            f"allocation_diagnostics: --estimator {args.estimator!r} has no allocator: use <estimator>+alloc"
        )
    records, final = record(config, args.estimator, args.seed, args.cache_dir)
    band = spec.prompt_allocation(args.seed, config.group_size).extra_band
    setting = "default" if args.train_set is None else f"epochs ({args.train_set})"
    print(f"`{args.estimator}`, {setting}, seed {args.seed}: final accuracy {final:.2f}%\n")
    print(level_table(records, config.group_size, band))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
