"""verl 0.9.1's own trainer, end to end on CPU, in every V1 mode: dataset, agent-loop rollout, reward,
old log-prob, the advantage stage with ACR metrics, the FSDP actor update, checkpoint and resume.

Every run is a real ``python -m verl.trainer.main_ppo trainer.v1.trainer_mode=avspo_<mode>`` (stock verl
choosing our trainer through its own registry) or ``python -m verl_avspo.main_ppo`` (our launcher, which checks
the config and then runs that same ``main_ppo`` with that same mode) of a tiny random Qwen2 on gloo FSDP ranks
(the harness in ``verl_cpu``; nothing is mocked). The two are one route, so each mode is run once, on one of
them. A run costs about one to three minutes, mostly process start-ups, so the seven runs are launched once per
module, two at a time, and each test reads the logs and checkpoints of the run it is about:

- ``avspo``: our launcher, ``sync``, ``avspo`` (θ_1 = 0.2), prompts skipped before rollout, 3 steps on 2 ranks,
  a checkpoint at steps 2 and 3;
- ``resumed``: our launcher again, resumed (``resume_mode=auto``) from ``avspo``'s step-2 checkpoint, in a
  folder holding ``avspo``'s whole log (steps 1-3), as a run that crashed after step 3 leaves it;
- ``dcpo``: our launcher, ``sync``, DCPO's estimator and policy loss, 1 step, checkpointed;
- ``colocate`` and ``colocate_resumed``: stock ``main_ppo``, ``avspo_colocate_async``, ``avspo``, prompts
  skipped before rollout, 3 steps with a checkpoint at step 2, and the same resumed from it;
- ``separate_stop``: stock ``main_ppo``, ``avspo_separate_async``, ``grpo``, with an alert that trips on the
  first step and stops the run, on the reward of ``stock_alloc`` (below), whose first visits all score 0;
- ``stock_dapo_skip``: stock ``main_ppo``, ``avspo_sync``, ``grpo`` with DAPO's ``filter_groups`` and prompts
  skipped before rollout, 4 steps, checkpointed at the last: skipped places left open, the rollouts saved and
  generated counted;
- ``stock_alloc``: stock ``main_ppo``, ``avspo_sync``, ``grpo`` with the rollout allocator at 7/8 of a step's
  budget, 4 steps, on a reward set by each prompt's visits (``verl_cpu/reward_by_visit.py``), so that its pilots
  and which of them spread are known: prompts left out, pilots extended in the same step by our agent loop, the
  others trained as groups of two;

All but the first two run on one rank: a rank is one more process to start, and the two-rank runs
already cover the sharded update, checkpoint and weight sync.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import shutil

import pyarrow.parquet as pq
import pytest
import torch
from closed_forms import ACR_KEYS, AVSPO_KEYS, PROMPT_KEYS, next_threshold
from verl_cpu.launch import (
    AVSPO_ENTRY,
    GROUP_SIZE,
    PROMPTS_PER_STEP,
    REWARD_BY_VISIT,
    VERL_ENTRY,
    Outcome,
    TinyRun,
    resume_from,
    separate_async_overrides,
)

from verl_avspo.cli import main
from verl_avspo.core.prompt_history import PromptHistory
from verl_avspo.verl_plugin.trainer_modes import MODE_KEY

pytestmark = [pytest.mark.slow, pytest.mark.verl, pytest.mark.ray]

THREE_STEPS = ["trainer.total_training_steps=3"]
# Prompt skipping before rollout, with a fixed exploration probability of 0.05: from the second epoch (step
# 3) a prompt collapsed on its one earlier visit is rolled out with probability 0.05, so whatever this CPU
# samples, the steps from 3 on skip prompts (a random policy's step has 1-3 collapsed groups of 4).
SKIP_PROMPTS = ["prompts.skip.enable=True", "prompts.skip.explore=0.05", "prompts.skip.adaptive=False"]
# The sync AVSPO run and its resume, skipping prompts. θ starts at 0.2, not the paper's 0.5: a random policy's step has
# 1-3 collapsed groups of 4, and ACR must exceed θ for the trigger to fire whatever this CPU samples.
AVSPO_SYNC = ["algorithm.adv_estimator=avspo", "algorithm.avspo.threshold_init=0.2", "trainer.save_freq=2",
              *(f"algorithm.{key}" for key in SKIP_PROMPTS)]  # fmt: skip
# Stock main_ppo in colocate_async, skipping prompts too (the async trainers ask _next_train_batch for an exact
# count); verl's config does not declare algorithm.prompts, hence the +.
COLOCATE_SKIP = [f"{MODE_KEY}=avspo_colocate_async", "algorithm.adv_estimator=avspo",
                 *(f"+algorithm.{key}" for key in SKIP_PROMPTS)]  # fmt: skip
# The skip rule's metrics, on every step of a run that skips.
SKIP_KEYS = ("prompts/skipped", "prompts/reselected", "prompts/reselected_cumulative", "prompts/rollouts_skipped",
             "prompts/rollouts_skipped_cumulative")  # fmt: skip
# Every step's generated rollouts (every dispatch of prompts to rollout, DAPO's refills included).
ROLLOUT_KEYS = ("train/rollouts_generated", "train/gen_batches", "train/rollouts_cumulative")
# Stock main_ppo, our sync trainer, grpo with DAPO's filter_groups and prompts skipped before rollout: 4 steps,
# checkpointed at the last (verl's config does not declare algorithm.prompts, hence the +).
DAPO_SKIP = [f"{MODE_KEY}=avspo_sync", "algorithm.adv_estimator=grpo", "algorithm.filter_groups.enable=True",
             "algorithm.filter_groups.metric=reward", *(f"+algorithm.{key}" for key in SKIP_PROMPTS),
             "trainer.total_training_steps=4", "trainer.save_freq=4"]  # fmt: skip
# Stock main_ppo, our sync trainer, grpo with the rollout allocator, 4 steps (2 epochs of 8 prompts) on the reward by
# visits, without extras (max_group_size = G) and with 7/8 of a uniform step's budget (14 of 16 rollouts). Epoch 1:
# every prompt is new and costs a full group, so 3 of each step's 4 fit and 1 is left out; every group collapses.
# Epoch 2: the 6 prompts seen get a pilot of 2 (those of even index spread and are extended to G, those of odd
# index do not), the 2 never seen a full group (a pilot's expected cost is 2 + 0.25 x 2, so all four fit).
ALLOCATE = [f"{MODE_KEY}=avspo_sync", "algorithm.adv_estimator=grpo", "+algorithm.prompts.allocation.enable=True",
            f"+algorithm.prompts.allocation.max_group_size={GROUP_SIZE}",
            "+algorithm.prompts.allocation.budget_share=0.875", "trainer.total_training_steps=4",
            "trainer.save_freq=4", f"reward.custom_reward_function.path={REWARD_BY_VISIT}"]  # fmt: skip
ALLOCATION_KEYS = ("prompts/rollouts_allocated", "prompts/pilots", "prompts/pilots_extended",
                   "prompts/pilot_extend_rate")  # fmt: skip
# verl's own metrics of the FSDP actor update: present only if the step reached it.
ACTOR_KEYS = ("actor/pg_loss", "actor/grad_norm", "actor/lr")


def _same_controller(a: dict, b: dict) -> bool:
    """Two AVSPO controller states are equal (the RNG state is a tensor)."""
    plain = [{k: v for k, v in state.items() if k != "rng_state"} for state in (a, b)]
    return plain[0] == plain[1] and torch.equal(a["rng_state"], b["rng_state"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Outcome]:
    def launch(name: str, entry: str, overrides: list[str], prepare=None, num_ranks: int = 1) -> Outcome:
        run = TinyRun.prepare(tmp_path_factory.mktemp(name), num_ranks=num_ranks)
        if prepare is not None:
            prepare(run)
        return Outcome(run, run.launch(entry, overrides).returncode)

    def lane_one() -> dict[str, Outcome]:
        avspo = launch("avspo", AVSPO_ENTRY, [*AVSPO_SYNC, *THREE_STEPS], num_ranks=2)
        resumed = launch(
            "resumed",
            AVSPO_ENTRY,
            [*AVSPO_SYNC, "trainer.resume_mode=auto", *THREE_STEPS],
            prepare=lambda run: (
                resume_from(avspo.run, 2, run),
                shutil.copy(avspo.run.metrics_path(), run.metrics_path()),
            ),
            num_ranks=2,
        )
        dcpo = launch(
            "dcpo",
            AVSPO_ENTRY,
            [
                "algorithm.adv_estimator=dcpo",
                "actor_rollout_ref.actor.policy_loss.loss_mode=dcpo",
                "actor_rollout_ref.actor.clip_ratio_c=10",
                "trainer.save_freq=1",
                "trainer.total_training_steps=1",
            ],
        )
        return {
            "avspo": avspo,
            "resumed": resumed,
            "dcpo": dcpo,
            "stock_alloc": launch("stock_alloc", VERL_ENTRY, ALLOCATE),
        }

    def lane_two() -> dict[str, Outcome]:
        outcomes = {
            # Stock verl with our sync trainer, grpo with DAPO's filter_groups on the reward, skipping prompts.
            "stock_dapo_skip": launch("stock_dapo_skip", VERL_ENTRY, DAPO_SKIP),
            # Stock verl with our separate_async trainer: grpo, and an alert that trips on the first step and
            # stops the run (verl's config does not declare algorithm.acr, hence the +).
            "separate_stop": launch(
                "separate_stop",
                VERL_ENTRY,
                [
                    *separate_async_overrides(1, mode="avspo_separate_async"),
                    "algorithm.adv_estimator=grpo",
                    # The paper's rule, which needs no reward history: stalled on step 1.
                    "+algorithm.acr.alert.rule=acr",
                    "+algorithm.acr.alert.threshold=0.0",
                    "+algorithm.acr.alert.window=1",
                    "+algorithm.acr.alert.action=stop",
                    # Every prompt's first group scores 0, so step 1 collapses whichever groups finish first
                    # (the harness's own reward would leave that to timing).
                    f"reward.custom_reward_function.path={REWARD_BY_VISIT}",
                    *THREE_STEPS,
                ],
            ),
        }
        colocate = launch("colocate", VERL_ENTRY, [*COLOCATE_SKIP, "trainer.save_freq=2", *THREE_STEPS])
        colocate_resumed = launch(
            "colocate_resumed",
            VERL_ENTRY,
            [*COLOCATE_SKIP, "trainer.save_freq=2", "trainer.resume_mode=auto", *THREE_STEPS],
            prepare=lambda run: resume_from(colocate.run, 2, run),
        )
        return {**outcomes, "colocate": colocate, "colocate_resumed": colocate_resumed}

    # Made before the lanes start: pytest creates (and, with --basetemp, first empties) the base
    # folder on its first use, and two lanes doing that at once delete each other's work folders.
    tmp_path_factory.getbasetemp()
    # Two at a time: a run is mostly single-threaded process start-ups, and the machine has two cores.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        lanes = [pool.submit(lane_one), pool.submit(lane_two)]
        return {name: outcome for lane in lanes for name, outcome in lane.result().items()}


def test_avspo_run_logs_acr_avspo_and_actor_metrics_every_step(runs):
    records = runs["avspo"].records()
    assert [record["step"] for record in records] == [1, 2, 3]
    for record in records:
        missing = [key for key in (*ACR_KEYS, *AVSPO_KEYS, *ACTOR_KEYS, *PROMPT_KEYS) if key not in record["data"]]
        assert not missing, f"step {record['step']} lacks {missing}"
        data = record["data"]
        assert 0.0 <= data["acr/effective"] <= data["acr/rate"] <= 1.0
        assert data["acr/groups"] == 4  # 4 prompts x 4 responses per step
        assert math.isfinite(data["actor/pg_loss"]) and data["actor/grad_norm"] > 0
    # θ and the trigger follow docs/method.md §3 on whatever this CPU sampled: θ_1 = threshold_init,
    # θ_{t+1} = clip(θ_t + eta·sign(J_t − J_{t−1})·(s_t − θ_t)) with s_t the batch ACR and J_t the mean
    # score (ΔJ = 0 holds θ still); a step with s_t > θ_t augments every collapsed group (apply_to=both),
    # leaving none with all-zero advantages, and any other step leaves them at zero as GRPO does.
    state = runs["avspo"].state(3)["controller"]  # holds θ_4 and J_3
    settings = state["config"]
    assert settings["acr_signal"] == "batch" and settings["adaptive_threshold"]
    threshold, previous_score = settings["threshold_init"], None
    for record in records:
        data, step = record["data"], record["step"]
        assert data["avspo/signal"] == pytest.approx(data["acr/rate"]), step
        assert data["avspo/threshold"] == pytest.approx(threshold, abs=1e-9), step
        fired = data["avspo/signal"] > threshold
        assert data["avspo/triggered"] == pytest.approx(data["acr/rate"] if fired else 0.0), step
        assert data["acr/effective"] == pytest.approx(0.0 if fired else data["acr/rate"]), step
        score = data["critic/score/mean"]
        threshold = next_threshold(
            threshold, data["acr/rate"], score, previous_score, settings["eta"], settings["threshold_bounds"]
        )
        previous_score = score
    assert state["threshold"] == pytest.approx(threshold, abs=1e-9)
    assert state["previous_mean_score"] == pytest.approx(previous_score)
    # θ_1 = 0.2: one collapsed group of the four fires the trigger (a step without one has only mixed groups).
    assert any(r["data"]["avspo/triggered"] > 0 for r in records), "no step had a collapsed group to augment"


def test_save_freq_writes_checkpoints_with_the_avspo_state(runs):
    outcome = runs["avspo"]
    outcome.records()
    checkpoints = outcome.run.checkpoints
    assert sorted(p.name for p in checkpoints.glob("global_step_*")) == ["global_step_2", "global_step_3"]
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    for step in (2, 3):
        assert any((checkpoints / f"global_step_{step}" / "actor").glob("model_world_size_2_rank_*.pt"))
        state = outcome.state(step)
        assert state["controller"] is not None and state["dcpo"] is None
    assert outcome.state(2)["controller"]["step"] == 2 and outcome.state(3)["controller"]["step"] == 3


def test_resumed_run_continues_like_the_uninterrupted_one(runs):
    uninterrupted = {record["step"]: record["data"] for record in runs["avspo"].records()}
    resumed_records = runs["resumed"].records()
    # The log keeps the rows up to the resumed step and drops the crashed attempt's later one (step 3),
    # which the resumed run logs again.
    assert [record["step"] for record in resumed_records] == [1, 2, 3]
    assert [r["data"] for r in resumed_records[:2]] == [uninterrupted[1], uninterrupted[2]]
    resumed = resumed_records[2]["data"]
    # The rollout is seeded from the weights, the prompt and its place in the batch (hf_rollout.py), so
    # step 3 samples the same groups of responses; everything computed from them must match.
    for key in (*ACR_KEYS, *AVSPO_KEYS, *PROMPT_KEYS, *SKIP_KEYS, *ROLLOUT_KEYS, "critic/score/mean",
                "critic/advantages/max", "critic/advantages/min"):  # fmt: skip
        assert resumed[key] == pytest.approx(uninterrupted[3][key], abs=1e-6), key
    assert resumed["actor/pg_loss"] == pytest.approx(uninterrupted[3]["actor/pg_loss"], rel=1e-4, abs=1e-6)
    # The whole controller (step count, θ, J_3, RNG): a restarted one fails this whether or not θ moved.
    assert _same_controller(runs["resumed"].state(3)["controller"], runs["avspo"].state(3)["controller"])
    # Skipping on: step 3 (epoch 2) skipped the same prompts, and the rule's generator is where the
    # uninterrupted run's is.
    assert uninterrupted[3]["prompts/skipped"] > 0
    resumed_skip, straight_skip = (runs[name].state(3)["prompt_skip"] for name in ("resumed", "avspo"))
    assert torch.equal(resumed_skip["generator"], straight_skip["generator"])
    assert resumed_skip["reselected"] == straight_skip["reselected"] > 0


def test_dcpo_run_checkpoints_its_per_prompt_history(runs):
    outcome = runs["dcpo"]
    records = outcome.records()
    assert [record["step"] for record in records] == [1]
    assert all(key in records[0]["data"] for key in (*ACR_KEYS, *ACTOR_KEYS))
    assert not any(key in records[0]["data"] for key in SKIP_KEYS)  # skipping is off unless asked for
    history = outcome.state(1)["dcpo"]
    assert history["prompt_key"] == "index"
    # The 4 prompts of the step, keyed by their extra_info.index (0..7 in the train file), each seen once.
    assert len(history["keys"]) == 4 and set(history["keys"]) <= set(range(8))
    assert history["visits"].tolist() == [1, 1, 1, 1]


def test_alert_stop_ends_a_separate_async_run_early_with_a_checkpoint(runs):
    outcome = runs["separate_stop"]
    records = outcome.records()
    assert [record["step"] for record in records] == [1]  # of 3
    data = records[0]["data"]
    assert all(key in data for key in (*ACR_KEYS, *ACTOR_KEYS))
    assert not any(key.startswith("avspo/") for key in data)
    assert data["acr/effective"] == pytest.approx(data["acr/rate"])  # GRPO leaves collapsed groups at zero
    assert data["acr/rate"] == 1.0 and data["acr/all_wrong"] == 1.0 and data["acr/stalled"] == 1.0
    checkpoints = outcome.run.checkpoints
    assert sorted(p.name for p in checkpoints.glob("global_step_*")) == ["global_step_1"]
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert outcome.state(1)["stagnation"] == {"streak": 1, "stalled": True, "rewards": []}
    assert "stopping the run after step 1 (algorithm.acr.alert.action=stop)" in outcome.log
    assert "adds nothing" not in outcome.log


def test_colocate_async_launcher_logs_everything_and_resumes_the_avspo_state(runs):
    outcome = runs["colocate"]
    records = outcome.records()
    assert [record["step"] for record in records] == [1, 2, 3]
    for record in records:
        missing = [
            key
            for key in (*ACR_KEYS, *AVSPO_KEYS, *ACTOR_KEYS, *PROMPT_KEYS, *SKIP_KEYS, *ROLLOUT_KEYS)
            if key not in record["data"]
        ]
        assert not missing, f"step {record['step']} lacks {missing}"
        assert record["data"]["acr/effective"] <= record["data"]["acr/rate"]
    # Each skipped prompt's place is refilled (the async modes ask for exact counts): a re-selection, no rollout
    # saved; counted step by step and across the resume.
    for run in (records, runs["colocate_resumed"].records()):
        skipped = [record["data"]["prompts/skipped"] for record in run]
        assert [record["data"]["prompts/reselected"] for record in run] == skipped
        assert [record["data"]["prompts/rollouts_skipped"] for record in run] == [0.0] * len(run)
    cumulative = [record["data"]["prompts/reselected_cumulative"] for record in records]
    assert cumulative == list(itertools.accumulate(r["data"]["prompts/skipped"] for r in records))
    assert cumulative[-1] > 0, "nothing was skipped: the counts above would hold vacuously"
    generated = [record["data"]["train/rollouts_generated"] for record in records]
    assert all(count > 0 and count % GROUP_SIZE == 0 for count in generated), generated
    assert [r["data"]["train/rollouts_cumulative"] for r in records] == list(itertools.accumulate(generated))
    saved = outcome.state(2)["controller"]
    assert saved["step"] == 2
    # Step 3's threshold is the one step 2 left in the controller (θ moves from step 2 on: ΔJ is 0 on step 1).
    assert records[2]["data"]["avspo/threshold"] == saved["threshold"]
    resumed = runs["colocate_resumed"].records()
    assert [record["step"] for record in resumed] == [3]
    # Restored, not restarted: the same step-3 threshold, and a controller that has counted 3 steps.
    # (An async run's responses depend on where aborts fall, so the samples are not compared.)
    assert resumed[0]["data"]["avspo/threshold"] == saved["threshold"]
    assert runs["colocate_resumed"].state(3)["controller"]["step"] == 3
    # The skip rule's cumulative count is restored too: step 3 adds its own to the step-2 checkpoint's.
    step_three = resumed[0]["data"]
    assert step_three["prompts/reselected_cumulative"] == (
        outcome.state(2)["prompt_skip"]["reselected"] + step_three["prompts/reselected"]
    )
    assert step_three["prompts/reselected_cumulative"] > 0, "nothing was skipped: the sum above would hold vacuously"
    assert step_three["train/rollouts_cumulative"] == (
        outcome.state(2)["rollouts_cumulative"] + step_three["train/rollouts_generated"]
    )


def test_stock_main_ppo_with_our_sync_mode_logs_acr_every_step_and_dapo_still_filters(runs):
    outcome = runs["stock_dapo_skip"]
    assert outcome.returncode == 0, outcome.log[-6000:]
    records = outcome.records()
    assert [record["step"] for record in records] == [1, 2, 3, 4]
    for record in records:
        data = record["data"]
        assert all(key in data for key in (*ACR_KEYS, *ACTOR_KEYS, *PROMPT_KEYS)), record["step"]
        assert data["acr/effective"] == 0.0  # the trained batch holds no collapsed group
    # DAPO filtering stayed on: verl's own eviction metric, and collapsed groups counted in ACR
    # although none is in the trained batch.
    filtered = [r["data"] for r in records if r["data"].get("training/filter_groups/evicted_samples", 0) > 0]
    assert filtered, "no step filtered a group: the DAPO check would be vacuous"
    for data in filtered:
        assert data["acr/rate"] > 0 and data["acr/groups"] > 4
    # Every group ACR counted, the trained, the evicted and the surplus, is a visit in the prompt history
    # (a skipped prompt is not: it was never generated).
    history = PromptHistory()
    history.load_state_dict(outcome.state(4)["prompt_history"])
    assert history.table()["visits"].sum() == sum(record["data"]["acr/groups"] for record in records)


def dapo_groups(data: dict) -> int:
    """The groups a sync DAPO step generated, by verl's own counts: the batch, the evicted, the surplus."""
    return PROMPTS_PER_STEP + sum(
        int(data.get(f"training/filter_groups/{name}_samples", 0)) for name in ("evicted", "discarded_surplus")
    )


