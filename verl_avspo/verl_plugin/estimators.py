"""The ``avspo`` and ``dcpo`` advantage estimators as verl calls them (``verl.trainer.ppo.core_algos``'s
registry; :mod:`verl_avspo.verl_plugin.register` registers them).

Each is a thin function over the run's :class:`~verl_avspo.core.run_tracker.RunTracker`
(:mod:`verl_avspo.verl_plugin.run_state`), which holds the state verl's stateless call cannot carry and
collects the estimator's ``avspo/*`` metrics for the step's log. Imports nothing from verl at import time
(the launcher's checks use :func:`is_group_estimator` before verl is loaded).

- ``algorithm.adv_estimator=avspo``: settings from ``algorithm.avspo`` and ``algorithm.acr``
  (``verl_avspo.core.config``) and ``algorithm.norm_adv_by_std_in_grpo``.
- ``algorithm.adv_estimator=dcpo``: DCPO's smooth advantage standardization (``verl_avspo.core.dcpo``),
  settings from ``algorithm.dcpo``. It needs a prompt identity that is stable across steps, which verl does
  not pass to an estimator (its ``uid`` is new every step): the launcher's trainer sets it on the tracker
  (``RunTracker.set_prompt_keys``) right before verl's advantage stage.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from verl_avspo.core.advantage import token_advantages
from verl_avspo.core.run_tracker import MissingPromptIdentity
from verl_avspo.verl_plugin.run_state import tracker_for

__all__ = ["AVSPO", "DCPO", "compute_avspo_advantage", "compute_dcpo_advantage", "is_group_estimator"]

AVSPO = "avspo"
DCPO = "dcpo"


def _norm_adv_by_std(config: Any) -> bool:
    return True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))


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
        config: verl's ``config.algorithm`` (DictConfig); reads ``avspo``, ``acr`` and
            ``norm_adv_by_std_in_grpo``.

    Returns:
        advantages, returns: both (bs, response_length), masked; for outcome rewards they are
        the same tensor, as in verl's grpo.
    """
    tracker = tracker_for(config, AVSPO)
    output = tracker.avspo_advantages(token_level_rewards, response_mask, index, _norm_adv_by_std(config))
    return output.advantages, output.advantages


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
        index: (bs,) uid of each response; the prompt key of each uid is the one the trainer set
            on the run's tracker.
        config: verl's ``config.algorithm``; reads ``dcpo`` and ``norm_adv_by_std_in_grpo``.

    Returns:
        advantages, returns: both (bs, response_length), masked, the same tensor (outcome reward).
    """
    tracker = tracker_for(config, DCPO)
    try:
        scalar = tracker.dcpo_advantages(token_level_rewards, response_mask, index)
    except MissingPromptIdentity as error:
        raise MissingPromptIdentity(
            f"algorithm.adv_estimator=dcpo: {error} verl's uid is new every step; verl-avspo's trainer passes the "
            "dataset's extra_info.index (algorithm.prompts.key), verl's own trainer cannot. Launch with `python -m "
            "verl_avspo.main_ppo algorithm.adv_estimator=dcpo ...`, or add trainer.v1.trainer_mode=avspo_sync to "
            "stock `python -m verl.trainer.main_ppo`."
        ) from error
    advantages = token_advantages(scalar, response_mask)
    return advantages, advantages


def is_group_estimator(name: str) -> bool:
    """Whether the registered estimator ``name`` normalises within prompt groups: verl passes the
    uid array only to estimators that take an ``index`` argument (grpo, rloo, avspo, ...)."""
    from verl.trainer.ppo import core_algos

    fn = core_algos.get_adv_estimator_fn(name)
    return "index" in inspect.signature(fn).parameters
