"""The launcher's checks of ``algorithm.prompts`` (part of the first stage, :mod:`.settings`): where the
prompts are keyed from, prompt skipping and the rollout allocator, each against the trainer, the estimator and
the data. Imports no verl.

Pure: one message per problem, naming the key, the value and the fix; the caller raises and logs them.
"""

from __future__ import annotations

from collections.abc import Iterator

from omegaconf import DictConfig, OmegaConf

from verl_avspo.core.prompt_allocation import PromptAllocationConfig, allocation_problems
from verl_avspo.core.prompt_skip import SkipSpelling, skip_problems
from verl_avspo.verl_plugin.checks.prompt_index import prompt_index_problems
from verl_avspo.verl_plugin.checks.values import filters_groups, v1_mode
from verl_avspo.verl_plugin.estimators import is_group_estimator
from verl_avspo.verl_plugin.prompt_identity import (
    ALLOCATION_MANAGER,
    ALLOCATION_SECTION,
    PROMPT_KEY_SETTING,
    SKIP_SECTION,
    PromptsConfig,
)

__all__ = ["idle_keys_problems", "prompt_allocation_problems", "prompts_problems"]


_SKIP_SPELLING = SkipSpelling(
    skip=SKIP_SECTION,
    estimator="algorithm.adv_estimator",
    group_size="actor_rollout_ref.rollout.n",
    group_estimators="grpo, avspo, rloo, ...",
)


def prompts_problems(config: DictConfig, prompts: PromptsConfig, warnings: list[str]) -> Iterator[str]:
    """Prompt skipping needs a trainer that reads the prompts before rollout and a prompt history to
    decide from; an ``index`` key needs train rows with distinct ``extra_info.index`` (DCPO's own check,
    in the settings' baseline checks, covers the dcpo estimator)."""
    skipping, estimator = prompts.skip.enable, str(config.algorithm.adv_estimator)
    enabled = f"{SKIP_SECTION}.enable=True"
    if skipping and not config.trainer.use_v1:
        yield (
            f"{enabled} cannot skip with trainer.use_v1=False: verl's legacy trainer reads its dataloader inside "
            "one monolithic fit loop, with no step between the dataloader and the rollout to act on. Set "
            f"trainer.use_v1=True (the V1 trainer, any mode) or {SKIP_SECTION}.enable=False."
        )
    if not skipping:
        yield from idle_keys_problems(config, SKIP_SECTION)
    if skipping:
        compares_groups = is_group_estimator(estimator)
        yield from skip_problems(_SKIP_SPELLING, estimator, compares_groups, config.actor_rollout_ref.rollout.n)
    yield from prompt_allocation_problems(config, prompts)
    if prompts.key != "index" or estimator == "dcpo":
        return
    if OmegaConf.select(config, "data.custom_cls.path", default=None):
        warnings.append(
            f"data.custom_cls is set: its dataset may fill index its own way, so the train files' extra_info.index "
            f"is not checked for {PROMPT_KEY_SETTING}=index; different prompts sharing an index within a batch are "
            "still refused during training"
        )
        return
    index_problems, index_warnings = prompt_index_problems(
        config.data.get("train_files", None), needed_by=f"{PROMPT_KEY_SETTING}=index", what="the per-prompt history"
    )
    warnings.extend(index_warnings)
    yield from index_problems


def idle_keys_problems(config: DictConfig, section: str) -> list[str]:
    """Keys of ``section`` (skipping's or the allocator's) given while its ``enable`` is false: they would do
    nothing, refused as AVSPO's keys with another estimator are. A key left null (the launcher's YAML declares
    them all so) is not given."""
    given = OmegaConf.select(config, section, default=None)
    if not isinstance(given, DictConfig) or given.get("enable", None):
        return []
    idle = [f"{section}.{key}={value}" for key, value in given.items() if key != "enable" and value is not None]
    if not idle:
        return []
    they, them = ("it", "it") if len(idle) == 1 else ("they", "them")
    return [
        f"{', '.join(idle)} set while {section}.enable is false: {they} would do nothing. Set {section}.enable=True, "
        f"or remove {them}."
    ]


