"""The V1 trainer subclass against a real TransferQueue on a local Ray cluster.

``AVSPOTrainerSync(config)`` is built with verl's real ``PPOTrainer.__init__`` (it needs no GPU;
``helpers.make_trainer``). What does need GPUs is stubbed, and only that: the FSDP actor worker
group (``actor_rollout_wg``, whose save/load ``helpers.RecordingWorkerGroup`` records, and whose
``compute_log_prob`` output ``LogProbWorkerGroup`` writes) and, for ``step()``, the per-iteration
GPU pipeline ``_step_once`` and the rollout dispatch ``prepare_step``.
"""

import logging

import numpy as np
import pytest
import torch
import transfer_queue as tq
from helpers import make_trainer, put_groups, with_checkpoint_parts
from transfer_queue.metadata import KVBatchMeta
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.trainer.ppo.v1.utils import MetricsAggregator
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from verl_avspo.core.advantage import compute_avspo_outcome_advantage
from verl_avspo.core.controller import AdaptiveController
from verl_avspo.verl_plugin import run_state
from verl_avspo.verl_plugin.rollout_allocation import PILOT_FIELD
from verl_avspo.verl_plugin.run_state import VERL_ADVICE as ADVICE
from verl_avspo.verl_plugin.trainer import STATE_FILE
from verl_avspo.verl_plugin.trainer_v1 import AVSPOTrainerSync

pytestmark = [pytest.mark.usefixtures("transfer_queue_cluster", "fresh_estimator_state"), pytest.mark.verl]

REDUCING = ("max", "min", "sum", "total")


def read_back(batch):
    data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["uid", "rm_scores", "advantages"])
    rewards = data["rm_scores"].to_padded_tensor(0.0)
    mask = torch.nested.as_nested_tensor([torch.ones_like(r) for r in data["rm_scores"].unbind()], layout=torch.jagged)
    return rewards, mask.to_padded_tensor(0.0), np.array(list(data["uid"]), dtype=object), data["advantages"]


def assert_averaged(metrics):
    """Every name we log is averaged by verl's own MetricsAggregator, never max/min/summed."""
    ours = [k for k in metrics if k.startswith(("acr/", "avspo/"))]
    assert ours
    for name in ours:
        assert not any(word in name for word in REDUCING), name
        assert MetricsAggregator()._get_aggregation_type(name) == "weighted_avg", name


def test_grpo_advantage_stage_logs_acr_and_keeps_verl_advantages():
    trainer = make_trainer("algorithm.adv_estimator=grpo")
    batch = put_groups("a", [[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 0, 0]])
    metrics = {}
    batch = trainer._compute_advantage(batch, metrics)

    assert metrics["acr/rate"] == 0.5
    assert metrics["acr/all_correct"] == 0.25 and metrics["acr/all_wrong"] == 0.25
    assert metrics["acr/effective"] == 0.5  # GRPO: effective collapse equals raw collapse
    assert metrics["acr/groups"] == 4 and metrics["acr/singletons"] == 0
    assert not any(k.startswith("avspo/") for k in metrics)
    assert_averaged(metrics)

    rewards, mask, uid, advantages = read_back(batch)
    expected, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uid)
    assert torch.allclose(advantages.to_padded_tensor(0.0), expected, atol=1e-6)
    tq.kv_clear(keys=batch.keys, partition_id="train")


def test_verl_padding_rows_are_not_counted_as_a_collapsed_group():
    # verl's own padding (as _balance_batch does it): 6 responses padded to a multiple of 4 with two
    # no-op rows sharing one uid and score 0, which would otherwise count as an all-wrong group.
    trainer = make_trainer("algorithm.adv_estimator=grpo")
    batch = put_groups("p", [[1, 0, 1], [1, 1, 0]])
    batch = upsample_batch_to_divisible_size(batch, 4, eos_token_id=0)
    assert len(batch) == 8 and sum(tag.get("is_padding", False) for tag in batch.tags) == 2
    metrics = {}
    batch = trainer._compute_advantage(batch, metrics)
    assert metrics["acr/rate"] == 0.0 and metrics["acr/all_wrong"] == 0.0 and metrics["acr/groups"] == 2
    tq.kv_clear(keys=batch.keys, partition_id="train")


