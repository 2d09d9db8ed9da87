"""benchmarks/instrument_study_report.py, the study of docs/results.md "Every arm on the calibrated instrument":
the CSV it exports from the study's run folders (one row per setting x arm x seed, the earlier studies'
columns without a fixed target, the curve, the allocator's unallocated candidates, the accuracy per level named
as in --levels); the targets derived from GRPO's gain (T50, T90) and the rollouts to them, interpolated and
censored; the accuracy at equal rollouts; and the report's verdicts on constructed runs whose closed forms are
known: a ratio of rollouts per step is the ratio of rollouts to a target when the curves per step agree, the
goal figures met below 0.5 and 0.25 and not above, the gate withholding every verdict where GRPO did not
learn, a censored arm reported as a bound; and the committed study's figures as README and docs/results.md
quote them."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import load_benchmark

from verl_avspo.tools.seed_stats import paired_t

LEVELS = ("1+1", "2+1", "2+2", "2*1")


@pytest.fixture(scope="module")
def study():
    return load_benchmark("instrument_study_report")


def _write_run(path, accuracies, per_step, pilots=0, extended=0, extra=0):
    """A sandbox-format JSONL evaluated at step 0 and every step after: ``per_step`` rollouts a step, every level
    at the mean accuracy (a fraction), the allocator's counts per step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as log:
        for step, acc in enumerate(accuracies):
            data = {"train/rollouts_cumulative": step * per_step, "eval/acc_mean": acc}
            data.update({f"eval/acc_level_{i}": acc + 0.01 * i for i in range(1, len(LEVELS) + 1)})
            if step:
                data.update({"acr/rate": 0.5, "train/rollouts_generated": per_step, "prompts/skipped": 0})
                data.update({"prompts/always_solved": 0.25, "prompts/never_solved": 0.125})
                data.update({"prompts/pilots": pilots, "prompts/pilots_extended": extended})
                data.update({"prompts/extra_rollouts": extra, "prompts/unallocated": 1})
            log.write(json.dumps({"step": step, "data": data}) + "\n")


def _linear(start=0.30, slope=0.02, steps=10):
    """Accuracy (a fraction) rising by ``slope`` a step from ``start``: its last 5 evaluations average
    start + 8 slope, so GRPO's gain g is 8 slope (16 points at the defaults)."""
    return [start + slope * step for step in range(steps + 1)]


# Rollouts per step of each arm; every arm but avspo follows grpo's curve per step, avspo one point above it.
PER_STEP = {
    "grpo": 256,
    "avspo": 256,
    "grpo+alloc": 64,
    "grpo+alloc=0.5": 192,
    "dapo_resample": 1024,
    "dapo_resample+skip": 512,
}


def _study(root, seeds=(6000, 6001, 6002), slope=0.02):
    for setting in ("default", "epochs"):
        for arm, per_step in PER_STEP.items():
            for seed in seeds:
                curve = _linear(slope=slope)
                if arm == "avspo":
                    curve = [acc + 0.01 * (step > 0) for step, acc in enumerate(curve)]
                pilots = (8, 2, 32) if arm.startswith("grpo+alloc") else (0, 0, 0)
                _write_run(root / setting / arm / "runs" / arm / f"seed{seed}.jsonl", curve, per_step, *pilots)


def test_export_writes_one_row_per_run_in_the_registered_columns(study, tmp_path):
    _study(tmp_path / "study")
    assert study.main(["export", str(tmp_path / "study"), "--csv", str(tmp_path / "s.csv")]) == 0
    rows = pd.read_csv(tmp_path / "s.csv")
    assert len(rows) == 2 * len(PER_STEP) * 3
    earlier = [c for c in load_benchmark("rollouts_saved_report").COLUMNS if c not in ("target", "rollouts_to_target")]
    assert rows.columns[: len(earlier)].tolist() == earlier
    assert "target" not in rows and "rollouts_to_target" not in rows  # derived by the report, from g
    # Settings in order, then the registered arm order, then seeds.
    assert rows["mix"].tolist()[:3] == ["default"] * 3 and list(dict.fromkeys(rows["arm"])) == list(study.ARMS)
    grpo = rows[(rows["mix"] == "default") & (rows["arm"] == "grpo")].iloc[0]
    assert grpo["final_acc"] == pytest.approx(46.0)  # steps 6-10: 30 + 2 x 8 points
    assert (grpo["acc_0"], grpo["acc_10"], grpo["rollouts_10"]) == (pytest.approx(30.0), pytest.approx(50.0), 2560)
    assert (grpo["rollouts_per_step"], grpo["prompts_unallocated"]) == (256, 10)
    # The accuracy per level, named as --levels names them, final and at step 0.
    for index, level in enumerate(LEVELS, start=1):
        assert grpo[f"final_acc_level_{level}"] == pytest.approx(46.0 + index)
        assert grpo[f"start_acc_level_{level}"] == pytest.approx(30.0 + index)
    alloc = rows[rows["arm"] == "grpo+alloc"].iloc[0]
    assert (alloc["pilots"], alloc["pilots_extended"], alloc["extra_rollouts"]) == (80, 20, 320)


