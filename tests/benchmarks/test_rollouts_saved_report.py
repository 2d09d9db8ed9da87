"""benchmarks/rollouts_saved_report.py, the studies of docs/results.md "Rollouts saved by skipping" and
"Rollouts per prompt from the history": the CSV it exports from run folders it is given (columns, final
accuracy over the last evaluations, rollouts to the target interpolated and censored), the ratio,
interval and non-inferiority closed forms on constructed numbers, censored runs in the ratio to a
baseline, the pairs and baselines a study names, and the report recomputed from the CSV alone; the
no-training row, the gate on grpo's gain over it and the gated verdicts, and the figures docs/results.md
quotes from the committed CSVs, now in its archive (grpo's gain, not training passing the registered test on the easy
mix)."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import load_benchmark

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def saved():
    return load_benchmark("rollouts_saved_report")


def _write_run(path, accuracies, per_step, skipped=0):
    """A sandbox-format JSONL: evaluated at step 0 and every step after, ``per_step`` rollouts a step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as log:
        for step, acc in enumerate(accuracies):
            data = {"train/rollouts_cumulative": step * per_step, "eval/acc_mean": acc}
            if step:
                data.update({"acr/rate": 0.5, "train/rollouts_generated": per_step, "prompts/skipped": skipped})
                data.update({"prompts/always_solved": 0.25, "prompts/never_solved": 0.125})
            log.write(json.dumps({"step": step, "data": data}) + "\n")


def _study(root):
    """Easy mix, 2 seeds: grpo 128 a step, reaching 70% at step 2 (seed 0) or never (seed 1);
    dapo_resample 512 a step; dapo_resample+skip 256 a step, skipping 3 prompts a step."""
    runs = root / "easy" / "runs"
    _write_run(runs / "grpo" / "seed400.jsonl", [0.6, 0.65, 0.75, 0.75], 128)
    _write_run(runs / "grpo" / "seed401.jsonl", [0.6, 0.62, 0.64, 0.66], 128)
    for seed in (400, 401):
        _write_run(runs / "dapo_resample" / f"seed{seed}.jsonl", [0.6, 0.7, 0.72, 0.74], 512)
        _write_run(runs / "dapo_resample+skip" / f"seed{seed}.jsonl", [0.6, 0.68, 0.72, 0.73], 256, skipped=3)


def test_export_writes_one_row_per_run_with_the_registered_columns(saved, tmp_path):
    _study(tmp_path / "study")
    assert saved.main(["export", str(tmp_path / "study"), "--csv", str(tmp_path / "s.csv"), "--target", "easy=70"]) == 0
    rows = pd.read_csv(tmp_path / "s.csv")
    assert list(rows.columns[: len(saved.COLUMNS)]) == saved.COLUMNS
    assert [c for c in rows.columns[len(saved.COLUMNS) :]] == [f"acc_{s}" for s in range(4)] + [
        f"rollouts_{s}" for s in range(4)
    ]
    assert list(zip(rows["arm"], rows["seed"], strict=True)) == [
        ("grpo", 400),
        ("grpo", 401),
        ("dapo_resample", 400),
        ("dapo_resample", 401),
        ("dapo_resample+skip", 400),
        ("dapo_resample+skip", 401),
    ]
    grpo = rows[rows["arm"] == "grpo"].set_index("seed")
    # The last 5 evaluations: all 4 here. Seed 400 crosses 70% halfway from 65% (128) to 75% (256).
    assert grpo.loc[400, "final_acc"] == pytest.approx((60 + 65 + 75 + 75) / 4)
    assert grpo.loc[400, "rollouts_to_target"] == pytest.approx(192)
    assert math.isnan(grpo.loc[401, "rollouts_to_target"]) and grpo.loc[401, "rollouts_cumulative"] == 384
    skip = rows[rows["arm"] == "dapo_resample+skip"].iloc[0]
    assert (skip["rollouts_per_step"], skip["prompts_skipped"], skip["raw_acr"]) == (256, 9, 0.5)
    assert (skip["always_solved"], skip["never_solved"], skip["target"]) == (0.25, 0.125, 70)
    with pytest.raises(SystemExit, match="no target for mix 'easy'"):
        saved.export(tmp_path / "study", {"hard": 28.0}, gains={})