def test_dapo_with_skipping_leaves_skipped_places_open_and_saves_their_rollouts(runs):
    """With DAPO's filter_groups the buffer generates more prompts until it has a batch of groups with
    spread, so a skipped prompt's place stays open until the buffer runs short: each step logs its
    generation batches and the rollouts generated (verl's own counts agree), and the places never needed
    are the rollouts saved."""
    records = runs["stock_dapo_skip"].records()
    assert [record["step"] for record in records] == [1, 2, 3, 4]
    for record in records:
        data = record["data"]
        assert all(key in data for key in (*ACR_KEYS, *SKIP_KEYS, *ROLLOUT_KEYS)), record["step"]
        assert data["train/rollouts_generated"] == GROUP_SIZE * dapo_groups(data), record["step"]
        assert data["train/gen_batches"] >= 1 and data["acr/effective"] == 0.0
        # Each skipped prompt's place was either filled by a later draw or left open (saved).
        assert data["prompts/reselected"] + data["prompts/rollouts_skipped"] / GROUP_SIZE == data["prompts/skipped"]
    generated = [record["data"]["train/rollouts_generated"] for record in records]
    assert [r["data"]["train/rollouts_cumulative"] for r in records] == list(itertools.accumulate(generated))
    assert any(record["data"]["train/gen_batches"] > 1 for record in records), "DAPO never refilled"
    saved = [record["data"]["prompts/rollouts_skipped"] for record in records]
    assert sum(saved) > 0, (saved, [record["data"]["prompts/skipped"] for record in records])
    assert records[-1]["data"]["prompts/rollouts_skipped_cumulative"] == sum(saved)


