"""``PyNcclCommunicator`` over gloo: OpenRLHF broadcasts each updated parameter from the trainer's
rank 0 to the generators through it (``trainer/ray/ppo_actor.py:436``, received in ``vllm``'s engine
stand-in). gloo broadcasts bfloat16 CPU tensors."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class PyNcclCommunicator:
    def __init__(self, group: Any, device: Any = None):
        self.rank, self.world_size = group.rank, group.world_size
        self.group = dist.ProcessGroupGloo(group.store, group.rank, group.world_size)

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = src
        self.group.broadcast([tensor], options).wait()
