"""A rollout backend for verl's agent loop that runs Hugging Face ``generate`` on CPU.

Selected with ``actor_rollout_ref.rollout.name=hf``. Its three parts mirror verl's vLLM backend:

- :class:`HFGenerateServer`, a Ray actor that holds a copy of the policy and answers the
  token-in/token-out ``generate`` calls of verl's ``LLMServerClient``;
- :class:`HFGenerateReplica`, the ``RolloutReplica`` that launches it (one per replica);
- :class:`HFServerAdapter`, the ``BaseRollout`` that lives in each FSDP worker and receives the
  actor's weights after every update; rank 0 of each replica pushes them to its server.

Sampling is seeded per request from the weights version, the prompt's tokens and how many times
this prompt was sampled since the last weight update, so the same weights answer the same prompts
with the same responses whatever order the agent loop's requests arrive in: a run resumed from a
checkpoint generates what the uninterrupted run generated.
"""

from __future__ import annotations

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

    def _seed(self, prompt_ids: list[int]) -> int:
        key = (self.weights_version, tuple(prompt_ids))
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
        temperature = float(sampling_params.get("temperature", 1.0))
        top_k = int(sampling_params.get("top_k", -1))
        generation_config = GenerationConfig(
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=float(sampling_params.get("top_p", 1.0)) if temperature > 0 else None,
            top_k=(top_k if top_k > 0 else 0) if temperature > 0 else None,
            max_new_tokens=self._max_new_tokens(prompt_ids, sampling_params),
            eos_token_id=sorted(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        torch.manual_seed(self._seed(prompt_ids))
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)
        with torch.no_grad():
            output = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=generation_config,
            )
        token_ids = output.sequences[0, len(prompt_ids) :].tolist()
        log_probs = None
        if sampling_params.get("logprobs"):
            # The scores after temperature and top-k/top-p: verl's default logprobs_mode, processed_logprobs.
            log_probs = [
                float(torch.log_softmax(scores[0].float(), dim=-1)[token])
                for scores, token in zip(output.scores, token_ids, strict=True)
            ]
        # generate pads a finished sequence only in batches; a single one stops at its eos.
        finished = bool(token_ids) and token_ids[-1] in self.eos_token_ids
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed" if finished else "length",
            extra_fields={"global_steps": self.weights_version},
        )

    # The replica's control calls. The model stays in host memory between rollouts, so there is
    # nothing to free or restore, and requests are never left in flight to abort.
    async def wake_up(self) -> None: ...

    async def sleep(self) -> None: ...

    async def clear_kv_cache(self) -> None: ...

    async def release_kv_cache(self) -> None: ...

    async def resume_kv_cache(self) -> None: ...

    async def resume_generation(self) -> None: ...

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

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
