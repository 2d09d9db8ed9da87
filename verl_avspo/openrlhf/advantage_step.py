"""The advantage step the adapter runs inside OpenRLHF's experience maker: the settings the
launcher passes through the environment, AVSPO's group step on OpenRLHF's rewards, and each step's
``acr/*`` and ``avspo/*`` metrics. Imports neither OpenRLHF nor Ray."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch

from verl_avspo.core.collapse import measure_collapse
from verl_avspo.core.config import ACR_KEYS, ACRConfig, resolve_settings
from verl_avspo.openrlhf.alert import StallAlert
from verl_avspo.openrlhf.group_norm import GroupNormAVSPO

__all__ = ["SETTINGS_ENV", "ACR_SETTINGS_ENV", "AVSPO_ESTIMATORS", "AdvantageStep", "settings_from_env"]

# JSON of the AVSPO settings (docs/configuration.md); empty or unset: ACR metrics only, OpenRLHF's estimator.
SETTINGS_ENV = "VERL_AVSPO_OPENRLHF_SETTINGS"
# JSON of the ACR metrics' own settings (tau, reward_range) and the stall alert's, for a run without AVSPO.
ACR_SETTINGS_ENV = "VERL_AVSPO_OPENRLHF_ACR"
# OpenRLHF estimators whose group step AVSPO replaces, and the normalisation each stands for.
AVSPO_ESTIMATORS = {"group_norm": True, "dr_grpo": False}
# Estimators with a per-prompt baseline whose output is the final advantage, so a collapsed group
# gets all-zero advantages. (reinforce_baseline also has one, but OpenRLHF then whitens the whole
# batch, which shifts every advantage: its acr/effective would be meaningless and is not logged.)
_GROUP_BASELINES = ("rloo", "group_norm", "dr_grpo")


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
    """The AVSPO settings the launcher passed to this worker, or None (ACR metrics only)."""
    return _json_object_from_env(SETTINGS_ENV, "the AVSPO settings")


def _acr_settings() -> dict[str, Any]:
    """The ACR metrics' tau and reward_range the launcher passed (``{}``: the defaults)."""
    settings = _json_object_from_env(ACR_SETTINGS_ENV, f"ACR metric settings ({', '.join(ACR_KEYS)})") or {}
    unknown = sorted(set(settings) - set(ACR_KEYS))
    if unknown:
        raise ValueError(f"{ACR_SETTINGS_ENV} has key(s) {unknown}; only {', '.join(ACR_KEYS)} are allowed")
    return settings


def _group_index(num_groups: int, group_size: int) -> torch.Tensor:
    return torch.arange(num_groups).repeat_interleave(group_size)


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


class AdvantageStep:
    """One experience maker's AVSPO estimator (None: OpenRLHF's own) and the step's metrics."""

    def __init__(self, estimator: str, settings: Mapping[str, Any] | None):
        self.estimator = estimator
        self.avspo: GroupNormAVSPO | None = None
        if settings is not None:
            if estimator not in AVSPO_ESTIMATORS:
                raise ValueError(
                    f"AVSPO settings were given but --algo.advantage.estimator={estimator!r}; AVSPO replaces "
                    f"{' or '.join(AVSPO_ESTIMATORS)} (use --algo.advantage.estimator avspo)"
                )
            self.avspo = GroupNormAVSPO(settings, norm_adv_by_std=AVSPO_ESTIMATORS[estimator])
        self.acr: ACRConfig = self.avspo.acr if self.avspo is not None else resolve_settings(_acr_settings())[1]
        self.alert = StallAlert(self.acr.alert)
        self.outputs: list[torch.Tensor] = []
        self.reward_stds: list[torch.Tensor] | None = None

    def shape(self, experiences: list, group_size: int) -> None:
        """AVSPO's group step on the penalised rewards, written back as OpenRLHF's would be."""
        if self.avspo is None:
            return
        order, lengths = _prompt_order(experiences)
        rewards = _to_prompt_order(torch.cat([experience.rewards for experience in experiences]), order, group_size)
        # OpenRLHF logs group_reward_std from experience.rewards after this point: keep it the rewards'.
        stds = rewards.std(-1, keepdim=True).expand(-1, group_size).reshape(-1)[order]
        self.reward_stds = list(stds.split(lengths)) if group_size > 1 else None
        advantages = self.avspo(rewards).reshape(-1)[order]
        for experience, shaped in zip(experiences, advantages.split(lengths), strict=True):
            experience.rewards = shaped

    def restore_reward_stds(self, experiences: list) -> None:
        """Put back the rewards' per-group std that OpenRLHF computed from AVSPO's output."""
        if self.reward_stds is not None:
            for experience, std in zip(experiences, self.reward_stds, strict=True):
                experience.info["group_reward_std"] = std
        self.reward_stds = None

    def metrics(self, experiences: list, group_size: int, prefilter: torch.Tensor | None) -> dict[str, float]:
        """The step's ``acr/*`` (raw rewards, before dynamic filtering where known) and ``avspo/*``."""
        tau, reward_range = self.acr.tau, self.acr.reward_range
        order, _ = _prompt_order(experiences)
        trained = _to_prompt_order(
            torch.cat([experience.info["reward"].reshape(-1) for experience in experiences]).to(torch.float64),
            order,
            group_size,
        )
        raw = prefilter if prefilter is not None and prefilter.numel() else trained
        num_groups, size = raw.shape
        metrics = measure_collapse(raw.reshape(-1), _group_index(num_groups, size), None, tau, reward_range)
        if self.avspo is not None or self.estimator in _GROUP_BASELINES:
            advantages = _to_prompt_order(torch.cat(self.outputs).to(torch.float64), order, group_size)
            trained_index = _group_index(trained.shape[0], group_size)
            effective = measure_collapse(trained.reshape(-1), trained_index, advantages.reshape(-1), tau, reward_range)
            metrics["acr/effective"] = effective["acr/effective"]
        if self.avspo is not None:
            metrics.update({key: value for key, value in self.avspo.metrics.items() if key.startswith("avspo/")})
        return metrics
