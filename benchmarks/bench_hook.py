"""What our trainer costs in stock verl: the CPU harness with verl's trainer and with ours, verl's stage timings
side by side.

Two runs of verl's unmodified ``python -m verl.trainer.main_ppo`` on the CPU harness of
``tests/e2e/verl_cpu`` (a tiny random Qwen2 on gloo FSDP ranks, Hugging Face ``generate`` as the
rollout server), with the same seed, data, model and overrides; the first with verl's trainer mode
(``--mode``), the second with ours for it (``trainer.v1.trainer_mode=avspo_<mode>``). They run one after the
other, not at once, so they do not compete for the cores.

Printed: for every ``timing_s/*`` stage verl logs, the mean over the measured steps (the first
``--warmup`` steps are left out: they include compilation and cache warm-up) of each run, and the
trainer's own ``timing_s/acr`` (the seconds our trainer spent measuring ACR, its TransferQueue reads
included, part of verl's ``timing_s/adv``) as a fraction of our run's ``timing_s/step``. The two runs' stage
times also differ by machine noise; our trainer's own time is the direct measure of its cost.

Usage:
    python benchmarks/bench_hook.py                       # grpo, sync, 8 steps, 2 left out
    python benchmarks/bench_hook.py --steps 12 --mode colocate_async
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from verl_cpu.launch import VERL_ENTRY, TinyRun  # noqa: E402

from verl_avspo.verl_plugin.trainer_modes import MODE_KEY, our_mode  # noqa: E402
from verl_avspo.verl_plugin.trainer_v1 import ACR_TIMING_KEY  # noqa: E402


def stage_means(records: list[dict], warmup: int) -> dict[str, float]:
    """Mean of every ``timing_s/*`` metric over the steps after ``warmup``."""
    measured = [record["data"] for record in records if record["step"] > warmup]
    keys = sorted({key for data in measured for key in data if key.startswith("timing_s/")})
    return {key: float(np.mean([data[key] for data in measured if key in data])) for key in keys}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the means")
    parser.add_argument("--ranks", type=int, default=1, help="FSDP ranks")
    parser.add_argument("--mode", default="sync", help="verl's trainer mode (sync or colocate_async)")
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one)")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides, after --")
    args = parser.parse_args(argv)

    workdir = args.out or Path(tempfile.mkdtemp(prefix="bench_hook_"))
    base = ["algorithm.adv_estimator=grpo", f"trainer.total_training_steps={args.steps}", *args.overrides]
    means = {}
    runs = (("without", f"{MODE_KEY}={args.mode}"), ("ours", f"{MODE_KEY}={our_mode(args.mode)}"))
    for name, mode in runs:
        run = TinyRun.prepare(workdir / name.replace(" ", "_"), num_ranks=args.ranks)
        result = run.launch(VERL_ENTRY, [*base, mode])
        if result.returncode != 0:
            print(f"the {name} run failed; see {run.workdir / 'metrics.log'}", file=sys.stderr)
            return result.returncode
        means[name] = stage_means(run.metrics(), args.warmup)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    print(
        f"verl main_ppo on the CPU harness, {args.ranks} rank(s), steps {args.warmup + 1}-{args.steps} of {args.steps} "
        f"(means), {' '.join(base)}; commit {commit.stdout.strip()}, {platform.machine()} {platform.processor() or ''} "
        f"with {len(os.sched_getaffinity(0))} cores"
    )
    keys = sorted(set(means["without"]) | set(means["ours"]))
    print(f"{'stage':<28}{'without (s)':>14}{'ours (s)':>16}")
    for key in keys:
        cells = [f"{means[name][key]:.4f}" if key in means[name] else "-" for name in ("without", "ours")]
        print(f"{key:<28}{cells[0]:>14}{cells[1]:>16}")
    hook, step = means["ours"][ACR_TIMING_KEY], means["ours"]["timing_s/step"]
    print(f"our trainer's own time: {hook * 1e3:.2f} ms a step, {100 * hook / step:.2f}% of its run's step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
