"""benchmarks/paired_test.py and benchmarks/rollout_plots.py, the statistics of docs/results.md:
the pre-registered tests against closed forms and brute force, the paired report on written runs,
the interpolation at a rollout budget, the rollout table's mean ± std and paired ± s.e. cells
on written runs, paired by seed (not by position), and benchmarks/study_plots.py on a one-seed study."""

import itertools
import json

import numpy as np
import pytest
from helpers import load_benchmark

from verl_avspo.tools.seed_stats import paired_t


@pytest.fixture(scope="module")
def paired():
    return load_benchmark("paired_test")


@pytest.fixture(scope="module")
def rollouts():
    return load_benchmark("rollout_plots")


@pytest.fixture(scope="module")
def study():
    return load_benchmark("study_plots")


def _brute_force_wilcoxon(diffs):
    d = diffs[diffs != 0]
    magnitudes = np.abs(d)
    ranks = np.array([(magnitudes < m).sum() + ((magnitudes == m).sum() + 1) / 2 for m in magnitudes])
    observed = ranks[d > 0].sum()
    totals = [
        sum(r for r, s in zip(ranks, signs, strict=True) if s) for signs in itertools.product((0, 1), repeat=len(d))
    ]
    return observed, np.mean([t >= observed - 1e-9 for t in totals])


@pytest.mark.parametrize("seed", range(5))
def test_wilcoxon_matches_brute_force_with_ties_and_zeros(paired, seed):
    diffs = np.random.default_rng(seed).integers(-4, 5, size=9).astype(float)  # ties and zeros
    w_plus, p = _brute_force_wilcoxon(diffs)
    result = paired.wilcoxon_signed_rank(diffs)
    assert result["w_plus"] == pytest.approx(w_plus) and result["p"] == pytest.approx(p)


def test_sign_test_is_binomial(paired):
    assert paired.sign_test(np.array([1.0, -2.0, 3.0, 4.0, 0.0])) == {"wins": 3, "n": 4, "p": 5 / 16}
    assert paired.sign_test(np.zeros(3))["p"] == 1.0