def test_avspo_advantage_stage_logs_estimator_metrics_and_writes_its_advantages():
    trainer = make_trainer()  # our config's default estimator: avspo, preset paper
    batch = put_groups("b", [[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 1]])
    metrics = {}
    batch = trainer._compute_advantage(batch, metrics)

    # ACR 0.75 > θ_1 = 0.5: the three collapsed groups get K = ceil(4 * 0.75^0.5) = 4 virtual samples.
    assert metrics["acr/rate"] == 0.75 and metrics["acr/all_wrong"] == 0.5
    assert metrics["avspo/threshold"] == 0.5
    assert metrics["avspo/triggered"] == 0.75
    assert metrics["avspo/virtual_k"] == 4.0
    assert metrics["acr/effective"] == 0.0
    assert_averaged(metrics)
    assert trainer.tracker.measurement is None  # the batch is closed, not left for another step

    rewards, mask, uid, advantages = read_back(batch)
    settings, acr = trainer.tracker.avspo, trainer.tracker.acr
    reference = compute_avspo_outcome_advantage(rewards, mask, uid, settings, acr, AdaptiveController(settings, acr))
    assert torch.allclose(advantages.to_padded_tensor(0.0), reference.advantages, atol=1e-6)
    tq.kv_clear(keys=batch.keys, partition_id="train")


def test_with_filter_groups_acr_is_the_rate_before_filtering():
    trainer = make_trainer(
        "algorithm.adv_estimator=grpo", "algorithm.filter_groups.enable=True", "data.train_batch_size=1"
    )
    groups = [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]]
    meta = put_groups("c", groups)
    prompts = [f"cg{g}" for g in range(len(groups))]
    tq.kv_batch_put(
        keys=prompts,
        partition_id="train",
        tags=[{"is_prompt": True, "status": "finished", "global_steps": 1} for _ in prompts],
    )
    # verl's real DAPO sampler: drops the two collapsed groups, keeps one mixed group, discards the other.
    batch, metrics = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=1)
    assert metrics["training/filter_groups/evicted_samples"] == 2
    batch = trainer._compute_advantage(batch, metrics)

    # Before filtering: 2 of 4 generated groups collapsed (one each way). The trained group is mixed.
    assert metrics["acr/rate"] == 0.5
    assert metrics["acr/all_correct"] == 0.25 and metrics["acr/all_wrong"] == 0.25
    assert metrics["acr/groups"] == 4
    assert metrics["acr/effective"] == 0.0
    tq.kv_clear(keys=[*meta.keys, *prompts], partition_id="train")


def test_with_the_allocator_the_pilot_sizes_are_read_with_the_scores(monkeypatch):
    """The advantage stage reads each row's pilot size in the same TransferQueue read as its score and counts
    the pilots extended and the rollouts they added: pilot 0 (2) extended to 4 sessions, pilot 1 left at 2,
    prompt 2 a full group."""
    trainer = make_trainer("algorithm.adv_estimator=grpo", "algorithm.prompts.allocation.enable=True")
    assert trainer.allocation is not None
    # As the dispatch writes it: a tensor field, which travels with each response.
    source = trainer.prompt_identity.source
    pilots = [{source: f"prompt {g}", PILOT_FIELD: torch.tensor(size)} for g, size in enumerate([2, 2, 0])]
    batch = put_groups("alloc", [[1, 0, 1, 1], [1, 1], [0, 1, 0, 0]], group_fields=pilots)
    reads = []  # every TransferQueue read's fields, verl's own included
    read = tq.kv_batch_get
    monkeypatch.setattr(tq, "kv_batch_get", lambda **kwargs: reads.append(kwargs["select_fields"]) or read(**kwargs))
    metrics = {}
    trainer._compute_advantage(batch, metrics)
    assert [fields for fields in reads if PILOT_FIELD in fields] == [["uid", "rm_scores", source, PILOT_FIELD]]
    assert metrics["acr/rate"] == pytest.approx(1 / 3)  # the pilot of two equal rewards collapsed
    trainer.tracker.observe_step(1, metrics)
    assert metrics["prompts/pilots_extended"] == 1 and metrics["train/rollouts_generated"] == 2
    tq.kv_clear(keys=batch.keys, partition_id="train")


