"""Reading a V1 training batch for the step's collapse measurement: its raw scores, uids and trained
advantages in TransferQueue, its real (non-padding) rows, and the groups DAPO filtering dropped.

Shared by the launcher's V1 trainers and the stock hook's adopted trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from verl.trainer.ppo.v1.replay_buffer import DAPO_FILTERED_REWARD_COUNTS_KEY

from verl_avspo.core.collapse import DroppedGroups

__all__ = ["real_rows", "read_scores", "read_advantages", "dropped_groups"]

# Prompt groups that V1's DAPO sampler generated but discarded as surplus (they were not collapsed).
_SURPLUS_KEY = "training/filter_groups/discarded_surplus_samples"


def real_rows(batch) -> list[bool]:
    """False for the no-op rows that _balance_batch appended (one shared `pad...` uid, score 0)
    to make the batch divisible by the DP size: they are not responses."""
    return [not tag.get("is_padding", False) for tag in batch.tags]


def read_scores(keys: list, partition_id: str, prompt_field: str) -> tuple[torch.Tensor, np.ndarray, list | None]:
    """One TransferQueue read of rows ``keys``: (bs,) raw scores (the reward loop's ``rm_scores``
    summed over tokens), (bs,) uids and each row's ``prompt_field`` (its prompt identity: ``index`` or
    ``raw_prompt``; None when the rows do not carry it, as a custom agent loop may not)."""
    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["uid", "rm_scores", prompt_field])
    prompts = list(data[prompt_field]) if prompt_field in data.keys() else None
    return data["rm_scores"].to_padded_tensor(0.0).sum(dim=-1), np.array(list(data["uid"]), dtype=object), prompts


def read_advantages(keys: list, partition_id: str) -> torch.Tensor:
    """(bs, L) advantages of rows ``keys``, as verl's advantage stage wrote them."""
    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["advantages"])
    return data["advantages"].to_padded_tensor(0.0)


def dropped_groups(eviction_metrics: Mapping[str, Any]) -> DroppedGroups | None:
    """The groups DAPO filtering removed, from verl's replay-buffer eviction metrics: the collapsed
    ones by shared score (``_dapo_filtered_reward_counts``) and the surplus ones."""
    collapsed = eviction_metrics.get(DAPO_FILTERED_REWARD_COUNTS_KEY) or {}
    surplus = int(eviction_metrics.get(_SURPLUS_KEY, 0))
    return DroppedGroups(dict(collapsed), surplus) if collapsed or surplus else None
