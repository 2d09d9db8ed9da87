"""Evaluation sets to verl parquet, one file and one ``data_source`` per benchmark.

    python recipes/data/prepare_eval.py --out-dir data/eval                      # all, from the hub
    python recipes/data/prepare_eval.py --out-dir data/eval --benchmarks math500 gsm8k \\
        --local-path math500=MATH-500/test.jsonl --local-path gsm8k=gsm8k/test.parquet
    python recipes/data/prepare_eval.py --out-dir data/eval --max-samples mmlu_pro=2000

Each benchmark keeps its own ``data_source`` (the names below), so verl's validation logs
``val-core/<name>/acc/mean@1`` per benchmark and ``verl-avspo table`` puts them side by side.
``--local-path NAME=FILE`` reads an offline copy with the hub dataset's columns.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common import check_writable, load_source, verl_row, write_parquet


@dataclass(frozen=True)
class Benchmark:
    """Where a benchmark lives on the hub and how to read one example into (question, answer)."""

    hub_name: str
    config: str | None
    split: str
    question: Callable[[dict], str]
    answer: Callable[[dict], str]
    ability: str = "math"


def _number(value) -> str:
    """AMC23 stores answers as floats (27.0); the gold answer is the integer."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _mmlu_pro_question(example: dict) -> str:
    options = "\n".join(f"{chr(ord('A') + i)}. {option}" for i, option in enumerate(example["options"]))
    return f"{example['question']}\n\nOptions:\n{options}\n\nAnswer with the letter of the correct option."


BENCHMARKS: dict[str, Benchmark] = {
    "math500": Benchmark("HuggingFaceH4/MATH-500", None, "test", lambda e: e["problem"], lambda e: e["answer"]),
    # GSM8K's answer field is a worked solution ending in "#### 1,234".
    "gsm8k": Benchmark(
        "openai/gsm8k",
        "main",
        "test",
        lambda e: e["question"],
        lambda e: e["answer"].split("####")[-1].strip().replace(",", ""),
    ),
    "minerva_math": Benchmark("math-ai/minervamath", None, "test", lambda e: e["question"], lambda e: e["answer"]),
    # OlympiadBench lists the final answer(s); several parts are joined as one tuple-like answer.
    "olympiadbench": Benchmark(
        "math-ai/olympiadbench",
        None,
        "test",
        lambda e: e["question"],
        lambda e: ", ".join(a.strip().strip("$") for a in e["final_answer"]),
    ),
    "amc23": Benchmark("math-ai/amc23", None, "test", lambda e: e["question"], lambda e: _number(e["answer"])),
    "aime2024": Benchmark("HuggingFaceH4/aime_2024", None, "train", lambda e: e["problem"], lambda e: str(e["answer"])),
    "mmlu_pro": Benchmark("TIGER-Lab/MMLU-Pro", None, "test", _mmlu_pro_question, lambda e: e["answer"], "knowledge"),
}


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    """``["math500=a.jsonl", ...]`` to ``{"math500": "a.jsonl"}``, with unknown names rejected."""
    pairs = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not rest:
            raise SystemExit(f"{flag} {value!r}: expected NAME=VALUE, for example {flag} math500=...")
        if name not in BENCHMARKS:
            raise SystemExit(f"{flag} {value!r}: unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
        pairs[name] = rest
    return pairs


def benchmark_rows(name: str, dataset, max_samples: int | None = None, seed: int = 0):
    """verl rows for one benchmark; ``max_samples`` keeps a seeded random subset."""
    benchmark = BENCHMARKS[name]
    indices = list(range(len(dataset)))
    if max_samples is not None and max_samples < len(indices):
        indices = sorted(random.Random(seed).sample(indices, max_samples))
    for index in indices:
        example = dataset[index]
        yield verl_row(
            name, benchmark.question(example), benchmark.answer(example), benchmark.ability, index, split="test"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, help="writes <out-dir>/<benchmark>.parquet")
    parser.add_argument("--benchmarks", nargs="+", default=list(BENCHMARKS), choices=list(BENCHMARKS))
    parser.add_argument("--local-path", action="append", default=[], metavar="NAME=FILE", help="offline copy")
    parser.add_argument("--max-samples", action="append", default=[], metavar="NAME=N", help="seeded subset")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    local_paths = _pairs(args.local_path, "--local-path")
    max_samples = {}
    for name, value in _pairs(args.max_samples, "--max-samples").items():
        if not value.isdigit() or int(value) < 1:
            parser.error(f"--max-samples {name}={value}: expected a positive integer, for example {name}=2000")
        max_samples[name] = int(value)
    try:
        check_writable(args.out_dir, "--out-dir")  # before the downloads, not after them
    except ValueError as err:
        parser.error(str(err))
    for name in args.benchmarks:
        benchmark = BENCHMARKS[name]
        out = Path(args.out_dir) / f"{name}.parquet"
        try:
            dataset = load_source(benchmark.hub_name, benchmark.config, benchmark.split, local_paths.get(name))
            count = write_parquet(benchmark_rows(name, dataset, max_samples.get(name), args.seed), out)
        except (FileNotFoundError, ValueError) as err:
            parser.error(f"{name}: {err}")
        except KeyError as err:
            parser.error(f"{name}: the data has no column {err}; expected the columns of {benchmark.hub_name}")
        print(f"{name}: {count} problems -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
