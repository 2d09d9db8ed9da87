"""Our verl V1 trainer (every mode): one class, :class:`AVSPOTrainer`, put before verl's trainer of each mode
(:mod:`verl_avspo.verl_plugin.trainer_v1` registers the three). What it adds to verl's:

- **ACR and the stall alert.** The run's :class:`~verl_avspo.core.run_tracker.RunTracker` measures each step's
  raw scores around verl's advantage stage (:meth:`AVSPOTrainer._compute_advantage`) and turns them into every
  ``acr/*`` metric; after verl's step it runs the stall rule (``acr/stalled``: the first stalled step logs a
  warning with advice, and ``algorithm.acr.alert.action=stop`` also saves a checkpoint and ends the run after
  that step). For ``avspo`` the estimator's own ``avspo/*`` join the same step's log.
- **The estimators' state.** The trainer hands verl's estimator functions its tracker at start-up, for the
  ``config.algorithm`` node verl's advantage stage passes them (:func:`~verl_avspo.verl_plugin.run_state.start_run`).
- **Prompts.** Each step's prompt keys and the groups verl's replay buffer clears unsampled go to the per-prompt
  history (:class:`~verl_avspo.verl_plugin.prompt_hooks.PromptRecords`); opt-in, prompts are skipped before
  their rollout (:class:`~verl_avspo.verl_plugin.prompt_hooks.PromptSkipping`) or given their own rollout count
  (:class:`~verl_avspo.verl_plugin.rollout_allocation.RolloutAllocation`); RENT's and INTUITOR's rewards replace
  the verifier's (:class:`~verl_avspo.verl_plugin.baseline_hooks.IntrinsicReward`, ``sync`` mode only).
- **Checkpoints.** The tracker's state is written to ``global_step_N/avspo_state.pt`` *before* verl's own save,
  so verl's tracker file only ever points at a folder that already holds it, and read back right after verl
  resolves the resume folder. (``trainer.checkpoint_callback_class`` has no load event and fires after
  ``latest_checkpointed_iteration.txt`` is written.) The file is written beside its target and renamed into
  place, so a full disk leaves no torn file; it stays local (``trainer.default_hdfs_dir`` gets verl's files).
- **The log kept on resume** (:mod:`verl_avspo.verl_plugin.file_log`).

The settings are parsed once, in ``__init__`` (:func:`~verl_avspo.verl_plugin.settings.parse_settings`), and
each part gets what it acts on. The parts hold no reference to the trainer: each override below passes them
what verl's trainer holds. Every verl method overridden calls verl's own; the private ones are listed in
:mod:`verl_avspo.verl_plugin.surface`. No metric name contains ``max``, ``min``, ``sum`` or ``total``: verl's
MetricsAggregator would reduce it with that operation instead of averaging.

Known limit: V1's ``compute_advantage_for_multi_trajectories`` groups multi-output agent sessions only for
``grpo``; for other estimators (avspo included) and for ACR every output row counts as one sample of its
prompt's group.
"""

from __future__ import annotations

import logging
import os
import time

from omegaconf import DictConfig
from verl.utils import tensordict_utils as tu
from verl.utils.fs import local_mkdir_safe

from verl_avspo.core.baseline_settings import IntrinsicConfig
from verl_avspo.core.files import FileWriteError
from verl_avspo.core.run_tracker import STATE_FILE, RunTracker
from verl_avspo.core.state_file import RunStateError
from verl_avspo.verl_plugin import run_state
from verl_avspo.verl_plugin.baseline_hooks import IntrinsicReward
from verl_avspo.verl_plugin.checks.checkpoint_folder import previous_checkpoint_fix
from verl_avspo.verl_plugin.estimators import is_group_estimator
from verl_avspo.verl_plugin.file_log import log_history, resume_folder, write_log_history
from verl_avspo.verl_plugin.prompt_hooks import PromptRecords, PromptSkipping, dapo_tops_up, dataset_rows
from verl_avspo.verl_plugin.prompt_identity import PromptIdentity, resolve_prompt_identity
from verl_avspo.verl_plugin.rollout_allocation import RolloutAllocation, prepare_allocation
from verl_avspo.verl_plugin.settings import parse_settings
from verl_avspo.verl_plugin.v1_batch import dropped_groups, read_advantages, read_scores, real_rows

