"""verl's own TaskRunner builds our trainer inside a real Ray actor, from the mode name alone.

verl's stock ``TaskRunnerV1`` (``verl/trainer/main_ppo.py``), unmodified, is given a config whose
``trainer.v1.trainer_mode`` is ours; its ``run`` is called for real and gets as far as this CPU machine allows (it
builds the trainer, then fails loading the tokenizer of a model folder that holds none), and the actor is then
inspected through ``__ray_call__``: the actor process found our name in verl's registry (registered by the entry
point once verl's V1 package was imported there), built our trainer, and the trainer showed verl its own mode name.
"""

import sys

import pytest
import ray
from omegaconf import OmegaConf
from verl.trainer.main_ppo import TaskRunnerV1

from verl_avspo.verl_plugin.launcher import compose_config

pytestmark = [pytest.mark.verl, pytest.mark.ray]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # num_cpus=16: on a 2-core machine TransferQueue's actors otherwise never schedule.
    ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False)
    # The inspector below runs in the actor, which cannot import this test file.
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


def inspect(runner):
    from verl.trainer.ppo import core_algos
    from verl.utils import tracking

    return {
        "trainer": type(runner.trainer).__name__,
        "mode_seen_by_verl": (runner.trainer.trainer_mode, runner.config.trainer.v1.trainer_mode),
        "avspo_registered": "avspo" in core_algos.ADV_ESTIMATOR_REGISTRY,
        "settings_preset": runner.trainer.tracker.avspo.preset,
        # a resumed run keeps its file log through our trainer (its logger property): verl's FileLogger is
        # not replaced in this process
        "file_logger": f"{tracking.FileLogger.__module__}.{tracking.FileLogger.__name__}",
    }


def test_verls_own_task_runner_builds_our_trainer_from_our_mode_name(tmp_path):
    runner = TaskRunnerV1.remote()
    with pytest.raises(ray.exceptions.RayTaskError):  # the tokenizer load, after the trainer was built
        ray.get(runner.run.remote(OmegaConf.create(config_for(tmp_path, "trainer.v1.trainer_mode=avspo_sync"))))
    seen = ray.get(runner.__ray_call__.remote(inspect))
    assert seen == {
        "trainer": "AVSPOTrainerSync",
        "mode_seen_by_verl": ("sync", "sync"),
        "avspo_registered": True,
        "settings_preset": "paper",
        "file_logger": "verl.utils.tracking.FileLogger",
    }
    ray.kill(runner)
