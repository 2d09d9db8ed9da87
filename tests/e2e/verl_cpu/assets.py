"""The tiny things a CPU run trains on, built locally (nothing is downloaded).

- a character-level tokenizer over digits, ``+``, ``=`` and newline, with ChatML-style markers
  (verl's Qwen token builder needs ``<|im_end|>`` and a one-token newline);
- a randomly initialised Qwen2 of a few ten thousand parameters;

The tokenizer has a folder of its own (``actor_rollout_ref.model.tokenizer_path``): beside a Qwen2
``config.json``, transformers would load it as a ``Qwen2Tokenizer``, whose byte-level pre-tokenizer
drops the newline of this vocabulary.
- verl-format parquet files of ``a+b=`` prompts, each row with a unique ``extra_info.index``.

Half the prompts have a one-digit sum, which a random policy often writes somewhere in its answer,
and half a two-digit one, which it rarely does: every step then has groups with mixed rewards and
groups that collapse (all wrong), so ACR and AVSPO's trigger move, and its threshold moves whenever two
steps' mean scores differ. Which responses a CPU samples can differ with its kind (the e2e tests check
closed forms on the run they get, not one trajectory).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

# What every launch of a tiny run sets, whichever trainer it starts: one thread per process (many
# processes share two cores), no hub and no wandb (everything is local), every Ray worker's log line.
QUIET_OFFLINE_ENV = {
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "RAY_DEDUP_LOGS": "0",
}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHARACTERS = [*"0123456789", "+", "=", "\n"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>{% endif %}"
)
DATA_SOURCE = "tiny_arithmetic"


def build_tokenizer(folder: Path):
    """A character-level ``PreTrainedTokenizerFast``, saved to ``folder``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *CHARACTERS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return tokenizer


def build_model(folder: Path, *, hidden_size: int = 32, num_layers: int = 1, seed: int = 0) -> tuple[Path, Path]:
    """A random Qwen2 in ``folder/model`` and its tokenizer in ``folder/tokenizer`` (what
    ``actor_rollout_ref.model.path`` and ``.tokenizer_path`` name)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    model_folder, tokenizer_folder = folder / "model", folder / "tokenizer"
    tokenizer = build_tokenizer(tokenizer_folder)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(model_folder)
    return model_folder, tokenizer_folder


def arithmetic_rows(count: int, start_index: int = 0) -> list[dict]:
    """``count`` distinct ``a+b=`` prompts, alternating one-digit and two-digit sums."""
    small = [(a, b) for a in range(1, 10) for b in range(0, 10 - a)]
    large = [(a, b) for a in range(1, 10) for b in range(10 - a, 10)]
    pairs = [pair for both in zip(small, large, strict=False) for pair in both][:count]
    if len(pairs) < count:
        raise ValueError(f"at most {len(pairs)} distinct prompts")
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{a}+{b}="}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": start_index + i, "split": "train"},
        }
        for i, (a, b) in enumerate(pairs)
    ]


def write_dataset(path: Path, count: int, start_index: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(arithmetic_rows(count, start_index)).to_parquet(path)
    return path


def read_metrics(path: Path) -> list[dict]:
    """The records of verl's ``file`` logger (one JSON object per logged step)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
