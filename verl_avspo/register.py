"""verl adapter: registers the ``avspo`` advantage estimator.

This module is the ``verl.plugins`` entry point, so every ``import verl`` in every process (the
launcher, the TaskRunner actor, each FSDP and vLLM worker) imports it. It therefore imports only
``verl.trainer.ppo.core_algos`` from verl, and does no work beyond registration.

Use it with ``algorithm.adv_estimator=avspo``; settings come from ``algorithm.avspo`` (see
``verl_avspo.config``) and ``algorithm.norm_adv_by_std_in_grpo``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from verl.trainer.ppo import core_algos

from verl_avspo.advantage import compute_avspo_outcome_advantage
from verl_avspo.config import AVSPOConfig, resolve_config
from verl_avspo.controller import AdaptiveController

__all__ = [
    "NAME",
    "compute_avspo_advantage",
    "avspo_settings",
    "get_controller",
    "pop_last_metrics",
    "reset",
    "register",
]

NAME = "avspo"

# One controller per distinct setting in this process: verl calls the estimator as a plain
# function, so the state that must persist across steps (θ, EMA, J_{t-1}, RNG) lives here.
_controllers: dict[AVSPOConfig, AdaptiveController] = {}
_last_metrics: dict[str, float] = {}


def _plain(value: Any) -> Any:
    """DictConfig/ListConfig (or any mapping/sequence) to plain containers, for caching."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


@functools.lru_cache(maxsize=64)
def _resolve_canonical(canonical: str) -> AVSPOConfig:
    return resolve_config(json.loads(canonical))


def avspo_settings(algorithm_config: Any) -> AVSPOConfig:
    """The validated AVSPO settings of verl's ``config.algorithm`` (``avspo`` may be absent,
    meaning ``preset: paper``). Validation runs once per distinct setting."""
    raw = None if algorithm_config is None else algorithm_config.get("avspo", None)
    if raw is not None and not isinstance(raw, Mapping):
        return resolve_config(raw)  # raises the explanatory error
    plain = _plain(raw) if raw is not None else {}
    try:
        canonical = json.dumps(plain, sort_keys=True)
    except TypeError:  # an unserialisable value: validate directly for the error message
        return resolve_config(plain)
    return _resolve_canonical(canonical)


def get_controller(settings: AVSPOConfig) -> AdaptiveController:
    """The process-wide controller for ``settings`` (created on first use)."""
    if settings not in _controllers:
        _controllers[settings] = AdaptiveController(settings)
    return _controllers[settings]


def pop_last_metrics() -> dict[str, float]:
    """Metrics of the latest ``avspo`` call in this process (``acr/*`` and ``avspo/*``), then
    cleared so a step never logs another step's values. Empty if none ran since the last pop."""
    metrics = dict(_last_metrics)
    _last_metrics.clear()
    return metrics


def reset() -> None:
    """Forget all controller state and metrics (a fresh run in the same process, or tests)."""
    _controllers.clear()
    _last_metrics.clear()


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
    settings = avspo_settings(config)
    norm_adv_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    with torch.no_grad():
        output = compute_avspo_outcome_advantage(
            token_level_rewards, response_mask, index, settings, get_controller(settings), norm_adv_by_std
        )
    _last_metrics.clear()
    _last_metrics.update(output.metrics)
    return output.advantages, output.advantages


def register() -> None:
    """Register ``avspo`` in verl's registry. Safe to call again, for example after a test
    cleared the registry or after this module was reloaded."""
    current = core_algos.ADV_ESTIMATOR_REGISTRY.get(NAME)
    if current is compute_avspo_advantage:
        return
    if current is not None and getattr(current, "__module__", None) == __name__:
        del core_algos.ADV_ESTIMATOR_REGISTRY[NAME]  # our own function from before a reload
    core_algos.register_adv_est(NAME)(compute_avspo_advantage)


register()
