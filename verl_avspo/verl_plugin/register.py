"""verl adapter: registers the ``avspo`` and ``dcpo`` advantage estimators and the ``dcpo`` policy loss.

This module is the ``verl.plugins`` entry point, so every ``import verl`` in every process (the
launcher, the TaskRunner actor, each FSDP and vLLM worker) imports it. It therefore imports only
``verl.trainer.ppo.core_algos`` from verl, and does no work beyond registration. That the actor
workers import it too is what makes ``actor_rollout_ref.actor.policy_loss.loss_mode=dcpo``
resolvable there (verl looks the loss up inside the worker, in ``workers/utils/losses.py``).

- ``algorithm.adv_estimator=avspo``: settings from ``algorithm.avspo`` (see ``verl_avspo.core.config``)
  and ``algorithm.norm_adv_by_std_in_grpo``.
- ``algorithm.adv_estimator=dcpo``: DCPO's smooth advantage standardization
  (``verl_avspo.core.dcpo``), settings from ``algorithm.dcpo`` (``verl_avspo.core.baselines``). It needs a
  prompt identity that is stable across steps, which verl does not pass to an estimator (its
  ``uid`` is new every step): the launcher's trainer supplies it through :func:`set_prompt_keys`.
- ``actor_rollout_ref.actor.policy_loss.loss_mode=dcpo``: PPO-clip with DCPO's token-wise
  dynamic bounds from ``clip_ratio_low`` / ``clip_ratio_high``, capped at ``clip_ratio_c``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from verl_avspo.core.advantage import compute_avspo_outcome_advantage, response_scores, token_advantages
from verl_avspo.core.baselines import DCPOConfig, dcpo_settings
from verl_avspo.core.config import ACRConfig, AVSPOConfig, resolve_settings
from verl_avspo.core.controller import AdaptiveController
from verl_avspo.core.dcpo import PromptRewardHistory, dynamic_clip_token_losses

__all__ = [
    "NAME",
    "DCPO_NAME",
    "compute_avspo_advantage",
    "compute_dcpo_advantage",
    "compute_dcpo_policy_loss",
    "avspo_settings",
    "acr_settings",
    "get_controller",
    "get_dcpo_history",
    "set_prompt_keys",
    "pop_last_metrics",
    "reset",
    "register",
]

NAME = "avspo"
DCPO_NAME = "dcpo"

# One controller per distinct setting in this process: verl calls the estimator as a plain
# function, so the state that must persist across steps (θ, EMA, J_{t-1}, RNG) lives here.
_controllers: dict[tuple[AVSPOConfig, ACRConfig], AdaptiveController] = {}
_last_metrics: dict[str, float] = {}
# DCPO's per-prompt reward history, one per (settings, std normalisation), and the prompt key of
# each uid of the step about to be computed (None: a padding row, which is left out).
_dcpo_histories: dict[tuple[DCPOConfig, bool], PromptRewardHistory] = {}
_prompt_keys: dict[str, Any] = {}


def _plain(value: Any) -> Any:
    """DictConfig/ListConfig (or any mapping/sequence) to plain containers, for caching."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


@functools.lru_cache(maxsize=64)
def _resolve_canonical(canonical: str) -> tuple[AVSPOConfig, ACRConfig]:
    return resolve_settings(json.loads(canonical))


def _settings(algorithm_config: Any) -> tuple[AVSPOConfig, ACRConfig]:
    """The validated ``algorithm.avspo`` of verl's ``config.algorithm`` (absent means
    ``preset: paper``), as the estimator's and the ACR metrics' configs. Validated once per distinct setting."""
    raw = None if algorithm_config is None else algorithm_config.get("avspo", None)
    if raw is not None and not isinstance(raw, Mapping):
        return resolve_settings(raw)  # raises the explanatory error
    plain = _plain(raw) if raw is not None else {}
    try:
        canonical = json.dumps(plain, sort_keys=True)
    except TypeError:  # an unserialisable value: validate directly for the error message
        return resolve_settings(plain)
    return _resolve_canonical(canonical)


def avspo_settings(algorithm_config: Any) -> AVSPOConfig:
    """The AVSPO estimator's settings of verl's ``config.algorithm`` (all of ``algorithm.avspo`` is validated)."""
    return _settings(algorithm_config)[0]


def acr_settings(algorithm_config: Any) -> ACRConfig:
    """The ACR settings (``tau``, ``reward_range``, ``alert``) of verl's ``config.algorithm``, which
    every estimator's run reads (all of ``algorithm.avspo`` is validated)."""
    return _settings(algorithm_config)[1]


def get_controller(settings: AVSPOConfig, acr: ACRConfig) -> AdaptiveController:
    """The process-wide controller for these settings (created on first use)."""
    if (settings, acr) not in _controllers:
        _controllers[settings, acr] = AdaptiveController(settings, acr)
    return _controllers[settings, acr]


def pop_last_metrics(prefix: str = "") -> dict[str, float]:
    """Metrics of the latest ``avspo`` call in this process (``acr/*`` and ``avspo/*``; only those
    whose name starts with ``prefix``), then cleared so a step never logs another step's values.
    Empty if none ran since the last pop."""
    metrics = {key: value for key, value in _last_metrics.items() if key.startswith(prefix)}
    _last_metrics.clear()
    return metrics


