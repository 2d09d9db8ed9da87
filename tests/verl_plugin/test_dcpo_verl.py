"""DCPO in verl: the ``dcpo`` estimator through verl's registry, ``compute_advantage`` and the V1
trainer's advantage stage (real TransferQueue on a local Ray cluster), its history in checkpoints,
and the ``dcpo`` policy loss through verl's policy-loss registry.

Nothing here needs a GPU except the actor worker group's checkpoint save/load, which is stubbed
(``RecordingWorkerGroup``, tests/support/helpers.py).
"""

import logging
import math

import numpy as np
import pytest
import torch
import transfer_queue as tq
from helpers import TRAINER_BASE, grouped_data, make_trainer, put_groups, with_checkpoint_parts
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.workers.config.actor import ActorConfig

from verl_avspo.core.dcpo import PromptRewardHistory, dynamic_clip_bounds
from verl_avspo.verl_plugin import dcpo_loss, estimators, run_state
from verl_avspo.verl_plugin.launcher import compose_config
from verl_avspo.verl_plugin.trainer import STATE_FILE

pytestmark = [pytest.mark.usefixtures("fresh_estimator_state"), pytest.mark.verl]

DCPO = "algorithm.adv_estimator=dcpo"


def algorithm_config(*overrides):
    return compose_config([*TRAINER_BASE, DCPO, *overrides]).algorithm  # the DictConfig verl's trainers pass


# ---- verl's registry and compute_advantage ------------------------------------------------------


def test_dcpo_is_registered_in_verls_registry():
    assert core_algos.get_adv_estimator_fn("dcpo") is estimators.compute_dcpo_advantage
    assert core_algos.get_policy_loss_fn("dcpo") is dcpo_loss.compute_dcpo_policy_loss


def test_compute_advantage_scripted_visits_match_the_reward_history():
    # Prompt 7: mixed on visit 1, collapsed on visit 2 (gets a non-zero advantage from its history);
    # prompt 9: collapsed on visit 1 (0, as GRPO) and mixed on visit 2.
    config = algorithm_config()
    steps = [
        ([[1, 0, 1, 0], [1, 1, 1, 1]], [7, 9]),
        ([[1, 1, 1, 1], [0, 1, 0, 0]], [7, 9]),
    ]
    reference = PromptRewardHistory(epsilon=1e-6)
    for step, (groups, prompts) in enumerate(steps):
        data = grouped_data(groups, f"s{step}_")
        run_state.tracker_for(config, "dcpo").set_prompt_keys({f"s{step}_{g}": key for g, key in enumerate(prompts)})
        data = compute_advantage(data, adv_estimator="dcpo", config=config)
        advantages = data.batch["advantages"]
        scores = data.batch["token_level_rewards"].sum(-1)
        keys = [key for key, group in zip(prompts, groups, strict=True) for _ in group]
        expected = reference.advantages(scores, keys, data.non_tensor_batch["uid"])
        assert torch.equal(advantages, expected.unsqueeze(-1) * data.batch["response_mask"])
        assert torch.equal(data.batch["returns"], advantages)
        per_response = advantages[:, -1]
        if step == 0:
            assert torch.all(per_response[4:] == 0)  # first visit of a collapsed group
            assert torch.all(per_response[:4] != 0)
        else:
            # Visit 2 of a collapsed prompt: Â_total/2 with the totals over 8 rewards, 6 of them 1.
            mean, std = 6 / 8, math.sqrt(6 * (1 / 4) ** 2 + 2 * (3 / 4) ** 2) / math.sqrt(7)
            assert torch.allclose(per_response[:4], torch.full((4,), (1 - mean) / (std + 1e-6) / 2))
            assert torch.all(per_response[4:] != 0)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # First visit of [1, 0, 0, 0]: mean 1/4, unbiased std 1/2.
        (["algorithm.dcpo.epsilon=0.5"], [0.75, -0.25, -0.25, -0.25]),
        (["algorithm.norm_adv_by_std_in_grpo=False"], [0.75, -0.25, -0.25, -0.25]),
        ([], [1.5 / (1 + 2e-6), -0.5 / (1 + 2e-6), -0.5 / (1 + 2e-6), -0.5 / (1 + 2e-6)]),
    ],
)
def test_the_config_reaches_the_history(overrides, expected):
    config = algorithm_config(*overrides)
    run_state.tracker_for(config, "dcpo").set_prompt_keys({"x0": 1})
    data = compute_advantage(grouped_data([[1, 0, 0, 0]], "x"), adv_estimator="dcpo", config=config)
    assert data.batch["advantages"][:, -1].tolist() == pytest.approx(expected, rel=1e-6)


