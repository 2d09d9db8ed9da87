"""A rollout backend for verl's agent loop that runs Hugging Face ``generate`` on CPU.

Selected with ``actor_rollout_ref.rollout.name=hf``. Its three parts mirror verl's vLLM backend:

- :class:`HFGenerateServer`, a Ray actor that holds a copy of the policy and answers the
  token-in/token-out ``generate`` calls of verl's ``LLMServerClient``;
- :class:`HFGenerateReplica`, the ``RolloutReplica`` that launches it (one per replica);
- :class:`HFServerAdapter`, the ``BaseRollout`` that lives in each FSDP worker and receives the
  actor's weights after every update; rank 0 of each replica pushes them to its server.

A request is generated in chunks of :data:`CHUNK_TOKENS` tokens. Each chunk is seeded from the
weights version, the request's group (its ``det-<position>`` id, which verl sends under
``rollout.full_determinism``; see :mod:`verl_cpu.request_ids`), the tokens so far (prompt and
response) and how many times that group drew from that context since the last weight update, so the
same weights answer the same batch with the same groups of responses whatever order the agent loop's
requests arrive in: a sync run resumed from a checkpoint generates what the uninterrupted run
generated, even when a batch holds one prompt twice. For verl's async trainers the server supports
partial rollouts as vLLM's does: ``abort_all_requests`` stops running requests at their next chunk
(returned with ``stop_reason="aborted"``, which verl's ``FullyAsyncLLMServerClient`` resumes) and
parks new ones until ``resume_generation``. Where an abort falls depends on timing, so async runs
are not reproducible response for response.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
from typing import Any

import ray
import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput
from verl.workers.rollout.utils import ensure_async_iterator

NAME = "hf"
# Tokens generated per ``generate`` call of a request: between two chunks an abort can stop it, and
# the part generated so far goes back to verl's client as a partial rollout.
CHUNK_TOKENS = 4


def server_name(replica_rank: int) -> str:
    """The Ray actor name of a replica's server (the adapter looks its server up by it)."""
    return f"hf_generate_server_{replica_rank}"


def _rollout_world_size(config) -> int:
    return config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size