def get_dcpo_history(settings: DCPOConfig, norm_adv_by_std: bool = True) -> PromptRewardHistory:
    """The process-wide DCPO reward history for these settings (created on first use)."""
    key = (settings, bool(norm_adv_by_std))
    if key not in _dcpo_histories:
        _dcpo_histories[key] = PromptRewardHistory(epsilon=settings.epsilon, norm_adv_by_std=norm_adv_by_std)
    return _dcpo_histories[key]


def set_prompt_keys(keys_by_uid: Mapping[str, Any]) -> None:
    """The stable prompt key of every uid of the next ``dcpo`` call (the trainer calls this right
    before verl's advantage stage; the call consumes them). A key of None marks a uid whose rows
    are padding: they get zero advantages and stay out of the history."""
    _prompt_keys.clear()
    _prompt_keys.update(keys_by_uid)


def reset() -> None:
    """Forget all estimator state and metrics (a fresh run in the same process, or tests)."""
    _controllers.clear()
    _last_metrics.clear()
    _dcpo_histories.clear()
    _prompt_keys.clear()


def compute_avspo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """AVSPO outcome advantage, called by verl's ``compute_advantage``.

    Args:
        token_level_rewards: (bs, response_length)
        response_mask: (bs, response_length)
        index: (bs,) numpy object array of uid strings.
        config: verl's ``config.algorithm`` (DictConfig); reads ``avspo`` and
            ``norm_adv_by_std_in_grpo``.

    Returns:
        advantages, returns: both (bs, response_length), masked; for outcome rewards they are
        the same tensor, as in verl's grpo.
    """
    settings, acr = _settings(config)
    norm_adv_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    with torch.no_grad():
        output = compute_avspo_outcome_advantage(
            token_level_rewards, response_mask, index, settings, acr, get_controller(settings, acr), norm_adv_by_std
        )
    _last_metrics.clear()
    _last_metrics.update(output.metrics)
    return output.advantages, output.advantages


def _dcpo_prompt_keys(index: Any) -> tuple[np.ndarray, list]:
    """(N,) bool of the real (non-padding) rows and the prompt key of each real row, from the keys
    the trainer set for this step's uids. Looks up each group once, not each response."""
    uids, inverse = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)
    missing = [uid for uid in uids if uid not in _prompt_keys]
    if missing:
        detail = f"uid {missing[0]!r} (and {len(missing) - 1} more)" if _prompt_keys else "any uid"
        raise ValueError(
            f"algorithm.adv_estimator=dcpo has no prompt identity for {detail}: DCPO keeps per-prompt reward "
            "statistics across steps, and verl's uid is new every step. The trainer of `python -m "
            "verl_avspo.main_ppo` passes the dataset's extra_info.index (algorithm.dcpo.prompt_key); stock "
            "`python -m verl.trainer.main_ppo` cannot. Launch with `python -m verl_avspo.main_ppo "
            "algorithm.adv_estimator=dcpo ...`."
        )
    group_keys = np.empty(len(uids), dtype=object)
    group_keys[:] = [_prompt_keys[uid] for uid in uids]
    real_group = np.array([key is not None for key in group_keys], dtype=bool)
    real = real_group[inverse]
    return real, group_keys[inverse[real]].tolist()


def compute_dcpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DCPO's smooth advantage standardization, called by verl's ``compute_advantage``.

    Args:
        token_level_rewards: (bs, response_length)
        response_mask: (bs, response_length)
        index: (bs,) uid of each response; the prompt key of each uid comes from
            :func:`set_prompt_keys`.
        config: verl's ``config.algorithm``; reads ``dcpo`` and ``norm_adv_by_std_in_grpo``.

    Returns:
        advantages, returns: both (bs, response_length), masked, the same tensor (outcome reward).
    """
    settings = dcpo_settings(config)
    norm_adv_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    # Checked before the keys are read: a NaN reward would poison its prompt's history for good.
    scores = response_scores(token_level_rewards, response_mask, index)
    real, keys = _dcpo_prompt_keys(index)
    _prompt_keys.clear()  # one step's keys serve one call
    advantage = torch.zeros_like(scores)
    real_rows = torch.from_numpy(real).to(scores.device)
    if keys:
        history = get_dcpo_history(settings, norm_adv_by_std)
        real_index = np.asarray(index, dtype=object)[real]
        with torch.no_grad():
            advantage[real_rows] = history.advantages(scores[real_rows], keys, real_index).to(scores.dtype)
    advantages = token_advantages(advantage, response_mask)
    return advantages, advantages


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


def _register_adv_est(name: str, fn: Any) -> None:
    current = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
    if current is fn:
        return
    if current is not None and getattr(current, "__module__", None) == __name__:
        del core_algos.ADV_ESTIMATOR_REGISTRY[name]  # our own function from before a reload
    core_algos.register_adv_est(name)(fn)


def register() -> None:
    """Register ``avspo``, ``dcpo`` and the ``dcpo`` policy loss in verl's registries. Safe to call
    again, for example after a test cleared a registry or after this module was reloaded."""
    _register_adv_est(NAME, compute_avspo_advantage)
    _register_adv_est(DCPO_NAME, compute_dcpo_advantage)
    current_loss = core_algos.POLICY_LOSS_REGISTRY.get(DCPO_NAME)
    if current_loss is not None and getattr(current_loss, "__module__", None) != __name__:
        raise ValueError(
            f"policy loss {DCPO_NAME!r} is already registered by {current_loss.__module__}; verl-avspo will not "
            "replace it. Remove the other registration or use its loss_mode."
        )
    core_algos.register_policy_loss(DCPO_NAME)(compute_dcpo_policy_loss)


register()
