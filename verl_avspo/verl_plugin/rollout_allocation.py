"""Per-prompt rollout allocation in verl's V1 trainers, every mode (``algorithm.prompts.allocation``,
docs/prompts.md), through verl's own extension points:

- **How many.** Each call of ``_next_train_batch`` (every dispatch of prompts to rollout) asks the run
  tracker's allocator (``core.prompt_allocation``) how many rollouts each prompt gets, and writes the count
  into the prompt's row as ``__rollout_n__``, the per-prompt count verl's V1 agent loop already reads
  (``agent_loop_tq.py:113-115``); a pilot's row also carries :data:`PILOT_FIELD`, its pilot size.
- **Pilots extended in the same step.** :class:`AllocatingAgentLoopManager`, which our trainer sets as verl's
  ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` when the allocator is on, runs its workers as
  :class:`AllocatingAgentLoopWorker`: for a pilot it runs the pilot's sessions, tests their rewards by the
  collapse test ACR counts with (``core.prompt_allocation.pilots_spread``) and, where they differ, runs the
  rest of the group, sessions ``pilot_size`` to ``rollout.n - 1`` under the same uid, before it publishes the
  group's one terminal status. The replay buffer therefore sees one group of ``rollout.n``, as it counts groups
  and not responses. A collapsed pilot ends as a group of ``pilot_size``, trained as one: under GRPO its
  advantages are 0, as if dropped (the sandbox drops it); AVSPO gives it its virtual-reward advantage.
- **Prompts left out.** Below a uniform step's budget (``budget_share`` < 1, sync mode with one update per
  step only) the prompts the allocator funds nothing are removed before dispatch, and the trainer's
  ``_step_once`` asks the replay buffer for the step's groups less those (:meth:`RolloutAllocation.take_left_out`).
- **Accounting.** The first pass counts as generated at dispatch (``train/rollouts_generated``); the
  extensions count when their groups reach the advantage stage, where :meth:`RolloutAllocation.observe_pilots`
  reads each pilot's sessions and reports them to the tracker (``prompts/pilots_extended``, the allocator's
  estimate of the extended share), or, for a group the replay buffer evicts unsampled (stale), when it is
  cleared (``PromptRecords.record_cleared``). The pilot field travels with every response in TransferQueue,
  so a resumed run's groups are read the same way.

What verl's trainer does with groups of unequal size needs no change: the PPO mini-batch and the batch
multiple are in responses (``ppo_mini_batch_size * rollout.n``), and ``_balance_batch`` pads the batch to that
multiple with no-op rows; the advantage estimators group responses by uid.

The pilot path is a fork of verl's ``AgentLoopWorkerTQ._run_prompt`` (its statuses and sessions repeated, and
checked against verl's by :mod:`verl_avspo.verl_plugin.surface`), kept in this one module: verl has no
per-prompt hook between a group's sessions and its terminal status (docs/prompts.md says why the fork stays;
``patches/08-agent-loop-run-group.patch`` proposes the door upstream, ``run_group``). Every other prompt,
validation's included, runs verl's own ``_run_prompt``.
"""

from __future__ import annotations

import asyncio
import logging

import ray
import torch
import transfer_queue as tq
from omegaconf import OmegaConf, open_dict
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ, apply_greedy_sampling_params
from verl.utils import tensordict_utils as tu

from verl_avspo.core.prompt_allocation import pilots_spread
from verl_avspo.verl_plugin.checks.prompts import prompt_allocation_problems
from verl_avspo.verl_plugin.prompt_identity import ALLOCATION_MANAGER, PromptsConfig, prompt_keys
from verl_avspo.verl_plugin.settings import parse_settings

__all__ = [
    "PILOT_FIELD",
    "ROLLOUT_N_FIELD",
    "AllocatingAgentLoopManager",
    "AllocatingAgentLoopWorker",
    "RolloutAllocation",
    "prepare_allocation",
]

logger = logging.getLogger(__name__)

