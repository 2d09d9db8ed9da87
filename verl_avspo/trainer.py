"""verl trainers that log ACR every step, raise the stagnation alert, and checkpoint AVSPO's state.

:class:`AVSPOTrainerSync` is verl's V1 ``PPOTrainerSync``; :class:`AVSPORayPPOTrainer` is the legacy
``RayPPOTrainer`` (``trainer.use_v1=False``). Both add, for any group estimator (grpo, rloo,
avspo, ...):

- ``acr/rate``, ``acr/all_correct``, ``acr/all_wrong`` on the raw scores (before DAPO filtering),
  ``acr/effective`` on the final advantages, and ``acr/groups``, ``acr/singletons``;
- for ``avspo``, the estimator's own ``avspo/threshold``, ``avspo/signal``, ``avspo/triggered`` and
  ``avspo/virtual_k`` (taken from ``register.pop_last_metrics``: the estimator runs once);
- ``acr/stalled``: 1 while ACR has stayed above ``algorithm.avspo.alert.threshold`` for
  ``alert.window`` consecutive steps. The first such step logs a warning with advice; with
  ``alert.action=stop`` (V1 only) it also saves a checkpoint and ends the run after that step.

No metric name contains ``max``, ``min``, ``sum`` or ``total``: verl's MetricsAggregator would
reduce it with that operation instead of averaging.

Checkpoints: ``_save_checkpoint`` / ``_load_checkpoint`` are overridden rather than using
``trainer.checkpoint_callback_class``, because the callback has no load event and fires after
``latest_checkpointed_iteration.txt`` is written. Our state is written to
``global_step_N/avspo_state.pt`` *before* verl's own save, so the tracker file only ever points at a
folder that already holds it, and it is restored right after verl resolves the resume folder.
The file stays local: ``trainer.default_hdfs_dir`` receives verl's actor files only.

Known limit: V1's ``compute_advantage_for_multi_trajectories`` groups multi-output agent sessions
only for ``grpo``; for other estimators (avspo included) and for ACR every output row counts as
one sample of its prompt's group.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.replay_buffer import DAPO_FILTERED_REWARD_COUNTS_KEY
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.fs import local_mkdir_safe

from verl_avspo import register
from verl_avspo.alert import StagnationMonitor
from verl_avspo.collapse import acr_metrics, detect_collapse, effective_collapse_rate, group_ids, group_stats
from verl_avspo.config import AVSPOConfig
from verl_avspo.main_ppo import is_group_estimator

__all__ = [
    "STATE_FILE",
    "step_collapse_metrics",
    "AVSPOTrainerMixin",
    "AVSPOTrainerSync",
    "AVSPORayPPOTrainer",
    "install_sync_trainer",
    "install_legacy_trainer",
]

logger = logging.getLogger(__name__)

STATE_FILE = "avspo_state.pt"
# Prompt groups that V1's DAPO sampler generated but discarded as surplus (not collapsed).
_SURPLUS_KEY = "training/filter_groups/discarded_surplus_samples"


def step_collapse_metrics(
    scores: torch.Tensor,
    index: Any,
    advantages: torch.Tensor,
    settings: AVSPOConfig,
    filtered: Mapping[float, int] | None = None,
    surplus: int = 0,
) -> dict[str, float]:
    """One step's ``acr/*`` metrics for the trained batch, corrected for DAPO filtering.

    Args:
        scores: (bs,) raw per-response scores of the trained batch.
        index: (bs,) uid of each response.
        advantages: (bs,) or (bs, L) final advantages, for ``acr/effective``.
        settings: ``tau`` and ``reward_range`` come from here.
        filtered: ``{shared score: number of groups}`` of the collapsed groups that
            ``algorithm.filter_groups`` removed before this batch was sampled.
        surplus: non-collapsed groups the filter's over-sampling generated and discarded.

    Returns:
        ``acr/rate``, ``acr/all_correct``, ``acr/all_wrong`` and ``acr/groups`` over every
        generated group (trained + filtered + surplus), i.e. the rate before filtering;
        ``acr/effective`` and ``acr/singletons`` over the trained batch.
    """
    ids, num_groups = group_ids(index, device=scores.device)
    stats = group_stats(scores, ids, num_groups)
    kept = detect_collapse(stats, settings.tau, settings.reward_range)
    effective = effective_collapse_rate(advantages, stats, settings.tau)
    if not filtered and not surplus:
        return acr_metrics(kept, effective)
    filtered = filtered or {}
    midpoint = 0.5 * sum(settings.reward_range)
    filtered_correct = sum(count for value, count in filtered.items() if float(value) >= midpoint)
    filtered_wrong = sum(filtered.values()) - filtered_correct
    eligible = kept.num_eligible + filtered_correct + filtered_wrong + int(surplus)
    correct = int(kept.all_correct.sum()) + filtered_correct
    wrong = int(kept.all_wrong.sum()) + filtered_wrong
    before = dataclasses.replace(
        kept,
        num_eligible=eligible,
        rate=(correct + wrong) / eligible,
        all_correct_rate=correct / eligible,
        all_wrong_rate=wrong / eligible,
    )
    return acr_metrics(before, effective)


class AVSPOTrainerMixin:
    """What both trainers add: ACR metrics, the stagnation alert and the AVSPO checkpoint state.

    Mixed in before a verl trainer class; relies on its ``config`` and ``global_steps``.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._init_avspo()

    def _init_avspo(self) -> None:
        self.avspo_settings = register.avspo_settings(self.config.algorithm)
        self.stagnation = StagnationMonitor(self.avspo_settings.alert)
        estimator = str(self.config.algorithm.adv_estimator)
        self.uses_avspo = estimator == register.NAME
        self.measures_collapse = is_group_estimator(estimator)

    # ---- metrics -------------------------------------------------------------------------

    def _collapse_metrics(self, scores: torch.Tensor, index: Any, advantages: torch.Tensor, **filtering: Any) -> dict:
        metrics = step_collapse_metrics(scores, index, advantages, self.avspo_settings, **filtering)
        if self.uses_avspo:
            metrics.update({k: v for k, v in register.pop_last_metrics().items() if k.startswith("avspo/")})
        return metrics

    def _observe_collapse(self, metrics: dict) -> bool:
        """Feed this step's ACR to the stagnation monitor and log ``acr/stalled``. Returns True
        on the one step at which the run becomes stalled."""
        newly_stalled = self.stagnation.update(metrics["acr/rate"])
        metrics["acr/stalled"] = float(self.stagnation.stalled)
        if newly_stalled:
            logger.warning(self.stagnation.message(self.global_steps))
        return newly_stalled

    # ---- checkpoint ----------------------------------------------------------------------

    def _checkpoint_folder(self) -> str:
        return os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")

    def avspo_state_dict(self) -> dict[str, Any]:
        controller = register.get_controller(self.avspo_settings).state_dict() if self.uses_avspo else None
        return {"controller": controller, "stagnation": self.stagnation.state_dict()}

    def load_avspo_state_dict(self, state: dict[str, Any]) -> None:
        if self.uses_avspo and state.get("controller") is not None:
            register.get_controller(self.avspo_settings).load_state_dict(state["controller"])
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


