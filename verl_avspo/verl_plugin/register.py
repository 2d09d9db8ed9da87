"""verl adapter: registers the ``avspo`` and ``dcpo`` advantage estimators, the ``dcpo`` policy loss and our
V1 trainers (``trainer.v1.trainer_mode=avspo_sync`` and the other modes of
:mod:`verl_avspo.verl_plugin.trainer_modes`).

This module is the ``verl.plugins`` entry point, so every ``import verl`` in every process (the
launcher, the TaskRunner actor, each FSDP and vLLM worker) imports it. It therefore imports only
``verl.trainer.ppo.core_algos`` from verl, and does no work beyond registration. That the actor
workers import it too is what makes ``actor_rollout_ref.actor.policy_loss.loss_mode=dcpo``
resolvable there (verl looks the loss up inside the worker, in ``workers/utils/losses.py``).

Our trainers need verl's ``verl.trainer.ppo.v1`` (TransferQueue, the agent loop: tens of seconds of imports),
which most processes never load. So the entry point does not import them: it asks Python to run
:mod:`verl_avspo.verl_plugin.trainer_v1` right after ``verl.trainer.ppo.v1`` is first imported, in whatever
process that is (:func:`verl_avspo.verl_plugin.after_import.after_import`, the wing's one import hook).
verl's TaskRunner imports it just before it looks the mode up (``verl/trainer/main_ppo.py:139-141``), so
our names are there when verl reads them, and a process that never trains (a worker, the legacy trainer's)
never loads our trainers.

It also installs :mod:`verl_avspo.verl_plugin.trl_guard` (stdlib only), so that verl 0.9.1 trains in an
environment whose TRL has no value-head class. It reads no command line: our trainer mode named with
``trainer.use_v1=False`` is refused where verl hands us the config (the launcher, ``verl-avspo doctor``, our
estimator's first call: :func:`verl_avspo.verl_plugin.run_state.tracker_for`).

The estimators are :mod:`verl_avspo.verl_plugin.estimators`, the run state they share
:mod:`verl_avspo.verl_plugin.run_state`, the loss :mod:`verl_avspo.verl_plugin.dcpo_loss`.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from verl.trainer.ppo import core_algos

from verl_avspo.verl_plugin import trl_guard
from verl_avspo.verl_plugin.after_import import after_import
from verl_avspo.verl_plugin.dcpo_loss import compute_dcpo_policy_loss
from verl_avspo.verl_plugin.estimators import AVSPO, DCPO, compute_avspo_advantage, compute_dcpo_advantage
from verl_avspo.verl_plugin.registries import is_ours, registered

__all__ = ["NAME", "DCPO_NAME", "register", "register_trainers_with_v1"]

logger = logging.getLogger(__name__)

NAME = AVSPO
DCPO_NAME = DCPO


def _register_adv_est(name: str, fn: Any) -> None:
    """``register_adv_est(name)(fn)`` unless ours is registered already (once per process, a reload included).
    verl refuses another's function under the name (``ValueError``)."""
    if not is_ours(registered(core_algos.get_adv_estimator_fn, name), fn):
        core_algos.register_adv_est(name)(fn)


def register() -> None:
    """Register ``avspo``, ``dcpo`` and the ``dcpo`` policy loss in verl's registries, through verl's
    ``register_adv_est`` and ``register_policy_loss`` only, once per process: a name that holds ours already
    (this module or the estimators' reloaded included) is left as it is. Safe to call again, for example after
    a test cleared a registry."""
    _register_adv_est(NAME, compute_avspo_advantage)
    _register_adv_est(DCPO_NAME, compute_dcpo_advantage)
    current_loss = registered(core_algos.get_policy_loss_fn, DCPO_NAME)
    if current_loss is None:
        core_algos.register_policy_loss(DCPO_NAME)(compute_dcpo_policy_loss)
    elif not is_ours(current_loss, compute_dcpo_policy_loss):
        # verl's register_policy_loss replaces a name without a word: ask first.
        raise ValueError(
            f"policy loss {DCPO_NAME!r} is already registered by {current_loss.__module__}; verl-avspo will not "
            "replace it. Remove the other registration or use its loss_mode."
        )


_V1_PACKAGE = "verl.trainer.ppo.v1"
_TRAINERS = "verl_avspo.verl_plugin.trainer_v1"


def _register_trainers(_package: Any = None) -> None:
    """Import our trainers (they register themselves); a failure is logged, not raised, so that verl's own
    trainers still run, and a run that names our mode is told why verl does not know it."""
    try:
        importlib.import_module(_TRAINERS)
    except ImportError as err:
        if err.name in sys.modules and err.name.startswith("verl_avspo."):
            # One of our own modules imported verl's V1 package halfway through its own import (a test that
            # imports prompt_hooks first): our trainers register when that import finishes and they are imported.
            return
        logger.warning("verl-avspo: our V1 trainers (trainer.v1.trainer_mode=avspo_*) are not registered: %r", err)
    except Exception as err:  # noqa: BLE001 (a future verl's change must not break verl's own trainers)
        logger.warning("verl-avspo: our V1 trainers (trainer.v1.trainer_mode=avspo_*) are not registered: %r", err)


def register_trainers_with_v1() -> None:
    """Have our trainers registered when verl's V1 package is imported, or now if it already is."""
    after_import(_V1_PACKAGE, _register_trainers)


trl_guard.install()  # first: a registration that fails must not leave verl unable to train next to TRL
register()
register_trainers_with_v1()
