"""verl trainers that log ACR every step, raise the stagnation alert, and checkpoint AVSPO's state.

:class:`AVSPOTrainerSync` is verl's V1 ``PPOTrainerSync``; :class:`AVSPORayPPOTrainer` is the legacy
``RayPPOTrainer`` (``trainer.use_v1=False``). Both add, for any group estimator (grpo, rloo,
avspo, ...):

- ``acr/rate``, ``acr/all_correct``, ``acr/all_wrong`` on the raw scores (before DAPO filtering),
  ``acr/effective`` on the final advantages, and ``acr/groups``, ``acr/singletons``,
  ``acr/reward_mean`` (the mean raw score of the measured groups);
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

Baselines (V1 sync trainer only; the launcher refuses other trainers for them):

- ``algorithm.adv_estimator=dcpo``: before verl's advantage stage the trainer reads each
  response's prompt identity from TransferQueue (``algorithm.dcpo.prompt_key``: the ``index``
  field that verl's RLHFDataset fills from ``extra_info.index`` and the agent loop stores with
  every response, or a hash of ``raw_prompt``) and hands ``uid -> key`` to the estimator
  (``register.set_prompt_keys``). DCPO's per-prompt history is checkpointed with AVSPO's state.
- ``algorithm.intrinsic.reward=negative_entropy`` (RENT) / ``self_certainty`` (INTUITOR): the
  verifier's ``rm_scores`` are replaced, before the advantage stage, by the intrinsic reward of
  each response, computed from the old policy's per-token entropy (which verl's old-log-prob pass
  already returns) or self-certainty (which it returns only with
  ``patches/verl-0.9.1-intrinsic.patch``); the verifier's mean score is still logged
  (``intrinsic/verifier_score``). ``acr/*`` then measure the intrinsic reward's groups.

Known limit: V1's ``compute_advantage_for_multi_trajectories`` groups multi-output agent sessions
only for ``grpo``; for other estimators (avspo included) and for ACR every output row counts as
one sample of its prompt's group.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import ray
import torch
import transfer_queue as tq
from omegaconf import DictConfig
from tensordict import TensorDict
from verl import DataProto
from verl.trainer import main_ppo_v0
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.replay_buffer import DAPO_FILTERED_REWARD_COUNTS_KEY
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.fs import local_mkdir_safe
from verl.workers.utils.padding import response_from_nested, response_to_nested

from verl_avspo.core.alert import StagnationMonitor
from verl_avspo.core.baselines import dcpo_settings, intrinsic_settings
from verl_avspo.core.collapse import acr_metrics, detect_collapse, effective_collapse_rate, group_ids, group_stats
from verl_avspo.core.config import AVSPOConfig
from verl_avspo.core.intrinsic import masked_token_mean, negative_entropy
from verl_avspo.verl_plugin import register
from verl_avspo.verl_plugin.checks import is_group_estimator

__all__ = [
    "STATE_FILE",
    "SELF_CERTAINTY_KEY",
    "prompt_key",
    "intrinsic_rewards",
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
# The per-token output that patches/verl-0.9.1-intrinsic.patch adds to the actor's log-prob pass,
# and the flag that requests it.
SELF_CERTAINTY_KEY = "self_certainty"
_SELF_CERTAINTY_FLAG = "calculate_self_certainty"


def prompt_key(value: Any, source: str) -> int | str:
    """A prompt's stable identity across steps, as a checkpointable int or str.

    Args:
        value: the response's ``index`` (verl's copy of ``extra_info.index``) or its ``raw_prompt``
            (chat messages).
        source: ``index`` or ``raw_prompt`` (``algorithm.dcpo.prompt_key``).
    """
    if source == "raw_prompt":
        text = json.dumps(value, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:32]
    if isinstance(value, (int, np.integer)) or (isinstance(value, torch.Tensor) and value.numel() == 1):
        return int(value)
    return str(value)


def intrinsic_rewards(
    reward: str, token_values: torch.Tensor, response_mask: torch.Tensor, last_tokens: int | None = None
) -> torch.Tensor:
    """Each response's intrinsic reward from per-token values of the old policy.

    Args:
        reward: ``negative_entropy`` (RENT; ``token_values`` are entropies) or ``self_certainty``
            (INTUITOR; ``token_values`` are KL(U || p_t)).
        token_values: (bs, response_length).
        response_mask: (bs, response_length).
        last_tokens: RENT only, average over the last ``last_tokens`` response tokens.

    Returns:
        (bs,) float32.
    """
    if reward == "negative_entropy":
        return negative_entropy(token_values.float(), response_mask, last_tokens)
    if reward == "self_certainty":
        return masked_token_mean(token_values.float(), response_mask)
    raise ValueError(
        f"algorithm.intrinsic.reward={reward!r} has no per-token source: use self_certainty or negative_entropy"
    )


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
        self.uses_dcpo = estimator == register.DCPO_NAME
        self.dcpo_settings = dcpo_settings(self.config.algorithm)
        self.intrinsic = intrinsic_settings(self.config.algorithm)
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
        newly_stalled = self.stagnation.update(metrics)
        metrics["acr/stalled"] = float(self.stagnation.stalled)
        if newly_stalled:
            logger.warning(self.stagnation.message(self.global_steps))
        return newly_stalled

    # ---- checkpoint ----------------------------------------------------------------------

    def _checkpoint_folder(self) -> str:
        return os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")

    def _dcpo_history(self):
        norm_by_std = bool(self.config.algorithm.get("norm_adv_by_std_in_grpo", True))
        return register.get_dcpo_history(self.dcpo_settings, norm_by_std)

    def avspo_state_dict(self) -> dict[str, Any]:
        controller = register.get_controller(self.avspo_settings).state_dict() if self.uses_avspo else None
        dcpo = self._dcpo_history().state_dict() if self.uses_dcpo else None
        if dcpo is not None:
            dcpo["prompt_key"] = self.dcpo_settings.prompt_key  # what its keys are
        return {"controller": controller, "stagnation": self.stagnation.state_dict(), "dcpo": dcpo}

    def load_avspo_state_dict(self, state: dict[str, Any]) -> None:
        if self.uses_avspo and state.get("controller") is not None:
            register.get_controller(self.avspo_settings).load_state_dict(state["controller"])
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


class AVSPOTrainerSync(AVSPOTrainerMixin, PPOTrainerSync):
    """verl's V1 synchronous trainer with ACR metrics, the alert and AVSPO checkpoint state.

    Installed under the mode name ``sync`` by :func:`install_sync_trainer`.
    """

    def _compute_old_log_prob(self, batch, metrics: dict):
        """verl's old-log-prob pass; for INTUITOR it also asks the actor for each token's
        self-certainty (an output only a verl patched with patches/verl-0.9.1-intrinsic.patch
        produces) and stores its response part in TransferQueue."""
        wants_certainty = self.intrinsic.reward == "self_certainty"
        if wants_certainty:
            batch.extra_info[_SELF_CERTAINTY_FLAG] = True
        batch = super()._compute_old_log_prob(batch, metrics)  # a new batch meta, without the flag
        if wants_certainty:
            fields = tq.kv_batch_get(keys=batch.keys[:1], partition_id=batch.partition_id)
            if SELF_CERTAINTY_KEY not in fields.keys():
                raise RuntimeError(
                    "algorithm.intrinsic.reward=self_certainty (INTUITOR): the actor returned no per-token "
                    "self-certainty. verl 0.9.1 computes it only when patched: apply "
                    "patches/verl-0.9.1-intrinsic.patch (FSDP engine) to the verl that the workers import, and "
                    "leave actor_rollout_ref.model.use_fused_kernels off."
                )
            data = tq.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=[SELF_CERTAINTY_KEY, "response_mask"]
            )
            data[SELF_CERTAINTY_KEY] = response_from_nested(data[SELF_CERTAINTY_KEY], data["response_mask"])
            batch = tq.kv_batch_put(
                keys=batch.keys, partition_id=batch.partition_id, fields=data.select(SELF_CERTAINTY_KEY)
            )
        return batch

    @staticmethod
    def _real_rows(batch) -> list[bool]:
        """False for the no-op rows that _balance_batch appended (one shared `pad...` uid, score 0)
        to make the batch divisible by the DP size: they are not responses."""
        return [not tag.get("is_padding", False) for tag in batch.tags]

    def _apply_intrinsic_reward(self, batch, metrics: dict) -> None:
        """Replace ``rm_scores`` by each response's intrinsic reward (on its last token, where verl's
        reward loop puts a score), from the old policy's per-token entropy or self-certainty."""
        source = "entropy" if self.intrinsic.reward == "negative_entropy" else SELF_CERTAINTY_KEY
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["rm_scores", "response_mask", source]
        )
        response_mask = data["response_mask"]
        mask = response_mask.to_padded_tensor(0)
        rewards = intrinsic_rewards(
            self.intrinsic.reward, data[source].to_padded_tensor(0.0), mask, self.intrinsic.last_tokens
        )
        verifier = data["rm_scores"].to_padded_tensor(0.0)
        lengths = response_mask.offsets().diff()
        scores = torch.zeros_like(verifier)
        rows = torch.arange(len(lengths))
        scores[rows, (lengths - 1).clamp(min=0)] = rewards.to(scores.dtype)
        # _balance_batch's padding rows have an all-zero response mask, so their reward is already 0.
        real = torch.tensor(self._real_rows(batch), dtype=torch.bool)
        tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({"rm_scores": response_to_nested(scores, response_mask)}, batch_size=len(batch)),
        )
        metrics["intrinsic/reward"] = float(rewards[real].mean())
        metrics["intrinsic/verifier_score"] = float(verifier[real].sum(dim=-1).mean())

    def _pass_prompt_keys(self, batch) -> None:
        """Hand the dcpo estimator the stable prompt key of each uid of this batch."""
        source = self.dcpo_settings.prompt_key
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", source])
        keys: dict[str, Any] = {}
        for uid, value, real in zip(list(data["uid"]), list(data[source]), self._real_rows(batch), strict=True):
            if str(uid) not in keys:  # once per group: the G responses of a uid share the prompt
                keys[str(uid)] = prompt_key(value, source) if real else None
        if source == "index":
            self._refuse_index_collisions(batch, keys)
        register.set_prompt_keys(keys)

    @staticmethod
    def _refuse_index_collisions(batch, keys: dict[str, Any]) -> None:
        """Raise if two groups share an ``index`` but not their prompt. (The same prompt twice in
        one batch is legitimate, e.g. sampled again by DAPO's over-sampling across an epoch.)"""
        uids_by_key: dict[Any, list[str]] = {}
        for uid, key in keys.items():
            if key is not None:
                uids_by_key.setdefault(key, []).append(uid)
        shared = {key: uids for key, uids in uids_by_key.items() if len(uids) > 1}
        if not shared:
            return
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "raw_prompt"])
        prompt_of = dict(zip(map(str, data["uid"]), data["raw_prompt"], strict=True))
        for key, uids in shared.items():
            prompts = {prompt_key(prompt_of[uid], "raw_prompt") for uid in uids}
            if len(prompts) > 1:
                raise ValueError(
                    f"algorithm.adv_estimator=dcpo: {len(prompts)} different prompts of this batch have the same "
                    f"index {key!r}, so DCPO would pool their rewards. verl's RLHFDataset sets index from each row's "
                    "extra_info.index (0 when it is missing; several train files often each count from 0). Give "
                    "every row a unique extra_info.index (recipes/data does), or set "
                    "algorithm.dcpo.prompt_key=raw_prompt."
                )

    def _compute_advantage(self, batch, metrics: dict):
        """verl's advantage stage, then the step's collapse metrics. Costs one TransferQueue read
        of ``uid``, ``rm_scores`` and the ``advantages`` just written (plus, before the stage, the
        intrinsic reward's inputs or DCPO's prompt keys when those are on)."""
        if self.intrinsic.enabled:
            self._apply_intrinsic_reward(batch, metrics)
        if self.uses_dcpo:
            self._pass_prompt_keys(batch)
        batch = super()._compute_advantage(batch, metrics)
        if self.measures_collapse:
            keys = [key for key, real in zip(batch.keys, self._real_rows(batch), strict=True) if real]
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
    main_ppo_v0.RayPPOTrainer = AVSPORayPPOTrainer


@ray.remote
class AVSPOTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's V1 TaskRunner with our ``PPOTrainerSync`` subclass installed under the mode ``sync``.

    The swap happens inside the actor, where the trainer is built; the mode name stays ``sync``
    because verl compares it literally in several places.
    """

    def run(self, config: DictConfig):
        install_sync_trainer()
        return super().run(config)


@ray.remote
class AVSPOLegacyTaskRunner(main_ppo_v0.TaskRunner.__ray_actor_class__):
    """verl's legacy TaskRunner (``trainer.use_v1=False``) building our ``RayPPOTrainer`` subclass."""

    def run(self, config: DictConfig):
        install_legacy_trainer()
        return super().run(config)