def test_prompts_are_skipped_before_rollout_and_counted_every_step(runs):
    records = runs["avspo"].records()
    skipped = [record["data"]["prompts/skipped"] for record in records]
    # Epoch 1 (steps 1-2) sees every prompt for the first time: nothing to skip. Then (step 3) prompts are skipped,
    # each replaced by a refill (a re-selection, no rollout saved), and the batch still trains 4 groups.
    assert skipped[:2] == [0.0, 0.0] and sum(skipped) > 0, skipped
    for record in records:
        data = record["data"]
        assert data["prompts/reselected"] == data["prompts/skipped"] and data["prompts/rollouts_skipped"] == 0
        assert data["acr/groups"] == 4, record["step"]
    cumulative = [record["data"]["prompts/reselected_cumulative"] for record in records]
    assert cumulative == list(itertools.accumulate(skipped))
    assert runs["avspo"].state(3)["prompt_skip"]["reselected"] == cumulative[-1]
    assert runs["avspo"].state(3)["prompt_skip"]["rollouts_skipped"] == 0
    # The history: 8 prompts, 4 groups a step, 12 visits in all.
    seen = [record["data"]["prompts/seen"] for record in records]
    assert seen == [4.0, 8.0, 8.0]
    assert int(runs["avspo"].state(3)["prompt_history"]["visits"].sum()) == 12


