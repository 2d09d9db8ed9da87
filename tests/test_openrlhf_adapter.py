"""The OpenRLHF adapter reproduces OpenRLHF's group_norm where AVSPO does not trigger, and AVSPO's
closed form where it does. OpenRLHF itself is not installed: its group_norm is two lines, written
out here as the reference."""

import math

import pytest
import torch

from verl_avspo.openrlhf import GroupNormAVSPO


def openrlhf_group_norm(rewards):
    return (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)


def test_preset_grpo_equals_openrlhf_group_norm():
    rewards = torch.randn(6, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    adapter = GroupNormAVSPO({"preset": "grpo", "epsilon": 1e-9, "reward_range": [-10, 10]})
    torch.testing.assert_close(adapter(rewards), openrlhf_group_norm(rewards))
    assert adapter.metrics["acr/rate"] == 0.0


def test_collapsed_rows_get_the_push_and_metrics():
    rewards = torch.tensor([[1.0] * 4, [0.0] * 4, [1.0, 0.0, 0.0, 1.0]])
    adapter = GroupNormAVSPO({"preset": "paper_code"})
    advantages = adapter(rewards)
    torch.testing.assert_close(advantages[0], torch.full((4,), 1 / math.sqrt(5)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(advantages[1], torch.full((4,), -1 / math.sqrt(5)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(advantages[2], openrlhf_group_norm(rewards[2:])[0], atol=1e-5, rtol=1e-5)
    assert adapter.metrics["acr/rate"] == pytest.approx(2 / 3) and adapter.metrics["acr/effective"] == 0.0


def test_state_round_trip():
    first, second = GroupNormAVSPO({"eta": 0.5}), GroupNormAVSPO({"eta": 0.5})
    for rewards in (torch.ones(2, 4), torch.tensor([[1.0, 0, 1, 0], [1, 1, 1, 1]])):
        first(rewards)
    second.load_state_dict(first.state_dict())
    assert second.controller.threshold == first.controller.threshold and second.controller.step == 2


def test_flat_rewards_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"reshape with rewards.reshape\(-1, n_samples_per_prompt\)"):
        GroupNormAVSPO()(torch.ones(8))
