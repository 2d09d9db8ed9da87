"""AVSPO as a drop-in for OpenRLHF's ``group_norm`` reward shaping, over the shared core.

OpenRLHF (``--algo.advantage.estimator group_norm``) reshapes the batch's scalar rewards to
(num_prompts, n_samples_per_prompt) and normalises each row by its mean and std. This class does
the same through the framework-free AVSPO core and a run tracker (``verl_avspo.core.run_tracker``), so
collapsed rows get AVSPO's push, every row is measured for ACR and the stall alert runs. It does not
import OpenRLHF; ``python -m verl_avspo.openrlhf`` installs the same step into OpenRLHF's trainer
(``verl_avspo.openrlhf.trainer_wrap``). By hand, where OpenRLHF computes::

    rewards = rewards.reshape(-1, n_samples_per_prompt)
    rewards = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)

use instead (one ``GroupNormAVSPO`` for the whole run, so the adaptive threshold persists)::

    rewards = avspo(rewards.reshape(-1, n_samples_per_prompt))
    logger.log(avspo.metrics)   # acr/rate, acr/effective, acr/stalled, avspo/threshold, ...

and save ``avspo.state_dict()`` with the checkpoint. Each call is one training step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from verl_avspo.core.config import AVSPOConfig, resolve_settings
from verl_avspo.core.controller import AdaptiveController
from verl_avspo.core.run_tracker import RunTracker
from verl_avspo.openrlhf.advantage_step import OPENRLHF_ADVICE, group_index, run_state

__all__ = ["GroupNormAVSPO"]


class GroupNormAVSPO:
    """Stateful AVSPO group normalisation for rewards laid out one prompt per row.

    Args:
        settings: the AVSPO keys of docs/configuration.md (a preset and overrides) and ACR's ``tau``,
            ``reward_range`` and ``alert`` beside them; None is ``preset: paper``. OpenRLHF's own
            group_norm uses epsilon 1e-9; pass ``{"epsilon": 1e-9}`` to match it exactly on uncollapsed rows.
        norm_adv_by_std: divide by the group std (False: Dr. GRPO style, r − μ').
    """

    def __init__(self, settings: Mapping[str, Any] | None = None, norm_adv_by_std: bool = True):
        config, acr = resolve_settings(settings)
        self.tracker = RunTracker(acr, config, rule_setting="alert.rule", advice=OPENRLHF_ADVICE)
        self.norm_adv_by_std = norm_adv_by_std
        self.metrics: dict[str, float] = {}

    @property
    def config(self) -> AVSPOConfig:
        return self.tracker.avspo

    @property
    def controller(self) -> AdaptiveController:
        return self.tracker.controller

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        """Args:
            rewards: (num_prompts, n_samples_per_prompt) scalar rewards.

        Returns:
            (num_prompts, n_samples_per_prompt) advantages; ``self.metrics`` holds the step's
            ACR and AVSPO metrics and ``acr/stalled``.
        """
        if rewards.dim() != 2:
            raise ValueError(
                f"rewards must be (num_prompts, n_samples_per_prompt), got shape {tuple(rewards.shape)}; "
                "reshape with rewards.reshape(-1, n_samples_per_prompt)"
            )
        num_prompts, group_size = rewards.shape
        flat = rewards.reshape(-1, 1)
        index = group_index(num_prompts, group_size)
        output = self.tracker.avspo_advantages(flat, torch.ones_like(flat), index, self.norm_adv_by_std)
        self.metrics = dict(self.tracker.end_step(self.controller.step, output.scalar_advantages))
        return output.scalar_advantages.view(num_prompts, group_size)

    def state_dict(self) -> dict[str, Any]:
        return self.tracker.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`, or an earlier release's (the bare controller state)."""
        self.tracker.load_state_dict(run_state(state))
