"""The advantage step the adapter runs inside OpenRLHF's experience maker: the settings the
launcher passes through the environment, and one :class:`~verl_avspo.core.run_tracker.RunTracker` per
experience maker that measures each step's raw rewards once, computes AVSPO's group step on
OpenRLHF's rewards, and gives the step's ``acr/*`` and ``avspo/*`` metrics, the stall alert and the
state a checkpoint keeps. Imports neither OpenRLHF nor Ray."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from verl_avspo.core.acr_config import ACR_KEYS, ACRConfig, resolve_acr
from verl_avspo.core.alert import stall_advice
from verl_avspo.core.collapse import DroppedGroups
from verl_avspo.core.config import AVSPOConfig, resolve_avspo
from verl_avspo.core.prompt_history import prompt_key
from verl_avspo.core.prompt_skip import PromptSkipConfig, resolve_prompt_skip
from verl_avspo.core.run_tracker import RunTracker
from verl_avspo.core.validation import Problems

__all__ = [
    "SETTINGS_ENV",
    "ACR_SETTINGS_ENV",
    "PROMPT_SKIP_ENV",
    "PROMPT_SKIP_FLAGS",
    "prompt_skip_from_env",
    "AVSPO_ESTIMATORS",
    "AVSPO_FLAGS",
    "ACR_FLAGS",
    "OPENRLHF_ADVICE",
    "AdvantageStep",
    "group_index",
    "one_token_copies",
    "resolve_flags",
    "settings_from_env",
    "acr_settings_from_env",
]

# JSON of the AVSPO settings (docs/configuration.md); empty or unset: OpenRLHF's estimator runs.
SETTINGS_ENV = "VERL_AVSPO_OPENRLHF_SETTINGS"
# JSON of ACR's own settings (tau, reward_range, alert), read by every run.
ACR_SETTINGS_ENV = "VERL_AVSPO_OPENRLHF_ACR"
# JSON of the pre-rollout skip rule's settings (core.prompt_skip); empty or unset: no skipping.
PROMPT_SKIP_ENV = "VERL_AVSPO_OPENRLHF_PROMPT_SKIP"
# How OpenRLHF users spell the groups of settings (python -m verl_avspo.openrlhf).
AVSPO_FLAGS = "--avspo"
ACR_FLAGS = "--acr"
PROMPT_SKIP_FLAGS = "--prompts.skip"
# OpenRLHF estimators whose group step AVSPO replaces, and the normalisation each stands for.
AVSPO_ESTIMATORS = {"group_norm": True, "dr_grpo": False}
# Estimators with a per-prompt baseline whose output is the final advantage, so a collapsed group
# gets all-zero advantages. (reinforce_baseline also has one, but OpenRLHF then whitens the whole
# batch, which shifts every advantage: its acr/effective would be meaningless and is not logged.)
_GROUP_BASELINES = ("rloo", "group_norm", "dr_grpo")
# What the stall alert advises, in OpenRLHF's flags.
OPENRLHF_ADVICE = stall_advice(
    "--rollout.temperature", "--rollout.n_samples_per_prompt", "--algo.advantage.estimator avspo"
)


def _json_object_from_env(name: str, what: str) -> dict[str, Any] | None:
    """The JSON object in environment variable ``name`` (None if unset or empty)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        settings = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"{name}={raw!r} is not JSON ({error}); it must hold {what}") from None
    if not isinstance(settings, dict):
        raise ValueError(f"{name}={raw!r} must be a JSON object of {what} (for example {{}})")
    return settings


def settings_from_env() -> dict[str, Any] | None:
    """The AVSPO settings the launcher passed to this worker, or None (OpenRLHF's estimator)."""
    return _json_object_from_env(SETTINGS_ENV, "the AVSPO settings")


def acr_settings_from_env() -> dict[str, Any] | None:
    """ACR's settings the launcher passed to this worker (None: the defaults)."""
    return _json_object_from_env(ACR_SETTINGS_ENV, f"ACR's settings ({', '.join(ACR_KEYS)})")


def prompt_skip_from_env() -> PromptSkipConfig | None:
    """The skip rule the launcher passed to this worker (``--prompts.skip.*``), or None (no skipping)."""
    settings = _json_object_from_env(PROMPT_SKIP_ENV, "the prompt skip rule's settings")
    return None if settings is None else resolve_prompt_skip(settings, section=PROMPT_SKIP_FLAGS)


