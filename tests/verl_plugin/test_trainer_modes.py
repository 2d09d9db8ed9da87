"""Our trainer modes in verl's own trainer registry, against verl's real trainer constructor, its real replay
buffers and a real TransferQueue on a local Ray cluster: ``get_trainer_cls("avspo_<mode>")`` (what stock
``main_ppo`` calls) gives our trainer, which presents verl's own mode name to every reader of the mode, keeps
verl's buffer for the mode (DAPO's arguments included), and measures each sampled batch at the advantage stage.

verl's own ``PPOTrainer.__init__`` builds the trainer (it needs no GPU). Stubbed, and only that:
``_add_prompts_to_generate``, the refill that would dispatch prompts to the rollout (GPU) workers; here it
records what it was asked for. Groups are written to TransferQueue as verl's agent loop and reward loop write
them (a finished prompt tag, and per response ``uid`` and ``rm_scores``).
"""

import numpy as np
import pytest
import transfer_queue as tq
from helpers import make_trainer, put_groups
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from verl_avspo.verl_plugin.trainer import AVSPOTrainer
from verl_avspo.verl_plugin.trainer_modes import MODES
from verl_avspo.verl_plugin.trainer_v1 import V1_TRAINERS

pytestmark = [pytest.mark.usefixtures("transfer_queue_cluster", "fresh_estimator_state"), pytest.mark.verl]

DAPO = ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=reward"]


class RefillRecorder(PPOTrainer):
    """verl's trainer with the rollout dispatch replaced by a record of the prompts asked for."""

    def _add_prompts_to_generate(self, count):
        self.refills.append(count)


# Our trainer of each mode (as verl's registry gives it) with the rollout dispatch recorded.
RECORDING = {
    mode: type(cls.__name__, (RefillRecorder, get_trainer_cls(mode)), {"refills": []})
    for mode, cls in V1_TRAINERS.items()
}


def build(mode, *overrides):
    RECORDING[mode].refills = []
    return make_trainer(f"trainer.v1.trainer_mode={mode}", *overrides, trainer_cls=RECORDING[mode])


def test_verls_registry_gives_our_trainer_for_each_of_our_modes():
    assert set(V1_TRAINERS) == set(MODES) == {"avspo_sync", "avspo_colocate_async", "avspo_separate_async"}
    for mode, cls in V1_TRAINERS.items():
        assert get_trainer_cls(mode) is cls and issubclass(cls, AVSPOTrainer)
        assert issubclass(cls, get_trainer_cls(MODES[mode]))  # verl's own trainer of that mode
    assert get_trainer_cls("sync").__module__.startswith("verl.")  # verl's own names are left alone


@pytest.mark.parametrize(
    ("mode", "buffer_cls"), [("avspo_sync", ReplayBuffer), ("avspo_colocate_async", ReplayBufferAsync)]
)
def test_our_trainer_shows_verl_its_own_mode_name_and_keeps_verls_buffer_with_dapo_arguments(mode, buffer_cls):
    trainer = build(mode, *DAPO)
    verl_name = MODES[mode]
    # Every reader of the mode (docs/architecture.md, "Trainer modes") reads it from these two places.
    assert trainer.trainer_mode == verl_name and trainer.config.trainer.v1.trainer_mode == verl_name
    assert type(trainer.replay_buffer) is buffer_cls  # trainer_base.py:153 chose by verl's name
    assert trainer.replay_buffer.trainer_mode == verl_name
    assert trainer.replay_buffer.filter_groups_metric == "reward"
    assert trainer.replay_buffer.refill_fn == trainer._add_prompts_to_generate
    if buffer_cls is ReplayBuffer:
        assert (trainer.replay_buffer.train_batch_size, trainer.replay_buffer.gen_batch_size) == (
            trainer.config.data.train_batch_size,
            1,
        )
    # The mode's own section of trainer.v1 reached verl (trainer_base.py:130, :157; rollout_skip.py:189 reads
    # the same config object).
    assert trainer.replay_buffer.trainer_config == trainer.config.trainer.v1[verl_name]


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


def test_a_sampled_batch_is_measured_at_the_advantage_stage():
    trainer = build("avspo_sync", "algorithm.adv_estimator=grpo")
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
    trainer = build("avspo_sync", "algorithm.adv_estimator=grpo", *DAPO)
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
    trainer = build("avspo_sync", "algorithm.adv_estimator=grpo", "algorithm.prompts.key=index", *DAPO)
    group_size = trainer.config.actor_rollout_ref.rollout.n
    # Two collapsed groups (DAPO evicts them), three with a spread for two places (one is surplus).
    scores = [[1] * group_size, [0] * group_size, *([1] + [0] * (group_size - 1) for _ in range(3))]
    put_finished_groups("h", scores, group_fields=[{"index": 10 + g} for g in range(len(scores))])
    trainer.records.watch(trainer.replay_buffer)  # what the trainer's step does first
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
    trainer = build("avspo_sync", "algorithm.adv_estimator=avspo", "algorithm.avspo.threshold_init=0.2")
    put_finished_groups("c", [[1, 0, 0, 0], [0, 0, 0, 0]])
    batch, metrics = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    batch = trainer._compute_advantage(batch, metrics)
    assert metrics["avspo/signal"] == 0.5 and metrics["avspo/threshold"] == 0.2  # 1 of 2 groups collapsed
    assert metrics["avspo/triggered"] == 0.5 and metrics["acr/rate"] == 0.5 and metrics["acr/effective"] == 0.0
    clear(batch)
