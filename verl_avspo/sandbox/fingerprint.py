"""``verl-avspo sandbox --fingerprint``: in seconds, whether this machine computes the sandbox as
the machine that measured the README's table did.

It runs the start of ``make demo``'s first run, shortened (``FINGERPRINT_SETTINGS``: the first
50 warm-up steps, 8 held-out problems per level, 3 RL steps of GRPO, seed 0), and prints two
hashes: of the weights the RL steps start from (every bit of 50 steps of forward, backward and
AdamW) and of the tokens sampled at the three RL steps (each step's from the weights after the
updates before it; the rate's warm-up, over the full run's share of the steps, gives the first
update the rate 0 and the second the full rate). Equal weights mean this machine rounds as the
reference one did; equal samples, that its decisions agree. Both depend on the versions of torch
and transformers, which the line names.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
import transformers

from verl_avspo.sandbox.config import SandboxConfig
from verl_avspo.sandbox.estimators import parse_estimators
from verl_avspo.sandbox.loop import train

__all__ = ["FINGERPRINT_SETTINGS", "fingerprint"]

FINGERPRINT_SETTINGS = {"sft_steps": 50, "eval_size": 8, "steps": 3, "seed": 0}


def fingerprint(config: SandboxConfig) -> str:
    """One line: the hashes of ``config``'s shortened first run (``FINGERPRINT_SETTINGS``)."""
    short = replace(
        config,
        steps=FINGERPRINT_SETTINGS["steps"],
        eval_size=FINGERPRINT_SETTINGS["eval_size"],
        policy=replace(config.policy, sft_steps=FINGERPRINT_SETTINGS["sft_steps"]),
    )
    weights, samples = hashlib.sha256(), hashlib.sha256()

    def record(step: int, model: transformers.PreTrainedModel, batch) -> None:
        if step == 1:  # before the first update: the warmed-up weights
            for name, tensor in sorted(model.state_dict().items()):
                weights.update(name.encode())
                weights.update(tensor.detach().contiguous().numpy().tobytes())
        samples.update(batch.rollout.response_ids.numpy().tobytes())

    (grpo,) = parse_estimators("grpo")
    with tempfile.TemporaryDirectory() as scratch:
        train(short, grpo, FINGERPRINT_SETTINGS["seed"], Path(scratch) / "log.jsonl", on_rollout=record)
    return (
        f"sandbox fingerprint: weights {weights.hexdigest()[:12]}, samples {samples.hexdigest()[:12]} "
        f"(torch {torch.__version__}, transformers {transformers.__version__})"
    )
