"""What every verl trainer of the launcher adds: ACR metrics, the stagnation alert, AVSPO's checkpoint state.

:class:`AVSPOTrainerMixin` is mixed into verl's trainers by :mod:`verl_avspo.verl_plugin.trainer_v1`
(the V1 trainers of every mode: ``sync``, ``colocate_async``, ``separate_async``) and
:mod:`verl_avspo.verl_plugin.trainer_legacy` (the legacy ``RayPPOTrainer``, ``trainer.use_v1=False``).
This module imports neither: each route imports only its own trainer, so the legacy route runs
without TransferQueue and the V1 routes without ``main_ppo_v0``. For any group estimator (grpo,
rloo, avspo, ...) the trainers log:

- ``acr/rate``, ``acr/all_correct``, ``acr/all_wrong`` on the raw scores (before DAPO filtering),
  ``acr/effective`` on the final advantages, and ``acr/groups``, ``acr/singletons``,
  ``acr/reward_mean`` (the mean raw score of the measured groups), all from
  ``verl_avspo.core.collapse.measure_collapse``;
- for ``avspo``, the estimator's own ``avspo/threshold``, ``avspo/signal``, ``avspo/triggered`` and
  ``avspo/virtual_k`` (taken from ``register.pop_last_metrics``: the estimator runs once);
- ``acr/stalled``: 1 while the stall rule ``algorithm.avspo.alert.rule`` holds (its signal above
  ``alert.threshold`` for ``alert.window`` consecutive steps, ``core.alert``). The first such step
  logs a warning with advice; with ``alert.action=stop`` (V1 only) it also saves a checkpoint and
  ends the run after that step.

No metric name contains ``max``, ``min``, ``sum`` or ``total``: verl's MetricsAggregator would
reduce it with that operation instead of averaging.

Checkpoints: ``_save_checkpoint`` / ``_load_checkpoint`` are overridden rather than using
``trainer.checkpoint_callback_class``, because the callback has no load event and fires after
``latest_checkpointed_iteration.txt`` is written. Our state is written to
``global_step_N/avspo_state.pt`` *before* verl's own save, so the tracker file only ever points at a
folder that already holds it, and it is restored right after verl resolves the resume folder.
The file stays local: ``trainer.default_hdfs_dir`` receives verl's actor files only.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from verl.utils.fs import local_mkdir_safe

from verl_avspo.core.alert import StagnationMonitor
from verl_avspo.core.baselines import dcpo_settings, intrinsic_settings
from verl_avspo.core.collapse import DroppedGroups, measure_collapse
from verl_avspo.verl_plugin import register
from verl_avspo.verl_plugin.checks import is_group_estimator

__all__ = ["STATE_FILE", "AVSPOTrainerMixin"]

logger = logging.getLogger(__name__)

# verl-avspo's state beside verl's checkpoint: the AVSPO controller, the alert's streak and DCPO's
# reward history (the name predates DCPO; kept so that earlier checkpoints resume).
STATE_FILE = "avspo_state.pt"


class AVSPOTrainerMixin:
    """What both trainers add: ACR metrics, the stagnation alert and the AVSPO checkpoint state.

    Mixed in before a verl trainer class; relies on its ``config`` and ``global_steps``.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._init_avspo()

    def _init_avspo(self) -> None:
        self.acr_settings = register.acr_settings(self.config.algorithm)
        self.stagnation = StagnationMonitor(self.acr_settings.alert)
        estimator = str(self.config.algorithm.adv_estimator)
        self.uses_avspo = estimator == register.NAME
        self.avspo_settings = register.avspo_settings(self.config.algorithm) if self.uses_avspo else None
        self.uses_dcpo = estimator == register.DCPO_NAME
        self.dcpo_settings = dcpo_settings(self.config.algorithm)
        self.intrinsic = intrinsic_settings(self.config.algorithm)
        self.measures_collapse = is_group_estimator(estimator)

    # ---- metrics -------------------------------------------------------------------------

    def _collapse_metrics(
        self, scores: torch.Tensor, index: Any, advantages: torch.Tensor, dropped: DroppedGroups | None = None
    ) -> dict:
        """The step's ``acr/*`` (``verl_avspo.core.collapse.measure_collapse``) and, for avspo, the
        estimator's ``avspo/*``.

        Args:
            scores: (bs,) raw scores of the trained batch; index: (bs,) their uids.
            advantages: (bs, L) final advantages, for ``acr/effective``.
            dropped: the groups a filter removed before this batch (ACR is measured before filtering).
        """
        acr = self.acr_settings
        metrics = measure_collapse(scores, index, advantages, acr.tau, acr.reward_range, dropped)
        if self.uses_avspo:
            metrics.update(register.pop_last_metrics("avspo/"))
        return metrics

    def _observe_collapse(self, metrics: dict) -> bool:
        """Feed this step's ACR to the stagnation monitor and log ``acr/stalled``. Returns True
        on the one step at which the run becomes stalled."""
        newly_stalled = self.stagnation.update(metrics)
        metrics["acr/stalled"] = float(self.stagnation.stalled)
        if newly_stalled:
            logger.warning(self.stagnation.message(self.global_steps))
        return newly_stalled

    # ---- checkpoint ----------------------------------------------------------------------

    def _checkpoint_folder(self) -> str:
        return os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")

    def _dcpo_history(self):
        norm_adv_by_std = bool(self.config.algorithm.get("norm_adv_by_std_in_grpo", True))
        return register.get_dcpo_history(self.dcpo_settings, norm_adv_by_std)

    def _controller(self):
        return register.get_controller(self.avspo_settings, self.acr_settings)

    def avspo_state_dict(self) -> dict[str, Any]:
        controller = self._controller().state_dict() if self.uses_avspo else None
        dcpo = self._dcpo_history().state_dict() if self.uses_dcpo else None
        if dcpo is not None:
            dcpo["prompt_key"] = self.dcpo_settings.prompt_key  # what its keys are
        return {"controller": controller, "stagnation": self.stagnation.state_dict(), "dcpo": dcpo}

    def load_avspo_state_dict(self, state: dict[str, Any]) -> None:
        if self.uses_avspo and state.get("controller") is not None:
            self._controller().load_state_dict(state["controller"])
        if self.uses_dcpo:
            if state.get("dcpo") is None:
                logger.warning(
                    "the checkpoint holds no DCPO reward history (saved by a run with another estimator?): "
                    "every prompt's next visit counts as its first"
                )
            elif state["dcpo"].get("prompt_key", self.dcpo_settings.prompt_key) != self.dcpo_settings.prompt_key:
                # (A checkpoint from before prompt_key was saved is taken to match.)
                logger.warning(
                    "the checkpoint's DCPO reward history is keyed by %s, this run by algorithm.dcpo.prompt_key=%s: "
                    "no prompt would match, so the history starts fresh (every next visit counts as the first)",
                    state["dcpo"]["prompt_key"],
                    self.dcpo_settings.prompt_key,
                )
            else:
                self._dcpo_history().load_state_dict(state["dcpo"])
        self.stagnation.load_state_dict(state["stagnation"])

    def _save_checkpoint(self):
        folder = self._checkpoint_folder()
        local_mkdir_safe(folder)
        torch.save(self.avspo_state_dict(), os.path.join(folder, STATE_FILE))
        return super()._save_checkpoint()

    def _resume_folder(self) -> str | None:
        """The ``global_step_N`` folder verl just resumed from (None for a fresh start), found the
        way verl's ``_load_checkpoint`` finds it: ``global_steps`` was parsed from its name."""
        trainer_config = self.config.trainer
        if trainer_config.resume_mode == "disable" or not self.global_steps:
            return None
        if trainer_config.resume_mode == "resume_path":
            folder = str(trainer_config.resume_from_path)
        else:
            folder = self._checkpoint_folder()
        return os.path.abspath(folder)

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        folder = self._resume_folder()
        if folder is not None:
            path = os.path.join(folder, STATE_FILE)
            if os.path.exists(path):
                self.load_avspo_state_dict(torch.load(path, weights_only=True))
                logger.info("restored AVSPO controller and stagnation state from %s", path)
            else:
                logger.warning(
                    "%s has no %s (written by a run without verl-avspo?): the AVSPO threshold and the "
                    "stagnation streak start fresh",
                    folder,
                    STATE_FILE,
                )
        return result