def test_resumed_run_continues_exactly_like_an_uninterrupted_one(tmp_path):
    overrides = [
        "algorithm.avspo.strategy=random",  # its RNG state must survive too
        "algorithm.avspo.k=2",
        "algorithm.avspo.eta=0.5",
        "algorithm.avspo.threshold_init=0.3",
        f"trainer.default_local_dir={tmp_path}",
        "trainer.resume_mode=auto",
    ]
    steps = [
        [[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]],
        [[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]],
        [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0]],
        [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]],
    ]

    def run_steps(trainer, tag, batches):
        out = []
        for i, groups in enumerate(batches):
            metrics = {}
            batch = trainer._compute_advantage(put_groups(f"{tag}{i}", groups), metrics)
            out.append((metrics["avspo/threshold"], read_back(batch)[3].to_padded_tensor(0.0)))
            tq.kv_clear(keys=batch.keys, partition_id="train")
        return out

    uninterrupted = run_steps(make_trainer(*overrides), "u", steps)
    assert len({threshold for threshold, _ in uninterrupted}) > 2  # θ really moves

    run_state.reset()
    first = with_checkpoint_parts(make_trainer(*overrides))
    before = run_steps(first, "f", steps[:2])
    first.global_steps = 2
    first.tracker.alert.streak = 2
    first._save_checkpoint()
    folder = tmp_path / "global_step_2"
    assert (folder / STATE_FILE).exists() and (folder / "data.pt").exists()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"

    run_state.reset()  # a new process: no controller state survives except through the checkpoint
    resumed = with_checkpoint_parts(make_trainer(*overrides))
    resumed._load_checkpoint()
    assert resumed.global_steps == 2 and resumed.actor_rollout_wg.loaded == [str(folder / "actor")]
    assert resumed.tracker.alert.streak == 2
    after = run_steps(resumed, "r", steps[2:])

    for (theta_a, adv_a), (theta_b, adv_b) in zip(uninterrupted, before + after, strict=True):
        assert theta_a == theta_b
        assert torch.equal(adv_a, adv_b)


def test_resume_from_a_checkpoint_without_avspo_state_warns(tmp_path, caplog):
    (tmp_path / "global_step_3").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    trainer = with_checkpoint_parts(make_trainer(f"trainer.default_local_dir={tmp_path}"))
    with caplog.at_level(logging.WARNING, logger="verl_avspo"):
        trainer._load_checkpoint()
    assert trainer.global_steps == 3
    assert f"has no {STATE_FILE}" in caplog.text


class ScriptedTrainer(AVSPOTrainerSync):
    """Runs verl's real ``step()`` (its MetricsAggregator included) over scripted ACR values; the
    GPU pipeline of one iteration (``_step_once``) and the rollout dispatch are stubbed."""

    acr_values: list = []
    rewards: list = []

    def prepare_step(self):
        return {}

    def _step_once(self, metrics, timing_raw, sample_batch_size):
        metrics["acr/rate"] = metrics["acr/all_wrong"] = self.acr_values[self.global_steps - 1]
        metrics["acr/reward_mean"] = self.rewards[self.global_steps - 1] if self.rewards else 0.5
        return KVBatchMeta(partition_id="train", keys=[], tags=[])


def run_scripted(trainer, acr_values, rewards=()):
    trainer.acr_values, trainer.rewards = acr_values, list(rewards)
    stalled = []
    for step in range(1, len(acr_values) + 1):
        trainer.global_steps = step
        metrics = {}
        trainer.step(metrics, {})
        stalled.append(metrics["acr/stalled"])
        if trainer.total_training_steps == step:
            break
    return stalled


def test_alert_warns_once_at_the_window_th_high_step_and_does_not_stop(caplog):
    trainer = make_trainer(
        "algorithm.adv_estimator=grpo",
        "algorithm.acr.alert.window=3",
        "algorithm.acr.alert.rule=acr",
        trainer_cls=ScriptedTrainer,
    )
    trainer.total_training_steps = 100
    with caplog.at_level(logging.WARNING, logger="verl_avspo"):
        stalled = run_scripted(trainer, [0.5, 0.5, 0.2, 0.5, 0.36, 0.9, 0.8, 0.1])
    assert stalled == [0, 0, 0, 0, 0, 1, 1, 0]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert (
        "ACR above 0.35 for 3 consecutive steps (now step 6, algorithm.acr.alert.rule=acr)" in warnings[0].getMessage()
    )
    assert ADVICE in warnings[0].getMessage()
    assert trainer.total_training_steps == 100


def test_alert_with_action_stop_saves_a_checkpoint_and_ends_after_that_step(tmp_path, caplog):
    trainer = make_trainer(
        "algorithm.adv_estimator=grpo",
        "algorithm.acr.alert.window=2",
        "algorithm.acr.alert.action=stop",
        "algorithm.acr.alert.rule=acr",
        f"trainer.default_local_dir={tmp_path}",
        trainer_cls=ScriptedTrainer,
    )
    with_checkpoint_parts(trainer)
    trainer.total_training_steps = 100
    with caplog.at_level(logging.WARNING, logger="verl_avspo"):
        stalled = run_scripted(trainer, [0.1, 0.6, 0.7, 0.8, 0.9])
    assert stalled == [0, 0, 1]
    assert trainer.total_training_steps == 3  # fit's loop condition ends the run after logging step 3
    assert trainer.actor_rollout_wg.saved == [(str(tmp_path / "global_step_3" / "actor"), 3)]
    state = torch.load(tmp_path / "global_step_3" / STATE_FILE, weights_only=True)
    assert state["stagnation"] == {"streak": 2, "stalled": True, "rewards": []} and state["controller"] is None
    assert "stopping the run after step 3 (algorithm.acr.alert.action=stop)" in caplog.text