def test_stock_compute_advantage_without_prompt_keys_names_the_launcher():
    data = grouped_data([[1, 0, 1, 0]], "x")
    with pytest.raises(ValueError, match=r"no prompt identity for any uid.*python -m verl_avspo\.main_ppo"):
        compute_advantage(data, adv_estimator="dcpo", config=algorithm_config())


def test_keys_are_consumed_when_the_batch_closes():
    config = algorithm_config()
    tracker = run_state.tracker_for(config, "dcpo")
    tracker.set_prompt_keys({"x0": 1})
    data = compute_advantage(grouped_data([[1, 0]], "x"), adv_estimator="dcpo", config=config)
    tracker.measure(data.batch["token_level_rewards"].sum(-1), data.non_tensor_batch["uid"])
    tracker.batch_metrics()  # as the trainer closes each batch
    with pytest.raises(ValueError, match="no prompt identity"):
        compute_advantage(grouped_data([[1, 0]], "x"), adv_estimator="dcpo", config=config)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_reward_is_refused_before_it_reaches_the_history(bad):
    config = algorithm_config()
    data = grouped_data([[1, 0, 1, 0]], "x")
    data.batch["token_level_rewards"][1, -1] = bad
    run_state.tracker_for(config, "dcpo").set_prompt_keys({"x0": 1})
    with pytest.raises(ValueError, match=r"1 response score\(s\) are not finite.*uid=\['x0'\]"):
        compute_advantage(data, adv_estimator="dcpo", config=config)
    assert len(run_state.tracker_for(config, "dcpo").dcpo_history) == 0


def test_a_mask_of_the_wrong_shape_is_refused():
    data = grouped_data([[1, 0]], "x")
    run_state.tracker_for(algorithm_config(), "dcpo").set_prompt_keys({"x0": 1})
    with pytest.raises(ValueError, match=r"response_mask shape \(2, 2\) does not match"):
        estimators.compute_dcpo_advantage(
            data.batch["token_level_rewards"], torch.ones(2, 2), data.non_tensor_batch["uid"], algorithm_config()
        )


# ---- the V1 trainer's advantage stage -----------------------------------------------------------


def put_prompts(tag, groups, indices, texts=None):
    """:func:`helpers.put_groups` with the dataset ``index`` verl stores with every response and a
    ``raw_prompt`` (``problem <index>`` unless ``texts`` are given)."""
    texts = texts or [f"problem {index}" for index in indices]
    prompts = [
        {"index": index, "raw_prompt": [{"role": "user", "content": text}]}
        for index, text in zip(indices, texts, strict=True)
    ]
    return put_groups(tag, groups, group_fields=prompts)


def run_steps(trainer, tag, steps):
    """Each step's per-response advantages (a flat tensor), through the trainer's advantage stage."""
    out = []
    for i, (groups, indices) in enumerate(steps):
        batch = trainer._compute_advantage(put_prompts(f"{tag}{i}", groups, indices), {})
        data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages"])
        out.append(torch.stack([row[-1] for row in data["advantages"].unbind()]))
        tq.kv_clear(keys=batch.keys, partition_id="train")
    return out


STEPS = [
    ([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], [3, 5, 8]),
    ([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], [3, 5, 11]),
    ([[0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], [3, 5, 8]),
    ([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]], [8, 3, 5]),
]


def reference_advantages(steps):
    history, out = PromptRewardHistory(epsilon=1e-6), []
    for groups, indices in steps:
        scores = torch.tensor([s for group in groups for s in group], dtype=torch.float32)
        keys = [index for index, group in zip(indices, groups, strict=True) for _ in group]
        uid = np.array([g for g, group in enumerate(groups) for _ in group])
        out.append(history.advantages(scores, keys, uid))
    return out


@pytest.mark.usefixtures("transfer_queue_cluster")
@pytest.mark.parametrize("prompt_key", ["index", "raw_prompt"])
def test_trainer_passes_prompt_keys_from_the_batch(prompt_key):
    trainer = make_trainer(DCPO, f"algorithm.prompts.key={prompt_key}")
    got = run_steps(trainer, f"k{prompt_key}", STEPS)
    for step, (a, b) in enumerate(zip(got, reference_advantages(STEPS), strict=True)):
        assert torch.allclose(a, b, atol=1e-6), step
    assert torch.all(got[0][4:] == 0)  # prompts 5 and 8 collapsed on their first visit
    assert torch.all(got[1][:4] != 0)  # prompt 3 collapsed on its second visit: its history speaks
    assert torch.all(got[1][8:] == 0)  # prompt 11 is new


