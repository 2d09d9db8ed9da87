"""verl's V1 trainers, every mode, with ACR metrics, the stagnation alert and AVSPO checkpoint state, in
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
its mode before verl's ``__init__`` runs: the config is the TaskRunner's own object, so every later reader
(the trainer, the replay buffer, the agent loop, rollout skip) sees verl's name.

All three verl trainers inherit ``_compute_advantage``, ``step``, ``_save_checkpoint`` and ``_load_checkpoint``
from the base ``PPOTrainer``, so one mixin, :class:`ACRTrainerV1Mixin`, serves them all. What it logs and
saves: :mod:`verl_avspo.verl_plugin.trainer`. The prompt identity of every step's groups and prompt skipping
before rollout hook in through :class:`verl_avspo.verl_plugin.prompt_hooks.PromptHooksV1`, per-prompt rollout
allocation through :class:`verl_avspo.verl_plugin.rollout_allocation.AllocationHooksV1`; the intrinsic rewards
of RENT and INTUITOR (``sync`` mode only) through :class:`verl_avspo.verl_plugin.baseline_hooks.BaselineHooksV1`.

Known limit: V1's ``compute_advantage_for_multi_trajectories`` groups multi-output agent sessions only for
``grpo``; for other estimators (avspo included) and for ACR every output row counts as one sample of its
prompt's group.
"""

from __future__ import annotations

import logging
import time

from omegaconf import DictConfig
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_avspo.verl_plugin import run_state
from verl_avspo.verl_plugin.baseline_hooks import BaselineHooksV1
from verl_avspo.verl_plugin.file_log import log_history, write_log_history
from verl_avspo.verl_plugin.prompt_hooks import PromptHooksV1
from verl_avspo.verl_plugin.registries import is_ours, registered
from verl_avspo.verl_plugin.rollout_allocation import AllocationHooksV1, prepare_allocation
from verl_avspo.verl_plugin.trainer import ACRTrainerMixin
from verl_avspo.verl_plugin.trainer_modes import our_mode
from verl_avspo.verl_plugin.v1_batch import dropped_groups, read_advantages, read_scores, real_rows

__all__ = [
    "ACRTrainerV1Mixin",
    "AVSPOTrainerSync",
    "AVSPOTrainerColocateAsync",
    "AVSPOTrainerSeparateAsync",
    "V1_TRAINERS",
    "ACR_TIMING_KEY",
]

logger = logging.getLogger(__name__)

ACR_TIMING_KEY = "timing_s/acr"


class ACRTrainerV1Mixin(ACRTrainerMixin, PromptHooksV1, AllocationHooksV1, BaselineHooksV1):
    """What our V1 trainer adds to verl's (any mode). Mixed in before verl's trainer class; the run's
    :class:`ACRTrainerMixin` first, so its ``__init__`` runs verl's and then sets what the hooks read."""

    verl_mode: str
    """verl's name of the mode this trainer runs: what verl's code is shown as ``trainer.v1.trainer_mode``."""

    def __init__(self, config: DictConfig):
        # verl compares the mode string literally from here on (module docstring): show it its own name.
        config.trainer.v1.trainer_mode = self.verl_mode
        prepare_allocation(config)  # before verl's TaskRunner builds the agent loop manager
        self._log_history = log_history(config)  # before verl's FileLogger reopens (truncates) the log, in fit
        super().__init__(config)

    @property
    def logger(self):
        """verl's ``Tracking`` of this run, which verl's ``fit`` builds and assigns here."""
        try:
            return self.__dict__["logger"]
        except KeyError:
            raise AttributeError("logger") from None

    @logger.setter
    def logger(self, tracking) -> None:
        """verl's ``fit`` assigns its new ``Tracking``: a resumed run's kept log rows go into its file logger
        before verl logs anything (verl's ``FileLogger`` truncated the file: :mod:`.file_log`)."""
        self.__dict__["logger"] = tracking
        history, self._log_history = getattr(self, "_log_history", b""), b""
        write_log_history(tracking, history)

    def _compute_advantage(self, batch, metrics: dict):
        """verl's advantage stage with the step's collapse measured around it: the raw scores of the
        batch's real rows (and the groups DAPO filtering dropped while it was sampled) before, the
        trained advantages after, and the batch's prompt keys for the per-prompt history (read with
        the scores). verl's estimator call inside the stage reaches this trainer's tracker
        (:func:`run_state.advantage_stage`). Costs two TransferQueue reads (plus, before the stage, the
        intrinsic reward's inputs when it is on)."""
        self._apply_baselines(batch, metrics)
        if not self.measures_collapse:
            with run_state.advantage_stage(self.tracker):
                return super()._compute_advantage(batch, metrics)
        start = time.perf_counter()
        keys = [key for key, real in zip(batch.keys, real_rows(batch), strict=True) if real]
        rows = read_scores(keys, batch.partition_id, self.prompt_identity.source, self.pilot_field)
        self._pass_prompt_keys(batch, rows.uids, rows.prompts)
        if self.allocates_rollouts:
            self._observe_pilots(keys, rows.pilot_sizes)
        # The sampler's eviction metrics of this iteration say what DAPO filtering removed.
        self.tracker.measure(rows.scores, rows.uids, dropped_groups(metrics))
        measuring = time.perf_counter() - start
        with run_state.advantage_stage(self.tracker):
            batch = super()._compute_advantage(batch, metrics)
        start = time.perf_counter()
        metrics.update(self.tracker.batch_metrics(read_advantages(keys, batch.partition_id)))
        # What measuring ACR costs (the TransferQueue reads included), part of verl's timing_s/adv.
        metrics[ACR_TIMING_KEY] = measuring + time.perf_counter() - start
        return batch

    def step(self, metrics: dict, timing_raw: dict):
        """verl's step, then the stall rule on the step's metrics (aggregated over its sub-batches)."""
        self._record_dropped_groups()
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


def _register(name: str, cls: type) -> type:
    """``register_trainer(name)(cls)``, once per process: where ours is registered already (an earlier import
    of this module, before a reload) that class stays and is returned. verl refuses another's class under the
    name (``ValueError``)."""
    current = registered(trainer_base.get_trainer_cls, name)
    if is_ours(current, cls):
        return current
    return trainer_base.register_trainer(name)(cls)


class AVSPOTrainerSync(ACRTrainerV1Mixin, PPOTrainerSync):
    """verl's V1 ``sync`` trainer with ACR metrics, the alert and AVSPO checkpoint state."""

    verl_mode = "sync"


class AVSPOTrainerColocateAsync(ACRTrainerV1Mixin, PPOTrainerColocateAsync):
    """verl's V1 ``colocate_async`` trainer (partial rollouts on the training GPUs) with ACR metrics,
    the alert and AVSPO checkpoint state."""

    verl_mode = "colocate_async"


class AVSPOTrainerSeparateAsync(ACRTrainerV1Mixin, PPOTrainerSeparateAsync):
    """verl's V1 ``separate_async`` trainer (a standalone rollout pool) with ACR metrics, the alert
    and AVSPO checkpoint state."""

    verl_mode = "separate_async"


# Our mode name -> our trainer for it, as registered in verl's trainer registry (the class of this process's first
# import of this module: a reload registers nothing again).
V1_TRAINERS = {
    our_mode(cls.verl_mode): _register(our_mode(cls.verl_mode), cls)
    for cls in (AVSPOTrainerSync, AVSPOTrainerColocateAsync, AVSPOTrainerSeparateAsync)
}
