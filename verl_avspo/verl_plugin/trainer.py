"""What our verl trainer adds: ACR metrics, the stagnation alert, the run's checkpointed state.

:class:`ACRTrainerMixin` is mixed into verl's V1 trainers of every mode by
:mod:`verl_avspo.verl_plugin.trainer_v1`. This module imports no trainer of verl's (no TransferQueue).

The run's :class:`~verl_avspo.core.run_tracker.RunTracker` (handed to verl's estimator functions during the
advantage stage, :mod:`verl_avspo.verl_plugin.run_state`) measures each step's raw scores once and turns them
into every ``acr/*`` metric, runs the stall rule (``acr/stalled``; the first stalled step logs a warning
with advice, and ``algorithm.acr.alert.action=stop`` also saves a checkpoint and ends the run
after that step) and holds the state a restart keeps. For ``avspo`` the estimator's own
``avspo/threshold``, ``avspo/signal``, ``avspo/triggered`` and ``avspo/virtual_k`` join the same step's log.

No metric name contains ``max``, ``min``, ``sum`` or ``total``: verl's MetricsAggregator would
reduce it with that operation instead of averaging.

Checkpoints: ``_save_checkpoint`` / ``_load_checkpoint`` are overridden rather than using
``trainer.checkpoint_callback_class``, because the callback has no load event and fires after
``latest_checkpointed_iteration.txt`` is written. The tracker's state is written to
``global_step_N/avspo_state.pt`` *before* verl's own save, so the tracker file only ever points at a
folder that already holds it, and it is restored right after verl resolves the resume folder. The
state is written beside its target and renamed into place (``RunTracker.save``), so a full disk
leaves no torn file; the error names the file, ``trainer.default_local_dir`` and the fix.
The file stays local: ``trainer.default_hdfs_dir`` receives verl's actor files only.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from verl.utils.fs import local_mkdir_safe

from verl_avspo.core.baseline_settings import intrinsic_settings
from verl_avspo.core.files import FileWriteError
from verl_avspo.core.run_tracker import STATE_FILE
from verl_avspo.core.state_file import RunStateError
from verl_avspo.verl_plugin import run_state
from verl_avspo.verl_plugin.checks.checkpoint_folder import previous_checkpoint_fix
from verl_avspo.verl_plugin.estimators import is_group_estimator
from verl_avspo.verl_plugin.file_log import resume_folder
from verl_avspo.verl_plugin.prompt_identity import resolve_prompt_identity

__all__ = ["STATE_FILE", "ACRTrainerMixin"]

logger = logging.getLogger(__name__)


class ACRTrainerMixin:
    """The run's tracker (ACR metrics, the stagnation alert) and its checkpointed state.

    Mixed in before a verl trainer class; relies on its ``config`` and ``global_steps``.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        algorithm = self.config.algorithm
        estimator = str(algorithm.adv_estimator)
        self.tracker = run_state.start_run(algorithm)
        self.intrinsic = intrinsic_settings(algorithm)
        self.measures_collapse = is_group_estimator(estimator)
        # Where each prompt's identity is read from, for its history (and DCPO's) and skipping.
        self.prompt_identity = resolve_prompt_identity(self.config) if self.measures_collapse else None
        self.skips_prompts = self.prompt_identity is not None and self.tracker.skipper is not None
        self.allocates_rollouts = self.prompt_identity is not None and self.tracker.allocator is not None
        if not self.measures_collapse:
            logger.warning(
                "algorithm.adv_estimator=%s compares no groups of responses: verl-avspo's trainer logs no acr/* for it",
                estimator,
            )
        if self.prompt_identity is not None:
            logger.info(
                "verl-avspo: prompts are keyed by %s (%s)", self.prompt_identity.source, self.prompt_identity.reason
            )

    # ---- checkpoint ----------------------------------------------------------------------

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
