"""The part of vLLM's interface that OpenRLHF 0.11.2 calls, served by Hugging Face ``generate`` on CPU.

vLLM cannot be installed on a CPU machine (CUDA builds; it would also replace torch), and OpenRLHF has
no generation path without it (``--vllm.num_engines 0`` fails at ``trainer/ppo_utils/samples_generator.py:219``
with an IndexError). OpenRLHF's own rollout actor (``trainer/ray/vllm_engine.py:33-206``) runs unchanged
over :class:`AsyncLLMEngine` below. It calls ``generate`` (``:167-177``), ``is_sleeping`` (``:65``),
``output_processor.get_num_unfinished_requests()`` (``:181``) and ``collective_rpc`` with
``init_process_group`` / ``update_weight`` (``:110-119``, the weight sync).

``VLLM_STUB_WEIGHTS_DUMP``: a path; after each full weight sync the generator's parameters are saved
there (``torch.save`` of its state dict), for the test that compares them with the trainer's.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

__version__ = "0.17.0"  # > 0.8.5 (vllm_engine.py:93) and >= 0.16 (ppo_actor.py:508: no NCCL variable to set)
DUMP_ENV = "VLLM_STUB_WEIGHTS_DUMP"


class SamplingParams:
    def __init__(self, **kwargs: Any):
        self.__dict__.update(kwargs)


class AsyncEngineArgs:
    def __init__(self, *args: Any, **kwargs: Any):
        self.__dict__.update(kwargs)


@dataclasses.dataclass
class CompletionOutput:
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[dict] | None = None


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    outputs: list[CompletionOutput]


class _OutputProcessor:
    @staticmethod
    def get_num_unfinished_requests() -> int:
        return 0  # generate runs each request to its end before it yields


class AsyncLLMEngine:
    """One generator: the model at ``engine_args.model`` in bfloat16 (as OpenRLHF asks vLLM for,
    ``vllm_engine.py:274``), sampling with Hugging Face ``generate``."""

    def __init__(self, engine_args: AsyncEngineArgs):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(engine_args.model, dtype=getattr(torch, engine_args.dtype))
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(engine_args.model)
        self.output_processor = _OutputProcessor()
        self.sync_group = None
        torch.manual_seed(engine_args.seed)

    @classmethod
    def from_engine_args(cls, engine_args: AsyncEngineArgs) -> AsyncLLMEngine:
        return cls(engine_args)

    async def is_sleeping(self) -> bool:
        return False

    async def reset_prefix_cache(self) -> None:
        return None

    async def generate(self, prompt: dict, sampling_params: SamplingParams, request_id: str):
        """Yields one finished ``RequestOutput`` (vLLM streams partial ones; OpenRLHF keeps the last)."""
        params = sampling_params
        prompt_ids = torch.tensor([prompt["prompt_token_ids"]])
        eos = self.tokenizer.eos_token_id
        with torch.no_grad():
            output = self.model.generate(
                prompt_ids,
                attention_mask=torch.ones_like(prompt_ids),
                do_sample=params.temperature > 0,
                temperature=params.temperature or None,
                top_p=params.top_p,
                top_k=None if params.top_k in (None, -1) else params.top_k,
                max_new_tokens=params.max_tokens,
                min_new_tokens=params.min_tokens,
                eos_token_id=eos,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        tokens = output[0, prompt_ids.shape[1] :].tolist()
        if eos in tokens:  # generate pads after the end; vLLM returns up to and with the end token
            tokens = tokens[: tokens.index(eos) + 1]
        finish = "stop" if tokens and tokens[-1] == eos else "length"
        text = self.tokenizer.decode(tokens, skip_special_tokens=params.skip_special_tokens)
        yield RequestOutput(request_id, [CompletionOutput(tokens, text, finish)])

    async def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
        return [getattr(self, f"_{method}")(*args)]

    def _init_process_group(self, master_address, master_port, rank_offset, world_size, group_name, backend, use_ray):
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        if use_ray:
            raise NotImplementedError("the CPU harness does not stand in for --vllm.sync_with_ray")
        group = StatelessProcessGroup.create(master_address, master_port, rank_offset, world_size)
        self.sync_group = PyNcclCommunicator(group)

    def _update_weight(self, name: str, dtype: torch.dtype, shape, empty_cache: bool = False) -> None:
        weight = torch.empty(shape, dtype=dtype)
        self.sync_group.broadcast(weight, src=0)
        with torch.no_grad():
            self.model.get_parameter(name).copy_(weight)
        if empty_cache and os.environ.get(DUMP_ENV):  # the last parameter of a sync
            torch.save(self.model.state_dict(), os.environ[DUMP_ENV])
