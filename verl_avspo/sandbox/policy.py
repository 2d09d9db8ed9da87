"""The sandbox policy: a tiny randomly initialised causal LM, its character tokenizer, sampling
(its own, from float64 probabilities), per-token log-probabilities, and a short supervised
warm-up cached on disk.

The model is a stock ``transformers`` Qwen2 or Llama built from a config (no weights are
downloaded). Prompts are left-padded so that every response starts at the same column.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from tqdm.auto import tqdm
from verl.utils.torch_functional import masked_mean

from verl_avspo.core.files import write_text
from verl_avspo.sandbox import task as task_module
from verl_avspo.sandbox.config import PolicyConfig
from verl_avspo.sandbox.task import ArithmeticTask

__all__ = [
    "CharTokenizer",
    "Rollout",
    "build_model",
    "next_tokens",
    "sample",
    "response_logits",
    "response_log_probs",
    "token_log_probs",
    "warm_policy",
]

logger = logging.getLogger(__name__)

# Enough for the longest level, "9*9": 1 bos + 20 prompt + 18 answer + 1 eos tokens.
MAX_POSITIONS = 64

MODEL_CLASSES = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
}


class CharTokenizer:
    """One token per character of ``alphabet``, after three special tokens: pad, bos and eos."""

    SPECIALS = ("<pad>", "<bos>", "<eos>")

    def __init__(self, alphabet: str = "0123456789+*="):
        self.alphabet = alphabet
        self.pad_id, self.bos_id, self.eos_id = range(len(self.SPECIALS))
        self._ids = {ch: i + len(self.SPECIALS) for i, ch in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.SPECIALS) + len(self.alphabet)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - set(self._ids))
        if unknown:
            raise ValueError(f"characters {unknown} are not in the tokenizer's alphabet {self.alphabet!r}")
        return [self._ids[ch] for ch in text]

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``<bos>`` + prompt, left-padded. Returns input_ids and attention_mask, both (n, P) int64."""
        rows = [[self.bos_id, *self.encode(p)] for p in prompts]
        width = max(map(len, rows))
        ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in rows])
        return ids, (ids != self.pad_id).long()

    def encode_responses(self, answers: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """answer + ``<eos>``, right-padded. Returns response_ids and response_mask, (n, R) int64."""
        rows = [[*self.encode(a), self.eos_id] for a in answers]
        width = max(map(len, rows))
        ids = torch.tensor([r + [self.pad_id] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        return ids, mask

    def decode_responses(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        """Text of each response up to its ``<eos>``; a special token inside a response decodes to
        ``?`` so that it can never match an answer."""
        chars = ["?"] * len(self.SPECIALS) + list(self.alphabet)
        texts = []
        for ids, mask in zip(response_ids.tolist(), response_mask.tolist(), strict=True):
            texts.append("".join(chars[i] for i, m in zip(ids, mask, strict=True) if m and i != self.eos_id))
        return texts


def build_model(config: PolicyConfig, tokenizer: CharTokenizer) -> transformers.PreTrainedModel:
    """A randomly initialised causal LM (seeded by ``config.seed``)."""
    config_cls, model_cls = MODEL_CLASSES[config.architecture]
    model_config = config_cls(
        vocab_size=tokenizer.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_id,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
    )
    torch.manual_seed(config.seed)
    return model_cls(model_config)


@dataclass(frozen=True)
class Rollout:
    """Sampled responses. ``prompt_ids``/``prompt_mask`` (n, P); ``response_ids``/``response_mask``
    (n, R), the mask covering the response up to and including its ``<eos>``."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor

    def select(self, rows: torch.Tensor) -> Rollout:
        return Rollout(self.prompt_ids[rows], self.prompt_mask[rows], self.response_ids[rows], self.response_mask[rows])

    @staticmethod
    def concat(rollouts: list[Rollout], pad_id: int) -> Rollout:
        """Rows of several rollouts in one, prompts left-padded and responses right-padded (with
        ``pad_id`` and mask 0) to the widest, as ``CharTokenizer`` and ``generate`` pad them."""
        return Rollout(
            pad_cat([r.prompt_ids for r in rollouts], pad_id, left=True),
            pad_cat([r.prompt_mask for r in rollouts], 0, left=True),
            pad_cat([r.response_ids for r in rollouts], pad_id),
            pad_cat([r.response_mask for r in rollouts], 0),
        )


def pad_cat(tensors: list[torch.Tensor], value: float, left: bool = False) -> torch.Tensor:
    """Concatenate (n_i, W_i, ...) tensors along rows after padding dim 1 to the largest W_i with ``value``."""
    width = max(t.shape[1] for t in tensors)
    padded = []
    for t in tensors:
        pad = [0, 0] * (t.dim() - 2) + ([width - t.shape[1], 0] if left else [0, width - t.shape[1]])
        padded.append(torch.nn.functional.pad(t, pad, value=value))
    return torch.cat(padded)


def next_tokens(logits: torch.Tensor, generator: torch.Generator | None, temperature: float = 1.0) -> torch.Tensor:
    """(n, V) next-token logits -> (n,) tokens: the argmax when ``generator`` is None, otherwise one
    draw per row at ``temperature``.

    A draw inverts the float64 CDF of softmax(logits / temperature) at a float64 uniform from
    ``generator``: the token depends on the logits and on the sandbox's own random stream only, not on
    torch's global generator nor on how ``torch.multinomial`` draws (``generate`` divides float32
    probabilities by exponentials). A last-bit difference in a logit moves a CDF boundary by about
    1e-7 of its probability, and flips the token only when the uniform falls that close to it.
    """
    if generator is None:
        return logits.argmax(dim=-1)
    cdf = torch.softmax(logits.double() / temperature, dim=-1).cumsum(dim=-1)
    uniform = torch.rand(len(logits), 1, dtype=torch.float64, generator=generator) * cdf[:, -1:]
    return (cdf <= uniform).sum(dim=-1).clamp(max=logits.shape[-1] - 1)


@torch.no_grad()
def sample(
    model: transformers.PreTrainedModel,
    tokenizer: CharTokenizer,
    prompts: list[str],
    max_new_tokens: int,
    generator: torch.Generator | None,
    temperature: float = 1.0,
) -> Rollout:
    """One response per prompt, token by token (:func:`next_tokens`): greedy when ``generator`` is
    None, otherwise drawn from ``generator`` at ``temperature``. A response ends at its ``<eos>``;
    the positions after it hold ``<pad>``, as ``generate`` pads them. The prompts' keys and values are
    computed once and cached (the model's own KV cache, as ``generate`` does), so each new token costs one
    position of forward pass."""
    prompt_ids, prompt_mask = tokenizer.encode_prompts(prompts)
    # Left padding: each row's positions count from its first prompt token, as in response_logits.
    inputs, mask, position_ids = prompt_ids, prompt_mask, (prompt_mask.cumsum(dim=1) - 1).clamp(min=0)
    cache, tokens = None, []
    finished = torch.zeros(len(prompts), dtype=torch.bool)
    for _ in range(max_new_tokens):
        output = model(
            input_ids=inputs, attention_mask=mask, position_ids=position_ids, past_key_values=cache, use_cache=True
        )
        cache = output.past_key_values
        token = next_tokens(output.logits[:, -1], generator, temperature).masked_fill(finished, tokenizer.pad_id)
        finished |= token == tokenizer.eos_id
        tokens.append(token)
        inputs, position_ids = token.unsqueeze(1), position_ids[:, -1:] + 1
        mask = torch.cat([mask, torch.ones_like(inputs)], dim=1)
        if finished.all():
            break
    response_ids = torch.stack(tokens, dim=1)
    is_eos = (response_ids == tokenizer.eos_id).long()
    # Tokens after the first <eos> are padding.
    response_mask = (is_eos.cumsum(dim=1) - is_eos == 0).long()
    return Rollout(prompt_ids, prompt_mask, response_ids, response_mask)


def response_logits(model: transformers.PreTrainedModel, rollout: Rollout, temperature: float = 1.0) -> torch.Tensor:
    """The float32 next-token logits that predicted each response token, divided by the sampling
    ``temperature`` (as verl's actor does, so that log-probs are those of the sampling policy),
    (n, R, V), with gradients."""
    input_ids = torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1)
    attention_mask = torch.cat([rollout.prompt_mask, rollout.response_mask], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    prompt_width, response_width = rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]
    # The logit at position t predicts token t + 1.
    return logits[:, prompt_width - 1 : prompt_width - 1 + response_width].float() / temperature


def token_log_probs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """(n, R, V) logits, (n, R) tokens -> (n, R) log-probabilities of the tokens.

    ATen's ``log_softmax``, not verl's ``logprobs_from_logits``: on CPU verl's takes ``logsumexp``,
    whose ``exp`` and ``log`` (and the backward's ``exp``) are MKL's, one more library whose code path
    depends on the CPU; ``log_softmax`` runs on ATen's pinned kernels, forward and backward."""
    return logits.log_softmax(dim=-1).gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)


def response_log_probs(model: transformers.PreTrainedModel, rollout: Rollout, temperature: float = 1.0) -> torch.Tensor:
    """log π_T(response token | prefix) at sampling temperature ``temperature``, (n, R), with gradients."""
    return token_log_probs(response_logits(model, rollout, temperature), rollout.response_ids)


def _cache_key(config: PolicyConfig, task: ArithmeticTask, tokenizer: CharTokenizer) -> str:
    settings = {
        "policy": asdict(config),
        "levels": [level.name for level in task.levels],
        # The held-out split decides the training pools: a model warmed up with a smaller split
        # has trained on problems that a larger one evaluates on.
        "eval_size": task.eval_size,
        "warm_up_share": task.warm_up_share,
        "alphabet": tokenizer.alphabet,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        # The code that builds, warms up and samples the task: a model warmed up by other code is
        # another model, even with the same settings.
        "code": hashlib.sha256(
            b"".join(Path(path).read_bytes() for path in (__file__, task_module.__file__))
        ).hexdigest(),
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def supervised_warm_up(
    model: transformers.PreTrainedModel,
    tokenizer: CharTokenizer,
    task: ArithmeticTask,
    config: PolicyConfig,
    after_step: Callable[[int], None] | None = None,
) -> None:
    """Teacher-forced next-token training on the warm-up pools (disjoint from the RL training pools and
    the held-out sets), loss on answer tokens only: a short run leaves a partial skill, good on easy
    levels and poor on hard ones. ``after_step(step)`` is called after each step (1-based); it may
    evaluate the model (benchmarks/sandbox_calibration.py's warm-up curve) but must leave it in train mode."""
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.sft_lr, weight_decay=0.01)
    model.train()
    for step in tqdm(range(1, config.sft_steps + 1), desc="SFT warm-up", leave=False):
        problems = task.sample_warm_up(config.sft_batch_size, generator)
        prompt_ids, prompt_mask = tokenizer.encode_prompts(problems.prompts)
        response_ids, response_mask = tokenizer.encode_responses(problems.answers)
        log_probs = response_log_probs(model, Rollout(prompt_ids, prompt_mask, response_ids, response_mask))
        loss = -masked_mean(log_probs, response_mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step(step)


def warm_policy(
    config: PolicyConfig, task: ArithmeticTask, cache_dir: Path | None
) -> tuple[transformers.PreTrainedModel, CharTokenizer]:
    """The warmed-up policy: loaded from ``cache_dir/<settings hash>`` if present, otherwise built,
    warmed up and saved there. ``cache_dir=None`` disables the cache."""
    tokenizer = CharTokenizer()
    path = None if cache_dir is None else Path(cache_dir) / _cache_key(config, task, tokenizer)
    if path is not None and (path / "config.json").exists():
        logger.info("reusing the warmed-up policy cached in %s", path)
        return MODEL_CLASSES[config.architecture][1].from_pretrained(path), tokenizer
    model = build_model(config, tokenizer)
    supervised_warm_up(model, tokenizer, task, config)
    if path is not None:
        staging = path.with_name(f"{path.name}.tmp{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging)
        write_text(staging / "sandbox_settings.json", json.dumps(asdict(config), indent=2))
        try:
            staging.rename(path)  # atomic: a reader never sees a half-written cache
        except OSError:  # a concurrent run cached the same settings first; its model is identical
            shutil.rmtree(staging, ignore_errors=True)
    return model, tokenizer
