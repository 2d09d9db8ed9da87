"""DCPO's dynamic-adaptive clipping as a verl policy loss (``actor_rollout_ref.actor.policy_loss.loss_mode=dcpo``).

Registered by :mod:`verl_avspo.verl_plugin.register`; verl looks the loss up inside each actor worker
(``workers/utils/losses.py``), which imports the plugin's entry point too. Imports only
``verl.trainer.ppo.core_algos`` from verl.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo import core_algos

from verl_avspo.core.dcpo import dynamic_clip_token_losses

__all__ = ["compute_dcpo_policy_loss"]


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def compute_dcpo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DCPO's dynamic-adaptive clipping as a verl policy loss (``policy_loss.loss_mode=dcpo``).

    Token loss ``max(-A r, -A clip(r, low, high))`` with DCPO's bounds from the old probability
    (``verl_avspo.core.dcpo.dynamic_clip_bounds``; ε_low/ε_high are ``clip_ratio_low``/``clip_ratio_high``,
    the upper bound is capped at ``clip_ratio_c``), then verl's dual clip ``min(·, -A c)`` on tokens
    with A < 0, as DCPO's released code does with c = 10. Otherwise as verl's ``vanilla`` loss: the
    log-ratio is clamped to ±20, ``rollout_is_weights`` multiply the token losses, and ``agg_loss``
    aggregates with the actor's ``global_batch_info``.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (bs, response_length).
        config: verl's ``ActorConfig`` of the actor.

    Returns:
        the aggregated loss and ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``.
    """
    if config is None:
        raise ValueError("the dcpo policy loss needs the actor config (verl passes config=ActorConfig)")
    clip_ratio = config.clip_ratio
    eps_low = config.clip_ratio_low if config.clip_ratio_low is not None else clip_ratio
    eps_high = config.clip_ratio_high if config.clip_ratio_high is not None else clip_ratio
    max_ratio = config.get("clip_ratio_c", 3.0)
    if not max_ratio > 1:
        raise ValueError(
            f"actor_rollout_ref.actor.clip_ratio_c={max_ratio!r} is invalid for the dcpo policy loss: it caps the "
            "upper ratio bound and dual-clips negative advantages, so it must be > 1. Set it to 10 (DCPO's value)."
        )
    mask = response_mask.to(log_prob.dtype)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    losses, clipped = dynamic_clip_token_losses(
        old_log_prob, old_log_prob + log_ratio, advantages, eps_low, eps_high, max_ratio
    )
    dual = -advantages * max_ratio
    negative = advantages < 0
    dual_clipped = negative & (losses > dual)
    losses = torch.where(negative, torch.minimum(losses, dual), losses)
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    loss = core_algos.agg_loss(
        loss_mat=losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info
    )
    metrics = {
        "actor/pg_clipfrac": _masked_mean(clipped.to(mask.dtype), mask).item(),
        "actor/ppo_kl": _masked_mean(-log_ratio.detach(), mask).item(),
        "actor/pg_clipfrac_lower": _masked_mean(dual_clipped.to(mask.dtype), mask).item(),
    }
    return loss, metrics
