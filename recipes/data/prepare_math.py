"""MATH train split to verl parquet (the pool the difficulty selector draws from).

    python recipes/data/prepare_math.py --out data/math/train.parquet
    python recipes/data/prepare_math.py --local-path MATH_train.jsonl --out data/math/train.parquet

The gold answer is the last ``\\boxed{}`` of the reference solution. ``--levels`` filters on MATH's
own difficulty label; the paper's "Level 3" is instead a pass-rate band of the base model, which
``select_difficulty.py`` applies.
"""

from __future__ import annotations

import argparse
import logging
import sys

from common import check_writable, load_source, verl_row, write_parquet

from verl_avspo.verl_plugin.rewards import last_boxed_answer

DATA_SOURCE = "math"
HUB_NAME = "DigitalLearningGmbH/MATH-lighteval"

logger = logging.getLogger("prepare_math")


def math_rows(dataset, levels: list[int] | None = None):
    """verl rows for MATH examples (columns ``problem``, ``solution``, ``level``, ``type``)."""
    wanted = None if levels is None else {f"Level {n}" for n in levels}
    for index, example in enumerate(dataset):
        if wanted is not None and example["level"] not in wanted:
            continue
        answer = last_boxed_answer(example["solution"])
        if answer is None:
            logger.warning("skipping MATH example %d: its solution has no \\boxed{} answer", index)
            continue
        yield verl_row(
            DATA_SOURCE,
            example["problem"],
            answer,
            "math",
            index,
            split="train",
            level=example["level"],
            type=example["type"],
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hub-name", default=HUB_NAME, help=f"a hub dataset with MATH's columns (default {HUB_NAME})")
    parser.add_argument("--local-path", help="offline copy of the train split (json, jsonl or parquet)")
    parser.add_argument("--levels", type=int, nargs="+", choices=range(1, 6), help="keep only these MATH levels")
    parser.add_argument("--out", required=True, help="output parquet")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        check_writable(args.out, "--out")  # before the download, not after it
        dataset = load_source(args.hub_name, None, "train", args.local_path)
        count = write_parquet(math_rows(dataset, args.levels), args.out)
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    except KeyError as err:
        parser.error(f"the data has no column {err}; expected the columns of {args.hub_name} (problem, solution, ...)")
    print(f"{count} MATH train problems -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