def test_alert_stop_on_the_last_step_leaves_the_save_to_fit(tmp_path):
    # fit saves the last step whenever save_freq > 0 (is_last_step), so stopping there must not save twice.
    trainer = make_trainer(
        "algorithm.adv_estimator=grpo",
        "algorithm.acr.alert.window=2",
        "algorithm.acr.alert.action=stop",
        "algorithm.acr.alert.rule=acr",
        "trainer.save_freq=5",
        f"trainer.default_local_dir={tmp_path}",
        trainer_cls=ScriptedTrainer,
    )
    with_checkpoint_parts(trainer)
    trainer.total_training_steps = 3
    assert run_scripted(trainer, [0.1, 0.6, 0.7]) == [0, 0, 1]
    assert trainer.total_training_steps == 3 and trainer.actor_rollout_wg.saved == []


def test_the_default_rule_needs_high_acr_and_no_reward_gain(caplog):
    # acr_no_gain, the default: the same high ACR stalls a run whose reward is flat, not one whose
    # reward keeps rising (window 2: the last 2 steps' mean reward against the 2 before).
    high = [0.9] * 6
    flat = make_trainer("algorithm.adv_estimator=grpo", "algorithm.acr.alert.window=2", trainer_cls=ScriptedTrainer)
    assert flat.tracker.alert.config.rule == "acr_no_gain"
    flat.total_training_steps = 100
    with caplog.at_level(logging.WARNING, logger="verl_avspo"):
        assert run_scripted(flat, high, [0.3] * 6) == [0, 0, 0, 1, 1, 1]
    assert "and a mean reward over them no higher than over the 2 steps before (now step 4" in caplog.text
    rising = make_trainer("algorithm.adv_estimator=grpo", "algorithm.acr.alert.window=2", trainer_cls=ScriptedTrainer)
    rising.total_training_steps = 100
    assert run_scripted(rising, high, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == [0] * 6


def put_entropies(batch, entropies):
    tq.kv_batch_put(
        keys=batch.keys, partition_id="train", fields=list_of_dict_to_tensordict([{"entropy": e} for e in entropies])
    )


def test_rent_last_tokens_and_padding_rows():
    # RENT over each response's last token only; the batch is padded to a multiple of 4 as
    # _balance_batch does: the padding row gets reward 0 and stays out of intrinsic/reward.
    trainer = make_trainer(
        "algorithm.adv_estimator=grpo",
        "algorithm.intrinsic.reward=negative_entropy",
        "algorithm.intrinsic.last_tokens=1",
    )
    batch = put_groups("rentpad", [[1, 0, 1]])
    generator = torch.Generator().manual_seed(2)
    entropies = [torch.rand(2 + s, generator=generator) for s in range(3)]
    put_entropies(batch, entropies)
    batch = upsample_batch_to_divisible_size(batch, 4, eos_token_id=0)
    metrics = {}
    batch = trainer._compute_advantage(batch, metrics)
    rewards, _, _, _ = read_back(batch)
    expected = [-float(e[-1]) for e in entropies]
    assert rewards.sum(-1).tolist() == pytest.approx([*expected, 0.0], abs=1e-6)
    assert metrics["intrinsic/reward"] == pytest.approx(sum(expected) / 3, abs=1e-6)
    tq.kv_clear(keys=batch.keys, partition_id="train")


def test_rent_replaces_the_verifier_scores_by_negative_entropy_before_the_advantage():
    # The per-token entropies are put into TransferQueue as the actor's old-log-prob pass leaves them
    # (a jagged response-length field); that GPU pass itself is not run.
    trainer = make_trainer("algorithm.adv_estimator=grpo", "algorithm.intrinsic.reward=negative_entropy")
    batch = put_groups("rent", [[1, 0, 1], [0, 0, 0]])
    generator = torch.Generator().manual_seed(0)
    entropies = [torch.rand(2 + s, generator=generator) for _ in range(2) for s in range(3)]
    tq.kv_batch_put(
        keys=batch.keys,
        partition_id="train",
        fields=list_of_dict_to_tensordict([{"entropy": e} for e in entropies]),
    )
    metrics = {}
    batch = trainer._compute_advantage(batch, metrics)

    rewards, mask, uid, advantages = read_back(batch)
    expected_scores = torch.tensor([-float(e.mean()) for e in entropies])
    assert torch.allclose(rewards.sum(-1), expected_scores, atol=1e-6)
    lengths = mask.sum(-1).long()
    assert torch.equal(rewards[torch.arange(6), lengths - 1], rewards.sum(-1))  # on each last token
    expected, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uid)
    assert torch.allclose(advantages.to_padded_tensor(0.0), expected, atol=1e-6)
    assert metrics["intrinsic/reward"] == pytest.approx(float(expected_scores.mean()), abs=1e-6)
    assert metrics["intrinsic/verifier_score"] == pytest.approx(2 / 6)
    # The all-wrong verifier group is no longer collapsed: its entropies differ.
    assert metrics["acr/rate"] == 0.0
    tq.kv_clear(keys=batch.keys, partition_id="train")


