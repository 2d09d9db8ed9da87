"""Time the advantage stage: verl's GRPO estimators against AVSPO, the ACR metrics and a floor.

Every estimator is called the way verl's ``compute_advantage`` calls it, on the same synthetic
batch: token rewards that are zero except at the last valid token of each response (as verl's
reward manager writes them), an int64 ``response_mask`` (verl slices it from ``attention_mask``)
with uneven response lengths, uuid4 ``uid`` strings in shuffled order (``trainer.balance_batch``
reorders the batch), binary rewards and a chosen fraction of collapsed groups.

Rows:
    grpo             verl's ``compute_grpo_outcome_advantage`` (a Python loop over samples)
    grpo_vectorized  verl's ``compute_grpo_vectorized_outcome_advantage``
    avspo paper      ``verl_avspo.verl_plugin.estimators.compute_avspo_advantage`` with ``preset: paper``; its
                     threshold starts at 0.5, so at an ACR of 0.4 it computes GRPO plus ACR
    avspo <strategy> the paper preset with that strategy and ``threshold_init: 0.1``, so every
                     collapsed group is augmented (the most work AVSPO can do)
    dcpo             ``verl_avspo.verl_plugin.estimators.compute_dcpo_advantage`` (DCPO's smooth advantage
                     standardization), each call preceded by the trainer's ``set_prompt_keys``;
                     every call revisits the same prompts, so from the second on every group is
                     blended with its history
    acr metrics      ``verl_avspo.core.collapse.measure_collapse`` on precomputed scores
    floor            the traffic no outcome estimator avoids: sum token rewards to scores, write
                     scores times mask (the fastest exact torch form of both)

Each row is timed in this process after warm-up: median and interquartile range over
``--repeats`` calls, the rows taking turns so that a change in machine load hits them alike, with
``torch.cuda.synchronize()`` around each call on CUDA. Peak extra memory is measured on one
separate call: ``torch.cuda.max_memory_allocated`` above the allocation before the call on CUDA;
on Linux CPUs the resident-set high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``)
above the resident set before the call. Both include the returned advantages.

Usage:
    python benchmarks/bench_advantage.py                       # the issue's grid
    python benchmarks/bench_advantage.py --sizes 8k --lengths 4k --groups 8 --repeats 15
    python benchmarks/bench_advantage.py --threads 2               # all cores instead of verl's one
    python benchmarks/bench_advantage.py --device cuda
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import verl
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos

from verl_avspo.core.collapse import measure_collapse
from verl_avspo.core.config import STRATEGIES
from verl_avspo.tools.markdown import render_table
from verl_avspo.verl_plugin import estimators, run_state

COLUMNS = ("N", "L", "G", "method", "median ms", "IQR ms", "min ms")
COLUMNS += ("x grpo", "x grpo_vec", "x floor", "peak extra MiB")
# The acceptance point and targets: (row, reference row, largest allowed ratio).
TARGET_POINT = (8192, 4096, 8)
TARGETS = (("avspo", "grpo", 0.25), ("avspo", "grpo_vectorized", 1.2), ("avspo", "floor", 3.0), ("acr", "avspo", 0.05))


@dataclass(frozen=True)
class Batch:
    """One synthetic advantage-stage input, laid out as verl hands it to an estimator."""

    token_level_rewards: torch.Tensor  # (N, L) float32
    response_mask: torch.Tensor  # (N, L) int64
    index: np.ndarray  # (N,) object array of uid strings
    scores: torch.Tensor  # (N,) float32, for the ACR-only row


def parse_count(text: str) -> int:
    """'8k' -> 8192, '1000' -> 1000."""
    match = re.fullmatch(r"(\d+)([kK]?)", text.strip())
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"expected a positive count such as 4096 or 4k, got {text!r}")
    return int(match.group(1)) * (1024 if match.group(2) else 1)


def count_list(text: str) -> list[int]:
    return [parse_count(part) for part in text.split(",")]


def make_batch(
    num_responses: int,
    length: int,
    group_size: int,
    collapsed: float = 0.4,
    uneven: bool = False,
    device: str = "cpu",
    seed: int = 0,
) -> Batch:
    """A batch whose share of collapsed groups (among groups of two or more) is ``collapsed``.

    Collapsed groups are half all-correct, half all-wrong. Every other group of two or more gets
    at least one correct and one wrong answer. With ``uneven`` the group sizes are drawn from
    [1, group_size], so some groups are singletons.
    """
    rng = np.random.default_rng(seed)
    if uneven:
        sizes = rng.integers(1, group_size + 1, size=num_responses)
        sizes = sizes[: np.searchsorted(np.cumsum(sizes), num_responses) + 1]
    else:
        sizes = np.full(-(-num_responses // group_size), group_size)
    sizes[-1] -= sizes.sum() - num_responses  # trim the last group to exactly N responses
    sizes = sizes[sizes > 0]
    num_groups = len(sizes)
    group = np.repeat(np.arange(num_groups), sizes)
    starts = np.cumsum(sizes) - sizes

    eligible = np.flatnonzero(sizes >= 2)
    chosen = rng.choice(eligible, size=round(collapsed * len(eligible)), replace=False)
    is_collapsed = np.zeros(num_groups, dtype=bool)
    is_collapsed[chosen] = True
    common = rng.integers(0, 2, size=num_groups).astype(np.float32)
    success = rng.uniform(0.2, 0.8, size=num_groups)
    reward = (rng.random(num_responses) < success[group]).astype(np.float32)
    mixed = np.flatnonzero((sizes >= 2) & ~is_collapsed)
    reward[starts[mixed]], reward[starts[mixed] + 1] = 1.0, 0.0
    reward = np.where(is_collapsed[group], common[group], reward)

    uids = np.array([str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in range(num_groups)], dtype=object)
    order = rng.permutation(num_responses)
    index, reward = uids[group][order], torch.from_numpy(reward[order])

    lengths = torch.from_numpy(rng.integers(1, length + 1, size=num_responses))
    response_mask = (torch.arange(length) < lengths.unsqueeze(1)).long()
    token_level_rewards = torch.zeros(num_responses, length)
    token_level_rewards[torch.arange(num_responses), lengths - 1] = reward
    return Batch(
        token_level_rewards.to(device), response_mask.to(device), index, token_level_rewards.sum(-1).to(device)
    )


def algorithm_config(**avspo):
    """verl's ``config.algorithm`` as the estimator sees it."""
    return OmegaConf.create({"adv_estimator": "avspo", "norm_adv_by_std_in_grpo": True, "avspo": avspo})