def _write_run(path, accuracies, per_step=128):
    """A sandbox-format JSONL: step 0 and every 2 steps evaluated, ``per_step`` rollouts a step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as log:
        for step, acc in enumerate(accuracies):
            record = {"step": step, "data": {"train/rollouts_cumulative": step * per_step, "eval/acc_mean": acc}}
            if step:
                record["data"].update({"acr/rate": 0.5, "train/rollouts_generated": per_step})
            log.write(json.dumps(record) + "\n")


def test_report_pairs_by_seed_and_decides_at_alpha(paired, tmp_path):
    for seed, (base, ours) in enumerate([(0.5, 0.6), (0.4, 0.45), (0.7, 0.72)]):
        _write_run(tmp_path / "runs" / "grpo" / f"seed{seed + 100}.jsonl", [0.1, base])
        _write_run(tmp_path / "runs" / "avspo" / f"seed{seed + 100}.jsonl", [0.1, ours])
    text = paired.report(tmp_path, "avspo", "grpo", alpha=0.05)
    assert "seeds 100..102 (3)" in text and "+10.0, +5.0, +2.0" in text
    assert "higher in 3 of 3 non-tied seeds, p = 0.1250" in text
    expected = paired_t(np.array([10.0, 5.0, 2.0]))
    assert f"p = {expected['p']:.4f}" in text
    assert ("**confirmed**" in text) == (expected["p"] < 0.05)
    with pytest.raises(SystemExit, match="no seed.*jsonl under"):
        paired.report(tmp_path, "dapo", "grpo", alpha=0.05)


def test_accuracy_at_a_rollout_budget_interpolates_between_evaluations(rollouts, tmp_path):
    from verl_avspo.tools.logs import read_metrics

    _write_run(tmp_path / "a.jsonl", [0.2, 0.3, 0.5], per_step=400)  # evaluations at 0, 400, 800 rollouts
    frame = read_metrics(tmp_path / "a.jsonl")
    assert rollouts.at_rollouts(frame, 600) == pytest.approx(40.0)  # halfway between 30% and 50%
    assert rollouts.at_rollouts(frame, 800) == pytest.approx(50.0)
    with pytest.raises(ValueError, match="budget 900 is past this run's last evaluation at 800 rollouts"):
        rollouts.at_rollouts(frame, 900)


def test_rollout_table_cells_are_mean_std_and_paired_standard_error(rollouts, tmp_path):
    finals = {"grpo": (0.5, 0.7), "avspo": (0.6, 0.9)}  # per seed; avspo gains 10 and 20 points
    for label, accuracies in finals.items():
        for seed, acc in enumerate(accuracies):
            _write_run(tmp_path / "runs" / label / f"seed{seed}.jsonl", [0.1, acc])
    text, budget = rollouts.table(rollouts.load(tmp_path))
    assert budget == 128
    # grpo 60 ± sqrt(200); avspo 75 ± sqrt(450); gain 15 ± sqrt(50) / sqrt(2) = 5
    assert text.splitlines()[2:] == [
        "| `grpo` | 60.0 ± 14.1 | — | 60.0 ± 14.1 | — | 128 ± 0 | — |",
        "| `avspo` | 75.0 ± 21.2 | +15.0 ± 5.0 (2 of 2) | 75.0 ± 21.2 | +15.0 ± 5.0 (2 of 2) | 128 ± 0 | — |",
    ]


def test_paired_cells_pair_runs_by_seed_not_by_position(rollouts, tmp_path):
    """A seed that one estimator lacks is left out of the pairs: grpo ran seeds 1-3, avspo 2-3."""
    for seed, acc in {1: 0.1, 2: 0.5, 3: 0.7}.items():
        _write_run(tmp_path / "runs" / "grpo" / f"seed{seed}.jsonl", [0.1, acc])
    for seed, acc in {2: 0.6, 3: 0.9}.items():  # +10 and +20 points on the seeds both ran
        _write_run(tmp_path / "runs" / "avspo" / f"seed{seed}.jsonl", [0.1, acc])
    runs = rollouts.load(tmp_path)
    assert [frame.attrs["seed"] for frame in runs["avspo"]] == [2, 3]
    row = rollouts.table(runs)[0].splitlines()[3]
    assert row.split(" | ")[2] == "+15.0 ± 5.0 (2 of 2)"  # by position it would be +45.0 ± 5.0


def test_study_plots_of_a_single_seed_draw_and_tabulate_without_a_spread(study, tmp_path, capsys):
    """One seed per estimator (a first look before the full study) has no std: no error bar, the mean alone."""
    for label, acc in {"grpo": 0.5, "avspo-beta_loo": 0.6}.items():
        path = tmp_path / "study" / "easy" / "runs" / label / "seed0.jsonl"
        path.parent.mkdir(parents=True)
        with path.open("w") as log:
            for step in range(3):
                data = {"eval/acc_mean": acc * step / 2, "eval/pass@4_level_1": acc, "acr/rate": 0.5}
                data.update({"acr/effective": 0.25, "actor/entropy": 1.0})
                log.write(json.dumps({"step": step, "data": data}) + "\n")
    with pytest.warns(RuntimeWarning):  # numpy: a std over one seed has zero degrees of freedom
        assert study.main([str(tmp_path / "study"), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "final_accuracy.png").stat().st_size > 0
    rows = capsys.readouterr().out.split("\n\n")[1].splitlines()[2:]
    assert rows == [
        "| `grpo` | 50.0 | 50.0 | — | 0.500 | 0.250 | 1.000 |",
        "| `avspo:beta_loo` | 60.0 | 60.0 | +10.0 | 0.500 | 0.250 | 1.000 |",
    ]


def test_holm_adjustment_is_step_down_and_monotone(rollouts):
    # sorted: 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> kept monotone at 0.06
    assert rollouts.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert rollouts.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_pre_registered_pair_tests_decide_by_holm_and_the_interval(rollouts, tmp_path):
    gains = {"grpo+skip": (10, 12, 11, 9, 10), "avspo+skip": (-10, -12, -11, -9, -10)}  # points, per seed
    for seed in range(5):
        for label, base in (("grpo", 0.5), ("avspo", 0.5)):
            _write_run(tmp_path / "easy" / "runs" / label / f"seed{seed}.jsonl", [0.1, base])
        for label, gain in gains.items():
            _write_run(tmp_path / "easy" / "runs" / label / f"seed{seed}.jsonl", [0.1, 0.5 + gain[seed] / 100])
    runs = rollouts.load(tmp_path / "easy")
    text = rollouts.pair_tests({"easy": (runs, 128.0)}, [("grpo+skip", "grpo"), ("avspo+skip", "avspo")], 0.05)
    helps, hurts = text.splitlines()
    assert helps.startswith("- easy: `grpo+skip` − `grpo` at 128 rollouts: +10.40 ±") and helps.endswith("**helps**")
    assert hurts.endswith("**hurts**")


def test_prompt_table_reports_the_share_of_candidate_rollouts_skipped(rollouts, tmp_path):
    for label, skipped in (("grpo", None), ("grpo+skip", 128)):
        path = tmp_path / "runs" / label / "seed0.jsonl"
        _write_run(path, [0.1, 0.5, 0.6])
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for record in records[1:]:
            record["data"]["prompts/collapsed_before"] = 0.25
            if skipped is not None:
                record["data"]["prompts/rollouts_skipped"] = skipped
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    rows = rollouts.prompt_table(rollouts.load(tmp_path)).splitlines()[2:]
    # one seed: no spread
    assert rows == ["| `grpo` | 0.500 | 0.250 | — |", "| `grpo+skip` | 0.500 | 0.250 | 0.500 |"]


def test_late_pairs_average_the_evaluations_from_a_step_on(rollouts, tmp_path):
    for seed, (base, ours) in enumerate([((0.5, 0.5), (0.6, 0.8)), ((0.4, 0.6), (0.5, 0.7))]):
        _write_run(tmp_path / "easy" / "runs" / "grpo" / f"seed{seed}.jsonl", [0.1, *base])
        _write_run(tmp_path / "easy" / "runs" / "grpo+skip" / f"seed{seed}.jsonl", [0.1, *ours])
    runs = rollouts.load(tmp_path / "easy")
    line = rollouts.late_pairs({"easy": (runs, 256.0)}, [("grpo+skip", "grpo")], first_step=1)
    # per seed: mean of steps 1-2 differs by +20 and +10 points
    assert "from step 1: +15.00 ± 5.00 (s.e., n = 2)" in line
