"""The legacy trainer subclass (``trainer.use_v1=False``): ACR metrics, alert and checkpoint state.

``RayPPOTrainer.__init__`` needs a tokenizer, datasets and GPU worker classes, so the trainer is
created with ``__new__`` and given only what the tested methods read; the FSDP actor worker group
(GPU) is a recorder. The batch goes through verl's real ``compute_advantage``.
"""

import logging

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torchdata.stateful_dataloader import StatefulDataLoader
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage

from verl_avspo.verl_plugin import run_state
from verl_avspo.verl_plugin.launcher import compose_config
from verl_avspo.verl_plugin.trainer import STATE_FILE
from verl_avspo.verl_plugin.trainer_legacy import AVSPORayPPOTrainer

pytestmark = [pytest.mark.usefixtures("fresh_estimator_state"), pytest.mark.verl]


class RecordingWorkerGroup:
    """Stands in for the FSDP actor worker group, which needs GPUs."""

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        self.saved = local_path

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.loaded = local_path


def legacy_trainer(*overrides):
    config = compose_config(["actor_rollout_ref.rollout.name=vllm", "trainer.use_v1=False", *overrides])
    OmegaConf.resolve(config)
    trainer = AVSPORayPPOTrainer.__new__(AVSPORayPPOTrainer)
    trainer.config, trainer.global_steps, trainer.use_critic = config, 0, False
    trainer.actor_rollout_wg = RecordingWorkerGroup()
    trainer.train_dataloader = StatefulDataLoader(list(range(8)), batch_size=2)
    trainer._init_avspo()
    return trainer


def legacy_batch(groups, trainer):
    """A batch as the legacy fit loop has it after compute_advantage."""
    scores = torch.tensor([s for group in groups for s in group], dtype=torch.float32)
    rewards = torch.zeros(len(scores), 3)
    rewards[:, -1] = scores
    uid = np.array([f"q{g}" for g, group in enumerate(groups) for _ in group], dtype=object)
    batch = DataProto.from_dict(
        tensors={
            "token_level_scores": rewards,
            "token_level_rewards": rewards,
            "response_mask": torch.ones(len(scores), 3),
        },
        non_tensors={"uid": uid},
    )
    algorithm = trainer.config.algorithm
    return compute_advantage(batch, algorithm.adv_estimator, num_repeat=4, config=algorithm)


def test_legacy_batch_metrics_for_avspo_and_alert(caplog):
    trainer = legacy_trainer("algorithm.acr.alert.window=2", "algorithm.acr.alert.rule=acr")
    groups = [[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 1]]
    trainer.global_steps = 1
    first = trainer.batch_collapse_metrics(legacy_batch(groups, trainer))
    assert first["acr/rate"] == 0.75 and first["acr/effective"] == 0.0
    assert first["avspo/threshold"] == 0.5 and first["avspo/triggered"] == 0.75 and first["avspo/virtual_k"] == 4.0
    assert first["acr/stalled"] == 0.0
    trainer.global_steps = 2
    with caplog.at_level(logging.WARNING, logger="verl_avspo"):
        second = trainer.batch_collapse_metrics(legacy_batch(groups, trainer))
    assert second["acr/stalled"] == 1.0
    assert "for 2 consecutive steps (now step 2, algorithm.acr.alert.rule=acr)" in caplog.text


def test_legacy_grpo_gets_acr_and_gae_gets_none():
    grpo = legacy_trainer("algorithm.adv_estimator=grpo")
    metrics = grpo.batch_collapse_metrics(legacy_batch([[1, 1, 1, 1], [1, 0, 0, 0]], grpo))
    assert metrics["acr/rate"] == 0.5 and metrics["acr/effective"] == 0.5
    assert not any(k.startswith("avspo/") for k in metrics)
    assert legacy_trainer("algorithm.adv_estimator=gae").batch_collapse_metrics(None) == {}


def test_legacy_checkpoint_round_trip_restores_the_controller(tmp_path):
    overrides = [f"trainer.default_local_dir={tmp_path}", "algorithm.avspo.eta=1.0"]
    steps = [
        [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 0], [0, 1, 1, 1]],  # ACR 0.2, J 0.7
        [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0]],  # ACR 0.2, J 0.25: θ -> 0.8
        [[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 1, 0]],  # ACR 2/3: above a fresh θ of 0.5, below 0.8
    ]
    uninterrupted = legacy_trainer(*overrides)
    expected = [legacy_batch(groups, uninterrupted).batch["advantages"] for groups in steps]

    run_state.reset()
    first = legacy_trainer(*overrides)
    for groups in steps[:2]:
        legacy_batch(groups, first)
    first.global_steps = 2
    first._save_checkpoint()
    assert (tmp_path / "global_step_2" / STATE_FILE).exists()

    run_state.reset()  # a new process
    resumed = legacy_trainer(*overrides)
    resumed._load_checkpoint()
    assert resumed.global_steps == 2 and resumed.actor_rollout_wg.loaded == str(tmp_path / "global_step_2" / "actor")
    controller = resumed.tracker.controller
    assert controller.step == 2 and controller.threshold == pytest.approx(0.8)
    # Restored, θ_3 = 0.8 > ACR_3 and nothing is augmented; a fresh controller (θ = 0.5) would augment.
    assert torch.equal(legacy_batch(steps[2], resumed).batch["advantages"], expected[2])
