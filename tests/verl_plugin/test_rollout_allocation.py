"""Per-prompt rollout allocation in verl's V1 trainers (``verl_plugin.rollout_allocation``): each dispatch's
counts written as verl's ``__rollout_n__`` and the pilot field, the pilots' outcomes read back at the
advantage stage, the agent-loop worker's pilot-then-rest control flow, and the start-up refusals with their
fixes. The trainer and the worker are built with ``__new__`` and given only what these methods read (no Ray,
no model); the worker's agent loop is a stand-in that returns a set reward, and TransferQueue calls are
recorded. The real route, with verl's agent loop and replay buffer, runs in tests/e2e/test_verl_cpu_e2e.py."""

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.import_utils import load_class_from_fqn

from verl_avspo.core.acr_config import ACRConfig
from verl_avspo.core.baseline_settings import IntrinsicConfig
from verl_avspo.core.prompt_allocation import PromptAllocationConfig
from verl_avspo.core.run_tracker import RunTracker
from verl_avspo.verl_plugin import prompt_hooks, rollout_allocation
from verl_avspo.verl_plugin.checks import settings_problems
from verl_avspo.verl_plugin.launcher import compose_config
from verl_avspo.verl_plugin.prompt_identity import ALLOCATION_MANAGER, PromptIdentity
from verl_avspo.verl_plugin.rollout_allocation import (
    PILOT_FIELD,
    ROLLOUT_N_FIELD,
    AllocatingAgentLoopManager,
    AllocatingAgentLoopWorker,
    prepare_allocation,
)
from verl_avspo.verl_plugin.settings import parse_settings
from verl_avspo.verl_plugin.trainer import AVSPOTrainer
from verl_avspo.verl_plugin.v1_batch import ScoredRows

pytestmark = pytest.mark.verl

GROUP_SIZE = 4
# No extras (max_group_size = G): a step's rollouts are G per full group and the pilot per pilot.
NO_EXTRAS = PromptAllocationConfig(enable=True, max_group_size=GROUP_SIZE)
ALLOCATE = ["actor_rollout_ref.rollout.name=vllm", "algorithm.prompts.allocation.enable=True"]


class Trainer(AVSPOTrainer, PPOTrainerSync):
    verl_mode = "sync"


def trainer(allocation: PromptAllocationConfig = NO_EXTRAS) -> Trainer:
    made = Trainer.__new__(Trainer)
    made.config = OmegaConf.create(
        {"data": {"train_batch_size": 4, "gen_batch_size": None}, "actor_rollout_ref": {"rollout": {"n": GROUP_SIZE}}}
    )
    rows = [{"index": i, "raw_prompt": [{"role": "user", "content": f"{i}+{i}="}]} for i in range(8)]
    made.train_dataloader = StatefulDataLoader(rows, batch_size=4, drop_last=True, collate_fn=collate_fn)
    made.train_dataloader_it, made.global_steps = None, 1
    tracker = RunTracker(ACRConfig())
    tracker.set_prompt_allocation(allocation)
    made._assemble(tracker, PromptIdentity("index", "test"), IntrinsicConfig())
    return made


def prepare(config) -> bool:
    """Our trainer's start-up step for the allocator, on the run's parsed settings (as ``__init__`` calls it)."""
    return prepare_allocation(config, parse_settings(config.algorithm).prompts)


def test_each_dispatch_writes_verls_per_prompt_count_and_counts_the_first_pass():
    made = trainer()
    first = made._next_train_batch()
    assert first[ROLLOUT_N_FIELD].tolist() == [GROUP_SIZE] * 4 and first[PILOT_FIELD].tolist() == [0] * 4
    # Prompts 4 and 6 collapsed on their last visit: a pilot of 2 each, the others the full group.
    made.tracker.prompt_history.record([4, 6], np.zeros(2), np.ones(2, dtype=bool), np.zeros(2, dtype=bool), 1)
    second = made._next_train_batch()
    assert list(second["index"]) == [4, 5, 6, 7]
    assert second[ROLLOUT_N_FIELD].tolist() == [2, 4, 2, 4]
    assert second[PILOT_FIELD].tolist() == [2, 0, 2, 0]
    metrics: dict = {}
    made.tracker.observe_step(1, metrics)
    assert metrics["train/rollouts_generated"] == 16 + 12 and metrics["prompts/pilots"] == 2


def test_a_budget_below_a_uniform_steps_leaves_prompts_out_and_the_buffer_waits_for_the_rest(monkeypatch):
    # Half a step's budget (8 of 16 rollouts) over 4 prompts never seen: two full groups, the other two left
    # out, in an order the allocator's seeded generator draws.
    made = trainer(PromptAllocationConfig(enable=True, max_group_size=GROUP_SIZE, budget_share=0.5))
    batch = made._next_train_batch()
    assert len(batch) == 2 and batch[ROLLOUT_N_FIELD].tolist() == [GROUP_SIZE] * 2
    assert set(batch["index"]) < {0, 1, 2, 3}
    # verl's sync step asks its replay buffer for data.train_batch_size groups; the step asks for the two.
    monkeypatch.setattr(PPOTrainerSync, "_step_once", lambda self, metrics, timing, size: size)
    assert made._step_once({}, {}, 4) == 2
    assert made._step_once({}, {}, 4) == 4  # the count is the step's: the next one starts afresh
    metrics: dict = {}
    made.tracker.observe_step(1, metrics)
    assert (metrics["prompts/unallocated"], metrics["train/rollouts_generated"]) == (2, 8)


