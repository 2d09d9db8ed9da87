"""The diagnosis of ``verl-avspo report`` on the logs every route writes (the sandbox's JSONL,
OpenRLHF's TensorBoard, verl's file logger): the score, validation and stall rule found under each
framework's names; rate columns out of range or all NaN reported, not diagnosed; a log that
starts late, has gaps or repeated steps said first and carried by the findings about the whole run;
stalls inside one streak merged; a verl PPO run with a critic whose answers are all cut at the length
cap (all-wrong collapse, its causes, advice that is not GRPO's)."""

import math

import pytest

from verl_avspo.core.config import AlertConfig
from verl_avspo.openrlhf.advantage_step import OPENRLHF_ADVICE
from verl_avspo.tools.diagnosis import diagnose
from verl_avspo.tools.logs import collect_runs, read_run, write_record


def write_verl_log(path, rows: dict[int, dict]):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as stream:
        for step, data in rows.items():
            write_record(stream, step, data)
    return path


def test_the_sandboxs_log_gives_its_final_score_validation_and_stall_rule(tmp_path, sandbox_log):
    frame = read_run(sandbox_log(tmp_path / "runs" / "grpo" / "seed0.jsonl", 0.5, 0.5, reward=0.375))
    diagnosis = diagnose("grpo/seed0", frame)
    assert diagnosis.row["final score"] == "0.375 (last 0.375)"  # train/reward_mean
    assert diagnosis.row["final val"] == "eval/acc_mean 0.500"
    assert diagnosis.values["score_metric"] == "train/reward_mean"
    # 4 steps cannot show acr_no_gain's 2 x 50 steps of history; a window of 2 can (acr/reward_mean logged).
    assert "it needs 100 steps of history and the log has 4" in diagnosis.text()
    assert diagnose("grpo/seed0", frame, AlertConfig(window=2)).values["stalled"] is not None


def test_an_openrlhf_log_gives_its_reward_and_runs_the_stall_rule(tmp_path, openrlhf_tensorboard):
    # OpenRLHF's own logger: train/reward, train/acr/rate; no acr/reward_mean (an older adapter).
    rows = {step: {"reward": 0.25, "acr/rate": 0.9, "acr/all_wrong": 0.9, "policy_loss": 0.1} for step in range(1, 9)}
    folder = openrlhf_tensorboard(tmp_path / "tensorboard", "or", rows, {8: {"eval_math500_pass1": 0.5}})
    (frame,) = collect_runs([folder]).values()
    diagnosis = diagnose("or", frame, AlertConfig(window=2))
    assert diagnosis.row["final score"] == "0.250 (last 0.250)" and diagnosis.values["score_metric"] == "train/reward"
    assert diagnosis.row["final val"] == "eval/eval_math500_pass1 0.500"
    assert "[ALERT] Stalled at steps 1–8 (8 steps)" in diagnosis.text()
    # What to try, in OpenRLHF's flags (its policy_loss tells the log apart), not verl's keys.
    assert f"1. try to {OPENRLHF_ADVICE}" in diagnosis.text()
    assert "actor_rollout_ref" not in diagnosis.text()
    split = {step: {**row, "acr/all_correct": 0.1, "acr/all_wrong": 0.8} for step, row in rows.items()}
    (frame,) = collect_runs([openrlhf_tensorboard(tmp_path / "tb3", "or", split)]).values()
    findings = diagnose("or", frame, AlertConfig(window=2)).text()
    assert "use a larger group (--rollout.n_samples_per_prompt)" in findings
    assert "or AVSPO with --avspo.apply_to all_wrong" in findings
    assert "algorithm." not in findings and "actor_rollout_ref" not in findings
    rising = {step: {"reward": 0.1 * step, "acr/rate": 0.9} for step in range(1, 9)}
    (frame,) = collect_runs([openrlhf_tensorboard(tmp_path / "tb2", "or", rising)]).values()
    quiet = diagnose("or", frame, AlertConfig(window=2)).text()
    assert "[INFO] No stalled window" in quiet and "longest streak above 0.35: 8 steps" in quiet
    assert "reward read from train/reward" in quiet


def test_rates_out_of_range_or_all_nan_are_reported_not_diagnosed(tmp_path):
    odd = write_verl_log(tmp_path / "odd.jsonl", {s: {"acr/rate": 5.0, "critic/score/mean": 0.5} for s in (1, 2, 3)})
    diagnosis = diagnose("odd", read_run(odd))
    assert diagnosis.findings[0].headline == (
        "Unusable column: acr/rate holds 3 value(s) outside [0, 1] (5 at step 1, 5 at step 2, 5 at step 3): "
        "verl-avspo logs it as a fraction of groups, so this column comes from something else and is not used"
    )
    assert diagnosis.values["acr_source"] is None
    assert "mean ACR" not in diagnosis.row and diagnosis.values["unusable_columns"].keys() == {"acr/rate"}

    rows = {s: {"acr/rate": 0.4, "acr/all_correct": 0.3, "acr/all_wrong": math.nan} for s in range(1, 6)}
    diagnosis = diagnose("nan", read_run(write_verl_log(tmp_path / "nan.jsonl", rows)))
    assert "acr/all_wrong is in the log but holds no value (every row is NaN), so it is not used" in diagnosis.text()
    assert "dominate" not in diagnosis.text() and "both kinds matter" not in diagnosis.text()
    assert diagnosis.row["all wrong"] == "—" and diagnosis.row["all correct"] == "0.300"
    # Split columns never logged: "—", not 0.000.
    plain = diagnose("plain", read_run(write_verl_log(tmp_path / "p.jsonl", {1: {"acr/rate": 0.4}})))
    assert plain.row["all correct"] == plain.row["all wrong"] == plain.row["effective"] == "—"
    assert plain.values["all_wrong"] is None