def prompt_allocation_problems(config: DictConfig, prompts: PromptsConfig) -> list[str]:
    """Why verl cannot run ``algorithm.prompts.allocation`` as configured (empty when it can, or when it is
    off). The launcher's checks and our trainer's start-up (stock ``main_ppo``) both ask."""
    allocation: PromptAllocationConfig = prompts.allocation
    if not allocation.enable:
        return idle_keys_problems(config, ALLOCATION_SECTION)
    enabled, estimator = f"{ALLOCATION_SECTION}.enable=True", str(config.algorithm.adv_estimator)
    off = f"{ALLOCATION_SECTION}.enable=False"
    group_size = config.actor_rollout_ref.rollout.n
    problems = []
    if not config.trainer.use_v1:
        problems.append(
            f"{enabled} cannot allocate with trainer.use_v1=False: verl's legacy trainer sends every prompt to "
            f"rollout with rollout.n responses from inside one fit loop. Set trainer.use_v1=True (the V1 trainer, "
            f"any mode) or {off}."
        )
    if not is_group_estimator(estimator):
        problems.append(
            f"{enabled} with algorithm.adv_estimator={estimator}: the allocator decides from the collapse history "
            f"of groups of responses, which {estimator} does not compare. Use a group estimator (grpo, avspo, "
            f"rloo, ...) or set {off}."
        )
    if prompts.skip.enable:
        problems.append(
            f"{enabled} with {SKIP_SECTION}.enable=True: the allocator gives the prompts the skip rule would drop a "
            f"pilot of {ALLOCATION_SECTION}.pilot_size rollouts instead, so the two decide the same prompts. Set "
            f"{SKIP_SECTION}.enable=False (the pilots cover those prompts) or {off}."
        )
    if filters_groups(config.algorithm):
        problems.append(
            f"{enabled} with algorithm.filter_groups.enable=True: DAPO's replay buffer replaces every collapsed group "
            f"with fresh prompts of rollout.n responses, outside the allocator's budget, and reads groups of "
            f"unequal size as its own. Set algorithm.filter_groups.enable=False or {off}."
        )
    try:
        problems += allocation_problems(allocation, int(group_size), ALLOCATION_SECTION, "actor_rollout_ref.rollout.n")
    except (TypeError, ValueError):
        pass  # a bad rollout.n: _rollout_problems names it
    mode = v1_mode(config)
    sync_steps = OmegaConf.select(config, "trainer.v1.sync.parameter_sync_step", default=1)
    if allocation.budget_share < 1 and mode is not None and (mode != "sync" or sync_steps != 1):
        where = (
            f"trainer.v1.trainer_mode={config.trainer.v1.trainer_mode}"
            if mode != "sync"
            else f"trainer.v1.sync.parameter_sync_step={sync_steps}"
        )
        problems.append(
            f"{ALLOCATION_SECTION}.budget_share={allocation.budget_share} is below 1 with {where}: a budget below a "
            f"uniform step's leaves prompts out, and only the sync mode with one update per step samples just the "
            f"groups a step dispatched (the async modes draw more prompts for every place left open, so nothing "
            f"would be saved). Set {ALLOCATION_SECTION}.budget_share to 1 or more, or use trainer.v1.trainer_mode="
            f"avspo_sync with parameter_sync_step=1."
        )
    try:
        funds_a_group = allocation.budget_share * int(config.data.train_batch_size) >= 1
    except (TypeError, ValueError):
        funds_a_group = True  # a bad train_batch_size: verl's validation names it
    if not funds_a_group:
        problems.append(
            f"{ALLOCATION_SECTION}.budget_share={allocation.budget_share} with data.train_batch_size="
            f"{config.data.train_batch_size}: the step's budget holds less than one full group. Raise "
            f"{ALLOCATION_SECTION}.budget_share to at least 1/{config.data.train_batch_size}."
        )
    manager = OmegaConf.select(config, "actor_rollout_ref.rollout.agent.agent_loop_manager_class", default=None)
    if manager not in (None, ALLOCATION_MANAGER):
        problems.append(
            f"{enabled} with actor_rollout_ref.rollout.agent.agent_loop_manager_class={manager}: a pilot is extended "
            f"by our agent loop manager ({ALLOCATION_MANAGER}), which the trainer sets when the key is null. Remove "
            f"the override (or set it to {ALLOCATION_MANAGER}), or set {off}."
        )
    return problems
