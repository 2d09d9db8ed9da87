"""TRL's own ``GRPOTrainer`` (1.16, no vLLM), end to end on CPU, with the adapter (``verl_avspo.trl``)
in front of it: generation, the reward function, TRL's advantages or AVSPO's, the loss, TRL's log,
checkpoints and resume, the stall alert's stop, evaluation, buffered generations, two processes
whose groups straddle them, and the per-prompt history (``prompts/*``) with skipping before the
rollout (``prompts.skip``), across a resume and across two processes.

Every run trains the tiny random Qwen2 of ``trl_cpu.harness`` in this process (one model and dataset
for the module; a run costs about a second), except the two-process run, which ``accelerate launch``
starts. The harness's recorders copy, per generation, the rewards TRL gathered, TRL's own
advantages, the advantages the mixin handed on and those TRL's completions log holds; each test
checks them against the core's estimator run apart (a fresh ``RunTracker``), or against the authors'
released rule, and checks TRL's log against the core's measurement; the prompts rolled out against
the core's skip rule replayed on the prompts TRL's dataloader drew.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("trl", reason="TRL is not installed (pip install 'verl-avspo[trl]')")

from closed_forms import ACR_KEYS, AVSPO_KEYS  # noqa: E402
from helpers import released_code_rule  # noqa: E402
from trl_cpu.harness import GROUP_SIZE, TinyAssets, contains_sum, launch, make_trainer  # noqa: E402

from verl_avspo.core.collapse import measure_collapse  # noqa: E402
from verl_avspo.core.prompt_history import prompt_key  # noqa: E402
from verl_avspo.core.run_tracker import RunTracker  # noqa: E402
from verl_avspo.tools.prompts import load_history  # noqa: E402
from verl_avspo.trl import STATE_FILE, resolve_trl_settings  # noqa: E402
from verl_avspo.trl.prompts import refill_candidates, select_groups  # noqa: E402

# A large eta and a low first threshold: AVSPO triggers on the first step with a collapsed group, and the
# threshold moves whenever the mean reward changes.
AVSPO = {"eta": 0.5, "threshold_init": 0.2}
CHECKPOINTED = {"save_strategy": "steps", "save_steps": 2}
# Skipping that acts on the first revisit: a prompt collapsed on its one visit is kept with probability 0.05.
SKIP = {"skip": {"enable": True, "explore": 0.05, "adaptive": False}}
PROMPT_METRICS = ("prompts/seen", "prompts/always_solved", "prompts/never_solved", "prompts/collapsed_before")
SKIP_METRICS = ("prompts/skipped", "prompts/reselected", "prompts/reselected_cumulative", "prompts/rollouts_skipped",
                "prompts/rollouts_skipped_cumulative")  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return TinyAssets.build(tmp_path_factory.mktemp("trl_tiny"))


@pytest.fixture(scope="module")
def few(tiny):
    """The same model on 6 prompts: an epoch is 3 steps, so step 4 revisits prompts (and a checkpoint at
    step 2 is inside the first epoch, where TRL's sampler resumes its order)."""
    return dataclasses.replace(tiny, prompts=6)


@pytest.fixture(scope="module")
def avspo_run(few, tmp_path_factory):
    """AVSPO (the paper preset, AVSPO above) with skipping (SKIP), 4 steps, a checkpoint every 2."""
    trainer = make_trainer(few, tmp_path_factory.mktemp("trl_avspo"), avspo=AVSPO, prompts=SKIP, config=CHECKPOINTED)
    trainer.train()
    return trainer


def assert_same_state(saved, expected) -> None:
    """Two tracker states (nested dicts of tensors and plain values) are equal."""
    if isinstance(expected, dict):
        assert saved.keys() == expected.keys()
        for key in expected:
            assert_same_state(saved[key], expected[key])
    elif isinstance(expected, torch.Tensor):
        assert torch.equal(saved, expected)
    else:
        assert saved == expected


def step_rows(trainer, prefix: str = "") -> dict[int, dict]:
    """TRL's log rows of training steps (``prefix='eval_'``: of evaluations), by step."""
    key = f"{prefix}loss"
    return {row["step"]: row for row in trainer.state.log_history if key in row}


def scores_and_index(record) -> tuple[torch.Tensor, np.ndarray]:
    """The one reward function's gathered rewards, and each row's group (G consecutive rows a prompt)."""
    scores = record["rewards"][:, 0]
    return scores, np.arange(len(scores)) // GROUP_SIZE


def group_prompt_keys(prompts: list) -> list[str]:
    """The core's key of each group's prompt; each group's rows hold one prompt."""
    groups = [prompts[i : i + GROUP_SIZE] for i in range(0, len(prompts), GROUP_SIZE)]
    assert all(group == [group[0]] * GROUP_SIZE for group in groups), groups
    return [prompt_key(group[0]) for group in groups]


def replay_prompts(tracker, settings, record, dataset) -> list[str]:
    """The prompts a generation should have rolled out: the core's skip rule (``tracker``) asked about
    the groups TRL's dataloader drew, the skipped ones replaced from the step's seeded permutation of
    ``dataset``; checked against the record's rolled-out prompts. Returns their keys."""
    keys = group_prompt_keys(record["drawn"])
    if tracker.skipper is not None:
        replacements = select_groups(
            keys,
            lambda candidates, at_least, refill: tracker.select_prompts(candidates, GROUP_SIZE, at_least, refill),
            refill_candidates(len(dataset), settings.prompts.skip.seed, record["step"]),
            lambda index: prompt_key(dataset[index]["prompt"]),
        )
        for group, (_, key) in replacements.items():
            keys[group] = key
    assert group_prompt_keys(record["prompts"]) == keys
    return keys


def replay(settings, records, dataset=None) -> list[tuple[torch.Tensor, dict]]:
    """The core's estimator on the recorded rewards, apart from the trainer: each generation's
    advantages and metrics, from a fresh tracker with the run's ``settings`` (``TRLSettings``); the
    prompts too (:func:`replay_prompts`, skipping from ``dataset``)."""
    tracker = RunTracker(settings.acr, settings.avspo, prompt_skip=settings.prompts.skip)
    expected = []
    for record in records:
        keys = replay_prompts(tracker, settings, record, dataset)
        tracker.set_prompt_keys(dict(enumerate(keys)))
        scores, index = scores_and_index(record)
        tracker.measure(scores, index)
        output = tracker.avspo_advantages(scores.unsqueeze(1), torch.ones(len(scores), 1), index)
        expected.append((output.scalar_advantages, dict(tracker.end_step(record["step"], output.scalar_advantages))))
    return expected


def loss_inputs_by_generation(trainer, per_generation: int) -> list[torch.Tensor]:
    """The advantages the training loss received, sorted, per generation batch."""
    training = [advantages for was_training, advantages in trainer.loss_advantages if was_training]
    chunks = [training[i : i + per_generation] for i in range(0, len(training), per_generation)]
    return [torch.cat(chunk).sort().values for chunk in chunks]


def test_avspo_run_logs_every_metric_on_every_step_beside_trls_own(avspo_run):
    rows = step_rows(avspo_run)
    assert sorted(rows) == [1, 2, 3, 4]
    for row in rows.values():
        assert set(ACR_KEYS + AVSPO_KEYS + PROMPT_METRICS + SKIP_METRICS) <= set(row), row
        # TRL's own collapse count is untouched and, with group scaling, the same rate (TRL's in float32).
        assert row["frac_reward_zero_std"] == pytest.approx(row["acr/rate"])
        # Every skipped group is replaced in place: a re-selection, no rollout saved.
        assert row["prompts/reselected"] == row["prompts/skipped"] and row["prompts/rollouts_skipped"] == 0
    assert any(row["avspo/triggered"] > 0 for row in rows.values())  # AVSPO changed some advantages
    # Step 4 revisits the first epoch's prompts (6 prompts, 2 a step): collapsed ones were skipped, and
    # every generation still rolled out 2 whole groups.
    skipped = [rows[step]["prompts/skipped"] for step in (1, 2, 3, 4)]
    assert skipped[:3] == [0, 0, 0] and skipped[3] > 0
    assert rows[4]["prompts/reselected_cumulative"] == sum(skipped)
    assert rows[4]["prompts/rollouts_skipped_cumulative"] == 0
    assert rows[4]["prompts/seen"] == 6
    assert all(len(group_prompt_keys(record["prompts"])) == 2 for record in avspo_run.records)
    # Each step generated its 2 groups, in one generation batch, and the counts add up.
    assert [rows[step]["train/rollouts_generated"] for step in (1, 2, 3, 4)] == [2 * GROUP_SIZE] * 4
    assert [rows[step]["train/rollouts_cumulative"] for step in (1, 2, 3, 4)] == [
        2 * GROUP_SIZE * s for s in (1, 2, 3, 4)
    ]
    assert all(row["train/gen_batches"] == 1 for row in rows.values())


def test_avspo_advantages_are_the_core_estimators_and_reach_the_loss_and_completions_log(avspo_run):
    rows = step_rows(avspo_run)
    expected = replay(avspo_run.avspo_settings, avspo_run.records, avspo_run.train_dataset)
    for record, (advantages, metrics), lost in zip(
        avspo_run.records, expected, loss_inputs_by_generation(avspo_run, 1), strict=True
    ):
        assert torch.equal(record["advantages"], advantages)
        assert record["logged"] == advantages.tolist()  # the completions table shows what was trained on
        assert torch.equal(lost, advantages.sort().values)
        assert {key: rows[record["step"]][key] for key in metrics} == pytest.approx(metrics)
    differs = [not torch.equal(r["advantages"], r["trl_advantages"]) for r in avspo_run.records]
    assert any(differs)


@pytest.mark.parametrize("preset", ["beta_loo", "beta_fitted"])
def test_the_beta_presets_run_through_trls_trainer(tiny, tmp_path, preset):
    """The presets the runs above do not use (paper: avspo_run; grpo, paper_code: below)."""
    trainer = make_trainer(tiny, tmp_path, avspo={"preset": preset}, config={"max_steps": 2})
    trainer.train()
    rows = step_rows(trainer)
    expected = replay(trainer.avspo_settings, trainer.records)
    for record, (advantages, metrics) in zip(trainer.records, expected, strict=True):
        assert torch.equal(record["advantages"], advantages)
        assert {key: rows[record["step"]][key] for key in metrics} == pytest.approx(metrics)
    assert all("avspo/prior_strength" in row for row in rows.values())


def test_resume_continues_the_run_exactly(avspo_run, few, tmp_path, caplog):
    """Steps 3-4 after a resume from step 2 log what the uninterrupted run logged (step 4 skips
    prompts), and the tracker ends in the same state: controller, alert, prompt history, skip rule."""
    checkpoint = Path(avspo_run.args.output_dir) / "checkpoint-2"
    full = step_rows(avspo_run)
    saved = torch.load(checkpoint / STATE_FILE, weights_only=True)  # after step 2: θ_3, the alert's two rewards
    assert saved["controller"]["step"] == 2 and saved["controller"]["threshold"] == full[3]["avspo/threshold"]
    assert saved["stagnation"]["rewards"] == [full[1]["acr/reward_mean"], full[2]["acr/reward_mean"]]
    # The prompt history as `verl-avspo prompts` reads the checkpoint folder: steps 1-2's 4 prompts, one visit each.
    table = load_history(checkpoint).table()
    rolled_out = [key for record in avspo_run.records[:2] for key in group_prompt_keys(record["prompts"])]
    assert sorted(table["key"].tolist()) == sorted(rolled_out) and table["visits"].tolist() == [1] * 4
    resumed = make_trainer(few, tmp_path, avspo=AVSPO, prompts=SKIP, config=CHECKPOINTED)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    again = step_rows(resumed)
    assert full[4]["prompts/skipped"] > 0
    for step in (3, 4):
        assert {k: v for k, v in again[step].items() if k != "step_time"} == {
            k: v for k, v in full[step].items() if k != "step_time"
        }
    assert [record["prompts"] for record in resumed.records] == [record["prompts"] for record in avspo_run.records[2:]]
    assert_same_state(resumed.tracker.state_dict(), avspo_run.tracker.state_dict())
    # A checkpoint without the file (a run without the adapter): TRL's state loads, the tracker's stays.
    bare = shutil.copytree(checkpoint, tmp_path / "bare")
    (bare / STATE_FILE).unlink()
    with caplog.at_level(logging.WARNING):
        resumed._load_optimizer_and_scheduler(str(bare))
    assert f"has no {STATE_FILE}" in caplog.text and resumed.tracker.controller.step == 4


@pytest.mark.parametrize("scale_rewards", ["group", "batch"])
def test_grpo_estimator_keeps_trls_advantages_and_measures_them(tiny, tmp_path, scale_rewards):
    trainer = make_trainer(tiny, tmp_path, estimator="grpo", config={"max_steps": 2, "scale_rewards": scale_rewards})
    trainer.train()
    rows = step_rows(trainer)
    assert trainer.tracker.controller is None
    for record in trainer.records:
        row = rows[record["step"]]
        assert torch.equal(record["advantages"], record["trl_advantages"])
        scores, index = scores_and_index(record)
        measured = measure_collapse(scores, index, advantages=record["trl_advantages"])
        assert set(ACR_KEYS) <= set(row) and {key: row[key] for key in measured} == pytest.approx(measured)
        assert not any(key.startswith("avspo/") for key in row)
        # With batch scaling, TRL's frac_reward_zero_std says only whether the whole batch is equal.
        trls_rate = row["acr/rate"] if scale_rewards == "group" else float(bool((scores == scores[0]).all()))
        assert row["frac_reward_zero_std"] == pytest.approx(trls_rate)


def unscorable_when_odd(completions: list[str], answer: list[str], **kwargs) -> list[float | None]:
    """:func:`contains_sum`, but None (unscorable, TRL's NaN) for every completion of odd length."""
    scores = contains_sum(completions, answer)
    return [None if len(completion) % 2 else score for completion, score in zip(completions, scores, strict=True)]


@pytest.mark.parametrize("scale_rewards", ["group", "none"])
def test_the_grpo_preset_gives_trls_advantages_unscorable_rows_included(tiny, tmp_path, scale_rewards):
    """With TRL's epsilon, AVSPO's ``grpo`` preset is TRL's GRPO: unscorable completions (None) are left
    out of their group's statistics and get 0, a group left with one scorable completion gets 0."""
    trainer = make_trainer(
        tiny,
        tmp_path,
        avspo={"preset": "grpo"},
        reward_funcs=unscorable_when_odd,
        config={"max_steps": 3, "scale_rewards": scale_rewards},
    )
    trainer.train()
    rows = step_rows(trainer)
    unscorable = 0
    for record in trainer.records:
        torch.testing.assert_close(record["advantages"], record["trl_advantages"], rtol=0, atol=1e-6)
        scores, index = scores_and_index(record)
        scorable = ~torch.isnan(scores)
        unscorable += int((~scorable).sum())
        assert bool((record["advantages"][~scorable] == 0).all())
        measured = measure_collapse(scores[scorable], index[scorable.numpy()])
        assert rows[record["step"]]["acr/rate"] == pytest.approx(measured["acr/rate"])
    assert unscorable > 0


def solved_then_unscorable(completions: list[str], **kwargs) -> list[float | None]:
    """Every completion correct on steps 1-3 (every group collapsed), unscorable from step 4."""
    step = kwargs["trainer_state"].global_step + 1
    return [1.0 if step < 4 else None] * len(completions)


def test_a_step_with_no_scorable_completion_logs_the_prompts_it_skipped(few, tmp_path):
    """Step 4 revisits prompts solved on their one visit (the skip rule skips them) and scores nothing:
    no acr/*, but its own skip counts, not carried to step 5."""
    trainer = make_trainer(few, tmp_path, prompts=SKIP, reward_funcs=solved_then_unscorable, config={"max_steps": 5})
    trainer.train()
    rows = step_rows(trainer)
    assert "acr/rate" in rows[3] and "acr/rate" not in rows[4] and "acr/rate" not in rows[5]
    assert rows[4]["prompts/skipped"] > 0
    reselected = [rows[step]["prompts/reselected"] for step in range(1, 6)]
    skipped = [rows[step]["prompts/skipped"] for step in range(1, 6)]
    assert rows[5]["prompts/reselected_cumulative"] == sum(reselected) == sum(skipped)


def scheduled_reward(completions: list[str], **kwargs) -> list[float]:
    """The released rule's three cases: all 0 on step 1 and all 1 on step 2 (it adds a virtual sample
    to every group), then a mixed group beside a collapsed one (it adds none: plain GRPO; the default
    ``trigger_scope="group"`` would augment the collapsed group)."""
    step = kwargs["trainer_state"].global_step + 1
    if step in (1, 2):
        return [float(step - 1)] * len(completions)
    return [float(i < GROUP_SIZE and i % 2 == 0) for i in range(len(completions))]


def test_paper_code_with_batch_scope_is_the_authors_released_rule_through_trls_trainer(tiny, tmp_path):
    trainer = make_trainer(
        tiny,
        tmp_path,
        avspo={"preset": "paper_code", "trigger_scope": "batch"},
        reward_funcs=scheduled_reward,
        config={"loss_type": "grpo", "max_steps": 3},
    )
    trainer.train()
    for record, lost in zip(trainer.records, loss_inputs_by_generation(trainer, 1), strict=True):
        scores, _ = scores_and_index(record)
        torch.testing.assert_close(record["advantages"], released_code_rule(scores, GROUP_SIZE))
        assert torch.equal(lost, record["advantages"].sort().values)  # loss_type grpo trains on them
    rows = step_rows(trainer)
    assert [rows[step]["avspo/triggered"] for step in (1, 2, 3)] == [1.0, 1.0, 0.0]
    assert rows[3]["acr/rate"] == 0.5


def test_buffered_generations_are_measured_once_and_evaluation_moves_no_state(tiny, tmp_path):
    """steps_per_generation=2: one generation serves two optimizer steps; its metrics are logged once
    and AVSPO's controller and the alert step once. Evaluation logs eval_acr/*, keeps TRL's advantages
    (AVSPO would step its controller) and leaves the controller, the alert and the prompt history alone."""
    trainer = make_trainer(
        tiny,
        tmp_path,
        avspo=AVSPO,
        eval_dataset=tiny.dataset().select(range(2)),
        config={
            "per_device_train_batch_size": GROUP_SIZE,
            "steps_per_generation": 2,
            "loss_type": "dr_grpo",
            "eval_strategy": "steps",
            "eval_steps": 2,
            "per_device_eval_batch_size": 2 * GROUP_SIZE,
        },
    )
    trainer.train()
    train = [record for record in trainer.records if record["training"]]
    evaluation = [record for record in trainer.records if not record["training"]]
    assert [record["step"] for record in train] == [1, 3] and len(evaluation) == 2
    rows = step_rows(trainer)
    assert [step for step, row in rows.items() if "acr/rate" in row] == [1, 3]
    assert trainer.tracker.controller.step == 2 and len(trainer.tracker.alert.rewards) == 2
    for record, (advantages, _), lost in zip(
        train, replay(trainer.avspo_settings, train), loss_inputs_by_generation(trainer, 2), strict=True
    ):
        assert torch.equal(record["advantages"], advantages) and torch.equal(lost, advantages.sort().values)
    for record in evaluation:
        assert torch.equal(record["advantages"], record["trl_advantages"])
    eval_rows = step_rows(trainer, "eval_")
    assert sorted(eval_rows) == [2, 4]
    assert all("eval_acr/rate" in row and "eval_acr/stalled" not in row for row in eval_rows.values())
    assert not any(key.startswith("eval_prompts/") for row in eval_rows.values() for key in row)
    assert int(trainer.tracker.prompt_history.table()["visits"].sum()) == 2 * len(train)  # 2 groups a generation


def never_right(completions: list[str], **kwargs) -> list[float]:
    return [0.0] * len(completions)


def test_the_stall_alert_stops_training_after_checkpointing_the_stalled_step(tiny, tmp_path, caplog):
    """Every group all wrong, an alert on 2 steps in a row with ACR above 0.5: it fires on step 2."""
    alert = {"rule": "acr", "threshold": 0.5, "window": 2, "action": "stop"}
    trainer = make_trainer(tiny, tmp_path, estimator="grpo", reward_funcs=never_right, acr={"alert": alert})
    with caplog.at_level(logging.WARNING):
        trainer.train()
    rows = step_rows(trainer)
    stalled = 2
    assert trainer.state.global_step == stalled < trainer.args.max_steps and sorted(rows) == [1, 2]
    assert rows[1]["acr/stalled"] == 0.0
    assert rows[stalled]["acr/stalled"] == 1.0
    saved = torch.load(tmp_path / f"checkpoint-{stalled}" / STATE_FILE, weights_only=True)
    assert saved["stagnation"]["stalled"] is True
    assert "advantage collapse" in caplog.text and "acr.alert.rule=acr" in caplog.text
    assert f"stopping the run after step {stalled}" in caplog.text


@pytest.mark.slow
def test_two_processes_give_groups_that_straddle_them_the_single_process_advantages(tiny, tmp_path):
    """2 accelerate CPU processes, 6 rows each, groups of 4: the middle group has two rows on each. With
    skipping on 3 prompts (each step draws all of them), step 2's skipped groups are replaced alike on
    both processes: the rolled-out groups stay whole across them, and both keep the same history."""
    settings = {"avspo": {"preset": "paper_code"}, "prompts": SKIP}
    three = dataclasses.replace(tiny, prompts=3)
    result = launch(three, tmp_path, settings, {"per_device_train_batch_size": 6, "max_steps": 2})
    assert result.returncode == 0, (tmp_path / "run.log").read_text()[-4000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]
    assert [rank["num_processes"] for rank in ranks] == [2, 2]
    # The whole generation batch: process 0's rows, then process 1's.
    merged = [
        {**first, "prompts": first["prompts"] + second["prompts"], "drawn": first["drawn"] + second["drawn"]}
        for first, second in zip(ranks[0]["records"], ranks[1]["records"], strict=True)
    ]
    run_settings = resolve_trl_settings("avspo", settings["avspo"], prompts=settings["prompts"])
    expected = replay(run_settings, merged, three.dataset())
    rows = [row for row in ranks[0]["log_history"] if "loss" in row]
    records = zip(ranks[0]["records"], ranks[1]["records"], expected, rows, strict=True)
    for first, second, (advantages, metrics), row in records:
        assert torch.equal(first["rewards"], second["rewards"])
        assert torch.equal(torch.cat([first["advantages"], second["advantages"]]), advantages)
        assert first["logged"] == second["logged"] == advantages.tolist()
        assert {key: row[key] for key in metrics} == pytest.approx(metrics)
        assert row["frac_reward_zero_std"] == pytest.approx(row["acr/rate"])
    assert any(metrics["acr/rate"] > 0 for _, metrics in expected)  # some collapsed group was augmented
    assert rows[0]["prompts/skipped"] == 0 and rows[0]["prompts/seen"] == 3 and rows[1]["prompts/skipped"] > 0
    states = [rank["state"] for rank in ranks]
    assert_same_state(states[0], states[1])
    assert states[0]["controller"]["step"] == 2
