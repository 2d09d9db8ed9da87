"""Keep the training problems whose base-model pass rate lies in a band (the paper's "Level 3").

    python recipes/data/select_difficulty.py --data data/math/train.parquet \\
        --pass-rates data/math/pass_rates_qwen2.5-math-1.5b.parquet \\
        --low 0.3 --high 0.5 --max-problems 500 --out data/math/train_level3_qwen2.5-math-1.5b.parquet

The band is inclusive: with 16 samples, 0.3-0.5 keeps 5 to 8 correct answers. Problems without a
pass rate are dropped. ``--max-problems`` keeps a seeded random subset when more qualify. The
selected rows carry their ``pass_rate`` in ``extra_info``.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys

import pandas as pd
from common import check_writable, read_parquet, write_parquet

logger = logging.getLogger("select_difficulty")


def select(
    rows: list[dict], rates: pd.DataFrame, low: float, high: float, max_problems: int | None, seed: int = 0
) -> list[dict]:
    """Rows with ``low <= pass_rate <= high`` (matched on ``extra_info.index``), at most
    ``max_problems`` of them, in their original order."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"pass-rate band [{low}, {high}] is invalid: need 0 <= low <= high <= 1")
    by_index = dict(zip(rates["index"].tolist(), rates["pass_rate"].tolist(), strict=True))
    missing = sum(row["extra_info"]["index"] not in by_index for row in rows)
    if missing:
        logger.warning("%d of %d problems have no pass rate and are dropped", missing, len(rows))
    kept = [
        {**row, "extra_info": {**row["extra_info"], "pass_rate": by_index[row["extra_info"]["index"]]}}
        for row in rows
        if low <= by_index.get(row["extra_info"]["index"], -1.0) <= high
    ]
    if max_problems is not None and len(kept) > max_problems:
        chosen = set(random.Random(seed).sample(range(len(kept)), max_problems))
        kept = [row for i, row in enumerate(kept) if i in chosen]
    elif max_problems is not None and len(kept) < max_problems:
        logger.warning(
            "only %d problems lie in [%s, %s], fewer than --max-problems %d", len(kept), low, high, max_problems
        )
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="verl parquet from prepare_math.py")
    parser.add_argument("--pass-rates", required=True, help="parquet from sample_pass_rates.py")
    parser.add_argument("--low", type=float, default=0.3, help="lowest pass rate kept (default 0.3)")
    parser.add_argument("--high", type=float, default=0.5, help="highest pass rate kept (default 0.5)")
    parser.add_argument("--max-problems", type=int, default=500, help="cap, seeded subset (default 500; 0: no cap)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output parquet")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        check_writable(args.out, "--out")
        kept = select(
            read_parquet(args.data),
            pd.read_parquet(args.pass_rates),
            args.low,
            args.high,
            args.max_problems or None,
            args.seed,
        )
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    except KeyError as err:
        parser.error(
            f"missing column {err}: --data must come from prepare_math.py and --pass-rates from "
            "sample_pass_rates.py (columns index, pass_rate)"
        )
    count = write_parquet(kept, args.out)
    print(f"{count} problems with pass rate in [{args.low}, {args.high}] -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
