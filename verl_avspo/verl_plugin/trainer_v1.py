"""verl's V1 trainers, every mode, with ACR metrics, the stagnation alert and AVSPO checkpoint state.

:func:`install_v1_trainers` puts :class:`AVSPOTrainerSync`, :class:`AVSPOTrainerColocateAsync` and
:class:`AVSPOTrainerSeparateAsync` into verl's ``TRAINER_REGISTRY`` under verl's own mode names
(``sync``, ``colocate_async``, ``separate_async``: verl compares them literally, so a new name would
silently change behaviour). All three verl trainers inherit ``_compute_advantage``, ``step``,
``_save_checkpoint`` and ``_load_checkpoint`` from the base ``PPOTrainer`` (``trainer_base.py``),
so one mixin, :class:`AVSPOTrainerV1Mixin`, serves them all. What it logs and saves:
:mod:`verl_avspo.verl_plugin.trainer`.

Baselines (V1 ``sync`` mode only; the launcher refuses the other modes for them):

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

import logging
from typing import Any

import numpy as np
import ray
import torch
import transfer_queue as tq
from omegaconf import DictConfig
from tensordict import TensorDict
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_from_nested, response_to_nested

from verl_avspo.verl_plugin import register
from verl_avspo.verl_plugin.sampler import dropped_groups
from verl_avspo.verl_plugin.trainer import AVSPOTrainerMixin, intrinsic_rewards, prompt_key

__all__ = [
    "SELF_CERTAINTY_KEY",
    "AVSPOTrainerV1Mixin",
    "AVSPOTrainerSync",
    "AVSPOTrainerColocateAsync",
    "AVSPOTrainerSeparateAsync",
    "V1_TRAINERS",
    "install_v1_trainers",
    "AVSPOTaskRunner",
]

logger = logging.getLogger(__name__)

# The per-token output that patches/verl-0.9.1-intrinsic.patch adds to the actor's log-prob pass,
# and the flag that requests it.
SELF_CERTAINTY_KEY = "self_certainty"
_SELF_CERTAINTY_FLAG = "calculate_self_certainty"


class AVSPOTrainerV1Mixin(AVSPOTrainerMixin):
    """What the launcher adds to a V1 trainer (any mode). Mixed in before verl's trainer class."""

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
            # The sampler's eviction metrics of this iteration say what DAPO filtering removed.
            metrics.update(self._collapse_metrics(scores, index, advantages, dropped_groups(metrics)))
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
        return super().run(config)