def test_the_pilots_outcomes_are_read_from_their_groups_sessions(monkeypatch):
    made = trainer()
    # Rows {uid}_{session}_{output}: pilot a extended to 4 sessions, pilot b left at 2, c a full group whose
    # sessions wrote two outputs each (a multi-turn agent loop), which counts sessions, not rows.
    keys = [f"a_{s}_0" for s in range(4)] + ["b_0_0", "b_1_0"] + [f"c_{s}_{o}" for s in range(4) for o in range(2)]
    made.allocation.observe_pilots(keys, torch.tensor([2] * 6 + [0] * 8))
    metrics: dict = {}
    made.tracker.observe_step(1, metrics)
    assert metrics["prompts/pilots_extended"] == 1
    assert metrics["train/rollouts_generated"] == 2 and metrics["train/gen_batches"] == 0  # a's two added
    # The extended share moves from its start (0.25) toward this step's 1 of 2: 0.9 x 0.25 + 0.1 x 0.5.
    assert metrics["prompts/pilot_extend_rate"] == pytest.approx(0.275)


def test_groups_the_replay_buffer_evicts_are_recorded_whatever_their_size(monkeypatch):
    """A stale group verl's async buffer evicts never reaches the advantage stage: a pilot's group (2 responses)
    and an extended one (4) still count in the history, and the extension's rollouts as generated."""
    made = trainer()
    responses = {"a_0_0": 1.0, "a_1_0": 1.0, "b_0_0": 1.0, "b_1_0": 0.0, "b_2_0": 1.0, "b_3_0": 0.0, "c_0_0": 1.0}
    buffer = SimpleNamespace(
        finished_keys={"train": {"a", "b", "c"}},
        failure_keys={"train": {"c"}},  # a failed group's responses say nothing: left out
        partitions={"train": {"a": {"is_prompt": True}, **{key: {} for key in responses}}},
    )

    def read_scores(keys, partition_id, source, pilot_field):
        assert pilot_field == PILOT_FIELD  # read with the scores, in one TransferQueue read
        uids = np.array([key.split("_")[0] for key in keys], dtype=object)
        scores = torch.tensor([responses[key] for key in keys])
        return ScoredRows(scores, uids, [{"a": 0, "b": 2}[uid] for uid in uids], torch.tensor([2] * len(keys)))

    monkeypatch.setattr(prompt_hooks, "read_scores", read_scores)
    made.records.record_cleared(buffer, "train", {"a", "b", "c"})
    metrics: dict = {}
    made.tracker.observe_step(1, metrics)
    assert (metrics["prompts/pilots_extended"], metrics["train/rollouts_generated"]) == (1, 2)
    table = made.tracker.prompt_history.table()
    visits = dict(zip(table["key"].tolist(), table["visits"].tolist(), strict=True))
    assert visits == {0: 1, 2: 1}
    streaks = dict(zip(table["key"].tolist(), table["collapse_streak"].tolist(), strict=True))
    assert streaks == {0: 1, 2: 0}  # the pilot of two equal rewards collapsed; the extended group did not


def worker(rewards: dict, failing: set = frozenset()) -> tuple[AllocatingAgentLoopWorker, list, list]:
    """A worker whose agent loop returns ``rewards[session]`` (raising for the sessions in ``failing``),
    with the sessions it ran and the statuses it published."""
    made = AllocatingAgentLoopWorker.__new__(AllocatingAgentLoopWorker)
    made.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": GROUP_SIZE}}})
    made.acr, made._pilot_rewards, made._warned_no_reward = ACRConfig(), {}, False
    made.reward_loop_worker_handles = None
    sessions, statuses = [], []

    async def run_agent_loop(params, *, trajectory, trace, session_id, **prompt):
        sessions.append(session_id)
        if session_id in failing:
            raise RuntimeError("the agent loop failed")
        await made._compute_score([SimpleNamespace(reward_score=rewards.get(session_id))], {"uid": prompt["uid"]})

    made._run_agent_loop = run_agent_loop
    return made, sessions, statuses


@pytest.fixture
def published(monkeypatch):
    statuses = []

    async def kv_put(key, partition_id, tag):
        statuses.append((key, partition_id, tag["status"]))

    monkeypatch.setattr(rollout_allocation.tq, "async_kv_put", kv_put)
    return statuses