def test_a_resumed_log_says_which_steps_are_missing_and_the_findings_carry_it(tmp_path):
    # Stock main_ppo resumed after step 3: verl's FileLogger rewrote the file, steps 4-5 remain.
    avspo = {"acr/rate": 0.4, "acr/all_correct": 0.1, "acr/all_wrong": 0.3, "acr/effective": 0.4}
    avspo |= {"avspo/triggered": 0.0, "avspo/threshold": 0.5, "critic/score/mean": 0.5}
    validation = {"val-core/math/acc/mean@1": 0.5}  # verl validates at the step it resumes from
    rows = {3: validation, 4: avspo, 5: avspo}
    diagnosis = diagnose("resumed", read_run(write_verl_log(tmp_path / "r.jsonl", rows)))
    assert diagnosis.findings[0].headline == (
        "Incomplete log: the log starts at step 4: steps 1–3 are not in it (a resumed run "
        "whose earlier rows were lost?)"
    )
    never = next(finding for finding in diagnosis.findings if "never augmented" in finding.headline)
    assert never.headline.endswith("(judged on the logged steps 4–5 only; steps 1–3 missing)")
    collapse = next(finding for finding in diagnosis.findings if finding.headline.startswith("Collapse"))
    assert collapse.headline.endswith("(judged on the logged steps 4–5 only; steps 1–3 missing)")
    assert diagnosis.values["coverage"]["starts_late"] is True

    gaps = {step: avspo for step in (1, 2, 3, 7, 8, 12)}
    diagnosis = diagnose("gaps", read_run(write_verl_log(tmp_path / "g.jsonl", gaps)))
    assert diagnosis.findings[0].headline == "Incomplete log: it has 2 gap(s): steps 4–6 and 9–11 missing"
    # Logged every 10 steps from step 10 (OpenRLHF's logging_steps): complete, nothing said.
    sparse = {step: avspo for step in range(10, 101, 10)}
    assert "starts at" not in diagnose("sparse", read_run(write_verl_log(tmp_path / "s.jsonl", sparse))).text()


def test_a_step_logged_twice_is_said(tmp_path):
    path = tmp_path / "twice.jsonl"
    with path.open("w") as stream:
        for step in (1, 2, 3, 2, 3, 4):  # a crashed attempt, then its resume from step 1 appended
            write_record(stream, step, {"acr/rate": 0.1 * step})
    with pytest.warns(UserWarning, match="logged more than once"):
        frame = read_run(path)
    assert diagnose("twice", frame).findings[0].headline == (
        "Incomplete log: step(s) 2 and 3 were logged more than once, each time with the same values (duplicated "
        "lines): the last value of each is used"
    )
    with path.open("a") as stream:  # a restarted attempt logs step 4 again with other values
        write_record(stream, 4, {"acr/rate": 0.9})
    with pytest.warns(UserWarning, match=r"1 with other values, 2 with the same"):
        frame = read_run(path)
    assert "2, 3 and 4 were logged more than once, 1 of them with other values the second time" in (
        diagnose("twice", frame).findings[0].headline
    )


def test_stalls_inside_one_streak_are_one_window(tmp_path):
    # ACR high throughout; the reward is flat but for a rise at step 10, which breaks "no gain" for
    # steps 10-12 only: two stalls (6-9, 13-30) of one streak, listed once from its start.
    rows = {s: {"acr/rate": 0.9, "critic/score/mean": 0.9 if s == 10 else 0.5} for s in range(1, 31)}
    diagnosis = diagnose("run", read_run(write_verl_log(tmp_path / "run.jsonl", rows)), AlertConfig(window=3))
    assert "Stalled at steps 1–30 (30 steps): most groups" in diagnosis.text()
    assert diagnosis.values["stalls"] == [{"first_step": 1, "last_step": 30, "steps": 30}]


def test_a_verl_ppo_run_all_wrong_from_truncation_is_named_as_ppo_with_its_causes(tmp_path):
    # PPO with a critic on GSM8K: from step 5 every response is cut at 512 tokens and scores 0; the clip
    # fraction rises. Step 0 is the validation before training, not a training step.
    rows = {0: {"val-core/gsm8k/acc/mean@1": 0.3, "val-aux/gsm8k/reward/mean@1": 0.3}}
    for step in range(1, 121):
        cut = step >= 5
        rows[step] = {
            "critic/score/mean": 0.0 if cut else 0.4,
            "critic/score/max": 0.0 if cut else 1.0,
            "critic/score/min": 0.0,
            "critic/vf_loss": 0.1,
            "response_length/clip_ratio": 1.0 if cut else 0.02,
            "actor/pg_clipfrac": 0.47 if cut else 0.01,
        }
    diagnosis = diagnose("ppo", read_run(write_verl_log(tmp_path / "ppo.jsonl", rows)))
    assert diagnosis.steps == 120 and "PPO with a critic" in diagnosis.heading
    assert diagnosis.values["coverage"]["first"] == 1 and diagnosis.values["coverage"]["rows"] == 120
    collapse = diagnosis.findings[0]
    assert collapse.headline == "Every group collapsed on 116 of 120 logged rows (critic/score/max == critic/score/min)"
    assert diagnosis.values["all_wrong"] == pytest.approx(116 / 120)
    text = diagnosis.text()
    assert "rose from 0.02 to 1.00 at step 5" in text and "raise data.max_response_length" in text
    assert "PPO clip fraction reached 0.47" in text and "not a group estimator" in text
    # It stalls (every group all-wrong, no gain): the advice is about the reward's spread, not the estimator.
    assert "[ALERT] Stalled at steps" in text and "give the reward a spread to learn from" in text
    assert "adv_estimator=grpo" not in text and "adv_estimator=avspo" not in text
