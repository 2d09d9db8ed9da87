"""The legacy trainer subclass (``trainer.use_v1=False``): ACR metrics, alert and checkpoint state.

``RayPPOTrainer.__init__`` needs a tokenizer, datasets and GPU worker classes, so the trainer is
created with ``__new__`` and given only what the tested methods read; the FSDP actor worker group
(GPU) is a recorder (``helpers.RecordingWorkerGroup``). The batch goes through verl's real
``compute_advantage``. A state save that fails (a full disk) names the file, the key and the fix, and so does a resume
from a torn state.
"""

import errno
import logging
import pathlib

import numpy as np
import pytest
import torch
from helpers import grouped_batch, outcome_data, with_checkpoint_parts
from omegaconf import OmegaConf
from verl.trainer.ppo.ray_trainer import compute_advantage

from verl_avspo.core.files import FileWriteError
from verl_avspo.core.run_tracker import RunStateError
from verl_avspo.verl_plugin import run_state
from verl_avspo.verl_plugin.launcher import compose_config
from verl_avspo.verl_plugin.trainer import STATE_FILE
from verl_avspo.verl_plugin.trainer_legacy import AVSPORayPPOTrainer

pytestmark = [pytest.mark.usefixtures("fresh_estimator_state"), pytest.mark.verl]


def legacy_trainer(*overrides):
    config = compose_config(["actor_rollout_ref.rollout.name=vllm", "trainer.use_v1=False", *overrides])
    OmegaConf.resolve(config)
    trainer = AVSPORayPPOTrainer.__new__(AVSPORayPPOTrainer)
    trainer.config, trainer.global_steps, trainer.use_critic = config, 0, False
    with_checkpoint_parts(trainer)._init_avspo()
    return trainer


def legacy_batch(groups, trainer):
    """A batch as the legacy fit loop has it after compute_advantage."""
    rewards, mask, uids = grouped_batch(groups)
    batch = outcome_data(rewards, mask, uids, token_level_scores=rewards)
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


def test_legacy_batch_records_each_prompt_by_its_extra_info_index():
    trainer = legacy_trainer("algorithm.adv_estimator=grpo", "algorithm.prompts.key=index")
    batch = legacy_batch([[1, 1, 1, 1], [1, 0, 0, 0]], trainer)
    uids = batch.non_tensor_batch["uid"]
    index_of = {uid: 10 + g for g, uid in enumerate(dict.fromkeys(uids))}
    batch.non_tensor_batch["extra_info"] = np.array([{"index": index_of[uid]} for uid in uids], dtype=object)
    trainer.global_steps = 1
    metrics = trainer.batch_collapse_metrics(batch)
    assert metrics["prompts/seen"] == 2 and metrics["prompts/always_solved"] == 0.5
    records = trainer.tracker.prompt_history.lookup([10, 11])
    assert records.all_correct.tolist() == [1, 0] and records.last_pass_rate.tolist() == [1.0, 0.25]


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
    assert resumed.global_steps == 2 and resumed.actor_rollout_wg.loaded == [str(tmp_path / "global_step_2" / "actor")]
    controller = resumed.tracker.controller
    assert controller.step == 2 and controller.threshold == pytest.approx(0.8)
    # Restored, θ_3 = 0.8 > ACR_3 and nothing is augmented; a fresh controller (θ = 0.5) would augment.
    assert torch.equal(legacy_batch(steps[2], resumed).batch["advantages"], expected[2])


def test_a_full_disk_in_the_state_save_names_the_file_and_the_fix_and_tears_nothing(tmp_path, monkeypatch):
    """A full disk used to end the run in torch's writer ("unexpected pos 64 vs 0") with a 0-byte
    avspo_state.pt left behind. Now the save stops before verl's own files, naming the file, the
    key and the fix, and leaves no file of the step."""
    trainer = legacy_trainer(f"trainer.default_local_dir={tmp_path}")
    trainer.global_steps = 1

    def full_disk(path, data):
        with open(path, "wb") as stream:
            stream.write(data[:64])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_bytes", full_disk)
    with pytest.raises(FileWriteError) as caught:
        trainer._save_checkpoint()
    message = str(caught.value)
    assert f"cannot write {tmp_path / 'global_step_1' / STATE_FILE}: no space left on the device" in message
    assert f"Free space in trainer.default_local_dir={tmp_path}" in message and "trainer.resume_mode=auto" in message
    assert caught.value.errno == errno.ENOSPC
    assert list((tmp_path / "global_step_1").iterdir()) == []  # no torn state
    assert trainer.actor_rollout_wg.saved == [] and not (tmp_path / "latest_checkpointed_iteration.txt").exists()


def test_a_torn_state_from_an_earlier_release_stops_the_resume_naming_the_file_and_the_fix(tmp_path):
    (tmp_path / "global_step_2").mkdir()
    (tmp_path / "global_step_2" / STATE_FILE).write_bytes(b"")  # what a full disk left in place
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    trainer = legacy_trainer(f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=auto")
    with pytest.raises(RunStateError, match=r"global_step_2/avspo_state.pt is empty .* resume from the previous"):
        trainer._load_checkpoint()