class AVSPOTrainerSync(AVSPOTrainerMixin, PPOTrainerSync):
    """verl's V1 synchronous trainer with ACR metrics, the alert and AVSPO checkpoint state.

    Installed under the mode name ``sync`` by :func:`install_sync_trainer`.
    """

    def _compute_advantage(self, batch, metrics: dict):
        """verl's advantage stage, then the step's collapse metrics. Costs one TransferQueue read
        of ``uid``, ``rm_scores`` and the ``advantages`` just written."""
        batch = super()._compute_advantage(batch, metrics)
        if self.measures_collapse:
            # _balance_batch appended no-op rows (one shared `pad...` uid, score 0) to make the
            # batch divisible by the DP size; they are not responses, so they are not counted.
            keys = [key for key, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding", False)]
            data = tq.kv_batch_get(
                keys=keys, partition_id=batch.partition_id, select_fields=["uid", "rm_scores", "advantages"]
            )
            scores = data["rm_scores"].to_padded_tensor(0.0).sum(dim=-1)
            index = np.array(list(data["uid"]), dtype=object)
            advantages = data["advantages"].to_padded_tensor(0.0)
            # The sampler's eviction metrics of this iteration: what DAPO filtering removed.
            filtering = {
                "filtered": metrics.get(DAPO_FILTERED_REWARD_COUNTS_KEY),
                "surplus": metrics.get(_SURPLUS_KEY, 0),
            }
            metrics.update(self._collapse_metrics(scores, index, advantages, **filtering))
        return batch

    def step(self, metrics: dict, timing_raw: dict):
        batch = super().step(metrics, timing_raw)
        if "acr/rate" in metrics and self._observe_collapse(metrics) and self.stagnation.config.action == "stop":
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
            "stopping the run after step %d (algorithm.avspo.alert.action=stop); checkpoint: %s. Change the setup "
            "as advised above, then resume with trainer.resume_mode=auto.",
            self.global_steps,
            self._checkpoint_folder(),
        )


class AVSPORayPPOTrainer(AVSPOTrainerMixin, RayPPOTrainer):
    """verl's legacy trainer (``trainer.use_v1=False``) with ACR metrics, the alert (warn only)
    and AVSPO checkpoint state. Its ``fit`` is one monolithic loop; the batch with raw scores and
    final advantages first reaches an overridable method in ``_update_actor``, whose returned
    metrics ``fit`` merges into the step's log (so no ACR is logged during critic warmup)."""

    def _update_actor(self, batch: DataProto) -> DataProto:
        output = super()._update_actor(batch)
        output.meta_info["metrics"].update(self.batch_collapse_metrics(batch))
        return output

    def batch_collapse_metrics(self, batch: DataProto) -> dict[str, float]:
        """The step's ``acr/*`` (and ``avspo/*``) metrics from the legacy trainer's batch, and the
        alert. Empty for estimators without groups."""
        if not self.measures_collapse:
            return {}
        scores = batch.batch["token_level_scores"].sum(dim=-1)
        metrics = self._collapse_metrics(scores, batch.non_tensor_batch["uid"], batch.batch["advantages"])
        self._observe_collapse(metrics)
        return metrics


def install_sync_trainer() -> None:
    """Make V1's ``sync`` mode build :class:`AVSPOTrainerSync`. Call inside the TaskRunner actor.

    Assigns the registry entry directly: ``register_trainer`` refuses to re-register a name, and
    the name must stay ``sync`` because verl compares the mode string literally.
    """
    trainer_base.TRAINER_REGISTRY["sync"] = AVSPOTrainerSync


def install_legacy_trainer() -> None:
    """Make the legacy TaskRunner build :class:`AVSPORayPPOTrainer` (it looks the class up by its
    module-global name). Call inside the TaskRunner actor."""
    from verl.trainer import main_ppo_v0

    main_ppo_v0.RayPPOTrainer = AVSPORayPPOTrainer
