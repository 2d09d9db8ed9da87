"""Train a tiny random Qwen2 with TRL's GRPOTrainer and the adapter on this machine's CPU; print what it logged.

    python tests/e2e/run_cpu_trl.py                          # AVSPOGRPOTrainer, AVSPO (paper preset), 8 steps
    python tests/e2e/run_cpu_trl.py --estimator grpo         # TRL's own advantages, ACR measured
    python tests/e2e/run_cpu_trl.py --processes 2            # two accelerate CPU processes (gloo)
    python tests/e2e/run_cpu_trl.py --avspo preset=paper_code trigger_scope=batch --acr alert.window=2
    python tests/e2e/run_cpu_trl.py --dataset-size 6 --steps 12 --prompts skip.enable=true   # skip prompts

``--avspo``, ``--acr`` and ``--prompts`` take KEY=VALUE pairs (docs/configuration.md, docs/trl.md; a
dotted key is a nested one), the trainer's ``avspo=``, ``acr=`` and ``prompts=`` arguments. The work
folder (``--out``) keeps the model, the checkpoints (every 4 steps, with ``avspo_state.pt``), TRL's
``trainer_state.json`` and the console log.
Needs TRL: ``pip install 'verl-avspo[trl]'``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trl_cpu.harness import TinyAssets, launch  # noqa: E402

COLUMNS = ("acr/rate", "acr/all_wrong", "acr/effective", "frac_reward_zero_std", "avspo/threshold", "avspo/triggered")
COLUMNS += ("reward", "loss")
# Printed beside them with skipping on.
SKIP_COLUMNS = ("prompts/never_solved", "prompts/skipped", "prompts/reselected_cumulative")


def key_values(pairs: list[str]) -> dict:
    """``["alert.window=2", "preset=paper"]`` -> ``{"alert": {"window": 2}, "preset": "paper"}`` (values: YAML)."""
    settings: dict = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        *sections, name = key.split(".")
        target = settings
        for section in sections:
            target = target.setdefault(section, {})
        target[name] = yaml.safe_load(value)
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a new temporary one)")
    parser.add_argument("--steps", type=int, default=8, help="training steps (default: 8)")
    parser.add_argument("--estimator", choices=("avspo", "grpo"), default="avspo")
    parser.add_argument("--processes", type=int, default=1, help="processes (default: 1)")
    parser.add_argument("--avspo", nargs="*", default=[], metavar="KEY=VALUE", help="AVSPO's settings")
    parser.add_argument("--acr", nargs="*", default=[], metavar="KEY=VALUE", help="ACR's settings")
    parser.add_argument("--prompts", nargs="*", default=[], metavar="KEY=VALUE", help="the prompt key and skip rule")
    parser.add_argument("--dataset-size", type=int, default=32, help="a+b= prompts in the dataset (default: 32)")
    args = parser.parse_args(argv)

    import torch  # after the arguments: --help needs no torch

    started = time.perf_counter()
    workdir = args.out or Path(tempfile.mkdtemp(prefix="trl_cpu_grpo_"))
    tiny = TinyAssets.build(workdir / "assets", prompts=args.dataset_size)
    settings = {"estimator": args.estimator, "acr": key_values(args.acr), "prompts": key_values(args.prompts)}
    columns = COLUMNS + (SKIP_COLUMNS if settings["prompts"].get("skip", {}).get("enable") else ())
    if args.estimator == "avspo":
        settings["avspo"] = key_values(args.avspo)
    config = {"max_steps": args.steps, "save_strategy": "steps", "save_steps": 4}
    print(f"AVSPOGRPOTrainer({', '.join(f'{k}={v!r}' for k, v in settings.items())}), {args.processes} process(es)")
    print(f"work folder: {workdir}; console log: {workdir / 'run' / 'run.log'}")
    result = launch(tiny, workdir / "run", settings, config, processes=args.processes)
    if result.returncode != 0:
        print(f"the run failed (exit {result.returncode}); the end of its log:", file=sys.stderr)
        print((workdir / "run" / "run.log").read_text()[-4000:], file=sys.stderr)
        return result.returncode
    history = torch.load(workdir / "run" / "rank0.pt", weights_only=False)["log_history"]
    print("step  " + "  ".join(columns))
    for row in (row for row in history if "loss" in row):
        cells = [f"{row[c]:.4f}" if row.get(c) is not None else "-" for c in columns]
        print(f"{row['step']:>4}  " + "  ".join(f"{cell:>{len(c)}}" for cell, c in zip(cells, columns, strict=True)))
    checkpoints = sorted((workdir / "run").glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    print(f"checkpoints: {', '.join(path.name for path in checkpoints) or 'none'}", end="")
    print(f"; TRL's log: {checkpoints[-1] / 'trainer_state.json'}" if checkpoints else "")
    print(f"{time.perf_counter() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
