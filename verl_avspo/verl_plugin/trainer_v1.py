"""verl's V1 trainers, every mode, with ACR metrics, the stagnation alert and AVSPO checkpoint state.

:func:`install_v1_trainers` puts :class:`AVSPOTrainerSync`, :class:`AVSPOTrainerColocateAsync` and
:class:`AVSPOTrainerSeparateAsync` into verl's ``TRAINER_REGISTRY`` under verl's own mode names
(``sync``, ``colocate_async``, ``separate_async``: verl compares them literally, so a new name would
silently change behaviour). All three verl trainers inherit ``_compute_advantage``, ``step``,
``_save_checkpoint`` and ``_load_checkpoint`` from the base ``PPOTrainer`` (``trainer_base.py``),
so one mixin, :class:`AVSPOTrainerV1Mixin`, serves them all. What it logs and saves:
:mod:`verl_avspo.verl_plugin.trainer`.

The prompt identity of every step's groups (the per-prompt history, DCPO's statistics) and prompt
skipping before rollout hook in through :class:`verl_avspo.verl_plugin.prompt_hooks.PromptHooksV1`;
the intrinsic rewards of RENT and INTUITOR (``sync`` mode only) through
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
from verl_avspo.verl_plugin.prompt_hooks import PromptHooksV1
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


class AVSPOTrainerV1Mixin(PromptHooksV1, BaselineHooksV1, AVSPOTrainerMixin):
    """What the launcher adds to a V1 trainer (any mode). Mixed in before verl's trainer class."""

    def _compute_advantage(self, batch, metrics: dict):
        """verl's advantage stage with the step's collapse measured around it: the raw scores of the
        batch's real rows (and the groups DAPO filtering dropped while it was sampled) before, the
        trained advantages after, and the batch's prompt keys for the per-prompt history (read with
        the scores). Costs two TransferQueue reads (plus, before the stage, the intrinsic reward's
        inputs when it is on)."""
        self._apply_baselines(batch, metrics)
        if not self.measures_collapse:
            return super()._compute_advantage(batch, metrics)
        start = time.perf_counter()
        keys = [key for key, real in zip(batch.keys, real_rows(batch), strict=True) if real]
        scores, uids, prompts = read_scores(keys, batch.partition_id, self.prompt_identity.source)
        self._pass_prompt_keys(batch, uids, prompts)
        # The sampler's eviction metrics of this iteration say what DAPO filtering removed.
        self.tracker.measure(scores, uids, dropped_groups(metrics))
        measuring = time.perf_counter() - start
        batch = super()._compute_advantage(batch, metrics)
        start = time.perf_counter()
        metrics.update(self.tracker.batch_metrics(read_advantages(keys, batch.partition_id)))
        # What measuring ACR costs (the TransferQueue reads included), part of verl's timing_s/adv.
        metrics[ACR_TIMING_KEY] = measuring + time.perf_counter() - start
        return batch

    def step(self, metrics: dict, timing_raw: dict):
        """verl's step, then the stall rule on the step's metrics (aggregated over its sub-batches)."""
        self._record_dropped_groups()  # here: the stock hook adopts the trainer before verl sets its replay_buffer
        self._top_up_open_places()
        batch = super().step(metrics, timing_raw)
        self._close_open_places()
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


def adopted_class(cls: type) -> type:
    """``cls`` (a verl V1 trainer class, or a subclass of one) with :class:`AVSPOTrainerV1Mixin` in front,
    under ``cls``'s own name and module: verl logs the class and compares the mode, not the class."""
    return type(cls.__name__, (AVSPOTrainerV1Mixin, cls), {"__module__": cls.__module__})


def adopt(trainer) -> None:
    """Make an already built V1 trainer (any mode) behave as the launcher's: its class becomes
    :func:`adopted_class` of its class, and the run's tracker is started. The stock hook does this from
    verl's replay-buffer construction, which runs in the trainer's ``__init__`` before ``init_workers``
    resumes a checkpoint, so the restore is the launcher's too.

    Raises:
        TypeError: the trainer's class has another object layout than verl's (a subclass with a mixin
            of its own that is not based on ``ABC``), so Python cannot change it.
    """
    if isinstance(trainer, AVSPOTrainerV1Mixin):
        return
    cls = type(trainer)
    try:
        trainer.__class__ = adopted_class(cls)
    except TypeError as err:
        raise TypeError(
            f"the ACR hook cannot turn trainer class {cls.__module__}.{cls.__qualname__} into the launcher's ({err}): "
            "its bases add another object layout than verl's PPOTrainer. Base your mixins on abc.ABC as verl's "
            "trainers are, or train with `python -m verl_avspo.main_ppo`."
        ) from None
    trainer._init_avspo()
