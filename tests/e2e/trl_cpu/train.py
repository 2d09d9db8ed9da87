"""One process of a tiny TRL GRPO run (``harness.launch`` starts it, with ``accelerate launch`` for
several): trains (``--resume``: from a checkpoint), then writes ``--out/rank<R>.pt``: the recorders'
records of each generation (``harness.Recorder``), TRL's ``log_history`` and the tracker's final state."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trl_cpu.harness import TinyAssets, make_trainer  # noqa: E402


def _cpu(value):
    return value.cpu() if isinstance(value, torch.Tensor) else value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--assets", required=True, help="TinyAssets as JSON")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--settings", default="{}", help="estimator, avspo, acr, as JSON")
    parser.add_argument("--config", default="{}", help="GRPOConfig overrides, as JSON")
    parser.add_argument("--resume", default=None, help="a checkpoint folder to resume from")
    args = parser.parse_args()
    trainer = make_trainer(
        TinyAssets.from_json(args.assets), args.out, config=json.loads(args.config), **json.loads(args.settings)
    )
    trainer.train(resume_from_checkpoint=args.resume)
    torch.save(
        {
            "records": [{key: _cpu(value) for key, value in record.items()} for record in trainer.records],
            "log_history": trainer.state.log_history,
            "state": trainer.tracker.state_dict(),
            "process_index": trainer.accelerator.process_index,
            "num_processes": trainer.accelerator.num_processes,
        },
        args.out / f"rank{trainer.accelerator.process_index}.pt",
    )
    # A process group left to the interpreter's exit can abort there ("terminate called without an active
    # exception", seen once in CI with 2 processes): end it while every process is still here.
    trainer.accelerator.end_training()  # destroys the process group


if __name__ == "__main__":
    main()
