"""Our TaskRunners install our trainers inside a real Ray actor, where verl builds the trainer.

Each runner's ``run`` is called for real; it gets as far as this CPU machine allows (the V1 runner
builds the trainer, then fails loading the tokenizer of a model folder that holds none), and
the actor is then inspected through ``__ray_call__``.
"""

import sys

import pytest
import ray
from omegaconf import OmegaConf

from verl_avspo.verl_plugin.launcher import compose_config
from verl_avspo.verl_plugin.trainer_legacy import AVSPOLegacyTaskRunner
from verl_avspo.verl_plugin.trainer_v1 import AVSPOTaskRunner

pytestmark = [pytest.mark.verl, pytest.mark.ray]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # num_cpus=16: on a 2-core machine TransferQueue's actors otherwise never schedule.
    ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False)
    # The inspectors below run in the actor, which cannot import this test file.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


def config_for(tmp_path, *overrides):
    config = compose_config(
        [
            "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.model.path={tmp_path}",  # an empty folder: no tokenizer to load
            "trainer.logger=[console]",
            "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
            *overrides,
        ]
    )
    return OmegaConf.to_container(config)  # plain data travels to the actor as verl's launcher sends it


def inspect_v1(runner):
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1 import trainer_base
    from verl.utils import tracking

    from verl_avspo.verl_plugin.trainer_v1 import V1_TRAINERS

    return {
        "trainer": type(runner.trainer).__name__,
        # every mode builds ours, under verl's own mode name
        "modes_are_ours": all(trainer_base.TRAINER_REGISTRY[mode] is cls for mode, cls in V1_TRAINERS.items()),
        "avspo_registered": "avspo" in core_algos.ADV_ESTIMATOR_REGISTRY,
        "settings_preset": runner.trainer.tracker.avspo.preset,
        # a resumed run keeps its file log: verl's Tracking builds ours in this process
        "file_logger": tracking.FileLogger.__name__,
    }


def test_v1_task_runner_builds_our_sync_trainer_inside_the_actor(tmp_path):
    runner = AVSPOTaskRunner.remote()
    with pytest.raises(ray.exceptions.RayTaskError):  # the tokenizer load, after the trainer was built
        ray.get(runner.run.remote(OmegaConf.create(config_for(tmp_path))))
    seen = ray.get(runner.__ray_call__.remote(inspect_v1))
    assert seen == {
        "trainer": "AVSPOTrainerSync",
        "modes_are_ours": True,
        "avspo_registered": True,
        "settings_preset": "paper",
        "file_logger": "ResumedFileLogger",
    }
    ray.kill(runner)


def inspect_legacy(runner):
    from verl.trainer import main_ppo_v0

    from verl_avspo.verl_plugin.trainer_legacy import AVSPORayPPOTrainer

    return main_ppo_v0.RayPPOTrainer is AVSPORayPPOTrainer


def test_legacy_task_runner_installs_our_ray_ppo_trainer_inside_the_actor(tmp_path):
    runner = AVSPOLegacyTaskRunner.remote()
    with pytest.raises(ray.exceptions.RayTaskError):  # worker setup needs GPUs
        ray.get(runner.run.remote(OmegaConf.create(config_for(tmp_path, "trainer.use_v1=False"))))
    assert ray.get(runner.__ray_call__.remote(inspect_legacy)) is True
    ray.kill(runner)