def resolve_flags(
    avspo: Mapping[str, Any] | None, acr: Mapping[str, Any] | None
) -> tuple[AVSPOConfig | None, ACRConfig]:
    """The run's settings from the ``--avspo.*`` and ``--acr.*`` flags: AVSPO's only when ``avspo``
    is given (a run without AVSPO builds none), ACR's always. An ACR key given as ``--avspo.*`` is
    refused with its ``--acr.`` flag.

    Raises:
        SettingsError: every bad flag at once, each named as the user typed it.
    """
    problems = Problems()
    acr_config = problems.check(resolve_acr, acr, section=ACR_FLAGS)
    avspo_config = None
    if avspo is not None:
        avspo_config = problems.check(resolve_avspo, avspo, section=AVSPO_FLAGS, acr_section=ACR_FLAGS)
    problems.raise_any()
    return avspo_config, acr_config


def group_index(num_groups: int, group_size: int) -> np.ndarray:
    """(num_groups * group_size,) group labels of rewards laid out one prompt per row."""
    return np.arange(num_groups).repeat(group_size)


def _prompt_order(experiences: list) -> tuple[torch.Tensor, list[int]]:
    """Each response's position in prompt order (OpenRLHF's ``experience.index``), and the
    number of responses per experience."""
    order = torch.tensor([i for experience in experiences for i in experience.index])
    return order, [len(experience.index) for experience in experiences]


def _to_prompt_order(values: torch.Tensor, order: torch.Tensor, group_size: int) -> torch.Tensor:
    """(bs,) values in experience order -> (num_prompts, group_size) in prompt order."""
    ordered = torch.empty_like(values)
    ordered[order] = values
    return ordered.view(-1, group_size)


def one_token_copies(rewards: list[torch.Tensor], indices: list[list[int]]) -> list[SimpleNamespace]:
    """Stand-ins for OpenRLHF experiences (one per ``rewards`` tensor, its responses' rollout positions
    ``indices``) whose responses are one action token with zero KL, no value and no length: OpenRLHF's advantage
    method, run on them with no reward clip and no length penalty, leaves each response's group-step output
    as its advantage (``advantages[:, 0]``), the per-token stage adding nothing."""
    return [
        SimpleNamespace(
            rewards=reward.detach().clone(),
            index=list(index),
            info={"reward": reward.detach().clone()},
            kl=torch.zeros(len(index), 1, dtype=reward.dtype),  # the reward is cast to the KL's dtype
            action_mask=torch.ones(len(index), 1, dtype=torch.bool),
            values=None,
            truncated=None,
            response_length=torch.ones(len(index), dtype=torch.long),
        )
        for reward, index in zip(rewards, indices, strict=True)
    ]


