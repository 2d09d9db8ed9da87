"""Train a tiny random Qwen2 with verl's real PPO loop on this machine's CPU, and print what it logged.

    python tests/e2e/run_cpu_ppo.py                       # python -m verl_avspo.main_ppo, avspo, 3 steps
    python tests/e2e/run_cpu_ppo.py --stock               # python -m verl.trainer.main_ppo (estimator only)
    python tests/e2e/run_cpu_ppo.py --device cuda         # on a GPU: verl's nvidia platform trains
    python tests/e2e/run_cpu_ppo.py --stock --mode avspo_sync  # stock main_ppo with our trainer
    python tests/e2e/run_cpu_ppo.py --mode colocate_async # any V1 trainer mode (separate_async: see launch.py)
    python tests/e2e/run_cpu_ppo.py -- algorithm.adv_estimator=grpo trainer.save_freq=1

Everything after ``--`` is passed on as Hydra overrides. The work folder (``--out``) keeps the model,
data, checkpoints, verl's JSONL metrics and the console log of the run. See ``verl_cpu`` for how
verl is made to run on CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from verl_cpu.launch import AVSPO_ENTRY, NUM_RANKS, VERL_ENTRY, TinyRun, separate_async_overrides  # noqa: E402

COLUMNS = ("acr/rate", "acr/effective", "avspo/threshold", "avspo/triggered", "critic/score/mean", "actor/pg_loss")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a new temporary one)")
    parser.add_argument("--steps", type=int, default=3, help="training steps (default: 3)")
    parser.add_argument("--stock", action="store_true", help="run verl's own main_ppo instead of our launcher")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where verl trains (cuda: one rank per GPU)"
    )
    parser.add_argument(
        "--mode",
        default="sync",
        help="trainer.v1.trainer_mode (default: sync; with --stock, avspo_sync etc. choose our trainer)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, after --")
    args = parser.parse_args(argv)

    workdir = args.out or Path(tempfile.mkdtemp(prefix="verl_cpu_ppo_"))
    num_ranks = torch.cuda.device_count() if args.device == "cuda" else NUM_RANKS
    if num_ranks == 0:
        parser.error("--device cuda: torch sees no CUDA device")
    run = TinyRun.prepare(workdir, num_ranks=num_ranks, device=args.device)
    entry = VERL_ENTRY if args.stock else AVSPO_ENTRY
    overrides = ["algorithm.adv_estimator=avspo", f"trainer.total_training_steps={args.steps}"]
    if args.stock:
        overrides.append("+algorithm.avspo.preset=paper")
    if args.mode.endswith("separate_async"):
        overrides += separate_async_overrides(num_ranks, args.device, args.mode)
    else:
        overrides.append(f"trainer.v1.trainer_mode={args.mode}")
    overrides += args.overrides
    print(f"python -m {entry} {' '.join(overrides)}  (+ the harness overrides in verl_cpu/launch.py)")
    print(f"work folder: {run.workdir}; console log: {run.workdir / 'metrics.log'}")
    result = run.launch(entry, overrides)
    if result.returncode != 0:
        print(f"the run failed (exit {result.returncode}); the end of its log:", file=sys.stderr)
        print((run.workdir / "metrics.log").read_text()[-4000:], file=sys.stderr)
        return result.returncode
    print("step  " + "  ".join(f"{column:>17}" for column in COLUMNS))
    for record in run.metrics():
        values = [record["data"].get(column) for column in COLUMNS]
        cells = [f"{value:17.4f}" if isinstance(value, (int, float)) else f"{'-':>17}" for value in values]
        print(f"{record['step']:>4}  " + "  ".join(cells))
    checkpoints = sorted(p.name for p in run.checkpoints.glob("global_step_*"))
    print(f"checkpoints: {', '.join(checkpoints) or 'none (set trainer.save_freq)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