def test_the_registered_target_is_the_mixs_start_plus_its_gain(saved, tmp_path):
    """Without --target, every run of a mix gets its start (the mean step-0 accuracy, 60% here) plus the
    registered gain: 68% on the easy mix, which grpo's seed 400 crosses between 65% (128) and 75% (256)."""
    _study(tmp_path / "study")
    rows = saved.export(tmp_path / "study").set_index(["arm", "seed"])
    assert saved.TARGET_GAINS["easy"] == 8.0 and (rows["target"] == 68.0).all()
    assert rows.loc[("grpo", 400), "rollouts_to_target"] == pytest.approx(128 + 0.3 * 128)
    assert rows.loc[("dapo_resample", 400), "rollouts_to_target"] == pytest.approx(512 * 8 / 10)


def test_rollouts_to_target_interpolates_the_first_crossing(saved):
    rollouts, accuracy = np.array([0.0, 100, 200, 300]), np.array([60.0, 72, 68, 80])
    assert saved.rollouts_to_target(rollouts, accuracy, 66.0) == pytest.approx(50)  # the first crossing, not the last
    assert saved.rollouts_to_target(rollouts, accuracy, 55.0) == 0.0  # reached at the start
    assert math.isnan(saved.rollouts_to_target(rollouts, accuracy, 81.0))


def test_log_ratio_interval_is_the_exponentiated_t_interval(saved):
    denominator = np.array([1.0, 2.0, 4.0])
    numerator = denominator * np.exp([1.0, 2.0, 3.0])  # log-ratios 1, 2, 3: mean 2, s.e. 1/sqrt(3)
    result = saved.log_ratio_interval(numerator, denominator)
    half = 4.302653 / math.sqrt(3)  # t_{0.975, 2}
    assert result["ratio"] == pytest.approx(math.exp(2))
    assert (result["low"], result["high"]) == pytest.approx((math.exp(2 - half), math.exp(2 + half)), rel=1e-5)


def test_non_inferiority_tests_against_the_margin(saved):
    differences = np.array([-1.0, 0.0, 1.0, 0.0])  # mean 0, s.e. sqrt(2/3)/2
    se = math.sqrt(2 / 3) / 2
    result = saved.non_inferiority(differences, margin=1.5, alpha=0.05)
    assert result["mean"] == pytest.approx(0) and result["t"] == pytest.approx(1.5 / se)
    assert result["lower"] == pytest.approx(-2.353363 * se, rel=1e-5)  # t_{0.95, 3}: the one-sided 95% bound
    half = 3.182446 * se  # t_{0.975, 3}: the two-sided 95% interval
    assert (result["ci_low"], result["ci_high"]) == pytest.approx((-half, half), rel=1e-5)
    assert result["verdict"] == "non-inferior" and result["p"] < 0.05
    assert saved.non_inferiority(differences - 1.5, margin=1.5, alpha=0.05)["verdict"] == "inconclusive"  # at −margin
    assert saved.non_inferiority(differences - 5, margin=1.5, alpha=0.05)["verdict"] == "inferior"


def test_ratio_verdicts_need_the_whole_interval_on_one_side_of_one(saved):
    assert saved.ratio_verdict(0.5, 0.9, "fewer", "more") == "fewer"
    assert saved.ratio_verdict(1.1, 2.0, "fewer", "more") == "more"
    assert saved.ratio_verdict(0.9, 1.1, "fewer", "more") == "no detectable difference"


def test_bootstrap_ratio_of_means_is_exact_for_a_constant_ratio_and_pairs_seeds(saved):
    result = saved.bootstrap_ratio(np.array([2.0, 4.0, 6.0]), np.array([1.0, 2.0, 3.0]), draws=500)
    assert (result["ratio"], result["low"], result["high"]) == pytest.approx((2.0, 2.0, 2.0))
    spread = saved.bootstrap_ratio(np.array([1.0, 3.0, 2.0, 6.0]), np.array([1.0, 1.0, 2.0, 2.0]))
    assert spread["ratio"] == pytest.approx(2.0) and spread["low"] < 2.0 < spread["high"]