def test_the_prompts_command_reads_a_real_run_and_writes_its_parquet_without_dead_prompts(runs, tmp_path, capsys):
    outcome = runs["avspo"]
    outcome.records()
    history = PromptHistory()
    history.load_state_dict(outcome.state(3)["prompt_history"])
    table = history.table()
    classes = dict(zip(table["key"].tolist(), table["class"].tolist(), strict=True))
    assert main(["prompts", str(outcome.run.checkpoints), "--show", "0"]) == 0
    out = capsys.readouterr().out
    assert "(step 3, 8 prompts seen, keyed by an integer index)" in out
    for name in ("always_solved", "never_solved", "mixed"):
        count = sum(value == name for value in classes.values())
        assert f"{name:<13}  {count:>8}" in out, name
    dropped = {"always_solved", "never_solved"}
    kept_path = tmp_path / "kept.parquet"
    code = main(["prompts", str(outcome.run.checkpoints), "--data", str(outcome.run.train), "--drop",
                 ",".join(sorted(dropped)), "--out", str(kept_path)])  # fmt: skip
    assert code == 0
    kept = [row["index"] for row in pq.read_table(kept_path).column("extra_info").to_pylist()]
    assert kept == [index for index in range(8) if classes[index] not in dropped]


def test_the_allocator_gives_pilots_and_our_agent_loop_extends_those_that_spread(runs):
    """verl's agent loop rolls out each prompt's own count (``__rollout_n__``), our agent loop extends the pilots
    whose rewards differ in the same step under the same uid, the replay buffer takes the groups of unequal size
    and the step's groups less those the budget left out, and the step's accounting says what was generated
    (docs/prompts.md)."""
    outcome = runs["stock_alloc"]
    assert outcome.returncode == 0, outcome.log[-6000:]
    records = outcome.records()
    assert [record["step"] for record in records] == [1, 2, 3, 4]
    for record in records:
        data, step = record["data"], record["step"]
        assert all(key in data for key in (*ACR_KEYS, *ACTOR_KEYS, *ROLLOUT_KEYS, *ALLOCATION_KEYS)), step
        assert data["acr/groups"] == PROMPTS_PER_STEP - data["prompts/unallocated"], step  # one group per prompt
        assert data["train/rollouts_generated"] == (
            data["prompts/rollouts_allocated"] + (GROUP_SIZE - 2) * data["prompts/pilots_extended"]
        ), step
    first, second = [r["data"] for r in records[:2]], [r["data"] for r in records[2:]]
    for data in first:  # 3 full groups (12 of the 14 rollouts), every group collapsed (no reward yet)
        assert (data["prompts/unallocated"], data["prompts/pilots"]) == (1, 0)
        assert (data["train/rollouts_generated"], data["acr/rate"]) == (3 * GROUP_SIZE, 1.0)
    assert [data["prompts/unallocated"] for data in second] == [0, 0]
    assert sum(data["prompts/pilots"] for data in second) == 6
    for data in second:  # a collapsed pilot is trained as a group of 2 and counts in ACR
        extended = data["prompts/pilots_extended"]
        assert data["acr/rate"] == pytest.approx((PROMPTS_PER_STEP - extended) / PROMPTS_PER_STEP)
    # The prompts seen twice are the 6 of epoch 1: their pilots spread exactly where their index is even.
    history = PromptHistory()
    history.load_state_dict(outcome.state(4)["prompt_history"])
    table = history.table()
    assert table["visits"].sum() == 3 + 3 + 4 + 4
    seen_twice = [key for key, visits in zip(table["key"], table["visits"], strict=True) if visits == 2]
    even = sum(key % 2 == 0 for key in seen_twice)
    assert len(seen_twice) == 6 and sum(data["prompts/pilots_extended"] for data in second) == even
    generated = [record["data"]["train/rollouts_generated"] for record in records]
    assert sum(generated) == 2 * 12 + 6 * 2 + 2 * GROUP_SIZE + even * (GROUP_SIZE - 2)  # of GRPO's 64
    assert [r["data"]["train/rollouts_cumulative"] for r in records] == list(itertools.accumulate(generated))
    # The allocator's estimate of the extended share, saved with the run state: 0.25, then one exponential
    # average step per step with pilots.
    rate = 0.25
    for data in second:
        if data["prompts/pilots"]:
            rate = 0.9 * rate + 0.1 * data["prompts/pilots_extended"] / data["prompts/pilots"]
        assert data["prompts/pilot_extend_rate"] == pytest.approx(rate)
    assert outcome.state(4)["prompt_allocation"]["extend_rate"] == pytest.approx(rate)
