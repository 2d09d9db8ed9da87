"""benchmarks/bench_advantage.py: its inputs, what it times and the table it prints (never times)."""

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from verl_avspo.core.collapse import group_ids, measure_collapse
from verl_avspo.core.config import STRATEGIES
from verl_avspo.verl_plugin import run_state

pytestmark = pytest.mark.verl

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_advantage.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_advantage", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)
    run_state.reset()


def _table(text):
    rows = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    return cells[0], cells[2:]


def test_main_prints_one_row_per_method_with_all_columns(bench, capsys):
    threads = torch.get_num_threads()  # main() sets the thread count: keep this process's
    argv = ["--sizes", "64,96", "--lengths", "16", "--groups", "8", "--repeats", "1", "--warmup", "0"]
    assert bench.main([*argv, "--threads", str(threads)]) == 0
    out = capsys.readouterr().out
    header, rows = _table(out)
    assert tuple(header) == bench.COLUMNS
    expected = ["grpo", "grpo_vectorized", "avspo paper"] + [f"avspo {s}" for s in STRATEGIES]
    expected += ["dcpo", "acr metrics", "floor"]
    assert [row[3] for row in rows] == expected * 2
    assert [row[0] for row in rows] == ["64"] * len(expected) + ["96"] * len(expected)
    by_method = {row[3]: row for row in rows[: len(expected)]}
    assert by_method["grpo"][7] == "1.000"
    assert by_method["grpo_vectorized"][8] == "1.000"
    assert by_method["floor"][9] == "1.000"
    assert all(len(row) == len(header) for row in rows)
    assert f"{threads} torch threads" in out and "targets at" not in out  # the target point was not run