def test_the_report_recomputes_everything_from_the_csv_and_marks_censored_ratios(saved, tmp_path):
    _study(tmp_path / "study")
    saved.main(["export", str(tmp_path / "study"), "--csv", str(tmp_path / "s.csv"), "--target", "easy=70"])
    text = saved.report(pd.read_csv(tmp_path / "s.csv"), tmp_path / "plots", margin=1.5, alpha=0.05)
    assert (tmp_path / "plots" / "rollouts_saved_easy_accuracy_per_rollout.png").stat().st_size > 0
    # (a): 256 / 512 on both seeds; final accuracy −0.75 on both (no spread).
    ratio = "`dapo_resample+skip` / `dapo_resample`: 0.500 (geometric mean over 2 seeds), 95% CI [0.500, 0.500]"
    assert f"{ratio}: **saves rollouts**" in text
    assert "at equal steps: -0.75 ± 0.00" in text and "**non-inferior**" in text
    # (b): grpo reached 70% in 1 of 2 runs; its censored seed counts with its 384 rollouts, a bound.
    section_b = text.split("### (b)")[1].split("### Arms")[0]
    rows = {line.split(" | ")[0]: line for line in section_b.splitlines() if line.startswith("| `")}
    assert rows["| `grpo`"] == "| `grpo` | 1 of 2 | 192 | — | — |"
    # dapo_resample reaches 70% at step 1 (512) on both seeds: mean 512 / mean(192, 384) = 512 / 288.
    assert rows["| `dapo_resample`"].startswith(f"| `dapo_resample` | 2 of 2 | 512 | {512 / 288:.3f} [")
    assert rows["| `dapo_resample`"].endswith("(bound: censored runs) | a bound, no verdict |")
    arms = text.split("### Arms")[1]
    assert "| `dapo_resample+skip` | 2 | 68.2 ± 0.0 | 256 ± 0 | 768 ± 0 | 0.500 ± 0.000 | 9 ± 0 |" in arms
    # The no-training row first: the step-0 accuracy, 0 rollouts; grpo's gain over it (+8.75, +3.0) is not
    # significant on 2 seeds, so every gated verdict is none.
    assert "| *no training* | 2 | 60.0 ± 0.0 | 0 ± 0 | 0 ± 0 | n/a | 0 ± 0 |" in arms
    assert "+5.88 ± 2.88 (s.e.)" in text and "**`grpo` did not beat not training**" in text
    assert "- gated: **none**: `grpo` did not beat not training on this mix\n" in text
    assert 'so no "fewer" above is a saving' in text


def test_a_single_seed_reports_the_ratio_without_an_interval(saved, tmp_path):
    """A smoke run of the study (one seed) has no spread: the report says so instead of failing."""
    _study(tmp_path / "study")
    for arm in ("grpo", "dapo_resample", "dapo_resample+skip"):
        (tmp_path / "study" / "easy" / "runs" / arm / "seed401.jsonl").unlink()
    rows = saved.export(tmp_path / "study", {"easy": 70.0})
    with pytest.warns(RuntimeWarning):  # numpy: the plot's std over one seed
        text = saved.report(rows, tmp_path / "plots", margin=1.5, alpha=0.05)
    assert "0.500 from 1 seed in common: no interval or test below 2 seeds" in text
    assert "| `grpo` | 1 of 1 | 192 | — | — |" in text
    never = rows.assign(rollouts_to_target=math.nan)  # no run reached the target: no mean to show
    assert "| `grpo` | 0 of 1 | — | — | — |" in saved.primary_b(never)


