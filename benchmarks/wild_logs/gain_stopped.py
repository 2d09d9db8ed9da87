"""Whether the public logs whose reward rose show a gain that stopped: the tests behind docs/diagnostics_results.md's
note on N9 ("gain stopped" against a ground truth of "gain, not a problem", beside logs 5 and 7, where the
ground truth counts the same reading as a problem), and why ``report`` tells such a stop at INFO.

    .venv/bin/python benchmarks/wild_logs/gain_stopped.py --logs /tmp/wild

``--logs`` is ``run_tools.py``'s folder (``<id>/<file>``, fetched by it). For each log whose reward rose
(Mann-Kendall p < 0.05 over all rows, as ``report`` reads it), it prints:

- ``last third p``: the Mann-Kendall test over the last third alone, ``report``'s rule (no trend: "gain stopped");
- the means of the three thirds of the rows;
- ``last > middle p``: a one-sided Mann-Whitney test that the last third's rewards are higher than the middle
  third's (a small p: the level still rose);
- ``report``: what ``report`` reads: "at its ceiling" (a reward between 0 and 1 at 0.95 or more over its last
  fifth: no gain problem, INFO), "gain lost" (the last third fell, p < 0.05: WARN), "gain stopped" (no trend
  over the last third: INFO) or "rose";
- ``slowed p``: the Mann-Kendall test over the last third of the reward less the run's rate (the change from
  the first fifth's mean to the last fifth's, per row): a small p with a negative tau is a last third that
  rose significantly slower than the run did (the gain stopped, shown rather than not seen).

Then, to size how far a 100-step log of 8 completions a step can tell, ``--draws`` runs of N9's shape (a
rise 0.19 -> 0.31 over the first third, then flat, each step's reward the mean of 8 draws) and how ``report``'s
trend rule reads them.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from verl_avspo.tools.logs import read_run
from verl_avspo.tools.signals import trend
from verl_avspo.tools.stats import score_column, training_rows

HERE = Path(__file__).resolve().parent


def mann_whitney_greater(higher: np.ndarray, lower: np.ndarray) -> float:
    """One-sided p of a Mann-Whitney test that ``higher`` is larger than ``lower`` (normal approximation,
    ties corrected, continuity corrected)."""
    both = np.concatenate([higher, lower])
    ranks = pd.Series(both).rank().to_numpy()
    n1, n2, n = len(higher), len(lower), len(both)
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    _, ties = np.unique(both, return_counts=True)
    variance = n1 * n2 / 12 * ((n + 1) - float((ties**3 - ties).sum()) / (n * (n - 1)))
    if variance <= 0:
        return 0.5
    return 0.5 * math.erfc((u - n1 * n2 / 2 - 0.5) / math.sqrt(variance) / math.sqrt(2))


def log_path(folder: Path) -> Path:
    files = sorted(folder.iterdir())
    return folder if files[0].name.startswith("events.out.tfevents") else files[0]


def tests(rewards: pd.Series) -> dict[str, float]:
    rows = len(rewards)
    third = rows // 3
    whole = trend(rewards)
    values = rewards.to_numpy(dtype=float)
    middle, last = values[rows - 2 * third : rows - third], values[rows - third :]
    rate = (whole.final - whole.first) / (rows - whole.rows)
    slowed = trend(pd.Series(last - rate * np.arange(third)))
    return {
        "rows": rows,
        "p": whole.p_value,
        "last third p": whole.recent_p_value,
        "thirds": (values[: rows - 2 * third].mean(), middle.mean(), last.mean()),
        "last > middle p": mann_whitney_greater(last, middle),
        "slowed tau": slowed.tau,
        "slowed p": slowed.p_value,
        "reading": "at its ceiling (INFO)"
        if (whole.stopped or whole.lost) and values.min() >= 0 and values.max() <= 1 and whole.final >= 0.95
        else "gain lost (WARN)"
        if whole.lost
        else "gain stopped (INFO)"
        if whole.stopped
        else "rose (INFO)",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", type=Path, required=True, help="run_tools.py's folder of fetched logs")
    parser.add_argument("--draws", type=int, default=1000, help="simulated runs of N9's shape")
    args = parser.parse_args(argv)
    ids = pd.read_csv(HERE / "ground_truth.csv", dtype=str)["id"]
    print("| log | rows | p | last third p | thirds' means | last > middle p | slowed (tau, p) | report |")
    print("|---|---|---|---|---|---|---|---|")
    for log in ids:
        try:
            with warnings.catch_warnings():  # a log read as far as it goes: report says so, not needed here
                warnings.simplefilter("ignore")
                frame = training_rows(read_run(log_path(args.logs / log)))
        except (OSError, ValueError):
            continue
        score = score_column(frame)
        rewards = frame[score].dropna() if score else pd.Series(dtype=float)
        if len(rewards) < 12 or trend(rewards).direction != "rose":
            continue
        t = tests(rewards)
        thirds = " / ".join(f"{m:.3f}" for m in t["thirds"])
        print(
            f"| {log} | {t['rows']} | {t['p']:.3g} | {t['last third p']:.3g} | {thirds} | {t['last > middle p']:.3g} "
            f"| {t['slowed tau']:+.2f}, {t['slowed p']:.3g} | {t['reading']} |"
        )
    rng = np.random.default_rng(0)
    shape = np.r_[np.linspace(0.19, 0.31, 33), np.full(67, 0.31)]
    read = {"rose": 0, "gain stopped": 0, "no gain": 0}
    for _ in range(args.draws):
        t = trend(pd.Series(rng.binomial(8, shape) / 8, index=range(1, 101)))
        read["gain stopped" if t.stopped else "rose" if t.direction == "rose" else "no gain"] += 1
    shares = ", ".join(f"{name} {count / args.draws:.0%}" for name, count in read.items())
    print(f"\nN9's shape, {args.draws} draws of 100 steps x 8 completions (seed 0): {shares}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
