"""Every bad batch raises a ValueError that names the problem and the fix, both from the ``avspo``
estimator's entry point (``verl_plugin.register``) and through verl's own ``compute_advantage``
(bad settings alone: tests/core/test_errors.py)."""

import logging

import numpy as np
import pytest
import torch
from helpers import group_uids, outcome_batch, outcome_data
from omegaconf import OmegaConf

from verl_avspo.verl_plugin.register import compute_avspo_advantage

pytestmark = pytest.mark.verl


def batch(scores):
    """The estimator's inputs for groups of two responses of 4 tokens (uids q0, q1, ...)."""
    rewards, mask = outcome_batch(scores, length=4)
    return {"token_level_rewards": rewards, "response_mask": mask, "index": group_uids([2] * (len(scores) // 2), "q")}


CONFIG = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "avspo": {"preset": "paper"}})


def test_nan_and_inf_scores_say_how_many_and_where():
    bad = batch([1.0, float("nan"), 0.0, 0.0, float("inf"), 1.0])
    with pytest.raises(
        ValueError, match=r"2 response score\(s\) are not finite \(1 NaN, 1 inf\) in group\(s\) uid=\['q0', 'q2'\]"
    ):
        compute_avspo_advantage(**bad, config=CONFIG)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b.update(response_mask=torch.ones(6, 3)), r"response_mask shape .*\(6, 3\).* does not match"),
        (
            lambda b: b.update(token_level_rewards=torch.ones(6)),
            r"token_level_rewards must be a \(batch, response_length\) tensor",
        ),
        (lambda b: b.update(index=None), r"index is missing: AVSPO and DCPO group responses by prompt"),
        (lambda b: b.update(index=b["index"][:4]), r"index has 4 entries but the batch has 6 responses"),
        (
            lambda b: b.update(
                token_level_rewards=torch.ones(0, 4), response_mask=torch.ones(0, 4), index=np.array([])
            ),
            "the batch is empty",
        ),
    ],
)
def test_malformed_batches(mutate, message):
    inputs = batch([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    mutate(inputs)
    with pytest.raises(ValueError, match=message):
        compute_avspo_advantage(**inputs, config=CONFIG)


def test_bad_setting_through_verl_compute_advantage():
    from verl.trainer.ppo.ray_trainer import compute_advantage

    inputs = batch([1.0, 0.0, 1.0, 1.0])
    data = outcome_data(inputs["token_level_rewards"], inputs["response_mask"], inputs["index"])
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "avspo": {"strategy": "oposite"}})
    with pytest.raises(ValueError, match="strategy='oposite' is invalid: allowed values are stratified, opposite"):
        compute_advantage(data, "avspo", config=config)


def test_missing_uid_through_verl_compute_advantage():
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    inputs = batch([1.0, 0.0])
    data = DataProto.from_dict(
        tensors={"token_level_rewards": inputs["token_level_rewards"], "response_mask": inputs["response_mask"]}
    )
    with pytest.raises(ValueError, match="index is missing"):
        compute_advantage(data, "avspo", config=CONFIG)


def test_absent_avspo_section_means_preset_paper():
    inputs = batch([1.0, 1.0, 1.0, 1.0])  # both groups collapsed: ACR 1 > θ 0.5
    adv, _ = compute_avspo_advantage(**inputs, config=OmegaConf.create({"norm_adv_by_std_in_grpo": True}))
    assert torch.all(adv[:, -1] > 0)


@pytest.mark.usefixtures("fresh_estimator_state")
@pytest.mark.parametrize("part", ["skip", "allocation"])
def test_skipping_or_allocating_without_a_trainer_of_ours_is_refused_with_the_fix(part):
    # Stock main_ppo without our trainer mode (or verl's legacy trainer) reaches verl-avspo only at the advantage
    # stage, after the rollout: the allocator would be ignored there as skipping would.
    config = OmegaConf.create({**CONFIG, "prompts": {part: {"enable": True}}})
    with pytest.raises(ValueError) as refused:
        compute_avspo_advantage(**batch([1.0, 0.0, 1.0, 1.0]), config=config)
    message = str(refused.value)
    assert message.startswith(f"algorithm.prompts.{part}.enable=True, but no verl-avspo trainer runs in this process")
    assert f"Set algorithm.prompts.{part}.enable=False, or: With verl's V1 trainer (trainer.use_v1=True" in message
    assert (
        "add trainer.v1.trainer_mode=avspo_sync (docs/integration.md) or launch with `python -m verl_avspo" in message
    )
    # The legacy trainer has no place for our trainer mode: the advice there is use_v1, not a mode.
    assert "verl's legacy trainer (trainer.use_v1=False) cannot run ours, so set trainer.use_v1=True" in message


@pytest.mark.usefixtures("fresh_estimator_state")
def test_the_estimator_without_our_trainer_says_what_each_verl_trainer_needs(caplog):
    with caplog.at_level(logging.WARNING):
        compute_avspo_advantage(**batch([1.0, 0.0, 1.0, 1.0]), config=CONFIG)
    (record,) = [r for r in caplog.records if "runs without our trainer" in r.getMessage()]
    message = record.getMessage()
    assert "add trainer.v1.trainer_mode=avspo_sync" in message
    assert "legacy trainer (trainer.use_v1=False) cannot run ours, so set trainer.use_v1=True" in message
