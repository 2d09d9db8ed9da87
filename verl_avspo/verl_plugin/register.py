"""verl adapter: registers the ``avspo`` and ``dcpo`` advantage estimators and the ``dcpo`` policy loss.

This module is the ``verl.plugins`` entry point, so every ``import verl`` in every process (the
launcher, the TaskRunner actor, each FSDP and vLLM worker) imports it. It therefore imports only
``verl.trainer.ppo.core_algos`` from verl, and does no work beyond registration and that check. That the actor
workers import it too is what makes ``actor_rollout_ref.actor.policy_loss.loss_mode=dcpo``
resolvable there (verl looks the loss up inside the worker, in ``workers/utils/losses.py``). It also
installs :mod:`verl_avspo.verl_plugin.trl_guard` (stdlib only), so that verl 0.9.1 trains in an
environment whose TRL has no value-head class. In stock ``main_ppo``'s own process it refuses the ACR
hook named with ``trainer.use_v1=False``, which verl would ignore without a word
(:func:`verl_avspo.verl_plugin.hook_overrides.refuse_legacy_hook`: it reads the command line only).

The estimators are :mod:`verl_avspo.verl_plugin.estimators`, the run state they share
:mod:`verl_avspo.verl_plugin.run_state`, the loss :mod:`verl_avspo.verl_plugin.dcpo_loss`.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo import core_algos

from verl_avspo.verl_plugin import hook_overrides, trl_guard
from verl_avspo.verl_plugin.dcpo_loss import compute_dcpo_policy_loss
from verl_avspo.verl_plugin.estimators import AVSPO, DCPO, compute_avspo_advantage, compute_dcpo_advantage

__all__ = ["NAME", "DCPO_NAME", "register"]

NAME = AVSPO
DCPO_NAME = DCPO


def _register_adv_est(name: str, fn: Any) -> None:
    current = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
    if current is fn:
        return
    if current is not None and getattr(current, "__module__", None) == fn.__module__:
        del core_algos.ADV_ESTIMATOR_REGISTRY[name]  # our own function from before a reload
    core_algos.register_adv_est(name)(fn)


def register() -> None:
    """Register ``avspo``, ``dcpo`` and the ``dcpo`` policy loss in verl's registries. Safe to call
    again, for example after a test cleared a registry or after this module was reloaded."""
    _register_adv_est(NAME, compute_avspo_advantage)
    _register_adv_est(DCPO_NAME, compute_dcpo_advantage)
    current_loss = core_algos.POLICY_LOSS_REGISTRY.get(DCPO_NAME)
    if current_loss is not None and getattr(current_loss, "__module__", None) != compute_dcpo_policy_loss.__module__:
        raise ValueError(
            f"policy loss {DCPO_NAME!r} is already registered by {current_loss.__module__}; verl-avspo will not "
            "replace it. Remove the other registration or use its loss_mode."
        )
    core_algos.register_policy_loss(DCPO_NAME)(compute_dcpo_policy_loss)


trl_guard.install()  # first: a registration that fails must not leave verl unable to train next to TRL
register()
hook_overrides.refuse_legacy_hook()
