"""The ACR hook for stock verl (``trainer.v1.sampler.custom_sampler``) against verl's real trainer
constructor, its real replay buffers and a real TransferQueue on a local Ray cluster: verl builds it around
its own buffer, and it adopts verl's trainer, which then measures each sampled batch at the advantage stage.

verl's own ``PPOTrainerSync`` / ``PPOTrainerColocateAsync`` ``__init__`` builds the hook (it needs no
GPU). Stubbed, and only that: ``_add_prompts_to_generate``, the refill that would dispatch prompts
to the rollout (GPU) workers; here it records what it was asked for. Groups are written to
TransferQueue as verl's agent loop and reward loop write them (a finished prompt tag, and per
response ``uid`` and ``rm_scores``).
"""

import numpy as np
import pytest
import transfer_queue as tq
from helpers import make_trainer, put_groups
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_avspo.verl_plugin import run_state
from verl_avspo.verl_plugin.checks import HOOK_OVERRIDES
from verl_avspo.verl_plugin.sampler import ACRSampler
from verl_avspo.verl_plugin.trainer_v1 import AVSPOTrainerV1Mixin, adopt, adopted_class

pytestmark = [pytest.mark.usefixtures("transfer_queue_cluster", "fresh_estimator_state"), pytest.mark.verl]

DAPO = ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=reward"]


class RefillRecorder(PPOTrainer):
    """verl's trainer with the rollout dispatch replaced by a record of the prompts asked for."""

    def _add_prompts_to_generate(self, count):
        self.refills.append(count)


class SyncTrainer(RefillRecorder, PPOTrainerSync):
    refills: list


class ColocateAsyncTrainer(RefillRecorder, PPOTrainerColocateAsync):
    refills: list


def build(trainer_cls, *overrides):
    mode = "colocate_async" if trainer_cls is ColocateAsyncTrainer else "sync"
    trainer_cls.refills = []
    return make_trainer(*HOOK_OVERRIDES, f"trainer.v1.trainer_mode={mode}", *overrides, trainer_cls=trainer_cls)


def put_finished_groups(tag, groups, group_fields=None):
    """One finished prompt group per list of scores, as the agent and reward loops leave them."""
    uids = [f"{tag}g{g}" for g in range(len(groups))]
    tq.kv_batch_put(
        keys=uids,
        partition_id="train",
        tags=[{"is_prompt": True, "status": "finished", "global_steps": 1} for _ in uids],
    )
    put_groups(tag, groups, length=3, group_fields=group_fields)


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


@pytest.mark.parametrize("cls", [PPOTrainerSync, PPOTrainerColocateAsync, PPOTrainerSeparateAsync])
def test_an_object_of_each_of_verls_own_trainer_classes_can_take_the_adopted_class(cls):
    # What stock main_ppo builds: verl's class itself (the CPU e2e once failed here with "object layout differs").
    trainer = object.__new__(cls)
    trainer.__class__ = adopted_class(cls)
    assert isinstance(trainer, AVSPOTrainerV1Mixin) and isinstance(trainer, cls)


def test_a_class_python_cannot_change_is_refused_with_the_fix():
    class PlainMixin:  # adds its own instance layout, unlike verl's ABC-based trainers
        pass

    cls = type("Custom", (PlainMixin, PPOTrainerSync), {})
    with pytest.raises(TypeError, match=r"Base your mixins on abc\.ABC .*python -m verl_avspo\.main_ppo"):
        adopt(object.__new__(cls))


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


def test_groups_dapo_filtered_while_sampling_reach_the_prompt_history():
    trainer = build(SyncTrainer, "algorithm.adv_estimator=grpo", "algorithm.prompts.key=index", *DAPO)
    group_size = trainer.config.actor_rollout_ref.rollout.n
    # Two collapsed groups (DAPO evicts them), three with a spread for two places (one is surplus).
    scores = [[1] * group_size, [0] * group_size, *([1] + [0] * (group_size - 1) for _ in range(3))]
    put_finished_groups("h", scores, group_fields=[{"index": 10 + g} for g in range(len(scores))])
    trainer._record_dropped_groups()  # what the trainer's step does first
    batch, metrics = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    assert metrics["training/filter_groups/evicted_samples"] == 2
    assert metrics["training/filter_groups/discarded_surplus_samples"] == 1
    batch = trainer._compute_advantage(batch, metrics)
    trainer.tracker.observe_step(1, metrics)  # the step closes: its groups enter the history
    assert metrics["prompts/seen"] == 5  # the two trained groups, the two DAPO filtered and the surplus one
    seen = trainer.tracker.prompt_history.lookup(np.arange(10, 15))
    assert seen.visits.tolist() == [1] * 5
    assert seen.all_correct.tolist() == [1, 0, 0, 0, 0] and seen.all_wrong.tolist() == [0, 1, 0, 0, 0]
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