def test_export_refuses_a_folder_without_runs(study, tmp_path):
    (tmp_path / "empty" / "default").mkdir(parents=True)
    with pytest.raises(SystemExit, match="no run under .*: run the study's run stage first"):
        study.export(tmp_path / "empty")


def _table(study, tmp_path, **kwargs):
    _study(tmp_path / "study", **kwargs)
    return study.export(tmp_path / "study")


def test_targets_are_each_runs_start_plus_a_share_of_grpos_gain(study, tmp_path):
    frame = study.with_targets(_table(study, tmp_path), gain=16.0)
    grpo = frame[frame["arm"] == "grpo"].iloc[0]
    assert (grpo["target_50"], grpo["target_90"]) == (pytest.approx(38.0), pytest.approx(44.4))
    # 2 points a step: 38% at step 4, 44.4% at step 7.2, linearly interpolated in rollouts.
    assert (grpo["rollouts_to_50"], grpo["rollouts_to_90"]) == (pytest.approx(4 * 256), pytest.approx(7.2 * 256))
    cheap = frame[frame["arm"] == "grpo+alloc"].iloc[0]
    assert cheap["rollouts_to_90"] == pytest.approx(7.2 * 64)
    # A target past the curve is never reached: censored (NaN), not the last evaluation.
    assert math.isnan(study.with_targets(frame, gain=40.0)["rollouts_to_90"].iloc[0])


def test_accuracy_at_equal_rollouts_is_read_off_each_curve(study, tmp_path, monkeypatch):
    monkeypatch.setattr(study, "EQUAL_ROLLOUTS", 1280)  # grpo's step 5
    frame = study.with_targets(_table(study, tmp_path), gain=16.0)
    at = frame.groupby("arm")["equal_rollouts_acc"].first()
    assert at["grpo"] == pytest.approx(40.0) and at["dapo_resample"] == pytest.approx(32.5)  # step 1.25
    assert math.isnan(at["grpo+alloc"])  # 10 steps x 64 = 640 rollouts: ended before
    table = study.outcome_b(frame[frame["mix"] == "default"])
    assert "| `grpo+alloc` | — (its runs ended at or before 640 rollouts) |" in table
    assert "| `dapo_resample` | 32.5 ± 0.0 | -7.50 ± 0.00 [-7.50, -7.50] | lower |" in table


def test_ratios_goal_figures_and_verdicts_follow_the_closed_forms(study, tmp_path):
    frame = _table(study, tmp_path)
    text = study.report(frame, tmp_path / "plots")
    # The gate: g = 16 points on every seed, so M = 3.2.
    assert "`grpo`'s gain g over not training: +16.00 ± 0.00" in text and "the gate passed" in text
    assert "margin M = 0.2 g = 3.20 points; targets (mean over seeds) T50 = 38.00%, T90 = 44.40%" in text
    default = text.split("## epochs")[0]
    # Same curve per step: rollouts to either target scale as rollouts per step (64/256, 64/1024).
    assert "| `grpo+alloc` | 3 of 3 | 461 | 0.250 [0.250, 0.250] | fewer than grpo | 0.062 [0.062, 0.062] |" in default
    assert "| `dapo_resample` | 3 of 3 | 7,373 | 4.000 [4.000, 4.000] | more than grpo | — | — |" in default
    # Goal figures: below 0.5 and 0.25 (met); 0.75 and 0.1875 (the first not met).
    assert (
        "| `grpo+alloc` | non-inferior | 0.250 [0.250, 0.250] | **met** (below 0.5) | 0.062 [0.062, 0.062] | "
        "**met** (below 0.25) |"
    ) in default
    assert (
        "| `grpo+alloc=0.5` | non-inferior | 0.750 [0.750, 0.750] | not met: needs the upper end below 0.5 | "
        "0.188 [0.188, 0.188] | **met** (below 0.25) |"
    ) in default
    # (a): avspo ends one point above grpo on every seed (better, and non-inferior), dapo level with it.
    assert "| `avspo` | 47.0 ± 0.0 | +17.00 ± 0.00 [+17.00, +17.00] | 0: gained | +1.00 ± 0.00" in default
    assert "**non-inferior** | better |" in default
    # (d): rollouts per step as geometric means of the per-seed ratios.
    assert "| `grpo+alloc=0.5` | 192.0 ± 0.0 | 0.750 [0.750, 0.750] | saves rollouts |" in default
    assert "| `dapo_resample` | 1024.0 ± 0.0 | 4.000 [4.000, 4.000] | costs rollouts |" in default
    # The allocator's counts: 8 pilots a step, 2 of them extended; 32 rollouts beyond G of 640 in all.
    assert "| `grpo+alloc` | 80 ± 0 | 0.250 ± 0.000 | 320 ± 0 | 0.500 ± 0.000 | 10 ± 0 |" in default
    # The arms, the no-training row first, and the accuracy per level.
    assert "| *no training* | 3 | 30.0 ± 0.0 |" in default
    assert "| *no training* | 31.0 ± 0.0 | 32.0 ± 0.0 | 33.0 ± 0.0 | 34.0 ± 0.0 |" in default
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "instrument_study_default_accuracy_per_rollout.png",
        "instrument_study_epochs_accuracy_per_rollout.png",
    ]


