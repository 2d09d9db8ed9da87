"""The base model's pass rate on every training problem, from N sampled answers each.

    python recipes/data/sample_pass_rates.py --data data/math/train.parquet \\
        --model Qwen/Qwen2.5-Math-1.5B --samples 16 --out data/math/pass_rates_qwen2.5-math-1.5b.parquet

Samples with the training settings (temperature 1.0, 1024 new tokens, the parquet's chat prompt
with the system prompt) and scores with ``verl_avspo.verl_plugin.rewards.compute_score``, the training reward.
``--backend vllm`` (default, GPU) batches everything; ``--backend transformers`` runs anywhere,
one prompt at a time (small models, smoke tests). Output columns: ``index``, ``data_source``,
``samples``, ``correct``, ``pass_rate``; ``select_difficulty.py`` reads it.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
from common import check_writable, read_parquet
from tqdm import tqdm

from verl_avspo.verl_plugin.rewards import compute_score


def generate_vllm(model: str, prompts: list[list[dict]], args: argparse.Namespace) -> list[list[str]]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, tensor_parallel_size=args.tensor_parallel_size, seed=args.seed)
    params = SamplingParams(n=args.samples, temperature=args.temperature, max_tokens=args.max_tokens)
    return [[c.text for c in output.outputs] for output in llm.chat(prompts, params)]


def generate_transformers(model: str, prompts: list[list[dict]], args: argparse.Namespace) -> list[list[str]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model, torch_dtype="auto").eval()
    completions = []
    for messages in tqdm(prompts, desc="sampling"):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            out = lm.generate(
                **ids,
                do_sample=True,
                temperature=args.temperature,
                top_k=0,
                max_new_tokens=args.max_tokens,
                num_return_sequences=args.samples,
                pad_token_id=tokenizer.pad_token_id,
            )
        completions.append(tokenizer.batch_decode(out[:, ids["input_ids"].shape[1] :], skip_special_tokens=True))
    return completions


BACKENDS = {"vllm": generate_vllm, "transformers": generate_transformers}


def pass_rates(rows: list[dict], completions: list[list[str]]) -> pd.DataFrame:
    """Score each row's completions against its ground truth; one output row per problem."""
    records = []
    for row, answers in zip(rows, completions, strict=True):
        gold = row["reward_model"]["ground_truth"]
        correct = sum(compute_score(row["data_source"], answer, gold) for answer in answers)
        records.append(
            {
                "index": row["extra_info"]["index"],
                "data_source": row["data_source"],
                "samples": len(answers),
                "correct": int(correct),
                "pass_rate": correct / len(answers),
            }
        )
    return pd.DataFrame.from_records(records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="verl parquet from prepare_math.py")
    parser.add_argument("--model", required=True, help="hub name or local path of the base model")
    parser.add_argument("--out", required=True, help="output parquet of pass rates")
    parser.add_argument("--samples", type=int, default=16, help="answers per problem (default 16)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="vllm")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm only")
    parser.add_argument("--limit", type=int, help="only the first N problems (smoke tests)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error(f"--samples {args.samples}: need at least one answer per problem")
    try:
        check_writable(args.out, "--out")  # before the sampling, not after it
        rows = read_parquet(args.data)[: args.limit]
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    completions = BACKENDS[args.backend](args.model, [row["prompt"] for row in rows], args)
    rates = pass_rates(rows, completions)
    rates.to_parquet(args.out, index=False)
    print(f"{len(rates)} problems, mean pass rate {rates['pass_rate'].mean():.3f} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