@pytest.mark.parametrize("uneven", [False, True])
def test_batch_has_the_requested_collapse_and_verl_layout(bench, uneven):
    batch = bench.make_batch(1000, 40, 8, collapsed=0.4, uneven=uneven, seed=3)
    rewards, mask = batch.token_level_rewards, batch.response_mask
    assert rewards.shape == mask.shape == (1000, 40) and mask.dtype == torch.int64
    assert batch.index.dtype == object and isinstance(batch.index[0], str) and len(batch.index[0]) == 36
    lengths = mask.sum(-1)
    assert lengths.min() >= 1 and len(lengths.unique()) > 10  # uneven response lengths
    # The reward sits on the last valid token only, as verl's reward manager writes it.
    last = torch.zeros_like(rewards, dtype=torch.bool)
    last[torch.arange(1000), lengths - 1] = True
    assert torch.equal(rewards[~last], torch.zeros(int((~last).sum())))
    assert set(batch.scores.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(batch.scores, rewards.sum(-1))

    ids, num_groups = group_ids(batch.index)
    sizes = torch.bincount(ids)
    eligible = int((sizes >= 2).sum())
    metrics = measure_collapse(batch.scores, batch.index)
    assert metrics["acr/rate"] == round(0.4 * eligible) / eligible
    assert metrics["acr/all_correct"] > 0.1 and metrics["acr/all_wrong"] > 0.1
    if uneven:
        assert metrics["acr/singletons"] > 0 and sizes.max() <= 8
    else:
        assert torch.equal(sizes, torch.full((125,), 8))
    assert not torch.equal(ids, torch.sort(ids).values)  # shuffled, as after balance_batch


def test_rows_compute_what_they_claim(bench):
    batch = bench.make_batch(512, 24, 8, seed=1)
    run_state.reset()
    calls = bench.methods(batch)
    grpo, _ = calls["grpo"]()
    vectorized, _ = calls["grpo_vectorized"]()
    torch.testing.assert_close(vectorized, grpo)
    # At ACR 0.4 the paper preset (threshold 0.5) does not trigger: it is GRPO plus the ACR metrics.
    paper, _ = calls["avspo paper"]()
    tracker = run_state.tracker_for(bench.algorithm_config(preset="paper"), "avspo")  # the estimator's fallback
    assert tracker.end_step(1, paper)["avspo/triggered"] == 0.0
    torch.testing.assert_close(paper, grpo)
    # The strategy rows augment every collapsed group, so they time AVSPO's full path.
    for strategy in STRATEGIES:
        augmented, _ = calls[f"avspo {strategy}"]()
        config = bench.algorithm_config(preset="paper", strategy=strategy, threshold_init=0.1)
        metrics = run_state.tracker_for(config, "avspo").end_step(1, augmented)
        assert metrics["avspo/triggered"] == metrics["acr/rate"] == 0.40625, strategy
        if strategy != "www":  # www leaves all-wrong groups at c = 0 where they were
            assert metrics["acr/effective"] == 0.0, strategy
        assert not torch.equal(augmented, grpo)
    # DCPO: the first call is GRPO (first visits). The second revisits every prompt with the same
    # rewards: the unbiased std over the 2G = 16 rewards is sqrt(14/15) of the group's, so
    # A = (Â_new + Â_total) / 2 = Â_new (1 + sqrt(15/14)) / 2; a collapsed group's history is as
    # collapsed as the group, so it stays 0.
    first, _ = calls["dcpo"]()
    torch.testing.assert_close(first, grpo)
    second, _ = calls["dcpo"]()
    mixed = grpo.abs().sum(-1) > 0
    torch.testing.assert_close(second[~mixed], grpo[~mixed])
    ratio = second[mixed].sum(-1) / grpo[mixed].sum(-1)
    torch.testing.assert_close(ratio, torch.full_like(ratio, 0.5 + 0.5 * (15 / 14) ** 0.5), rtol=1e-5, atol=0)
    assert calls["acr metrics"]() == measure_collapse(batch.scores, batch.index)
    assert torch.equal(calls["floor"](), batch.scores.unsqueeze(-1) * batch.response_mask)


def test_check_targets_reports_met_and_missed(bench):
    medians = {"grpo": 100.0, "grpo_vectorized": 30.0, "floor": 10.0, "avspo paper": 20.0, "avspo random": 40.0}
    medians["acr metrics"] = 1.0
    results = [{"N": 8192, "L": 4096, "G": 8, "method": name, "median_ms": ms} for name, ms in medians.items()]
    lines = bench.check_targets(results)
    assert lines[0] == "targets at N=8k, L=4k, G=8 (avspo = slowest row, 'avspo random'):"
    assert lines[1:] == [
        "  avspo / grpo = 0.400 (target <= 0.25): MISSED",
        "  avspo / grpo_vectorized = 1.333 (target <= 1.2): MISSED",
        "  avspo / floor = 4.000 (target <= 3.0): MISSED",
        "  acr / avspo = 0.025 (target <= 0.05): met",
    ]
    assert bench.check_targets([{**row, "N": 1024} for row in results]) == []


def test_parse_count(bench):
    assert bench.count_list("1k,8K,1000") == [1024, 8192, 1000]
    with pytest.raises(Exception, match="expected a positive count such as 4096 or 4k, got '8m'"):
        bench.parse_count("8m")


_MEASURE_64_MIB = f"""
import importlib.util, math, sys, torch
spec = importlib.util.spec_from_file_location("bench_advantage", {str(BENCH)!r})
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench
spec.loader.exec_module(bench)
print(bench.peak_extra_bytes(lambda: torch.ones(16 * 2**20), "cpu") / 2**20)  # 64 MiB of float32
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to reset the RSS peak")
def test_cpu_peak_memory_sees_a_known_allocation():
    # A fresh interpreter: a test worker's earlier allocations can leave freed memory resident.
    done = subprocess.run([sys.executable, "-c", _MEASURE_64_MIB], capture_output=True, text=True, check=True)
    mib = float(done.stdout.split()[-1])
    if math.isnan(mib):
        pytest.skip("this kernel does not reset VmHWM through /proc/self/clear_refs")
    assert 64 <= mib < 72


def test_cpu_peak_memory_is_nan_where_the_kernel_ignores_the_reset(bench, monkeypatch):
    status = {"VmRSS": 100_000, "VmHWM": 300_000}  # the peak stays above the current RSS after the reset
    monkeypatch.setattr(bench, "_status_kib", status.__getitem__)
    monkeypatch.setattr(bench.Path, "write_text", lambda self, text: len(text))
    assert math.isnan(bench.peak_extra_bytes(lambda: torch.ones(4), "cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown when CUDA is missing")
def test_cuda_request_without_cuda_skips_with_a_message(bench, capsys):
    assert bench.main(["--device", "cuda", "--sizes", "64", "--lengths", "8", "--groups", "8"]) == 0
    captured = capsys.readouterr()
    assert "CUDA is not available on this machine; nothing was timed" in captured.err
    assert captured.out == ""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_run_prints_the_table(bench, capsys):
    argv = ["--device", "cuda", "--sizes", "64", "--lengths", "16", "--groups", "8", "--repeats", "1"]
    argv += ["--threads", str(torch.get_num_threads())]
    assert bench.main(argv) == 0
    header, rows = _table(capsys.readouterr().out)
    assert tuple(header) == bench.COLUMNS and len(rows) == 3 + len(STRATEGIES) + 3
    assert all(np.isfinite(float(row[10])) for row in rows)