def floor(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Reduce token rewards to scores and write scores times mask, nothing else. Converting the
    int64 mask first and multiplying in place is exact and faster than a mixed-dtype multiply."""
    scores = token_level_rewards.sum(dim=-1)
    return response_mask.to(torch.result_type(scores, response_mask), copy=True).mul_(scores.unsqueeze(-1))


def methods(batch: Batch) -> dict[str, Callable[[], object]]:
    """Row name -> a call of that estimator on ``batch``."""
    inputs = {"token_level_rewards": batch.token_level_rewards, "response_mask": batch.response_mask}
    rows = {
        "grpo": lambda: core_algos.compute_grpo_outcome_advantage(**inputs, index=batch.index),
        "grpo_vectorized": lambda: core_algos.compute_grpo_vectorized_outcome_advantage(**inputs, index=batch.index),
    }

    def avspo(config):
        return lambda: estimators.compute_avspo_advantage(**inputs, index=batch.index, config=config)

    rows["avspo paper"] = avspo(algorithm_config(preset="paper"))
    for strategy in STRATEGIES:
        rows[f"avspo {strategy}"] = avspo(algorithm_config(preset="paper", strategy=strategy, threshold_init=0.1))
    prompt_keys = {uid: key for key, uid in enumerate(dict.fromkeys(batch.index.tolist()))}
    dcpo_config = OmegaConf.create({"adv_estimator": "dcpo", "norm_adv_by_std_in_grpo": True})

    def dcpo():
        # What the trainer does before verl's advantage stage.
        run_state.tracker_for(dcpo_config, "dcpo").set_prompt_keys(prompt_keys)
        return estimators.compute_dcpo_advantage(**inputs, index=batch.index, config=dcpo_config)

    rows["dcpo"] = dcpo
    rows["acr metrics"] = lambda: measure_collapse(batch.scores, batch.index)
    rows["floor"] = lambda: floor(batch.token_level_rewards, batch.response_mask)
    return rows


def synchronizer(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def time_calls(
    calls: dict[str, Callable[[], object]], repeats: int, warmup: int, sync: Callable[[], None]
) -> dict[str, np.ndarray]:
    """Milliseconds per call of each entry, after ``warmup`` untimed calls of each.

    The calls take turns (one round of every entry per repeat), so a slow drift in machine load
    shifts all rows alike instead of distorting their ratios. Results are freed outside the timing.
    """
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    seconds = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            sync()
            start = time.perf_counter()
            result = fn()
            sync()
            seconds[name].append(time.perf_counter() - start)
            del result
    return {name: np.array(values) * 1e3 for name, values in seconds.items()}


def _status_kib(field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE).group(1))


def peak_extra_bytes(fn: Callable[[], object], device: str) -> float:
    """Peak memory one call adds, its result included (NaN where it cannot be measured)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        result = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            before = _status_kib("VmRSS")
            reset_took = _status_kib("VmHWM") - before < 1024  # some kernels ignore the reset
        except (OSError, AttributeError):
            return float("nan")
        if not reset_took:
            return float("nan")
        result = fn()
        peak = (_status_kib("VmHWM") - before) * 1024
    del result
    return float(peak)


def benchmark(
    sizes: list[int],
    lengths: list[int],
    groups: list[int],
    repeats: int = 5,
    warmup: int = 1,
    device: str = "cpu",
    collapsed: float = 0.4,
    uneven: bool = False,
    seed: int = 0,
) -> list[dict]:
    """One dict per (N, L, G, method) with the median and IQR in ms, ratios and peak memory."""
    sync = synchronizer(device)
    results = []
    for num_responses in sizes:
        for length in lengths:
            for group_size in groups:
                batch = make_batch(num_responses, length, group_size, collapsed, uneven, device, seed)
                acr = measure_collapse(batch.scores, batch.index)["acr/rate"]
                print(f"N={num_responses} L={length} G={group_size}: ACR={acr:.3f}", file=sys.stderr, flush=True)
                run_state.reset()
                calls = methods(batch)
                timed = {}
                for name, ms in time_calls(calls, repeats, warmup, sync).items():
                    q1, median, q3 = np.percentile(ms, [25, 50, 75])
                    peak = peak_extra_bytes(calls[name], device)
                    timed[name] = {"median": median, "iqr": q3 - q1, "min": ms.min(), "peak": peak}
                for name, row in timed.items():
                    results.append(
                        {
                            "N": num_responses,
                            "L": length,
                            "G": group_size,
                            "acr": acr,
                            "method": name,
                            "median_ms": row["median"],
                            "iqr_ms": row["iqr"],
                            "min_ms": row["min"],
                            "x_grpo": row["median"] / timed["grpo"]["median"],
                            "x_grpo_vectorized": row["median"] / timed["grpo_vectorized"]["median"],
                            "x_floor": row["median"] / timed["floor"]["median"],
                            "peak_mib": row["peak"] / 2**20,
                        }
                    )
                del batch
    return results


def format_table(results: list[dict]) -> str:
    """A Markdown table of ``results``."""
    keys = ("N", "L", "G", "method", "median_ms", "iqr_ms", "min_ms")
    keys += ("x_grpo", "x_grpo_vectorized", "x_floor", "peak_mib")
    formats = {"median_ms": "{:.2f}", "iqr_ms": "{:.2f}", "min_ms": "{:.2f}", "peak_mib": "{:.1f}"}

    def cell(row: dict, key: str) -> str:
        return formats.get(key, "{:.3f}" if key.startswith("x_") else "{}").format(row[key])

    return render_table(COLUMNS, [[cell(row, key) for key in keys] for row in results])


def check_targets(results: list[dict]) -> list[str]:
    """The issue's targets at N=8k, L=4k, G=8, using the slowest AVSPO row; empty if not run."""
    point = [row for row in results if (row["N"], row["L"], row["G"]) == TARGET_POINT]
    if not point:
        return []
    median = {row["method"]: row["median_ms"] for row in point}
    slowest = max((name for name in median if name.startswith("avspo")), key=median.get)
    median["avspo"], median["acr"] = median[slowest], median["acr metrics"]
    lines = [f"targets at N=8k, L=4k, G=8 (avspo = slowest row, {slowest!r}):"]
    for row, reference, limit in TARGETS:
        ratio = median[row] / median[reference]
        verdict = "met" if ratio <= limit else "MISSED"
        lines.append(f"  {row} / {reference} = {ratio:.3f} (target <= {limit}): {verdict}")
    return lines


def environment(device: str) -> str:
    if device.startswith("cuda"):
        where = torch.cuda.get_device_name(device)
    else:
        cpuinfo = Path("/proc/cpuinfo")
        models = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE) if cpuinfo.exists() else []
        where = f"{models[0] if models else platform.processor()}, {torch.get_num_threads()} torch threads"
    versions = f"torch {torch.__version__}, verl {verl.__version__}, python {platform.python_version()}"
    # Other processes on the machine distort timings: the load average says whether it was quiet.
    load = ", load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    return f"device {device}: {where}; {versions}{load}"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=count_list, default=[1024, 8192, 32768], help="responses N (default 1k,8k,32k)")
    parser.add_argument("--lengths", type=count_list, default=[1024, 4096], help="response length L (default 1k,4k)")
    parser.add_argument("--groups", type=count_list, default=[8, 16], help="group size G (default 8,16)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per row (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls before timing (default 1)")
    parser.add_argument("--collapsed", type=float, default=0.4, help="share of collapsed groups (default 0.4)")
    parser.add_argument("--uneven", action="store_true", help="draw group sizes from [1, G] instead of all G")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default cpu)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: verl's TaskRunner is a Ray actor without num_cpus, so Ray sets "
        "OMP_NUM_THREADS=1 there)",
    )
    parser.add_argument("--seed", type=int, default=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    configure(parser)
    args = parser.parse_args(argv)
    if not 0.0 <= args.collapsed <= 1.0:
        parser.error(f"--collapsed must be a share in [0, 1], got {args.collapsed}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.repeats < 1 or args.warmup < 0:
        parser.error(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {args.device}: CUDA is not available on this machine; nothing was timed.", file=sys.stderr)
        return 0
    if not (args.device == "cpu" or args.device.startswith("cuda")):
        parser.error(f"--device must be cpu or cuda[:i], got {args.device!r}")
    torch.set_num_threads(args.threads)
    print(environment(args.device))
    print(f"repeats {args.repeats}, warm-up {args.warmup}, collapsed {args.collapsed}, uneven groups {args.uneven}\n")
    results = benchmark(
        args.sizes,
        args.lengths,
        args.groups,
        args.repeats,
        args.warmup,
        args.device,
        args.collapsed,
        args.uneven,
        args.seed,
    )
    print(format_table(results))
    for line in check_targets(results):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