def test_the_allocation_study_names_its_pairs_baselines_and_gains(saved, tmp_path):
    """The second study (benchmarks/rollout_allocation_study.sh) through the same script: outcome (a) for
    each pair given, (b) against each baseline, the target as a gain over the mix's start, and the
    allocator's counts in the arms table."""
    _study(tmp_path / "study")
    runs = tmp_path / "study" / "easy" / "runs"
    for seed in (400, 401):
        path = runs / "grpo+alloc" / f"seed{seed}.jsonl"
        _write_run(path, [0.6, 0.7, 0.72, 0.74], 64)
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for line in lines[1:]:
            line["data"].update({"prompts/pilots": 4, "prompts/pilots_extended": 1, "prompts/extra_rollouts": 8})
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    csv = tmp_path / "a.csv"
    assert saved.main(["export", str(tmp_path / "study"), "--csv", str(csv), "--gain", "easy=10"]) == 0
    rows = pd.read_csv(csv)
    assert (rows["target"] == 70.0).all()  # the start, 60%, plus the gain
    alloc = rows[rows["arm"] == "grpo+alloc"].iloc[0]
    assert (alloc["pilots"], alloc["pilots_extended"], alloc["extra_rollouts"]) == (12, 3, 24)
    text = saved.report(
        rows,
        tmp_path / "plots",
        margin=1.5,
        alpha=0.05,
        prefix="rollout_allocation_",
        pairs=(("grpo+alloc", "grpo"),),
        baselines=("grpo", "dapo_resample"),
    )
    assert (tmp_path / "plots" / "rollout_allocation_easy_accuracy_per_rollout.png").stat().st_size > 0
    assert (
        "`grpo+alloc` / `grpo`: 0.500 (geometric mean over 2 seeds)" in text
        and "### (a) `dapo_resample+skip`" not in text
    )
    to_dapo = text.split("(ratio to `dapo_resample`, paired bootstrap)")[1].split("### ")[0]
    # grpo+alloc reaches 70% at step 1 (64 rollouts), dapo_resample at step 1 (512): 64 / 512, never censored.
    assert "| `grpo+alloc` | 2 of 2 | 64 | 0.125 [0.125, 0.125] | fewer than dapo_resample |" in to_dapo
    assert "| 12 ± 0 | 3 ± 0 | 24 ± 0 |" in text.split("### Arms")[1]


def _rows(finals: dict[str, list[float]], start: float = 60.0, per_step: dict | None = None) -> pd.DataFrame:
    """CSV rows of one mix: per arm, one final accuracy per seed (seeds 0, 1, ...), all starting at ``start``."""
    per_step = per_step or {}
    return pd.DataFrame(
        [
            {
                "mix": "easy",
                "arm": arm,
                "seed": seed,
                "steps": 10,
                "target": start + 1,
                "final_acc": final,
                "rollouts_per_step": per_step.get(arm, 128.0),
                "rollouts_cumulative": 10 * per_step.get(arm, 128.0),
                "rollouts_to_target": math.nan,
                "raw_acr": 0.5,
                **dict.fromkeys(("prompts_skipped", "prompts_reselected", "rollouts_skipped"), 0.0),
                **dict.fromkeys(("always_solved", "never_solved"), 0.25),
                "acc_0": start,
                "acc_10": final,
                "rollouts_0": 0.0,
                "rollouts_10": 10 * per_step.get(arm, 128.0),
            }
            for arm, values in finals.items()
            for seed, final in enumerate(values)
        ]
    )


def test_the_no_training_row_is_the_step_0_accuracy_at_no_rollouts(saved):
    rows = saved.no_training_rows(_rows({"grpo": [61.0, 62.0, 63.0]}, start=60.0))
    assert list(rows["arm"]) == ["no training"] * 3 and list(rows["seed"]) == [0, 1, 2]
    assert (rows["final_acc"] == 60.0).all() and (rows["acc_10"] == 60.0).all()
    assert (rows[["rollouts_per_step", "rollouts_cumulative", "rollouts_10"]] == 0).all().all()
    assert rows["rollouts_to_target"].isna().all()  # the target is above the start: never reached