class AdvantageStep:
    """One experience maker's run tracker, with AVSPO's settings when AVSPO replaces OpenRLHF's group
    step (``settings``; None: OpenRLHF's own estimator, ACR metrics only).

    Each step: :meth:`measure` the raw rewards before the advantage stage, :meth:`shape` (AVSPO) after
    the length penalties, each response's scalar advantage in ``outputs`` (AVSPO's, or OpenRLHF's group
    step's: :func:`one_token_copies`), then :meth:`batch_metrics`;
    the trainer runs the stall rule once per step on the logged metrics (``tracker.observe_step``).
    """

    def __init__(
        self, estimator: str, settings: Mapping[str, Any] | None, acr_settings: Mapping[str, Any] | None = None
    ):
        self.estimator = estimator
        if settings is not None and estimator not in AVSPO_ESTIMATORS:
            raise ValueError(
                f"AVSPO settings were given but --algo.advantage.estimator={estimator!r}; AVSPO replaces "
                f"{' or '.join(AVSPO_ESTIMATORS)} (use --algo.advantage.estimator avspo)"
            )
        avspo, acr = resolve_flags(settings, acr_settings)
        self.tracker = RunTracker(
            acr,
            avspo,
            acr_section=ACR_FLAGS,
            advice=OPENRLHF_ADVICE,
            prompt_skip=prompt_skip_from_env(),
        )
        self.outputs: list[torch.Tensor] = []
        self.reward_stds: list[torch.Tensor] | None = None
        self._index: np.ndarray | None = None  # this step's group labels, in prompt order

    @property
    def avspo_on(self) -> bool:
        return self.tracker.avspo is not None

    @property
    def measures_effective(self) -> bool:
        """Whether the step's ``acr/effective`` is logged: AVSPO's, or a group baseline's final advantages."""
        return self.avspo_on or self.estimator in _GROUP_BASELINES

    def measure(
        self,
        experiences: list,
        group_size: int,
        dropped_rewards: torch.Tensor | None,
        dropped_prompts: list | None = None,
    ) -> None:
        """The step's one measurement, before the advantage stage: the reward function's rewards of the
        trained groups, and the (num_dropped, group_size) ``dropped_rewards`` of the groups dynamic
        filtering dropped while they were generated, whose ``dropped_prompts`` (texts, None where
        unknown) enter the per-prompt history with them."""
        order, _ = _prompt_order(experiences)
        raw = _to_prompt_order(torch.cat([e.info["reward"].reshape(-1) for e in experiences]), order, group_size)
        self._index = group_index(raw.shape[0], group_size)
        # Each group's prompt identity for the per-prompt history: OpenRLHF has no dataset index, so the
        # hash of the prompt text each response carries (the key the skip rule is asked with).
        texts = [prompt for experience in experiences for prompt in (experience.prompts or ())]
        if len(texts) == len(order):  # else an experience without its prompts: no history this step
            prompts = np.empty(len(order), dtype=object)
            prompts[order.numpy()] = texts
            self.tracker.set_prompt_keys({str(g): prompt_key(p) for g, p in enumerate(prompts[::group_size])})
        self.outputs = []
        dropped = None
        if dropped_rewards is not None and dropped_rewards.numel():
            dropped = DroppedGroups.of(dropped_rewards, self.tracker.acr.tau)
            if dropped_prompts is not None:
                keys = [None if prompt is None else prompt_key(prompt) for prompt in dropped_prompts]
                self.tracker.record_groups(keys, dropped_rewards)
        self.tracker.measure(raw.reshape(-1), self._index, dropped)

    def shape(self, experiences: list, group_size: int) -> None:
        """AVSPO's group step on the penalised rewards, written back as OpenRLHF's would be."""
        if not self.avspo_on:
            return
        order, lengths = _prompt_order(experiences)
        rewards = _to_prompt_order(torch.cat([experience.rewards for experience in experiences]), order, group_size)
        # OpenRLHF logs group_reward_std from experience.rewards after this point: keep it the rewards'.
        stds = rewards.std(-1, keepdim=True).expand(-1, group_size).reshape(-1)[order]
        self.reward_stds = list(stds.split(lengths)) if group_size > 1 else None
        flat = rewards.reshape(-1, 1)
        output = self.tracker.avspo_advantages(
            flat, torch.ones_like(flat), self._index, AVSPO_ESTIMATORS[self.estimator]
        )
        advantages = output.scalar_advantages.to(rewards.dtype)[order]
        for experience, shaped in zip(experiences, advantages.split(lengths), strict=True):
            experience.rewards = shaped
        # OpenRLHF's group step passes them through unchanged: each response's final scalar advantage.
        self.outputs = [shaped.detach().reshape(-1).clone() for shaped in advantages.split(lengths)]

    def restore_reward_stds(self, experiences: list) -> None:
        """Put back the rewards' per-group std that OpenRLHF computed from AVSPO's output."""
        if self.reward_stds is not None:
            for experience, std in zip(experiences, self.reward_stds, strict=True):
                experience.info["group_reward_std"] = std
        self.reward_stds = None

    def batch_metrics(self, experiences: list, group_size: int) -> dict[str, float]:
        """The step's ``acr/*`` and ``avspo/*`` (``acr/effective`` from the trained groups' advantages,
        for the estimators whose group step gives the final advantage)."""
        advantages = None
        if self.measures_effective:
            order, _ = _prompt_order(experiences)
            advantages = _to_prompt_order(torch.cat(self.outputs).to(torch.float64), order, group_size).reshape(-1)
        self.outputs = []
        return self.tracker.batch_metrics(advantages)
