"""ACR in stock ``python -m verl.trainer.main_ppo``: a replay-buffer hook for every V1 trainer mode.

    python -m verl.trainer.main_ppo <your overrides> \
        trainer.v1.sampler.custom_sampler.path=pkg://verl_avspo.verl_plugin.sampler \
        trainer.v1.sampler.custom_sampler.name=ACRSampler

verl 0.9.1 builds a user-named replay buffer in every V1 mode (``sync``, ``colocate_async``,
``separate_async``; ``trainer_base.py:139-185``) and merges the metrics dict its ``sample()``
returns into the step's log (``trainer_base.py:567``). :class:`ACRSampler` is verl's own buffer for
the mode, built exactly as verl builds it without a custom sampler (so DAPO's
``algorithm.filter_groups`` keeps working: verl hands a custom sampler none of those arguments),
plus, on every training batch it hands out:

- ``acr/rate``, ``acr/all_correct``, ``acr/all_wrong``, ``acr/groups``, ``acr/singletons``,
  ``acr/reward_mean`` of the sampled groups' raw scores, counting the groups DAPO filtering removed
  while sampling (ACR before filtering), for any group estimator;
- with ``algorithm.adv_estimator=avspo``, the estimator's ``avspo/*`` metrics **of the previous
  step**: the estimator runs after sampling, and nothing after it returns metrics to stock verl's
  log; the last step's values are never logged. ``acr/effective`` and ``acr/stalled`` (and the
  AVSPO state in checkpoints, and ``alert.action=stop``) need the launcher,
  ``python -m verl_avspo.main_ppo``;
- ``timing_s/acr_hook``: the seconds the hook itself took (inside verl's ``timing_s/gen``).

The scores are the reward loop's ``rm_scores``, which it writes while rollouts stream in. A
colocated reward model (``reward.reward_model.enable=True`` without ``enable_resource_pool``)
scores only after sampling (``trainer_base.py:575-578``), so the hook refuses that setup.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import transfer_queue as tq
from omegaconf import open_dict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import DAPO_FILTERED_REWARD_COUNTS_KEY

from verl_avspo.core.collapse import DroppedGroups, measure_collapse
from verl_avspo.verl_plugin import register
from verl_avspo.verl_plugin.checks import HOOK_OVERRIDES, SAMPLER_NAME, hook_problems, is_group_estimator

__all__ = ["HOOK_TIMING_KEY", "ACRSampler", "dropped_groups", "read_scores"]

logger = logging.getLogger(__name__)

HOOK_TIMING_KEY = "timing_s/acr_hook"
# Prompt groups that V1's DAPO sampler generated but discarded as surplus (they were not collapsed).
_SURPLUS_KEY = "training/filter_groups/discarded_surplus_samples"


def dropped_groups(eviction_metrics: Mapping[str, Any]) -> DroppedGroups | None:
    """The groups DAPO filtering removed, from verl's replay-buffer eviction metrics: the collapsed
    ones by shared score (``_dapo_filtered_reward_counts``) and the surplus ones."""
    collapsed = eviction_metrics.get(DAPO_FILTERED_REWARD_COUNTS_KEY) or {}
    surplus = int(eviction_metrics.get(_SURPLUS_KEY, 0))
    return DroppedGroups(dict(collapsed), surplus) if collapsed or surplus else None


def read_scores(keys: list, partition_id: str, advantages: bool = False) -> tuple[Any, np.ndarray, Any]:
    """One TransferQueue read of rows ``keys``: (bs,) raw scores (the reward loop's ``rm_scores``
    summed over tokens), (bs,) uids and, with ``advantages``, the (bs, L) advantages (else None)."""
    fields = ["uid", "rm_scores", *(["advantages"] if advantages else [])]
    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)
    scores = data["rm_scores"].to_padded_tensor(0.0).sum(dim=-1)
    index = np.array(list(data["uid"]), dtype=object)
    return scores, index, data["advantages"].to_padded_tensor(0.0) if advantages else None


def _stock_replay_buffer(trainer: Any) -> Any:
    """verl's own replay buffer for the trainer's mode, built by the trainer's own
    ``_build_replay_buffer`` with the custom sampler hidden for the call (so every argument verl
    gives its built-in buffer, DAPO's included, is given, whatever verl version computes them)."""
    custom = trainer.config.trainer.v1.sampler.custom_sampler
    path = custom.path
    with open_dict(custom):
        custom.path = None
    try:
        return trainer._build_replay_buffer()
    finally:
        with open_dict(custom):
            custom.path = path


class ACRSampler:
    """verl's replay buffer for the trainer mode, whose ``sample`` also returns the batch's ACR.

    verl constructs it with ``trainer_mode, trainer_config, max_off_policy_*, sampler_kwargs,
    refill_fn`` (``trainer_base.py:155-185``); ``refill_fn`` is the trainer's bound
    ``_add_prompts_to_generate``, through which the hook reads the trainer's config. Every other
    attribute (``wait_for_sampleable``, ``get_sampleable_count``, ``poll_interval``, ...) is the
    built-in buffer's.
    """

    def __init__(self, *, refill_fn: Any = None, **kwargs: Any):
        trainer = getattr(refill_fn, "__self__", None)
        if trainer is None or not hasattr(trainer, "_build_replay_buffer"):
            raise TypeError(
                f"{SAMPLER_NAME} wraps the replay buffer of verl's V1 trainer and is built by it: name it in "
                f"{' '.join(HOOK_OVERRIDES)} instead of constructing it directly."
            )
        problems = hook_problems(trainer.config)
        if problems:
            raise ValueError("\n".join(problems))
        self.buffer = _stock_replay_buffer(trainer)
        algorithm = trainer.config.algorithm
        self.acr_settings = register.acr_settings(algorithm)
        estimator = str(algorithm.adv_estimator)
        self.measures_collapse = is_group_estimator(estimator)
        self.reports_avspo = estimator == register.NAME
        if not self.measures_collapse:
            logger.warning(
                "algorithm.adv_estimator=%s compares no groups of responses: the ACR hook logs nothing for it",
                estimator,
            )

    def __getattr__(self, name: str) -> Any:
        # Only for what this class lacks; the buffer is set first in __init__.
        if name == "buffer":
            raise AttributeError(name)
        return getattr(self.buffer, name)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """verl's ``sample``, plus the ``acr/*`` (and last step's ``avspo/*``) metrics of a training batch."""
        batch, metrics = self.buffer.sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        if partition_id == "train" and self.measures_collapse:
            start = time.perf_counter()
            metrics = {**metrics, **self.batch_metrics(batch, metrics)}
            # The hook's own cost, part of verl's timing_s/gen; summed over sub-batches like verl's timings.
            metrics[HOOK_TIMING_KEY] = time.perf_counter() - start
        return batch, metrics

    def batch_metrics(self, batch: KVBatchMeta, eviction_metrics: Mapping[str, Any]) -> dict[str, float]:
        """One TransferQueue read of the batch's ``uid`` and ``rm_scores``, measured with the groups
        that DAPO filtering removed while this batch was sampled."""
        if not batch.keys:
            return {}
        scores, index, _ = read_scores(batch.keys, batch.partition_id)
        acr = self.acr_settings
        metrics = measure_collapse(scores, index, None, acr.tau, acr.reward_range, dropped_groups(eviction_metrics))
        if self.reports_avspo:
            # The estimator ran at the previous step's advantage stage, in this process.
            metrics.update(register.pop_last_metrics("avspo/"))
        return metrics
