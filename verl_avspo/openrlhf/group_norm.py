"""AVSPO as a drop-in for OpenRLHF's ``group_norm`` reward shaping, over the shared core.

OpenRLHF (``--algo.advantage.estimator group_norm``) reshapes the batch's scalar rewards to
(num_prompts, n_samples_per_prompt) and normalises each row by its mean and std. This class does
the same through the framework-free AVSPO core, so collapsed rows get AVSPO's push and every row
is measured for ACR. It does not import OpenRLHF; ``python -m verl_avspo.openrlhf`` installs it
into OpenRLHF's trainer (``verl_avspo.openrlhf.trainer_wrap``). By hand, where OpenRLHF computes::

    rewards = rewards.reshape(-1, n_samples_per_prompt)
    rewards = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)

use instead (one ``GroupNormAVSPO`` for the whole run, so the adaptive threshold persists)::

    rewards = avspo(rewards.reshape(-1, n_samples_per_prompt))
    logger.log(avspo.metrics)   # acr/rate, acr/effective, avspo/threshold, ...

and save ``avspo.state_dict()`` with the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from verl_avspo.core.advantage import compute_avspo_outcome_advantage
from verl_avspo.core.config import resolve_settings
from verl_avspo.core.controller import AdaptiveController

__all__ = ["GroupNormAVSPO"]


class GroupNormAVSPO:
    """Stateful AVSPO group normalisation for rewards laid out one prompt per row.

    Args:
        settings: the ``algorithm.avspo`` keys of docs/configuration.md (a preset and overrides); None is
            ``preset: paper``. OpenRLHF's own group_norm uses epsilon 1e-9; pass
            ``{"epsilon": 1e-9}`` to match it exactly on uncollapsed rows.
        norm_adv_by_std: divide by the group std (False: Dr. GRPO style, r − μ').
    """

    def __init__(self, settings: Mapping[str, Any] | None = None, norm_adv_by_std: bool = True):
        self.config, self.acr = resolve_settings(settings)
        self.controller = AdaptiveController(self.config, self.acr)
        self.norm_adv_by_std = norm_adv_by_std
        self.metrics: dict[str, float] = {}

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        """Args:
            rewards: (num_prompts, n_samples_per_prompt) scalar rewards.

        Returns:
            (num_prompts, n_samples_per_prompt) advantages; ``self.metrics`` holds the step's
            ACR and AVSPO metrics.
        """
        if rewards.dim() != 2:
            raise ValueError(
                f"rewards must be (num_prompts, n_samples_per_prompt), got shape {tuple(rewards.shape)}; "
                "reshape with rewards.reshape(-1, n_samples_per_prompt)"
            )
        num_prompts, group_size = rewards.shape
        flat = rewards.reshape(-1, 1)
        index = torch.arange(num_prompts, device=rewards.device).repeat_interleave(group_size)
        output = compute_avspo_outcome_advantage(
            flat, torch.ones_like(flat), index, self.config, self.acr, self.controller, self.norm_adv_by_std
        )
        self.metrics = output.metrics
        return output.scalar_advantages.view(num_prompts, group_size)

    def state_dict(self) -> dict[str, Any]:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controller.load_state_dict(state)
