"""The ACR hook for stock verl (``trainer.v1.sampler.custom_sampler``) against verl's real trainer
constructor, its real replay buffers and a real TransferQueue on a local Ray cluster: verl builds it around
its own buffer, and it adopts verl's trainer, which then measures each sampled batch at the advantage stage.

verl's own ``PPOTrainerSync`` / ``PPOTrainerColocateAsync`` ``__init__`` builds the hook (it needs no
GPU). Stubbed, and only that: ``_add_prompts_to_generate``, the refill that would dispatch prompts
to the rollout (GPU) workers; here it records what it was asked for. Groups are written to
TransferQueue as verl's agent loop and reward loop write them (a finished prompt tag, and per
response ``uid`` and ``rm_scores``).
"""

import pytest
import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from verl_avspo.verl_plugin import run_state
from verl_avspo.verl_plugin.checks import HOOK_OVERRIDES
from verl_avspo.verl_plugin.launcher import compose_config
from verl_avspo.verl_plugin.sampler import ACRSampler
from verl_avspo.verl_plugin.trainer_v1 import AVSPOTrainerV1Mixin

pytestmark = [pytest.mark.usefixtures("transfer_queue_cluster", "fresh_estimator_state"), pytest.mark.verl]

BASE = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=4", "trainer.logger=[console]"]
DAPO = ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=reward"]


class RefillRecorder:
    """verl's trainer with the rollout dispatch replaced by a record of the prompts asked for."""

    def _add_prompts_to_generate(self, count):
        self.refills.append(count)


class SyncTrainer(RefillRecorder, PPOTrainerSync):
    refills: list


class ColocateAsyncTrainer(RefillRecorder, PPOTrainerColocateAsync):
    refills: list


def build(trainer_cls, *overrides):
    mode = "colocate_async" if trainer_cls is ColocateAsyncTrainer else "sync"
    config = compose_config([*BASE, *HOOK_OVERRIDES, f"trainer.v1.trainer_mode={mode}", *overrides])
    OmegaConf.resolve(config)  # as TaskRunnerV1.run does
    trainer_cls.refills = []
    return trainer_cls(config=config)


def put_finished_groups(tag, groups):
    """One finished prompt group per list of scores, as the agent and reward loops leave them."""
    uids = [f"{tag}g{g}" for g in range(len(groups))]
    tq.kv_batch_put(
        keys=uids,
        partition_id="train",
        tags=[{"is_prompt": True, "status": "finished", "global_steps": 1} for _ in uids],
    )
    keys, fields = [], []
    for uid, scores in zip(uids, groups, strict=True):
        for s, score in enumerate(scores):
            rm_scores = torch.zeros(3)
            rm_scores[-1] = score
            keys.append(f"{uid}_{s}_0")
            fields.append({"uid": uid, "response_mask": torch.ones(3, dtype=torch.int64), "rm_scores": rm_scores})
    tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=[{}] * len(keys))


def clear(batch):
    tq.kv_clear(keys=batch.keys, partition_id=batch.partition_id)


@pytest.mark.parametrize(
    ("trainer_cls", "buffer_cls"), [(SyncTrainer, ReplayBuffer), (ColocateAsyncTrainer, ReplayBufferAsync)]
)
def test_verl_builds_the_hook_around_its_own_buffer_with_dapo_arguments(trainer_cls, buffer_cls):
    trainer = build(trainer_cls, *DAPO)
    hook = trainer.replay_buffer
    assert isinstance(hook, ACRSampler) and type(hook.buffer) is buffer_cls
    # What verl gives its built-in buffer and not a custom sampler (trainer_base.py:163-184).
    assert hook.buffer.filter_groups_metric == "reward"
    assert hook.buffer.refill_fn == trainer._add_prompts_to_generate
    if buffer_cls is ReplayBuffer:
        assert (hook.buffer.train_batch_size, hook.buffer.gen_batch_size) == (trainer.config.data.train_batch_size, 1)
    # The custom sampler is named again once the buffer is built; the built-in buffer's methods show through.
    assert trainer.config.trainer.v1.sampler.custom_sampler.path == "pkg://verl_avspo.verl_plugin.sampler"
    assert hook.poll_interval == hook.buffer.poll_interval and hasattr(hook, "wait_for_sampleable") == (
        buffer_cls is ReplayBufferAsync
    )