class LogProbWorkerGroup:
    """Stands in for the FSDP actor worker group's ``compute_log_prob`` (it needs GPUs): writes
    what the worker leaves in TransferQueue, per-token outputs over each whole sequence (a 3-token
    prompt plus the response), with ``self_certainty`` only where the patched engine would add it."""

    PROMPT = 3

    def __init__(self, patched):
        self.patched, self.flags, self.full = patched, [], {}

    def compute_log_prob(self, batch):
        self.flags.append(batch.extra_info.get("calculate_self_certainty"))
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
        generator = torch.Generator().manual_seed(1)
        # What the rollout left beside them (verl compares its log-probs with the actor's).
        rollout = [
            {"responses": torch.zeros(len(m), dtype=torch.int64), "rollout_log_probs": -torch.rand(len(m))}
            for m in data["response_mask"].unbind()
        ]
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=list_of_dict_to_tensordict(rollout))
        lengths = [self.PROMPT + len(m) for m in data["response_mask"].unbind()]
        names = ["log_probs", "entropy"] + (["self_certainty"] if self.patched else [])
        self.full = {name: [torch.rand(n, generator=generator) for n in lengths] for name in names}
        rows = [{name: self.full[name][i] for name in names} for i in range(len(lengths))]
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=list_of_dict_to_tensordict(rows))
        return batch


def test_intuitor_asks_the_actor_for_self_certainty_and_trains_on_its_response_mean():
    trainer = make_trainer("algorithm.adv_estimator=grpo", "algorithm.intrinsic.reward=self_certainty")
    trainer.actor_rollout_wg = LogProbWorkerGroup(patched=True)
    batch = put_groups("intuitor", [[1, 0, 1], [0, 0, 0]])
    metrics = {}
    batch = trainer._compute_old_log_prob(batch, metrics)
    assert trainer.actor_rollout_wg.flags == [True]  # the worker was asked for self-certainty
    batch = trainer._compute_advantage(batch, metrics)

    rewards, mask, uid, advantages = read_back(batch)
    # verl's response slice of a per-token output: the positions that predict the response tokens.
    start, lengths = LogProbWorkerGroup.PROMPT - 1, mask.sum(-1).long().tolist()
    full = trainer.actor_rollout_wg.full["self_certainty"]
    expected_scores = torch.tensor([float(f[start : start + n].mean()) for f, n in zip(full, lengths, strict=True)])
    assert torch.allclose(rewards.sum(-1), expected_scores, atol=1e-6)
    expected, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uid)
    assert torch.allclose(advantages.to_padded_tensor(0.0), expected, atol=1e-6)
    assert metrics["intrinsic/reward"] == pytest.approx(float(expected_scores.mean()), abs=1e-6)
    assert metrics["intrinsic/verifier_score"] == pytest.approx(2 / 6)
    assert "actor/entropy" in metrics  # verl's own old-log-prob metrics still run
    tq.kv_clear(keys=batch.keys, partition_id="train")


def test_intuitor_on_an_unpatched_actor_names_the_patch():
    trainer = make_trainer("algorithm.adv_estimator=grpo", "algorithm.intrinsic.reward=self_certainty")
    trainer.actor_rollout_wg = LogProbWorkerGroup(patched=False)
    batch = put_groups("unpatched", [[1, 0]])
    with pytest.raises(RuntimeError, match=r"returned no per-token self-certainty.*verl-0\.9\.1-intrinsic\.patch"):
        trainer._compute_old_log_prob(batch, {})
    tq.kv_clear(keys=batch.keys, partition_id="train")