class HFGenerateServer:
    """One replica's generation server: the policy in float32, answering one request at a time.

    ``generate`` is a coroutine that never awaits, so on the actor's event loop each request runs
    to completion before the next starts and seeding the global RNG right before it is safe.
    """

    def __init__(self, config, model_config, replica_rank: int):
        torch.set_num_threads(1)
        self.config = config
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        self.model = AutoModelForCausalLM.from_pretrained(self.model_config.local_path, dtype=torch.float32).eval()
        tokenizer = self.model_config.tokenizer
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_token_ids = {tokenizer.eos_token_id}
        generation_eos = getattr(self.model_config.generation_config, "eos_token_id", None)
        if generation_eos is not None:
            self.eos_token_ids.update(generation_eos if isinstance(generation_eos, list) else [generation_eos])
        self.weights_version: int | None = None
        self._draws: collections.Counter = collections.Counter()
        # Partial-rollout control (verl's async trainers): the gate new requests wait at, whether
        # they are turned away instead, and how many aborts happened (a running request stops when
        # it sees a new one).
        self._open = asyncio.Event()
        self._open.set()
        self._rejecting = False
        self._aborts = 0
        self._running = 0

    def address(self) -> str:
        """A unique name for verl's load balancer (there is no HTTP endpoint)."""
        return f"{server_name(self.replica_rank)}@{ray.get_runtime_context().get_node_id()}"

    def load_weights(self, weights: dict[str, torch.Tensor], global_steps: int | None) -> None:
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
        if unexpected or set(missing) - tied:
            raise RuntimeError(f"weights do not match the rollout model: missing {missing}, unexpected {unexpected}")
        self.weights_version = global_steps
        self._draws.clear()

    def _seed(self, request_id: str, prompt_ids: list[int]) -> int:
        # Without full_determinism verl sends a fresh uuid per request: the draw count alone tells a
        # group's G identical requests apart, so the id must stay out of the key.
        group = request_id if str(request_id).startswith("det-") else None
        key = (self.weights_version, group, tuple(prompt_ids))
        draw = self._draws[key]
        self._draws[key] += 1
        digest = hashlib.sha256(repr((*key, draw)).encode()).digest()
        return int.from_bytes(digest[:4], "little")

    def _max_new_tokens(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> int:
        budget = self.config.prompt_length + self.config.response_length - len(prompt_ids)
        requested = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        limit = self.config.response_length if requested is None else requested
        return max(1, min(limit, budget))

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data or video_data or kwargs.get("audio_data"):
            raise NotImplementedError("the hf rollout backend generates from text prompts only")
        if not self._open.is_set():
            if self._rejecting:  # the replica is leaving the load balancer: the client retries elsewhere
                return self._output([], [], "aborted")
            await self._open.wait()  # parked until resume_generation, as vLLM parks it
        aborts_seen = self._aborts
        self._running += 1
        try:
            return await self._generate(request_id, prompt_ids, sampling_params, aborts_seen)
        finally:
            self._running -= 1

    async def _generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], aborts_seen: int
    ) -> TokenOutput:
        temperature = float(sampling_params.get("temperature", 1.0))
        top_k = int(sampling_params.get("top_k", -1))
        budget = self._max_new_tokens(prompt_ids, sampling_params)
        token_ids: list[int] = []
        log_probs: list[float] = []
        while True:
            generation_config = GenerationConfig(
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_p=float(sampling_params.get("top_p", 1.0)) if temperature > 0 else None,
                top_k=(top_k if top_k > 0 else 0) if temperature > 0 else None,
                max_new_tokens=min(CHUNK_TOKENS, budget - len(token_ids)),
                eos_token_id=sorted(self.eos_token_ids),
                pad_token_id=self.pad_token_id,
                output_scores=True,
                return_dict_in_generate=True,
            )
            context = prompt_ids + token_ids
            torch.manual_seed(self._seed(request_id, context))
            input_ids = torch.tensor([context], dtype=torch.long)
            with torch.no_grad():
                output = self.model.generate(
                    input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=generation_config
                )
            chunk = output.sequences[0, len(context) :].tolist()
            # The scores after temperature and top-k/top-p: verl's default logprobs_mode, processed_logprobs.
            log_probs += [
                float(torch.log_softmax(scores[0].float(), dim=-1)[token])
                for scores, token in zip(output.scores, chunk, strict=True)
            ]
            token_ids += chunk
            # generate pads a finished sequence only in batches; a single one stops at its eos.
            if token_ids and token_ids[-1] in self.eos_token_ids:
                return self._output(token_ids, log_probs if sampling_params.get("logprobs") else None, "completed")
            if len(token_ids) >= budget:
                return self._output(token_ids, log_probs if sampling_params.get("logprobs") else None, "length")
            await asyncio.sleep(0)  # between chunks, an abort_all_requests call can run
            if self._aborts != aborts_seen:  # a partial rollout: verl's client resumes it after resume_generation
                return self._output(token_ids, log_probs if sampling_params.get("logprobs") else None, "aborted")

    def _output(self, token_ids: list[int], log_probs: list[float] | None, stop_reason: str) -> TokenOutput:
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason=stop_reason,
            extra_fields={"global_steps": self.weights_version},
        )

    # The replica's control calls. The model stays in host memory between rollouts, so sleeping
    # frees nothing; aborting stops every request at its next chunk and parks new ones until
    # resume_generation (or, with reject_request, turns them away).
    async def wake_up(self) -> None: ...

    async def sleep(self) -> None: ...

    async def clear_kv_cache(self) -> None: ...

    async def release_kv_cache(self) -> None: ...

    async def resume_kv_cache(self) -> None: ...

    async def resume_generation(self) -> None:
        self._rejecting = False
        self._open.set()

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        self._aborts += 1
        self._rejecting = reject_request
        self._open.clear()
        return {"aborted_count": self._running, "request_ids": []}

    async def start_profile(self, **kwargs: Any) -> None: ...

    async def stop_profile(self) -> None: ...


class HFGenerateReplica(RolloutReplica):
    """verl's rollout replica for :class:`HFGenerateServer`: one server, beside the replica's
    first worker, whatever the replica's world size (Hugging Face ``generate`` runs unsharded)."""

    async def launch_servers(self) -> None:
        node_id = await self.workers[0].__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id())
        server = (
            ray.remote(HFGenerateServer)
            .options(
                name=server_name(self.replica_rank),
                num_cpus=0,
                max_concurrency=self.max_concurrency,
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node_id=node_id, soft=False
                ),
            )
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = await server.address.remote()


class HFServerAdapter(BaseRollout):
    """The worker side of the hf backend: hands the actor's weights to the replica's server."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ["RANK"])
        world_size = _rollout_world_size(self.config)
        self.replica_rank = rank // world_size if replica_rank == -1 else replica_rank
        self.pushes_weights = rank % world_size == 0
        self._server = None

    async def resume(self, tags: list[str]) -> None:
        """The server keeps its weights and needs no cache: nothing to bring back."""

    async def release(self) -> None:
        """Nothing is held on a device."""

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps=None, **kwargs) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf rollout backend takes full tensors, not {wire_format!r}")
        # Every rank drains the generator: gathering a sharded parameter (DTensor.full_tensor) is a
        # collective, so a rank that skipped it would hang the others.
        state = {}
        async for name, tensor in ensure_async_iterator(weights):  # a checkpoint engine's may be async
            if self.pushes_weights:
                state[name] = tensor.detach().to("cpu")
        if not self.pushes_weights:
            return
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        await self._server.load_weights.remote(state, global_steps)


RolloutReplicaRegistry.register(NAME, lambda: HFGenerateReplica)
# Monkeypatch (no public hook): verl's workers resolve their BaseRollout through the private dict
# _ROLLOUT_REGISTRY (verl/workers/rollout/base.py:89, read by get_rollout_class at :96), which lists
# vllm, sglang and trtllm only; the replica registry above is public.
rollout_base._ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.HFServerAdapter"
