"""``StatelessProcessGroup`` as OpenRLHF's weight sync creates it (``utils/distributed_util.py:22-27``):
a rendezvous of the trainer's rank 0 (rank 0 here) and every generator (ranks 1..), apart from
DeepSpeed's own process group. vLLM's is a TCP store plus its own messaging; here the store alone."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import torch.distributed as dist


@dataclasses.dataclass
class StatelessProcessGroup:
    store: dist.TCPStore
    rank: int
    world_size: int

    @classmethod
    def create(cls, host: str, port: int, rank: int, world_size: int) -> StatelessProcessGroup:
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timedelta(seconds=120))
        return cls(store, rank, world_size)
