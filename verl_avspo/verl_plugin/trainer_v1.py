"""Our trainer (:class:`~verl_avspo.verl_plugin.trainer.AVSPOTrainer`) over each of verl's three V1 trainers, in
verl's own trainer registry.

:class:`AVSPOTrainerSync`, :class:`AVSPOTrainerColocateAsync` and :class:`AVSPOTrainerSeparateAsync` are
registered with verl's public ``register_trainer`` under our mode names (:data:`trainer_modes.MODES`:
``avspo_sync``, ``avspo_colocate_async``, ``avspo_separate_async``), so stock ``python -m verl.trainer.main_ppo
trainer.v1.trainer_mode=avspo_sync`` builds ours (``verl/trainer/main_ppo.py:141``) and the launcher only sets
that mode. The entry point (:mod:`verl_avspo.verl_plugin.register`) imports this module as soon as verl's
``verl.trainer.ppo.v1`` is imported, in whatever process that is, so the registry holds our names wherever verl
looks them up, and no other process pays for this module's imports.

verl then reads the mode as a mode: ``self.trainer_mode`` and the literal comparisons with ``"sync"``
(``trainer_base.py:129-157, 731, 902, 912, 1004, 1499``; ``verl/utils/skip/rollout_skip.py:189``; the list is
docs/architecture.md's). Each of our trainers therefore sets ``trainer.v1.trainer_mode`` back to verl's name for
its mode (:attr:`~verl_avspo.verl_plugin.trainer.AVSPOTrainer.verl_mode`) before verl's ``__init__`` runs: the
config is the TaskRunner's own object, so every later reader (the trainer, the replay buffer, the agent loop,
rollout skip) sees verl's name. All three verl trainers inherit the methods ours overrides from the base
``PPOTrainer``, so the one class serves them all.
"""

from __future__ import annotations

from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_avspo.verl_plugin.registries import is_ours, registered
from verl_avspo.verl_plugin.trainer import ACR_TIMING_KEY, AVSPOTrainer
from verl_avspo.verl_plugin.trainer_modes import our_mode

__all__ = [
    "ACR_TIMING_KEY",
    "AVSPOTrainerSync",
    "AVSPOTrainerColocateAsync",
    "AVSPOTrainerSeparateAsync",
    "V1_TRAINERS",
]


def _register(name: str, cls: type) -> type:
    """``register_trainer(name)(cls)``, once per process: where ours is registered already (an earlier import
    of this module, before a reload) that class stays and is returned. verl refuses another's class under the
    name (``ValueError``)."""
    current = registered(trainer_base.get_trainer_cls, name)
    if is_ours(current, cls):
        return current
    return trainer_base.register_trainer(name)(cls)


class AVSPOTrainerSync(AVSPOTrainer, PPOTrainerSync):
    """verl's V1 ``sync`` trainer with ours."""

    verl_mode = "sync"


class AVSPOTrainerColocateAsync(AVSPOTrainer, PPOTrainerColocateAsync):
    """verl's V1 ``colocate_async`` trainer (partial rollouts on the training GPUs) with ours."""

    verl_mode = "colocate_async"


class AVSPOTrainerSeparateAsync(AVSPOTrainer, PPOTrainerSeparateAsync):
    """verl's V1 ``separate_async`` trainer (a standalone rollout pool) with ours."""

    verl_mode = "separate_async"


# Our mode name -> our trainer for it, as registered in verl's trainer registry (the class of this process's first
# import of this module: a reload registers nothing again).
V1_TRAINERS = {
    our_mode(cls.verl_mode): _register(our_mode(cls.verl_mode), cls)
    for cls in (AVSPOTrainerSync, AVSPOTrainerColocateAsync, AVSPOTrainerSeparateAsync)
}