def test_the_gate_passes_only_where_grpo_beats_not_training_and_scales_the_margin(saved):
    # Gains +2, +3, +4 over the start: mean 3, s.e. 1/sqrt(3), t = 5.2 on 2 df, p ~ 0.018.
    learned = saved.learning_gate(_rows({"grpo": [62.0, 63.0, 64.0]}), alpha=0.05, fraction=0.2)
    assert learned["passed"] and learned["mean"] == pytest.approx(3.0) and learned["margin"] == pytest.approx(0.6)
    flat = saved.learning_gate(_rows({"grpo": [59.0, 61.0, 60.5]}), alpha=0.05, fraction=0.2)
    assert not flat["passed"] and flat["margin"] is None
    one = saved.learning_gate(_rows({"grpo": [70.0]}), alpha=0.05, fraction=0.2)
    assert not one["passed"] and one["n"] == 1


def test_the_gated_verdicts_use_a_fraction_of_grpos_gain(saved, tmp_path):
    """grpo gains 3 points; the arm is 0.5 below grpo on every seed but one (−0.4, −0.5, −0.6): non-inferior
    against the registered 1.5 points, not against 20% of grpo's gain (0.6 points); and not training passes the
    registered test only where grpo gains less than 1.5."""
    rows = _rows({"grpo": [62.0, 63.0, 64.0], "grpo+alloc": [61.6, 62.5, 63.4]}, per_step={"grpo+alloc": 64.0})
    text = saved.report(rows, tmp_path, 1.5, 0.05, "t_", (("grpo+alloc", "grpo"),), ("grpo",), fraction=0.2)
    gate = text.split("### (a)")[0]
    assert (
        "+3.00 ± 0.58 (s.e.)" in gate
        and "**`grpo` beat not training**: the gated margin is 20% of that gain, 0.60" in gate
    )
    assert "against `grpo` (margin −1.5): -3.00 ± 0.58 (s.e.), one-sided p = 0.9" in gate and "**inconclusive**" in gate
    section = text.split("### (a)")[1].split("### (b)")[0]
    assert "**non-inferior**" in section  # registered: −0.5 ± 0.06 against −1.5
    assert "- gated (margin −0.60, 20% of `grpo`'s gain over not training): one-sided p = " in section
    assert section.rstrip().endswith("**inconclusive**; **saves rollouts**")
    assert "- gated: `grpo` beat not training on this mix: the verdicts above stand" in text
    assert (tmp_path / "t_easy_accuracy_per_rollout.png").stat().st_size > 0
    with pytest.raises(SystemExit, match=r"--margin-fraction 1.5 is invalid: .* between 0 and 1"):
        saved.main(["report", str(tmp_path / "none.csv"), "--margin-fraction", "1.5"])


DOCS = BENCHMARKS.parent / "docs"


@pytest.mark.parametrize(
    ("study", "easy_gain", "hard_gain", "untrained_p"),
    [("rollouts_saved", 0.21, 2.55, 0.0159), ("rollout_allocation", -0.74, 2.42, 0.0045)],
)
def test_the_committed_studies_grpo_barely_learned_and_not_training_passes_on_the_easy_mix(
    saved, study, easy_gain, hard_gain, untrained_p, tmp_path
):
    """What docs/results_archive.md quotes, recomputed from the committed per-seed CSVs: grpo's gain over not
    training per mix, the gate, and not training passing the registered 1.5-point test on the easy mix."""
    table = pd.read_csv(DOCS / "results" / f"{study}.csv")
    easy, hard = (table[table["mix"] == mix] for mix in ("easy", "hard"))
    easy_gate, hard_gate = (saved.learning_gate(frame, 0.05, 0.2) for frame in (easy, hard))
    assert round(easy_gate["mean"], 2) == easy_gain and not easy_gate["passed"]
    assert round(hard_gate["mean"], 2) == hard_gain and hard_gate["passed"]
    easy_section = saved.gate_section(easy, 1.5, 0.05, 0.2)
    assert f"one-sided p = {untrained_p:.4f}: **non-inferior**: not training passes it too" in easy_section
    assert "**inconclusive**" in saved.gate_section(hard, 1.5, 0.05, 0.2).splitlines()[-1]
    archive = " ".join((DOCS / "results_archive.md").read_text().split())
    assert f"{easy_gain:+.1f}".replace("-", "−") in archive and f"{hard_gain:+.1f}" in archive
    assert f"{untrained_p:.2g}" in archive.split("not training at all passed their registered")[1][:120]