# verl's per-prompt rollout count, read (and removed) by its V1 agent loop.
ROLLOUT_N_FIELD = "__rollout_n__"
# A pilot's size on its prompt row (0: not a pilot); kept in every response's row in TransferQueue.
PILOT_FIELD = "avspo_pilot_size"
MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"


def prepare_allocation(config, prompts: PromptsConfig) -> bool:
    """At our trainer's start-up, before verl's: whether the run allocates rollouts. Refuses what verl cannot
    run (:func:`~verl_avspo.verl_plugin.checks.prompts.prompt_allocation_problems`, the launcher's own check,
    for stock ``main_ppo``) and sets our agent loop manager, which verl's TaskRunner builds after the trainer
    from this same config object (``main_ppo.py:151-153``). ``prompts``: the run's parsed ``algorithm.prompts``.

    Raises:
        ValueError: every problem at once, each naming the key, the value and the fix.
    """
    problems = prompt_allocation_problems(config, prompts)
    if problems:
        raise ValueError("verl-avspo cannot start this run:\n- " + "\n- ".join(problems))
    if not prompts.allocation.enable:
        return False
    if OmegaConf.select(config, MANAGER_KEY, default=None) is None:
        with open_dict(config):
            OmegaConf.update(config, MANAGER_KEY, ALLOCATION_MANAGER, force_add=True)
    return True


class RolloutAllocation:
    """The trainer's part for the allocator: each dispatch's allocation, the prompts it left out of the step, and
    the pilots' outcomes read back at the advantage stage (module docstring)."""

    pilot_field = PILOT_FIELD
    """The field read with a batch's scores (:func:`~verl_avspo.verl_plugin.v1_batch.read_scores`): each row's
    pilot size, for :meth:`observe_pilots`."""

    def __init__(self, tracker, source: str, group_size: int):
        """``source``: the prompt identity's field (``index`` or ``raw_prompt``)."""
        self.tracker, self.source, self.group_size = tracker, source, group_size
        self._left_out = 0  # prompts of this step the budget left without rollouts (budget_share < 1, sync mode)

    def allocate(self, batch, prompts: list):
        """The prompts of ``batch`` (``prompts``: its rows' identity field) that the allocator gives rollouts,
        each with its count; returns them and the rollouts of the first pass."""
        plan = self.tracker.allocate_prompts(prompt_keys(prompts, self.source), self.group_size)
        funded = plan.rollouts > 0
        if not bool(funded.any()):  # the start-up check makes the budget hold at least one full group
            raise RuntimeError("the rollout allocator gave no prompt of this dispatch any rollout")
        batch[ROLLOUT_N_FIELD] = plan.rollouts
        batch[PILOT_FIELD] = torch.where(plan.pilot, plan.rollouts, 0)
        if not bool(funded.all()):
            self._left_out += int((~funded).sum())
            batch = tu.index_select_tensor_dict(batch, torch.nonzero(funded).squeeze(1))
        return batch, plan.total

    def take_left_out(self) -> int:
        """The prompts the budget left out since the last call: the step's replay buffer waits for that many
        groups less (verl asks for ``data.train_batch_size``)."""
        left_out, self._left_out = self._left_out, 0
        return left_out

    def observe_pilots(self, keys: list, pilot_sizes: torch.Tensor) -> None:
        """The pilots among the batch's rows ``keys`` (``{uid}_{session}_{output}``), whose (bs,) ``pilot_sizes``
        :func:`~verl_avspo.verl_plugin.v1_batch.read_scores` read with their scores: each one extended if its
        group has more sessions than its pilot; the tracker counts them and the rollouts added."""
        sessions: dict[str, set[str]] = {}
        size_of: dict[str, int] = {}
        for key, size in zip(keys, pilot_sizes.tolist(), strict=True):
            if size:
                uid, session, _ = key.rsplit("_", 2)
                sessions.setdefault(uid, set()).add(session)
                size_of[uid] = int(size)
        extended = [len(sessions[uid]) > size_of[uid] for uid in sessions]
        added = sum(len(sessions[uid]) - size_of[uid] for uid in sessions)
        self.tracker.observe_pilots(torch.tensor(extended, dtype=torch.bool))
        self.tracker.count_rollouts(added, gen_batches=0)


class AllocatingAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's V1 agent-loop worker (``AgentLoopWorkerTQ``) that extends a pilot in the same step (module
    docstring). Prompts without :data:`PILOT_FIELD`, validation's included, run verl's own ``_run_prompt``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.acr = parse_settings(self.config.algorithm).acr
        self._pilot_rewards: dict[str, list] = {}
        self._warned_no_reward = False

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        pilot_size = int(prompt.get(PILOT_FIELD, 0))
        if not pilot_size or trajectory["validate"]:
            return await super()._run_prompt(prompt, sampling_params, trajectory, trace=trace)
        uid = prompt["uid"]
        await tq.async_kv_put(key=uid, partition_id="train", tag={"status": "running"})
        self._pilot_rewards[uid] = []
        status = "failure"
        try:
            prompt.pop(ROLLOUT_N_FIELD, None)
            params = dict(sampling_params)
            if not prompt.pop("__do_sample__", True):
                apply_greedy_sampling_params(params)
            failed = await self._run_sessions(params, trajectory, trace, prompt, range(pilot_size))
            if not failed and self._pilot_spread(uid, pilot_size):
                group_size = self.config.actor_rollout_ref.rollout.n
                failed = await self._run_sessions(params, trajectory, trace, prompt, range(pilot_size, group_size))
            status = "failure" if failed else "finished"
        except Exception:
            logger.exception("pilot rollout of uid=%s failed", uid)
        finally:
            # One terminal status, after every session of the group settled (as verl's _run_prompt does).
            self._pilot_rewards.pop(uid, None)
            await tq.async_kv_put(key=uid, partition_id="train", tag={"status": status})

    async def _run_sessions(self, params: dict, trajectory: dict, trace: bool, prompt: dict, sessions: range) -> bool:
        """Run the agent loop's ``sessions`` of one prompt to the end; whether any failed (each one logged)."""
        tasks = [
            asyncio.create_task(
                self._run_agent_loop(params, trajectory=trajectory, trace=trace, session_id=session, **prompt)
            )
            for session in sessions
        ]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [result for result in results if isinstance(result, BaseException)]
        for error in errors:
            trace_back = (type(error), error, error.__traceback__)
            logger.error("agent loop of uid=%s failed", prompt["uid"], exc_info=trace_back)
        return bool(errors)

    async def _compute_score(self, outputs, kwargs: dict) -> None:
        """verl's reward of a session; a pilot's is kept for its spread test."""
        await super()._compute_score(outputs, kwargs)
        rewards = self._pilot_rewards.get(kwargs["uid"])
        if rewards is not None:
            rewards.append(outputs[-1].reward_score)

    def _pilot_spread(self, uid: str, pilot_size: int) -> bool:
        """Whether the pilot's rewards differ. Without a reward for every session (a reward computed outside
        the agent loop, an empty output) the pilot is extended: the full group, nothing saved, nothing lost."""
        rewards = self._pilot_rewards[uid]
        if len(rewards) < pilot_size or any(reward is None for reward in rewards):
            if not self._warned_no_reward:
                logger.warning(
                    "algorithm.prompts.allocation: the agent loop holds no reward for a pilot's responses (a reward "
                    "computed outside the agent loop, such as a colocated reward model), so pilots are extended to "
                    "the full group and save nothing"
                )
                self._warned_no_reward = True
            return True
        scores = torch.tensor(rewards, dtype=torch.float64)
        ids = torch.zeros(len(rewards), dtype=torch.int64)
        return bool(pilots_spread(scores, ids, 1, self.acr.tau, self.acr.reward_range)[0])


class AllocatingAgentLoopManager(AgentLoopManagerTQ):
    """verl's V1 agent loop manager whose workers extend pilots (:class:`AllocatingAgentLoopWorker`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(AllocatingAgentLoopWorker)
