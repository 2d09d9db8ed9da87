"""Reading a V1 training batch for the step's collapse measurement: its raw scores, uids (and pilot sizes)
and trained advantages in TransferQueue, its real (non-padding) rows, and the groups DAPO filtering dropped.

Shared by the launcher's V1 trainers and the stock hook's adopted trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
import transfer_queue as tq
from verl.trainer.ppo.v1.replay_buffer import DAPO_FILTERED_REWARD_COUNTS_KEY

from verl_avspo.core.collapse import DroppedGroups

__all__ = ["ScoredRows", "real_rows", "read_scores", "read_advantages", "dropped_groups"]

# Prompt groups that V1's DAPO sampler generated but discarded as surplus (they were not collapsed).
_SURPLUS_KEY = "training/filter_groups/discarded_surplus_samples"


def real_rows(batch) -> list[bool]:
    """False for the no-op rows that _balance_batch appended (one shared `pad...` uid, score 0)
    to make the batch divisible by the DP size: they are not responses."""
    return [not tag.get("is_padding", False) for tag in batch.tags]


class ScoredRows(NamedTuple):
    """A batch's rows as the collapse measurement reads them (:func:`read_scores`)."""

    scores: torch.Tensor  # (bs,) raw scores: the reward loop's rm_scores summed over tokens
    uids: np.ndarray  # (bs,) each row's group
    prompts: list | None  # each row's prompt identity (index or raw_prompt); None when the rows lack the field
    pilot_sizes: torch.Tensor | None  # (bs,) each row's group's pilot size (0: not a pilot); None when not read


def read_scores(keys: list, partition_id: str, prompt_field: str, pilot_field: str | None = None) -> ScoredRows:
    """One TransferQueue read of rows ``keys``: scores, uids, each row's ``prompt_field`` (which a custom
    agent loop may not write) and, with the rollout allocator, ``pilot_field``."""
    fields = ["uid", "rm_scores", prompt_field, *([pilot_field] if pilot_field else [])]
    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)
    return ScoredRows(
        scores=data["rm_scores"].to_padded_tensor(0.0).sum(dim=-1),
        uids=np.array(list(data["uid"]), dtype=object),
        prompts=list(data[prompt_field]) if prompt_field in data.keys() else None,
        pilot_sizes=data[pilot_field].reshape(-1) if pilot_field else None,
    )


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