@pytest.mark.usefixtures("transfer_queue_cluster")
def test_trainer_refuses_different_prompts_that_share_an_index():
    # As with two train files that each number extra_info.index from 0.
    trainer = make_trainer(DCPO)
    batch = put_prompts("same", [[1, 0], [0, 1], [1, 1]], [0, 0, 1], ["2+2", "3*4", "1+1"])
    with pytest.raises(ValueError, match="2 different prompts of this batch have the same index 0"):
        trainer._compute_advantage(batch, {})
    tq.kv_clear(keys=batch.keys, partition_id="train")


@pytest.mark.usefixtures("transfer_queue_cluster")
def test_the_same_prompt_twice_in_a_batch_is_two_visits():
    trainer = make_trainer(DCPO)
    batch = trainer._compute_advantage(put_prompts("twice", [[1, 0], [1, 1]], [6, 6]), {})
    assert trainer.tracker.dcpo_history.stats(6) == pytest.approx({"visits": 2, "count": 4, "mean": 0.75, "std": 0.5})
    tq.kv_clear(keys=batch.keys, partition_id="train")


@pytest.mark.usefixtures("transfer_queue_cluster")
def test_padding_rows_get_zero_and_stay_out_of_the_history():
    trainer = make_trainer(DCPO)
    batch = upsample_batch_to_divisible_size(put_prompts("pad", [[1, 0, 1]], [4]), 4, eos_token_id=0)
    batch = trainer._compute_advantage(batch, {})
    data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages"])
    advantages = torch.stack([row[-1] for row in data["advantages"].unbind()])
    assert torch.all(advantages[:3] != 0) and advantages[3] == 0
    assert len(trainer.tracker.dcpo_history) == 1 and trainer.tracker.dcpo_history.stats(4)["count"] == 3
    tq.kv_clear(keys=batch.keys, partition_id="train")