def test_without_dapo_the_hook_wraps_verls_plain_buffer():
    hook = build(SyncTrainer).replay_buffer
    assert type(hook.buffer) is ReplayBuffer and hook.buffer.filter_groups_metric is None


def test_the_hook_adopts_verls_trainer_as_the_launchers():
    for trainer_cls in (SyncTrainer, ColocateAsyncTrainer):
        trainer = build(trainer_cls, "algorithm.adv_estimator=avspo")
        assert isinstance(trainer, AVSPOTrainerV1Mixin) and isinstance(trainer, trainer_cls)
        assert type(trainer).__name__ == trainer_cls.__name__  # verl's own checks of the class still hold
        assert run_state.bound_tracker() is trainer.tracker and trainer.tracker.controller is not None


def test_a_sampled_batch_is_measured_at_the_advantage_stage():
    trainer = build(SyncTrainer, "algorithm.adv_estimator=grpo")
    put_finished_groups("a", [[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]])
    batch, metrics = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=4)
    assert len(batch.keys) == 16 and not any(key.startswith("acr/") for key in metrics)
    batch = trainer._compute_advantage(batch, metrics)
    assert metrics["acr/rate"] == 0.75 and metrics["acr/groups"] == 4 and metrics["acr/effective"] == 0.75
    assert (metrics["acr/all_correct"], metrics["acr/all_wrong"]) == (0.25, 0.5)
    assert metrics["acr/reward_mean"] == pytest.approx((1 + 0 + 0 + 0.5) / 4)
    assert 0 < metrics["timing_s/acr"] < 60  # what measuring cost, beside verl's stage timings
    assert not any(key.startswith("avspo/") for key in metrics)
    clear(batch)


def test_groups_dapo_filtered_while_sampling_count_in_acr_and_filtering_still_happens():
    trainer = build(SyncTrainer, "algorithm.adv_estimator=grpo", *DAPO)
    put_finished_groups("b", [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 1, 0]])
    batch, metrics = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    # verl's filter evicted the two collapsed groups; the two left fill the batch, so nothing is refilled.
    assert metrics["training/filter_groups/evicted_samples"] == 2 and trainer.refills == []
    assert sorted({key.split("_")[0] for key in batch.keys}) == ["bg2", "bg3"]
    batch = trainer._compute_advantage(batch, metrics)
    # Measured before filtering: 2 of the 4 generated groups collapsed, though the batch has none.
    assert metrics["acr/rate"] == 0.5 and metrics["acr/groups"] == 4 and metrics["acr/effective"] == 0.0
    assert (metrics["acr/all_correct"], metrics["acr/all_wrong"]) == (0.25, 0.25)
    clear(batch)


def test_avspo_metrics_arrive_in_the_step_they_describe():
    trainer = build(SyncTrainer, "algorithm.adv_estimator=avspo", "algorithm.avspo.threshold_init=0.2")
    put_finished_groups("c", [[1, 0, 0, 0], [0, 0, 0, 0]])
    batch, metrics = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    batch = trainer._compute_advantage(batch, metrics)
    assert metrics["avspo/signal"] == 0.5 and metrics["avspo/threshold"] == 0.2  # 1 of 2 groups collapsed
    assert metrics["avspo/triggered"] == 0.5 and metrics["acr/rate"] == 0.5 and metrics["acr/effective"] == 0.0
    clear(batch)


def test_the_hook_refuses_to_be_built_outside_verls_trainer():
    with pytest.raises(TypeError, match="name it in trainer.v1.sampler.custom_sampler.path="):
        ACRSampler(trainer_mode="sync", refill_fn=None)
