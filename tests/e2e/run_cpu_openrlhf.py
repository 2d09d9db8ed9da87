"""Train a tiny random Qwen2 with OpenRLHF's real Ray PPO loop on this machine's CPU, and print what it logged.

    python tests/e2e/run_cpu_openrlhf.py                  # python -m verl_avspo.openrlhf, avspo, 4 steps
    python tests/e2e/run_cpu_openrlhf.py --stock          # python -m openrlhf.cli.train_ppo_ray, group_norm
    python tests/e2e/run_cpu_openrlhf.py -- --acr.alert.threshold 0 --acr.alert.window 2

Everything after ``--`` is passed on to the launcher (OpenRLHF's flags, ``--avspo.*`` and ``--acr.*``). The work
folder (``--out``) keeps the model, prompts, checkpoints, the final model, OpenRLHF's TensorBoard log
and the console log of the run. See ``openrlhf_cpu`` for how OpenRLHF is made to run on CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from openrlhf_cpu.launch import AVSPO_ENTRY, OPENRLHF_ENTRY, PROMPTS_PER_STEP, TinyRun  # noqa: E402

COLUMNS = ("acr/rate", "acr/effective", "avspo/threshold", "avspo/triggered", "rollout/reward_mean", "policy_loss")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a new temporary one)")
    parser.add_argument("--steps", type=int, default=4, help="training steps (default: 4)")
    parser.add_argument("--stock", action="store_true", help="run OpenRLHF's own train_ppo_ray instead of our launcher")
    parser.add_argument("arguments", nargs="*", help="more launcher arguments, after --")
    args = parser.parse_args(argv)

    workdir = args.out or Path(tempfile.mkdtemp(prefix="openrlhf_cpu_ppo_"))
    run = TinyRun.prepare(workdir, num_prompts=PROMPTS_PER_STEP * args.steps)
    entry = OPENRLHF_ENTRY if args.stock else AVSPO_ENTRY
    arguments = ["--algo.advantage.estimator", "group_norm" if args.stock else "avspo", *args.arguments]
    print(f"python -m {entry} {' '.join(arguments)}  (+ the harness arguments in openrlhf_cpu/launch.py)")
    print(f"work folder: {workdir}; console log: {workdir / 'run.log'}")
    result = run.launch(entry, arguments)
    if result.returncode != 0:
        print(f"the run failed (exit {result.returncode}); the end of its log:", file=sys.stderr)
        print(run.log()[-4000:], file=sys.stderr)
        return result.returncode
    scalars = {tag.removeprefix("train/"): dict(values) for tag, values in run.scalars().items()}
    print("step  " + "  ".join(f"{column:>19}" for column in COLUMNS))
    for step in sorted(scalars.get("policy_loss", {})):
        values = [scalars.get(column, {}).get(step) for column in COLUMNS]
        print(f"{step:>4}  " + "  ".join(f"{v:19.4f}" if v is not None else f"{'-':>19}" for v in values))
    checkpoints = sorted(p.name for p in (workdir / "ckpt" / "_actor").glob("global_step*"))
    print(f"checkpoints: {', '.join(checkpoints) or 'none'}; final model: {workdir / 'final'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