@pytest.mark.usefixtures("transfer_queue_cluster")
def test_history_is_checkpointed_and_a_resumed_run_continues_bit_exactly(tmp_path, caplog):
    overrides = [f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=auto"]
    uninterrupted = run_steps(make_trainer(DCPO, *overrides), "u", STEPS)

    run_state.reset()
    first = with_checkpoint_parts(make_trainer(DCPO, *overrides))
    before = run_steps(first, "f", STEPS[:2])
    first.global_steps = 2
    first._save_checkpoint()
    state = torch.load(tmp_path / "global_step_2" / STATE_FILE, weights_only=True)
    assert state["dcpo"] is not None and state["controller"] is None

    run_state.reset()  # a new process: the history survives only through the checkpoint
    resumed = with_checkpoint_parts(make_trainer(DCPO, *overrides))
    resumed._load_checkpoint()
    assert resumed.global_steps == 2 and len(resumed.tracker.dcpo_history) == 4
    after = run_steps(resumed, "r", STEPS[2:])
    for a, b in zip(uninterrupted, before + after, strict=True):
        assert torch.equal(a, b)

    run_state.reset()  # a resumed run keyed differently cannot use the history: it starts fresh, and says so
    other = with_checkpoint_parts(make_trainer(DCPO, *overrides, "algorithm.prompts.key=raw_prompt"))
    with caplog.at_level(logging.WARNING, logger="verl_avspo.core.run_tracker"):
        other._load_checkpoint()
    assert len(other.tracker.dcpo_history) == 0
    assert "keyed by index, this run's prompts by raw_prompt" in caplog.text

    run_state.reset()  # control: without the history, step 3 differs (prompt 3's second visit)
    fresh = run_steps(make_trainer(DCPO), "c", STEPS[2:3])
    assert not torch.equal(fresh[0], uninterrupted[2])


# ---- the dcpo policy loss -----------------------------------------------------------------------


def actor_config(**clip):
    return ActorConfig(
        strategy="fsdp",  # a label: the loss reads the clip ratios and global_batch_info only
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        use_torch_compile=False,
        **clip,
    )


def loss_inputs(seed=0, batch=4, length=6, spread=0.8):
    generator = torch.Generator().manual_seed(seed)
    old_log_prob = torch.rand(batch, length, generator=generator).clamp(min=1e-3).log()
    log_prob = old_log_prob + spread * torch.randn(batch, length, generator=generator)
    advantages = torch.randn(batch, 1, generator=generator).expand(batch, length).clone()
    mask = torch.ones(batch, length)
    mask[0, 4:] = 0
    return old_log_prob, log_prob, advantages, mask


def test_dcpo_policy_loss_is_the_hand_computed_dynamic_clip_objective():
    eps_low, eps_high, c = 0.2, 0.28, 10.0
    config = actor_config(clip_ratio_low=eps_low, clip_ratio_high=eps_high, clip_ratio_c=c)
    old_log_prob, log_prob, advantages, mask = loss_inputs()
    loss, metrics = core_algos.get_policy_loss_fn("dcpo")(
        old_log_prob, log_prob, advantages, mask, loss_agg_mode="token-mean", config=config
    )
    q, ratio = old_log_prob.exp(), (log_prob - old_log_prob).exp()
    low = 0.5 + 0.5 * torch.sqrt(torch.clamp(1 - 4 * eps_low / q, min=0))
    high = torch.clamp(0.5 + 0.5 * torch.sqrt(1 + 4 * eps_high / q), max=c)
    token = torch.maximum(-advantages * ratio, -advantages * torch.minimum(torch.maximum(ratio, low), high))
    token = torch.where(advantages < 0, torch.minimum(token, -advantages * c), token)
    assert torch.allclose(loss, (token * mask).sum() / mask.sum(), atol=1e-6)
    assert 0 < metrics["actor/pg_clipfrac"] < 1


def test_dcpo_policy_loss_equals_vanilla_where_the_bounds_coincide():
    # Every token with old probability q: DCPO's ε = q·a(1-a) and q·b(1+b) give PPO's [1-a, 1+b].
    a, b, q = 0.2, 0.28, 0.5
    old_log_prob, log_prob, advantages, mask = loss_inputs(seed=1, batch=8, spread=1.5)
    old_log_prob = torch.full_like(old_log_prob, math.log(q))
    low, high = dynamic_clip_bounds(old_log_prob, q * a * (1 - a), q * b * (1 + b))
    assert torch.allclose(low, torch.full_like(low, 1 - a)) and torch.allclose(high, torch.full_like(high, 1 + b))
    dcpo_config = actor_config(clip_ratio_low=q * a * (1 - a), clip_ratio_high=q * b * (1 + b), clip_ratio_c=3.0)
    vanilla_config = actor_config(clip_ratio_low=a, clip_ratio_high=b, clip_ratio_c=3.0)
    weights = torch.rand(old_log_prob.shape, generator=torch.Generator().manual_seed(2))
    for mode in ("token-mean", "seq-mean-token-mean"):
        ours, our_metrics = core_algos.get_policy_loss_fn("dcpo")(
            old_log_prob, log_prob, advantages, mask, mode, dcpo_config, rollout_is_weights=weights
        )
        theirs, their_metrics = core_algos.get_policy_loss_fn("vanilla")(
            old_log_prob, log_prob, advantages, mask, mode, vanilla_config, rollout_is_weights=weights
        )
        assert torch.allclose(ours, theirs, atol=1e-6), mode
        for name in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
            assert our_metrics[name] == pytest.approx(their_metrics[name], abs=1e-6), name
    assert their_metrics["actor/pg_clipfrac"] > 0 and their_metrics["actor/pg_clipfrac_lower"] > 0


def test_dcpo_policy_loss_clamps_the_log_ratio_like_vanilla():
    # One token's log-ratio of 30 is clamped to 20, as verl's vanilla loss does; with bounds that
    # equal PPO's (previous test) the two losses then agree on it too.
    a, b, q = 0.2, 0.28, 0.5
    old_log_prob, log_prob, advantages, mask = loss_inputs(seed=3)
    old_log_prob = torch.full_like(old_log_prob, math.log(q))
    log_prob = old_log_prob.clone()
    log_prob[0, 0] += 30.0
    advantages = -advantages.abs()  # negative: the dual clip binds at clip_ratio_c
    dcpo_config = actor_config(clip_ratio_low=q * a * (1 - a), clip_ratio_high=q * b * (1 + b), clip_ratio_c=3.0)
    vanilla_config = actor_config(clip_ratio_low=a, clip_ratio_high=b, clip_ratio_c=3.0)
    ours, our_metrics = core_algos.get_policy_loss_fn("dcpo")(
        old_log_prob, log_prob, advantages, mask, "token-mean", dcpo_config
    )
    theirs, their_metrics = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob, log_prob, advantages, mask, "token-mean", vanilla_config
    )
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert our_metrics["actor/ppo_kl"] == pytest.approx(their_metrics["actor/ppo_kl"], abs=1e-6)
    assert their_metrics["actor/ppo_kl"] == pytest.approx(-20.0 / mask.sum().item(), abs=1e-6)


def test_dcpo_policy_loss_refuses_a_dual_clip_constant_of_at_most_one():
    with pytest.raises(ValueError, match="clip_ratio_c=1.0 is invalid for the dcpo policy loss"):
        core_algos.get_policy_loss_fn("dcpo")(*loss_inputs(), "token-mean", actor_config(clip_ratio_c=1.0))
