"""Prompt skipping before rollout in the V1 trainer (its ``_next_train_batch`` with ``prompt_hooks.PromptSkipping``,
and with DAPO the top-up of the places skipping left open) and the rollouts each dispatch generates:
verl's own ``_next_train_batch`` and ``_fetch_one_gen_batch`` on a real ``StatefulDataLoader`` with
verl's ``collate_fn``, the tracker's skip rule (``core.prompt_skip``) deciding. The trainer is built
with ``__new__`` and given only what those methods read (no Ray, no workers); the launcher's e2e runs
skip in real runs (tests/e2e/test_verl_cpu_e2e.py)."""

import logging
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.dataset.rl_dataset import collate_fn

from verl_avspo.core.acr_config import ACRConfig
from verl_avspo.core.baseline_settings import IntrinsicConfig
from verl_avspo.core.prompt_skip import PromptSkipConfig
from verl_avspo.core.run_tracker import RunTracker
from verl_avspo.verl_plugin.prompt_identity import PromptIdentity, prompt_key
from verl_avspo.verl_plugin.trainer import AVSPOTrainer

pytestmark = pytest.mark.verl

# A once-collapsed prompt is kept with probability 0.05 (fixed): the rule's effect is visible in a few draws.
STRICT = PromptSkipConfig(enable=True, explore=0.05, adaptive=False)


class Trainer(AVSPOTrainer, PPOTrainerSync):
    verl_mode = "sync"


def rows(count: int = 8) -> list[dict]:
    """Dataset rows as verl's RLHFDataset returns them, less the token ids (not read here)."""
    return [
        {"index": i, "raw_prompt": [{"role": "user", "content": f"{i}+{i}="}], "dummy_tensor": torch.zeros(1)}
        for i in range(count)
    ]


def trainer(skip: PromptSkipConfig | None = STRICT, source: str = "index", batch: int = 4) -> Trainer:
    made = Trainer.__new__(Trainer)
    made.config = OmegaConf.create(
        {"data": {"train_batch_size": batch, "gen_batch_size": None}, "actor_rollout_ref": {"rollout": {"n": 4}}}
    )
    made.train_dataloader = StatefulDataLoader(rows(), batch_size=batch, drop_last=True, collate_fn=collate_fn)
    made.train_dataloader_it, made.global_steps = None, 1
    made._assemble(RunTracker(ACRConfig(), prompt_skip=skip), PromptIdentity(source, "test"), IntrinsicConfig())
    return made


def indices(batch) -> list[int]:
    return list(batch["index"])


def collapse(made: Trainer, keys: list, step: int = 1) -> None:
    """Record one all-correct visit of each of ``keys`` in the tracker's history."""
    ones = np.ones(len(keys), dtype=bool)
    made.tracker.prompt_history.record(keys, np.ones(len(keys)), ones, ~ones, step)


def test_without_skipping_the_batch_is_verls():
    made = trainer(skip=None)
    collapse(made, [0, 1, 2, 3])
    assert indices(made._next_train_batch()) == [0, 1, 2, 3]


def test_collapsed_prompts_are_skipped_and_the_batch_refilled():
    made = trainer()
    assert indices(made._next_train_batch()) == [0, 1, 2, 3]  # nothing seen yet: all kept
    assert indices(made._next_train_batch()) == [4, 5, 6, 7]
    collapse(made, [0, 1])
    made.global_steps = 3
    batch = made._next_train_batch()  # epoch 2: 0 and 1 skipped, 4 and 5 of the next chunk fill in
    assert indices(batch) == [2, 3, 4, 5] and len(batch["uid"]) == 4
    assert batch["global_steps"] == 3
    metrics = {"acr/rate": 0.0, "acr/all_wrong": 0.0, "acr/reward_mean": 0.0}  # the step's own, from its batch
    made.tracker.observe_step(3, metrics)
    # The refill rolled out 4 and 5 in their place: re-selections, no rollout saved.
    assert metrics["prompts/skipped"] == 2 and metrics["prompts/reselected"] == 2
    assert metrics["prompts/rollouts_skipped"] == 0 and metrics["prompts/rollouts_skipped_cumulative"] == 0


def test_prompts_keyed_by_their_messages_are_skipped_alike():
    made = trainer(source="raw_prompt")
    collapse(made, [prompt_key([{"role": "user", "content": f"{i}+{i}="}], "raw_prompt") for i in (0, 1)])
    assert indices(made._next_train_batch()) == [2, 3, 4, 5]


def test_a_restored_skipper_skips_what_the_uninterrupted_one_does():
    loose = PromptSkipConfig(enable=True, explore=0.5, adaptive=False, seed=3)
    straight, first = trainer(loose), trainer(loose)
    for made in (straight, first):
        collapse(made, list(range(8)))
    picks = [indices(straight._next_train_batch()) for _ in range(4)]
    assert indices(first._next_train_batch()) == picks[0]
    resumed = trainer(loose)
    resumed.tracker.load_state_dict(first.tracker.state_dict())
    resumed.train_dataloader.load_state_dict(first.train_dataloader.state_dict())
    assert [indices(resumed._next_train_batch()) for _ in range(3)] == picks[1:]
    assert len({tuple(p) for p in picks}) > 1  # the draws differ from step to step


def test_a_whole_epoch_rejected_fills_the_batch_without_the_rule(caplog):
    made = trainer()
    for step in range(1, 13):  # 12 collapsed visits each: kept with probability 0.05**12
        collapse(made, list(range(8)), step)
    with caplog.at_level(logging.WARNING, logger="verl_avspo.verl_plugin.prompt_hooks"):
        batch = made._next_train_batch()
    assert len(indices(batch)) == 4
    assert "a whole epoch of prompts was skipped" in caplog.text
    # The epoch's two chunks skipped (8 prompts), then the next chunk kept whatever the rule says.
    assert indices(batch) == [0, 1, 2, 3] and made.tracker._prompts.skipped == 8


