"""verl's V1 trainers, every mode, with ACR metrics, the stagnation alert and AVSPO checkpoint state.

:func:`install_v1_trainers` puts :class:`AVSPOTrainerSync`, :class:`AVSPOTrainerColocateAsync` and
:class:`AVSPOTrainerSeparateAsync` into verl's ``TRAINER_REGISTRY`` under verl's own mode names
(``sync``, ``colocate_async``, ``separate_async``: verl compares them literally, so a new name would
silently change behaviour). All three verl trainers inherit ``_compute_advantage``, ``step``,
``_save_checkpoint`` and ``_load_checkpoint`` from the base ``PPOTrainer`` (``trainer_base.py``),
so one mixin, :class:`AVSPOTrainerV1Mixin`, serves them all. What it logs and saves:
:mod:`verl_avspo.verl_plugin.trainer`.

The paper's other baselines (DCPO, RENT, INTUITOR; ``sync`` mode only) hook in through
:class:`verl_avspo.verl_plugin.baseline_hooks.BaselineHooksV1`.

Known limit: V1's ``compute_advantage_for_multi_trajectories`` groups multi-output agent sessions
only for ``grpo``; for other estimators (avspo included) and for ACR every output row counts as
one sample of its prompt's group.
"""

from __future__ import annotations

import logging
import time

import ray
from omegaconf import DictConfig
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_avspo.verl_plugin.baseline_hooks import BaselineHooksV1
from verl_avspo.verl_plugin.file_log import install_resumed_file_logger
from verl_avspo.verl_plugin.trainer import AVSPOTrainerMixin
from verl_avspo.verl_plugin.v1_batch import dropped_groups, read_advantages, read_scores, real_rows

__all__ = [
    "AVSPOTrainerV1Mixin",
    "AVSPOTrainerSync",
    "AVSPOTrainerColocateAsync",
    "AVSPOTrainerSeparateAsync",
    "V1_TRAINERS",
    "install_v1_trainers",
    "AVSPOTaskRunner",
    "adopt",
    "ACR_TIMING_KEY",
]

logger = logging.getLogger(__name__)

ACR_TIMING_KEY = "timing_s/acr"


class AVSPOTrainerV1Mixin(BaselineHooksV1, AVSPOTrainerMixin):
    """What the launcher adds to a V1 trainer (any mode). Mixed in before verl's trainer class."""

    def _compute_advantage(self, batch, metrics: dict):
        """verl's advantage stage with the step's collapse measured around it: the raw scores of the
        batch's real rows (and the groups DAPO filtering dropped while it was sampled) before, the
        trained advantages after. Costs two TransferQueue reads (plus, before the stage, the
        intrinsic reward's inputs or DCPO's prompt keys when those are on)."""
        self._apply_baselines(batch, metrics)
        if not self.measures_collapse:
            return super()._compute_advantage(batch, metrics)
        start = time.perf_counter()
        keys = [key for key, real in zip(batch.keys, real_rows(batch), strict=True) if real]
        # The sampler's eviction metrics of this iteration say what DAPO filtering removed.
        self.tracker.measure(*read_scores(keys, batch.partition_id), dropped_groups(metrics))
        measuring = time.perf_counter() - start
        batch = super()._compute_advantage(batch, metrics)
        start = time.perf_counter()
        metrics.update(self.tracker.batch_metrics(read_advantages(keys, batch.partition_id)))
        # What measuring ACR costs (the TransferQueue reads included), part of verl's timing_s/adv.
        metrics[ACR_TIMING_KEY] = measuring + time.perf_counter() - start
        return batch

    def step(self, metrics: dict, timing_raw: dict):
        """verl's step, then the stall rule on the step's metrics (aggregated over its sub-batches)."""
        batch = super().step(metrics, timing_raw)
        stalled = "acr/rate" in metrics and self.tracker.observe_step(self.global_steps, metrics)
        if stalled and self.tracker.acr.alert.action == "stop":
            self._stop_stalled_run()
        return batch

    def _stop_stalled_run(self) -> None:
        """Save a checkpoint now and make this step the last: ``fit`` logs the step, then its loop
        condition ``global_steps <= total_training_steps`` ends the run normally."""
        save_freq = self.config.trainer.save_freq
        last_step = self.global_steps >= self.total_training_steps
        if not (save_freq > 0 and (last_step or self.global_steps % save_freq == 0)):  # else fit saves it anyway
            self._save_checkpoint()
        self.total_training_steps = self.global_steps
        logger.error(
            "stopping the run after step %d (algorithm.acr.alert.action=stop); checkpoint: %s. Change the setup "
            "as advised above, then resume with trainer.resume_mode=auto.",
            self.global_steps,
            self._checkpoint_folder(),
        )


class AVSPOTrainerSync(AVSPOTrainerV1Mixin, PPOTrainerSync):
    """verl's V1 ``sync`` trainer with ACR metrics, the alert and AVSPO checkpoint state."""


class AVSPOTrainerColocateAsync(AVSPOTrainerV1Mixin, PPOTrainerColocateAsync):
    """verl's V1 ``colocate_async`` trainer (partial rollouts on the training GPUs) with ACR metrics,
    the alert and AVSPO checkpoint state."""


class AVSPOTrainerSeparateAsync(AVSPOTrainerV1Mixin, PPOTrainerSeparateAsync):
    """verl's V1 ``separate_async`` trainer (a standalone rollout pool) with ACR metrics, the alert
    and AVSPO checkpoint state."""


# verl's mode name -> our trainer for it.
V1_TRAINERS = {
    "sync": AVSPOTrainerSync,
    "colocate_async": AVSPOTrainerColocateAsync,
    "separate_async": AVSPOTrainerSeparateAsync,
}


def install_v1_trainers() -> None:
    """Make every V1 mode build our trainer for it. Call inside the TaskRunner actor.

    Assigns the registry entries directly: ``register_trainer`` refuses to re-register a name, and
    the names must stay verl's because verl compares the mode string literally.
    """
    trainer_base.TRAINER_REGISTRY.update(V1_TRAINERS)


@ray.remote
class AVSPOTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's V1 TaskRunner building our trainer for ``trainer.v1.trainer_mode``; the swap happens
    inside the actor, where the trainer is built."""

    def run(self, config: DictConfig):
        install_v1_trainers()
        install_resumed_file_logger(config)
        return super().run(config)


def adopt(trainer) -> None:
    """Make an already built V1 trainer (any mode, any subclass) behave as the launcher's: its class
    becomes a subclass with :class:`AVSPOTrainerV1Mixin` first, and the run's tracker is started.
    The stock hook does this from verl's replay-buffer construction, which runs in the trainer's
    ``__init__`` before ``init_workers`` resumes a checkpoint, so the restore is the launcher's too."""
    cls = type(trainer)
    if isinstance(trainer, AVSPOTrainerV1Mixin):
        return
    trainer.__class__ = type(cls.__name__, (AVSPOTrainerV1Mixin, cls), {"__module__": cls.__module__})
    trainer._init_avspo()
