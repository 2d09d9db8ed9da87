"""``verl-avspo demo``: ACR and AVSPO on one synthetic batch, through verl's own
``ray_trainer.compute_advantage`` (the function the legacy trainer and the V1 trainer call)."""

from __future__ import annotations

import argparse

import numpy as np
import torch

from verl_avspo.core.config import PRESETS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--groups", type=int, default=8, help="prompts in the batch (default 8)")
    parser.add_argument("--group-size", type=int, default=8, help="responses per prompt, G (default 8)")
    parser.add_argument(
        "--preset", default="paper", choices=list(PRESETS), help="AVSPO preset (default paper): %(choices)s"
    )
    parser.add_argument("--seed", type=int, default=0)


def synthetic_batch(groups: int, group_size: int, seed: int):
    """Binary rewards with U-shaped per-prompt pass rates (most prompts far too easy or far too
    hard for the policy, as in math RLVR), so that many groups collapse both ways."""
    from verl import DataProto

    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(groups, generator=gen) ** 4
    pass_rate = torch.where(torch.rand(groups, generator=gen) < 0.5, u, 1 - u).repeat_interleave(group_size)
    correct = (torch.rand(groups * group_size, generator=gen) < pass_rate).float()
    length = 4
    rewards = torch.zeros(groups * group_size, length)
    rewards[:, -1] = correct  # outcome reward on the last token, as verl's reward managers do
    uids = np.array([f"prompt-{g}" for g in range(groups) for _ in range(group_size)], dtype=object)
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.ones_like(rewards)},
        non_tensors={"uid": uids},
    )


def run(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from verl_avspo.verl_plugin import run_state

    if args.groups < 1 or args.group_size < 2:
        raise SystemExit(
            "verl-avspo demo: --groups must be at least 1 and --group-size at least 2 (one response per prompt "
            f"is a group that can neither collapse nor be normalised); got {args.groups} and {args.group_size}"
        )
    config = OmegaConf.create(
        {"adv_estimator": "avspo", "norm_adv_by_std_in_grpo": True, "avspo": {"preset": args.preset}}
    )
    batch = synthetic_batch(args.groups, args.group_size, args.seed)
    rewards = batch.batch["token_level_rewards"].sum(-1)
    scores = rewards.view(args.groups, args.group_size)
    tracker = run_state.start_run(config)  # one AVSPO step: its raw ACR, then acr/* and avspo/*
    tracker.measure(rewards, batch.non_tensor_batch["uid"])
    results = {}
    for estimator in ("grpo", "avspo"):  # each call writes its own advantages into the batch
        batch = compute_advantage(batch, estimator, config=config)  # the estimator uses the tracker of config
        results[estimator] = batch.batch["advantages"][:, -1].view(args.groups, args.group_size).clone()
    metrics = tracker.end_step(1, batch.batch["advantages"])

    print(f"Synthetic batch: {args.groups} prompts x {args.group_size} responses, binary rewards")
    print(f"AVSPO preset={args.preset}\n")
    print(f"{'group':>5}  {'correct':>7}  {'grpo advantage (first)':>23}  {'avspo advantage (first)':>24}")
    for g in range(args.groups):
        print(
            f"{g:>5}  {int(scores[g].sum()):>4}/{args.group_size:<2}  {results['grpo'][g, 0].item():>23.4f}"
            f"  {results['avspo'][g, 0].item():>24.4f}"
        )
    print()
    for name in ("acr/rate", "acr/all_correct", "acr/all_wrong", "acr/effective", "avspo/threshold", "avspo/triggered"):
        print(f"  {name:<18} {metrics[name]:.3f}")
    print("\nacr/rate is the fraction of groups with zero reward variance (no GRPO gradient);")
    print("acr/effective is the fraction still at zero advantage after AVSPO's virtual samples.")
    return 0
