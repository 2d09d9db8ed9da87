"""A checkpoint engine for CPU: the trainer's weights reach separate rollout workers through Ray.

verl's ``separate_async`` trainer refuses the ``naive`` backend (``trainer_separate_async.py:68-70``:
the rollout runs in its own processes, not beside the trainer), and its other backends move weights
over NCCL, NIXL or Mooncake (each needs ``cupy`` or an RDMA stack). This one is registered as
``ray_store`` from the harness plugin, through the public ``CheckpointEngineRegistry``: rank 0 of
the trainer puts each version's full state dict into a named Ray actor, and every rollout worker
takes it from there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

NAME = "ray_store"
_STORE = "verl_cpu_weight_store"


class WeightStore:
    """The latest weights put by the trainer, and a wait for a given version."""

    def __init__(self):
        self.version: Any = object()
        self.state: dict[str, torch.Tensor] = {}
        self.changed = asyncio.Event()

    async def put(self, version: Any, state: dict[str, torch.Tensor]) -> None:
        self.version, self.state = version, state
        self.changed.set()
        self.changed = asyncio.Event()

    async def get(self, version: Any) -> dict[str, torch.Tensor]:
        while self.version != version:
            await self.changed.wait()
        return self.state


def _store():
    # Detached: a named actor is otherwise destroyed as soon as the process that happened to create it
    # drops its handle (a sender after its put, say), taking the weights with it while a receiver
    # waits. The local cluster, and the actor with it, ends with the run.
    return ray.remote(WeightStore).options(name=_STORE, get_if_exists=True, num_cpus=0, lifetime="detached").remote()


@CheckpointEngineRegistry.register(NAME)
class RayStoreCheckpointEngine(CheckpointEngine):
    """Full tensors through a Ray actor: slow for a real model, instant for the harness's tiny one."""

    def __init__(self, bucket_size: int = 0, **kwargs: Any):
        self.rank = 0
        self.role = "actor"

    def prepare(self) -> dict[str, Any]:
        return {}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        actor = {"rank": list(range(actor_wg_world_size)), "role": ["actor"] * actor_wg_world_size}
        rollout = {"rank": list(range(rollout_world_size)), "role": ["rollout"] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, rank: int, role: str) -> None:
        self.rank, self.role = rank, role

    def finalize(self) -> None:
        """Nothing is held between updates."""

    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps=None):
        # Every rank drains the generator: gathering a sharded parameter is a collective.
        state = {name: tensor.detach().to("cpu").clone() for name, tensor in weights}
        if self.rank == 0:
            await _store().put.remote(global_steps, state)
        return {}

    async def receive_weights(self, global_steps=None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        state = await _store().get.remote(global_steps)
        for name, tensor in state.items():
            yield name, tensor