def test_a_replay_buffer_of_the_users_own_is_left_unwrapped(caplog):
    """The groups verl's replay buffer drops reach the history through its _clear_groups
    (tests/verl_plugin/test_trainer_modes.py); a custom sampler that is not verl's is left alone."""
    made = trainer()
    made.replay_buffer = SimpleNamespace(sample=lambda **kwargs: None)
    with caplog.at_level(logging.INFO, logger="verl_avspo.verl_plugin.prompt_hooks"):
        made.records.watch(made.replay_buffer)
        made.records.watch(made.replay_buffer)  # once per buffer
    assert not hasattr(made.replay_buffer, "_clear_groups")
    assert caplog.text.count("not recorded in the per-prompt history") == 1


def test_every_dispatch_counts_its_rollouts_as_a_generation_batch():
    made = trainer(skip=None)
    made._next_train_batch()
    made._next_train_batch(4)  # a refill dispatch (DAPO's, an async mode's exact count)
    metrics: dict = {}
    made.tracker.observe_step(1, metrics)
    assert (metrics["train/rollouts_generated"], metrics["train/gen_batches"]) == (32, 2)
    made._next_train_batch()
    made.tracker.observe_step(2, metrics)
    assert (metrics["train/rollouts_generated"], metrics["train/rollouts_cumulative"]) == (16, 48)


def dapo_trainer() -> Trainer:
    """A sync trainer with DAPO's filter_groups, a verl ReplayBuffer (only what the top-up reads) and a
    rollout that records what it is sent."""
    made = trainer()
    made.config.algorithm = {"filter_groups": {"enable": True}}
    made.config.data.gen_batch_size = 1  # verl's with DAPO: refills fetch single prompts
    made.train_dataloader = StatefulDataLoader(rows(), batch_size=1, drop_last=True, collate_fn=collate_fn)
    made.trainer_mode = "sync"
    buffer = ReplayBuffer.__new__(ReplayBuffer)
    buffer.pending_keys, buffer.running_keys = defaultdict(set), defaultdict(set)
    buffer.finished_keys, buffer.failure_keys = defaultdict(set), defaultdict(set)
    buffer._wait_for_next_poll = lambda partition_id, last: last
    made.replay_buffer, made.sent = buffer, []
    made._submit_batch_to_rollout = lambda batch: made.sent.append(indices(batch)) or len(batch)
    made.skipping.watch(buffer, made.config.data.train_batch_size, made._add_prompts_to_generate)  # as step does
    return made


def test_with_dapo_skipped_places_stay_open_until_the_buffer_runs_out_of_work():
    """DAPO's sync buffer generates more prompts for the groups it evicts: a skipped prompt's place is filled
    only when the buffer polls with nothing in flight, and the places never needed saved their rollouts."""
    made = dapo_trainer()
    made._next_train_batch(), made._next_train_batch()  # epoch 1: nothing seen, nothing skipped
    collapse(made, [0, 1])
    made.tracker.observe_step(1, {})
    assert indices(made._next_train_batch()) == [2, 3]  # 0 and 1 skipped, not replaced: two places open
    buffer = made.replay_buffer
    buffer.running_keys["train"].add("uid")
    buffer._wait_for_next_poll("train", 0.0)  # work in flight (DAPO's refills may bring what is missing)
    assert made.sent == [] and made.skipping.open_places == 2
    buffer.running_keys["train"].clear()
    buffer._wait_for_next_poll("val", 0.0)  # validation is not the step's
    buffer.finished_keys["train"].update({"a", "b", "c"})  # 3 groups with spread of the 4 it needs
    buffer._wait_for_next_poll("train", 0.0)  # idle and short by one: one open place is filled
    assert made.sent == [[4]] and made.skipping.open_places == 1
    buffer.finished_keys["train"].remove("c")  # (had DAPO evicted two)
    buffer._wait_for_next_poll("train", 0.0)
    assert made.sent == [[4], [5]] and made.skipping.open_places == 0
    metrics: dict = {}
    made.skipping.close_step()
    made.tracker.observe_step(2, metrics)
    assert (metrics["prompts/skipped"], metrics["prompts/reselected"], metrics["prompts/rollouts_skipped"]) == (2, 2, 0)
    assert (metrics["train/rollouts_generated"], metrics["train/gen_batches"]) == (16, 3)
    # A step whose buffer never ran short (its DAPO refills filled it): the open places saved their rollouts.
    collapse(made, [6, 7], step=2)
    made._next_train_batch()
    made.skipping.close_step()
    made.tracker.observe_step(3, metrics)
    # (A dispatch sends at least one prompt: where every candidate of the batch is skipped, one further draw
    # fills one place, a re-selection.)
    open_places = metrics["prompts/rollouts_skipped"] / 4
    assert open_places > 0 and metrics["prompts/reselected"] == metrics["prompts/skipped"] - open_places
    assert metrics["train/rollouts_generated"] + metrics["prompts/rollouts_skipped"] == 16  # the batch's 4 places
    assert made.sent == [[4], [5]]


def test_with_dapo_and_a_sampler_of_the_users_own_skipped_places_are_refilled_at_once():
    """Only verl's sync buffer is known to top a step up (and only it is wrapped to fill open places): with
    another sampler a place left open could stall the step, so each is refilled at once."""
    made = dapo_trainer()
    made.replay_buffer = SimpleNamespace(sample=lambda **kwargs: None)
    made._next_train_batch(), made._next_train_batch()
    collapse(made, [0, 1])
    assert indices(made._next_train_batch()) == [2, 3, 4, 5]  # as without DAPO
