"""A prompt's identity across steps in verl: where it is read from (``algorithm.prompts.key``) and
the stable key of one prompt, shared by the run's per-prompt history, prompt skipping and DCPO.

verl's ``uid`` is new on every visit, so a prompt is recognised by one of two fields that verl's
``RLHFDataset`` puts on every row and the agent loop stores with every response:

- ``index``: the row's ``extra_info.index`` (0 when a row has none, so only a file whose rows all have
  distinct indices can use it);
- ``raw_prompt``: the prompt's chat messages, keyed by a hash of them (any file; two rows with the
  same messages are one prompt).

``algorithm.prompts.key=auto`` (the default) takes ``index`` when every local parquet train file has
a distinct ``extra_info.index`` on every row, and ``raw_prompt`` otherwise; with ``adv_estimator=dcpo``
it takes ``index``, which refuses train files without distinct indices. Imports neither verl nor
TransferQueue.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from verl_avspo.core.prompt_allocation import PromptAllocationConfig, resolve_prompt_allocation
from verl_avspo.core.prompt_history import history_key
from verl_avspo.core.prompt_skip import PromptSkipConfig, resolve_prompt_skip
from verl_avspo.core.validation import Problems, choice, given_settings

__all__ = [
    "PROMPTS_SECTION",
    "PROMPTS_KEYS",
    "PROMPT_KEY_SETTING",
    "SKIP_SECTION",
    "ALLOCATION_SECTION",
    "ALLOCATION_MANAGER",
    "PromptsConfig",
    "resolve_prompts",
    "PROMPT_KEY_CHOICES",
    "PromptIdentity",
    "prompt_key",
    "prompt_keys",
    "prompt_key_setting",
    "resolve_prompt_identity",
]

logger = logging.getLogger(__name__)

PROMPTS_SECTION = "algorithm.prompts"
PROMPTS_KEYS = ("key", "skip", "allocation")
PROMPT_KEY_SETTING = f"{PROMPTS_SECTION}.key"
SKIP_SECTION = f"{PROMPTS_SECTION}.skip"
ALLOCATION_SECTION = f"{PROMPTS_SECTION}.allocation"
# The agent loop manager that extends pilots (verl's actor_rollout_ref.rollout.agent.agent_loop_manager_class).
ALLOCATION_MANAGER = "verl_avspo.verl_plugin.rollout_allocation.AllocatingAgentLoopManager"
# auto: index where the train files allow it, else raw_prompt.
PROMPT_KEY_CHOICES = ("auto", "index", "raw_prompt")


def prompt_key(value: Any, source: str) -> int | str:
    """A prompt's stable identity across steps, as a checkpointable int or str (the core's
    :func:`~verl_avspo.core.prompt_history.history_key`).

    Args:
        value: the row's ``index`` (verl's copy of ``extra_info.index``) or its ``raw_prompt``
            (chat messages).
        source: ``index`` or ``raw_prompt``.
    """
    return history_key(value, hashed=source == "raw_prompt")


def prompt_keys(values: Iterable[Any], source: str) -> list[int | str]:
    """:func:`prompt_key` of each value."""
    return [prompt_key(value, source) for value in values]


@dataclass(frozen=True)
class PromptsConfig:
    """The run's prompt settings (``algorithm.prompts``)."""

    key: str = "auto"
    """A prompt's identity across steps: ``index`` (extra_info.index), ``raw_prompt`` (a hash) or ``auto``."""
    skip: PromptSkipConfig = PromptSkipConfig()
    """The pre-rollout skip rule (``algorithm.prompts.skip.*``, off by default)."""
    allocation: PromptAllocationConfig = PromptAllocationConfig()
    """The per-prompt rollout allocator (``algorithm.prompts.allocation.*``, off by default)."""


def resolve_prompts(algorithm: Mapping[str, Any] | None) -> PromptsConfig:
    """Validated ``algorithm.prompts`` of verl's ``config.algorithm`` (absent or null keys take the defaults),
    its ``key`` read with :func:`prompt_key_setting`.

    Raises:
        SettingsError (a ValueError): every bad key at once.
    """
    problems = Problems()
    raw = (algorithm or {}).get("prompts", None)
    example = f"{PROMPT_KEY_SETTING}=auto"
    given = problems.check(given_settings, raw, PROMPTS_SECTION, PROMPTS_KEYS, problems, example=example) or {}
    key = problems.check(prompt_key_setting, algorithm)
    skip = problems.check(resolve_prompt_skip, given.get("skip", None), section=SKIP_SECTION)
    allocation = problems.check(resolve_prompt_allocation, given.get("allocation", None), section=ALLOCATION_SECTION)
    problems.raise_any()
    return PromptsConfig(key=key, skip=skip, allocation=allocation)


def prompt_key_setting(algorithm: Mapping[str, Any] | None) -> str:
    """The validated ``algorithm.prompts.key`` (``auto`` where unset; ``index`` for DCPO).

    Raises:
        ValueError: a value outside :data:`PROMPT_KEY_CHOICES`.
    """
    algorithm = algorithm or {}
    prompts = algorithm.get("prompts", None)
    key = prompts.get("key", None) if isinstance(prompts, Mapping) else None
    if key is not None:
        choice(PROMPT_KEY_SETTING, key, PROMPT_KEY_CHOICES)
    if key in (None, "auto") and str(algorithm.get("adv_estimator", "")) == "dcpo":
        return "index"  # DCPO's default, which refuses train files without distinct indices
    return "auto" if key is None else str(key)


@dataclass(frozen=True)
class PromptIdentity:
    """Where this run reads a prompt's identity from, and why."""

    source: str
    """``index`` or ``raw_prompt``: the TransferQueue / dataset field that is keyed."""
    reason: str
    """How it was chosen, for the log."""


def resolve_prompt_identity(config: Any) -> PromptIdentity:
    """This run's prompt identity from verl's whole ``config`` (``auto`` reads the local parquet train files).

    Raises:
        ValueError: an invalid ``algorithm.prompts.key`` (the launcher's checks report it before this runs).
    """
    from verl_avspo.verl_plugin.checks.prompt_index import prompt_index_problems

    setting = prompt_key_setting(config.algorithm)
    if setting != "auto":
        return PromptIdentity(setting, f"{PROMPT_KEY_SETTING}={setting}")
    data = config.get("data", None) or {}
    if data.get("custom_cls", None) and data.custom_cls.get("path", None):
        return PromptIdentity("raw_prompt", "auto: data.custom_cls may fill index its own way")
    problems, unreadable = prompt_index_problems(
        data.get("train_files", None), needed_by=f"{PROMPT_KEY_SETTING}=auto", what="the per-prompt history"
    )
    if problems or unreadable:
        why = "not a local parquet file" if unreadable else "missing or repeated in some rows"
        return PromptIdentity("raw_prompt", f"auto: the train files' extra_info.index is {why}")
    return PromptIdentity("index", "auto: every train row has a distinct extra_info.index")
