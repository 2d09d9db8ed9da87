"""Each route imports only what it needs, so either side of verl can go: its maintainers plan
to drop TransferQueue (and make the legacy trainer the default again), while 0.9.1 announces the
legacy trainer's removal.

Each check runs in a fresh interpreter in which the missing module is blocked
(``sys.modules[name] = None`` makes every import of it fail) and then imports and runs the route:

- without ``transfer_queue``: the estimator's entry point computes an advantage, and the launcher's
  legacy route (``trainer.use_v1=False``, the estimator alone) passes its dry run;
- without ``verl.trainer.main_ppo_v0``: our V1 trainers (every mode) import and are in verl's registry, and the
  launcher's dry run passes.
"""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.verl


@pytest.fixture(scope="module")
def runnable(tmp_path_factory, write_verl_parquet) -> str:
    """The overrides of a config that passes a dry run here (local data files and model folder, one
    logical GPU for Ray's local cluster), as the text of a Python list for the subprocess."""
    folder = tmp_path_factory.mktemp("resources")
    for name in ("train.parquet", "val.parquet"):
        write_verl_parquet(folder / name)
    (folder / "model").mkdir()
    return repr(
        [
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            f"data.train_files={folder / 'train.parquet'}",
            f"data.val_files={folder / 'val.parquet'}",
            f"actor_rollout_ref.model.path={folder / 'model'}",
            "trainer.n_gpus_per_node=1",
            "+ray_kwargs.ray_init.num_gpus=1",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        ]
    )


def run_without(module: str, code: str) -> subprocess.CompletedProcess:
    script = f"import sys\nsys.modules[{module!r}] = None\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)


def test_legacy_route_and_the_estimator_work_without_transfer_queue(runnable):
    result = run_without(
        "transfer_queue",
        f"""
        import numpy as np, torch
        import verl_avspo.verl_plugin.register  # the verl.plugins entry point
        from verl.trainer.ppo import core_algos
        advantages, _ = core_algos.get_adv_estimator_fn("avspo")(
            token_level_rewards=torch.tensor([[1.0], [0.0], [0.0], [0.0]]),
            response_mask=torch.ones(4, 1),
            index=np.array(["a", "a", "b", "b"], dtype=object),
        )
        assert advantages[0, 0] > 0 > advantages[1, 0], advantages
        from verl_avspo.verl_plugin import launcher
        assert launcher.main(["--dry-run", *{runnable}, "trainer.use_v1=False"]) == 0
        assert sys.modules["transfer_queue"] is None
        import importlib
        try:
            importlib.import_module("verl_avspo.verl_plugin.trainer_v1")
        except ImportError:
            print("V1 needs transfer_queue, as expected")
        """,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "OK: the config composes" in result.stdout
    assert "V1 needs transfer_queue, as expected" in result.stdout  # the block was real


def test_v1_routes_work_without_the_legacy_trainer(runnable):
    result = run_without(
        "verl.trainer.main_ppo_v0",
        f"""
        from verl.trainer.ppo.v1 import get_trainer_cls
        from verl_avspo.verl_plugin import launcher, trainer_v1
        assert {{mode: get_trainer_cls(mode) for mode in trainer_v1.V1_TRAINERS}} == trainer_v1.V1_TRAINERS
        assert set(trainer_v1.V1_TRAINERS) == {{"avspo_sync", "avspo_colocate_async", "avspo_separate_async"}}
        separate = ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
                    "actor_rollout_ref.rollout.n_gpus_per_node=1", "ray_kwargs.ray_init.num_gpus=2",
                    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]
        assert launcher.main(["--dry-run", *{runnable}, *separate]) == 0
        try:
            import verl.trainer.main_ppo_v0
        except ImportError:
            print("legacy blocked, as expected")
        """,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "legacy blocked, as expected" in result.stdout