def test_where_grpo_did_not_learn_no_verdict_stands(study, tmp_path):
    # A flat curve on every seed: g = 0, the gate fails and every target is the start (no ratio to 0 rollouts).
    text = study.report(_table(study, tmp_path, slope=0.0), tmp_path / "plots")
    assert "the gate **failed**" in text and "none (gate failed; " in text
    assert "**met**" not in text and "fewer than grpo" not in text


def test_a_mostly_censored_arm_is_a_bound_with_no_verdict(study, tmp_path):
    frame = _table(study, tmp_path)
    flat = [30.0] * 11
    never = (frame["arm"] == "grpo+alloc") & (frame["seed"] != 6000)  # 2 of 3 runs never reach T90
    frame.loc[never, [f"acc_{s}" for s in range(11)]] = flat
    text = study.report(frame, tmp_path / "plots").split("## epochs")[0]
    t90 = text.split("to T90")[1]
    assert "| `grpo+alloc` | 1 of 3 |" in t90 and "(bound: censored runs) | a bound, no verdict |" in t90


def test_bootstrap_intervals_are_seeded_and_paired(study, tmp_path):
    # With seed-to-seed spread the ratio interval is a percentile interval around the ratio of the means,
    # the same on every call (seed 0).
    frame = study.with_targets(_table(study, tmp_path, seeds=(6000, 6001, 6002, 6003)), gain=16.0)
    frame.loc[(frame["arm"] == "grpo+alloc"), "rollouts_to_90"] *= np.array([1.0, 2.0, 1.0, 2.0] * 2)
    first = study.rollout_ratio(frame[frame["mix"] == "default"], "grpo+alloc", "grpo", 0.9)
    again = study.rollout_ratio(frame[frame["mix"] == "default"], "grpo+alloc", "grpo", 0.9)
    assert first == again and first["ratio"] == pytest.approx(0.25 * 1.5)
    assert first["low"] < first["ratio"] < first["high"] and not first["bound"]


def _minus(value: float, digits: int) -> str:
    return f"{value:+.{digits}f}".replace("-", "−")


def test_the_committed_study_is_what_readme_and_results_md_quote(study, tmp_path):
    """The figures README's "Which estimator" and docs/results.md quote, recomputed from the committed CSV:
    GRPO's gain and its interval per setting, AVSPO's difference from GRPO, the half-budget allocator's
    rollouts to T90 and its accuracy cost, and the goal figures not met."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    table = pd.read_csv(docs / "results" / "instrument_study.csv")
    assert len(table) == 2 * len(study.ARMS) * 10 and set(table["seed"]) == set(range(6000, 6010))
    results = " ".join((docs / "results.md").read_text().split())
    readme = " ".join((docs.parent / "README.md").read_text().split())
    text = study.report(table, tmp_path)
    for _, frame in table.groupby("mix"):
        gate = study.learning_gate(frame, 0.05, study.MARGIN_FRACTION)
        assert gate["passed"]
        assert f"{gate['mean']:+.2f} ± {gate['se']:.2f}" in results
        assert f"[{gate['ci_low']:+.1f}, {gate['ci_high']:+.1f}]" in readme
        avspo = paired_t(np.subtract(*study._paired(frame, "avspo", "grpo", "final_acc")))
        cell = f"{_minus(avspo['mean'], 2)} [{_minus(avspo['ci_low'], 2)}, {_minus(avspo['ci_high'], 2)}]"
        assert cell in results and cell in readme
        frame = study.with_targets(frame, gate["mean"])
        half = study.rollout_ratio(frame, "grpo+alloc=0.5", "grpo", 0.9)
        assert f"{half['ratio']:.3f} [{half['low']:.3f}, {half['high']:.3f}]" in results
        assert f"{half['ratio']:.2f}× [{half['low']:.2f}, {half['high']:.2f}]" in readme
        assert half["high"] > study.GOALS["grpo"]  # the goal is not met
    assert "**met**" not in text and "1.42× and 2.5×" in readme