__all__ = ["ACR_TIMING_KEY", "STATE_FILE", "AVSPOTrainer"]

logger = logging.getLogger(__name__)

ACR_TIMING_KEY = "timing_s/acr"


class AVSPOTrainer:
    """What our V1 trainer adds to verl's (any mode; module docstring). Put before verl's trainer class."""

    verl_mode: str
    """verl's name of the mode this trainer runs: what verl's code is shown as ``trainer.v1.trainer_mode``."""

    def __init__(self, config: DictConfig):
        # verl compares the mode string literally (trainer_v1's docstring): show it its own name.
        config.trainer.v1.trainer_mode = self.verl_mode
        settings = parse_settings(config.algorithm)  # the one parse of this run's settings
        prepare_allocation(config, settings.prompts)  # before verl's TaskRunner builds the agent loop manager
        self._log_history = log_history(config)  # before verl's FileLogger reopens (truncates) the log, in fit
        super().__init__(config)
        identity = None
        if is_group_estimator(settings.estimator):
            # Where each prompt's identity is read from, for its history (and DCPO's), skipping and allocation.
            identity = resolve_prompt_identity(self.config)
            logger.info("verl-avspo: prompts are keyed by %s (%s)", identity.source, identity.reason)
        else:
            logger.warning(
                "algorithm.adv_estimator=%s compares no groups of responses: verl-avspo's trainer logs no acr/* for it",
                settings.estimator,
            )
        # The tracker, served to verl's estimator calls with this run's config.algorithm.
        self._assemble(run_state.start_run(self.config.algorithm, settings), identity, settings.intrinsic)

    def _assemble(self, tracker: RunTracker, identity: PromptIdentity | None, intrinsic: IntrinsicConfig) -> None:
        """The run's parts, from its tracker, its prompt identity (None: the estimator compares no groups, so
        nothing is measured per prompt) and its intrinsic-reward settings."""
        group_size = self.config.actor_rollout_ref.rollout.n
        self.tracker, self.prompt_identity = tracker, identity
        source = identity.source if identity is not None else None
        on = identity is not None
        self.allocation = RolloutAllocation(tracker, source, group_size) if on and tracker.allocator else None
        self.records = PromptRecords(tracker, source, group_size, self.allocation) if on else None
        self.skipping = PromptSkipping(tracker, source, group_size) if on and tracker.skipper else None
        self.intrinsic = IntrinsicReward(intrinsic) if intrinsic.enabled else None

    # ---- the step ------------------------------------------------------------------------

    def _next_train_batch(self, num_prompts: int | None = None):
        """verl's next prompts for rollout (every dispatch of every mode: a step's batch, DAPO's refills, the
        async modes' exact counts); those the skip rule keeps, each with the allocator's count. Each call is one
        generation batch: its prompts' rollouts count as generated this step."""
        batch = super()._next_train_batch(num_prompts)
        if self.skipping is not None:
            batch = self.skipping.kept(batch, self._draw_prompts, len(self.train_dataloader), self._dapo_tops_up())
        if self.allocation is not None:
            batch, rollouts = self.allocation.allocate(batch, dataset_rows(batch, self.prompt_identity.source))
        else:
            rollouts = len(batch) * self.config.actor_rollout_ref.rollout.n
        self.tracker.count_rollouts(rollouts)
        return batch

    def _draw_prompts(self):
        """The dataloader's next chunk of prompts, as verl's ``_next_train_batch`` stamps it (skipping's refills)."""
        chunk = self._fetch_one_gen_batch()
        tu.assign_non_tensor_data(chunk, "global_steps", self.global_steps)
        return chunk

    def _dapo_tops_up(self) -> bool:
        mode, buffer = getattr(self, "trainer_mode", "sync"), getattr(self, "replay_buffer", None)
        return dapo_tops_up(self.config, mode, buffer)

    def step(self, metrics: dict, timing_raw: dict):
        """verl's step, then the stall rule on the step's metrics (aggregated over its sub-batches)."""
        if self.records is not None:
            self.records.watch(self.replay_buffer)
        if self.skipping is not None and self._dapo_tops_up():
            updates = getattr(self, "parameter_sync_step", 1)
            batch_size = self.config.data.train_batch_size // updates
            self.skipping.watch(self.replay_buffer, batch_size, self._add_prompts_to_generate)
        batch = super().step(metrics, timing_raw)
        if self.skipping is not None:
            self.skipping.close_step()
        stalled = "acr/rate" in metrics and self.tracker.observe_step(self.global_steps, metrics)
        if stalled and self.tracker.acr.alert.action == "stop":
            self._stop_stalled_run()
        return batch

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int):
        """verl's local update, its replay buffer waiting for the step's groups less the prompts the allocator's
        budget left out (sync mode only, where each step's prompts are dispatched before it samples)."""
        left_out = self.allocation.take_left_out() if self.allocation is not None else 0
        return super()._step_once(metrics, timing_raw, sample_batch_size - left_out)

    def _compute_old_log_prob(self, batch, metrics: dict):
        """verl's old-log-prob pass; for INTUITOR it also returns each token's self-certainty."""
        if self.intrinsic is None:
            return super()._compute_old_log_prob(batch, metrics)
        self.intrinsic.request(batch)
        return self.intrinsic.store(super()._compute_old_log_prob(batch, metrics))

    def _compute_advantage(self, batch, metrics: dict):
        """verl's advantage stage with the step's collapse measured around it: the raw scores of the batch's real
        rows (and the groups DAPO filtering dropped while it was sampled) before, the trained advantages after,
        and the batch's prompt keys for the per-prompt history (read with the scores). verl's estimator call
        inside the stage uses this trainer's tracker (:func:`run_state.start_run`). Costs two TransferQueue reads
        (plus, before the stage, the intrinsic reward's inputs when it is on)."""
        if self.intrinsic is not None:
            self.intrinsic.apply(batch, metrics)
        if self.records is None:
            return super()._compute_advantage(batch, metrics)
        start = time.perf_counter()
        keys = [key for key, real in zip(batch.keys, real_rows(batch), strict=True) if real]
        pilot_field = self.allocation.pilot_field if self.allocation is not None else None
        rows = read_scores(keys, batch.partition_id, self.prompt_identity.source, pilot_field)
        self.records.pass_keys(batch, rows.uids, rows.prompts)
        if self.allocation is not None:
            self.allocation.observe_pilots(keys, rows.pilot_sizes)
        # The sampler's eviction metrics of this iteration say what DAPO filtering removed.
        self.tracker.measure(rows.scores, rows.uids, dropped_groups(metrics))
        measuring = time.perf_counter() - start
        batch = super()._compute_advantage(batch, metrics)
        start = time.perf_counter()
        metrics.update(self.tracker.batch_metrics(read_advantages(keys, batch.partition_id)))
        # What measuring ACR costs (the TransferQueue reads included), part of verl's timing_s/adv.
        metrics[ACR_TIMING_KEY] = measuring + time.perf_counter() - start
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

    # ---- the log and checkpoints -----------------------------------------------------------

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

    def _checkpoint_folder(self) -> str:
        return os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")

    def _save_checkpoint(self):
        folder = self._checkpoint_folder()
        try:
            local_mkdir_safe(folder)  # ours is written first, before verl makes the folder
            self.tracker.save(folder)
        except OSError as err:  # a full disk, a read-only or vanished folder: said with the key and the path
            where = self.config.trainer.default_local_dir
            raise FileWriteError(
                err.errno or 0,
                f"step {self.global_steps}'s checkpoint was not saved ({err}): verl's own files were not written, and "
                "the checkpoints before it are intact (latest_checkpointed_iteration.txt names the last). Free space "
                f"in trainer.default_local_dir={where} (or make it writable) and resume from its latest checkpoint "
                "with trainer.resume_mode=auto",
            ) from err
        return super()._save_checkpoint()

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        if self.global_steps:  # verl resumed (it parsed global_steps from the folder's name)
            folder = resume_folder(self.config.trainer)
            try:
                self.tracker.load(folder)
            except RunStateError as err:  # the launcher's checks refuse it before Ray; stock main_ppo gets here
                raise RunStateError(f"{err}. {previous_checkpoint_fix(folder)}.") from None
        return result