@pytest.mark.parametrize(
    ("rewards", "failing", "sessions", "status"),
    [
        ({0: 1.0, 1: 0.0}, set(), [0, 1, 2, 3], "finished"),  # a spread: the rest of the group, same uid
        ({0: 1.0, 1: 1.0}, set(), [0, 1], "finished"),  # collapsed: the pilot alone
        ({0: 1.0}, {1}, [0, 1], "failure"),  # a failed session: no extension, the group fails as verl's would
        ({0: None, 1: None}, set(), [0, 1, 2, 3], "finished"),  # no reward in the agent loop: extended
    ],
)
def test_a_pilot_runs_its_sessions_then_the_rest_where_they_spread(published, rewards, failing, sessions, status):
    made, ran, _ = worker(rewards, failing)
    prompt = {"uid": "u", PILOT_FIELD: torch.tensor(2), ROLLOUT_N_FIELD: torch.tensor(2)}
    asyncio.run(made._run_prompt(prompt, {}, {"validate": False}))
    assert sorted(ran) == sessions
    # One terminal status, after every session settled.
    assert published == [("u", "train", "running"), ("u", "train", status)]
    assert made._pilot_rewards == {}


def test_the_manager_and_its_workers_are_ours_by_verls_own_lookup():
    assert load_class_from_fqn(ALLOCATION_MANAGER, "AgentLoopManager") is AllocatingAgentLoopManager
    manager = AllocatingAgentLoopManager.__new__(AllocatingAgentLoopManager)
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {}, "model": {}}})
    AllocatingAgentLoopManager.__init__(manager, config, llm_client=None)
    assert manager.agent_loop_workers_class.__ray_actor_class__ is AllocatingAgentLoopWorker


def test_start_up_sets_our_manager_and_refuses_what_verl_cannot_run():
    config = compose_config(ALLOCATE)
    assert prepare(config) is True
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == ALLOCATION_MANAGER
    assert prepare(compose_config(["actor_rollout_ref.rollout.name=vllm"])) is False
    section = "algorithm.prompts.allocation"
    refused = {
        "trainer.use_v1=False": "cannot allocate with trainer.use_v1=False",
        "algorithm.prompts.skip.enable=True": f"Set algorithm.prompts.skip.enable=False (the pilots cover those "
        f"prompts) or {section}.enable=False",
        "algorithm.filter_groups.enable=True": "Set algorithm.filter_groups.enable=False",
        f"{section}.budget_share=0.0005": f"{section}.budget_share=0.0005 with data.train_batch_size=1024: the step's "
        "budget holds less than one full group",
        f"{section}.pilot_size=8": f"{section}.pilot_size=8 with actor_rollout_ref.rollout.n=8: a pilot must be",
        "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=my.Manager": "agent_loop_manager_class=my.Manager: "
        f"a pilot is extended by our agent loop manager ({ALLOCATION_MANAGER})",
    }
    for override, message in refused.items():
        config = compose_config([*ALLOCATE, override])
        problems = settings_problems(config).problems
        assert any(message in problem for problem in problems), (override, problems)
        with pytest.raises(ValueError, match="verl-avspo cannot start this run"):
            prepare(config)
    # Below a uniform step's budget, prompts are left out: only the sync mode with one update per step samples
    # just the groups it dispatched.
    half = f"{section}.budget_share=0.5"
    assert prepare(compose_config([*ALLOCATE, half])) is True
    for override in ("trainer.v1.trainer_mode=colocate_async", "+trainer.v1.sync.parameter_sync_step=2"):
        problems = settings_problems(compose_config([*ALLOCATE, half, override])).problems
        assert any(f"{half} is below 1 with {override.lstrip('+')}: a budget below" in p for p in problems), problems
    # A group estimator only, named with its fix.
    problems = settings_problems(compose_config([*ALLOCATE, "algorithm.adv_estimator=gae"])).problems
    fix = f"Use a group estimator (grpo, avspo, rloo, ...) or set {section}.enable=False."
    assert any("with algorithm.adv_estimator=gae: the allocator decides" in p and fix in p for p in problems), problems


def test_keys_of_a_part_that_is_off_are_refused_as_doing_nothing():
    # As algorithm.avspo.* keys with another estimator are: set while enable is false, they would do nothing.
    section, skip = "algorithm.prompts.allocation", "algorithm.prompts.skip"
    idle = [f"{section}.budget_share=0.5", f"{section}.pilot_size=4"]
    config = compose_config(["actor_rollout_ref.rollout.name=vllm", *idle])
    (problem,) = [p for p in settings_problems(config).problems if "would do nothing" in p]
    assert problem == (
        f"{section}.pilot_size=4, {section}.budget_share=0.5 set while {section}.enable is false: they would do "
        f"nothing. Set {section}.enable=True, or remove them."
    )
    with pytest.raises(ValueError, match=r"budget_share=0.5 set while algorithm.prompts.allocation.enable is false"):
        prepare(config)  # our trainer's start-up on stock main_ppo, where they are given with +
    problems = settings_problems(compose_config(["actor_rollout_ref.rollout.name=vllm", f"{skip}.explore=0.2"]))
    one = (
        f"{skip}.explore=0.2 set while {skip}.enable is false: it would do nothing. Set {skip}.enable=True, or "
        "remove it."
    )
    assert one in problems.problems
    # Unset (the launcher's YAML declares every key null) or with the part on: nothing to say.
    assert not settings_problems(compose_config(["actor_rollout_ref.rollout.name=vllm"])).problems
    assert prepare(compose_config([*ALLOCATE, f"{section}.pilot_size=4"])) is True
