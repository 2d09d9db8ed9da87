"""What a run will find on this machine: the installed verl (found without importing it), local
data files (read by :mod:`.data`), a local model path or a hub id that loads (:mod:`.hub`), the
classes the config names (:mod:`.extern`), and whether the Ray cluster can supply the GPUs the
config asks for (verl otherwise waits for them). Pure: problems and what could not be checked are
returned.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from verl_avspo.verl_plugin.checks.data import DATA_KEYS, DATA_WRITERS, data_problems, local_data_files
from verl_avspo.verl_plugin.checks.extern import extern_object_problems
from verl_avspo.verl_plugin.checks.hub import hub_model_problem
from verl_avspo.verl_plugin.trainer_modes import verl_mode

__all__ = [
    "verl_package_dir",
    "verl_has_self_certainty",
    "uses_critic",
    "model_path_keys",
    "cluster_gpus",
    "resource_problems",
]


def verl_package_dir() -> Path:
    """The installed verl's folder, found without importing verl (its ``__init__`` is the slow part)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("verl is not installed: pip install 'verl[verl-core]>=0.9.0,<0.10'")
    return Path(next(iter(spec.submodule_search_locations)))


def verl_has_self_certainty() -> bool:
    """Whether the installed verl's FSDP engine returns per-token self-certainty, i.e. carries
    patches/verl-0.9.1-intrinsic.patch. Reads the module's source file; imports nothing."""
    source = verl_package_dir() / "workers" / "engine" / "fsdp" / "transformer_impl.py"
    return source.is_file() and "calculate_self_certainty" in source.read_text(encoding="utf-8")


_REMOTE = re.compile(r"^[a-z][a-z0-9+.-]*://")
# A Hugging Face hub id: "name" or "org/name", neither absolute nor relative-looking.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _path_problems(config: DictConfig, not_checked: list[str]) -> Iterator[str]:
    for key in DATA_KEYS:
        if not local_data_files(config, key):  # verl builds both datasets, validation or not
            yield (
                f"{key}={OmegaConf.select(config, key, default=None)} names no file, and verl builds its "
                f"{'training' if key.endswith('train_files') else 'validation'} dataset from it before the first "
                f"step (even with trainer.test_freq=-1). Give the files (written by {DATA_WRITERS[key]})."
            )
    for key in DATA_KEYS:
        for name in local_data_files(config, key):
            if _REMOTE.match(name):
                not_checked.append(f"{key} entry {name} (remote)")
            elif not Path(name).expanduser().exists():
                yield (
                    f"{key}: {name} does not exist. Fix the path, or write the data first (recipes/README.md, "
                    f"{DATA_WRITERS[key]})."
                )
    for key in (*model_path_keys(config), "reward.custom_reward_function.path"):
        name = OmegaConf.select(config, key, default=None)
        if name is not None and key in _MODEL_KEYS and Path(str(name)).expanduser().is_file():
            yield f"{key}={name} is a file; give the model's folder (the one that holds its config.json)."
            continue
        if name is None or Path(str(name)).expanduser().exists():
            continue
        name = str(name)
        if _REMOTE.match(name):  # pkg:// (a module), hdfs://, ...
            if not name.startswith("pkg://"):
                not_checked.append(f"{key}={name} (remote)")
        elif key in _MODEL_KEYS and _HUB_ID.match(name):
            problem, unchecked = hub_model_problem(key, name)
            if problem:
                yield problem
            else:
                not_checked.append(unchecked)
        elif key == "critic.model.path":
            actor = OmegaConf.select(config, "actor_rollout_ref.model.path", default=None)
            why = (
                "critic.enable=True"
                if OmegaConf.select(config, "critic.enable", default=None) is True
                else f"algorithm.adv_estimator={config.algorithm.adv_estimator}"
            )
            yield (
                f"critic.model.path={name} does not exist on this machine: {why} trains a critic (a value model) "
                "starting from critic.model.path, and verl's default is a placeholder. Set critic.model.path, "
                f"usually to the actor's model (critic.model.path={actor}), or use an estimator without a critic "
                "(avspo, grpo)."
            )
        else:
            accepted = (
                "a hub id such as Qwen/Qwen2.5-0.5B is also accepted"
                if key in _MODEL_KEYS
                else "or name a module as pkg://package.module"
            )
            yield f"{key}={name} does not exist on this machine. Fix the path ({accepted})."


def uses_critic(config: DictConfig) -> bool:
    """Whether verl trains a critic: ``critic.enable``, or by default with the gae estimator (verl's
    ``need_critic``, without importing verl)."""
    enable = OmegaConf.select(config, "critic.enable", default=None)
    return enable is True or (enable is None and config.algorithm.adv_estimator == "gae")


_MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path", "reward.reward_model.model_path")


def model_path_keys(config: DictConfig) -> list[str]:
    """The model paths the run loads: the actor's, and the critic's and the reward model's when used."""
    keys = [_MODEL_KEYS[0]]
    if uses_critic(config):
        keys.append(_MODEL_KEYS[1])
    if OmegaConf.select(config, "reward.reward_model.enable", default=False) is True:
        keys.append(_MODEL_KEYS[2])
    return keys


def _gpu_pools(config: DictConfig) -> dict[str, int]:
    """The GPUs of each resource pool verl's trainer will ask Ray for, by its config section: the
    trainer's; ``separate_async``'s standalone rollout pool, which has GPUs of its own
    (trainer_separate_async.py); a standalone reward model's."""
    sections = ["trainer"]
    mode = verl_mode(OmegaConf.select(config, "trainer.v1.trainer_mode", default=None))
    if OmegaConf.select(config, "trainer.use_v1", default=False) and mode == "separate_async":
        sections.append("actor_rollout_ref.rollout")
    reward = config.reward.reward_model
    if reward.get("enable", False) and reward.get("enable_resource_pool", False):
        sections.append("reward.reward_model")
    pools = {section: OmegaConf.select(config, section) for section in sections}
    return {section: int(pool.n_gpus_per_node) * int(pool.nnodes) for section, pool in pools.items()}


def _ray_address(config: DictConfig) -> str | None:
    address = OmegaConf.select(config, "ray_kwargs.ray_init.address", default=None) or os.environ.get("RAY_ADDRESS")
    return None if address == "local" else address  # "local" starts a new local cluster, as no address does


def cluster_gpus(config: DictConfig, *, connect: bool) -> tuple[float | None, str]:
    """The GPUs the run's Ray cluster offers, and where that number comes from; None if unknown.

    Without a Ray address, verl starts a local cluster with ``ray_kwargs.ray_init.num_gpus`` GPUs, or
    the ones Ray detects (``torch.cuda.device_count()``, which honours CUDA_VISIBLE_DEVICES). With an
    address, the cluster is asked only if ``connect`` (then disconnected, so that verl's own
    ``ray.init`` still applies its runtime_env).
    """
    import ray

    if ray.is_initialized():
        return ray.cluster_resources().get("GPU", 0.0), "the running Ray cluster"
    address = _ray_address(config)
    if address:
        if not connect:
            return None, f"the Ray cluster at {address}"
        ray.init(address=address, logging_level=logging.WARNING)
        try:
            return ray.cluster_resources().get("GPU", 0.0), f"the Ray cluster at {address}"
        finally:
            ray.shutdown()
    num_gpus = OmegaConf.select(config, "ray_kwargs.ray_init.num_gpus", default=None)
    if num_gpus is not None:
        return float(num_gpus), f"ray_kwargs.ray_init.num_gpus={num_gpus}"
    import torch

    return float(torch.cuda.device_count()), "this machine (torch.cuda.device_count())"


def _gpu_problems(config: DictConfig, not_checked: list[str], *, connect: bool) -> Iterator[str]:
    device = str(OmegaConf.select(config, "trainer.device", default="cuda"))
    if device != "cuda":
        not_checked.append(f"the {device} devices the run needs (trainer.device={device})")
        return
    try:
        pools = _gpu_pools(config)
    except (TypeError, ValueError):  # text for a number: reported by the settings stage
        return
    wanted = sum(pools.values())
    available, source = cluster_gpus(config, connect=connect)
    if available is None:
        not_checked.append(f"that {source} has the {wanted} GPU(s) the config asks for")
        return
    if available < wanted:
        asked = " plus ".join(
            f"{section}.n_gpus_per_node={OmegaConf.select(config, section).n_gpus_per_node} x "
            f"{section}.nnodes={OmegaConf.select(config, section).nnodes}"
            for section in pools
        )
        if len(pools) == 1:
            fix = "Set trainer.n_gpus_per_node (recipes: N_GPUS) to the GPUs you have"
        else:
            keys = " or ".join(f"{section}.n_gpus_per_node" for section in pools)
            fix = f"Each pool has GPUs of its own: lower {keys} until they add up to the GPUs you have"
        if int(config.trainer.nnodes) > 1:
            fix += ", or start a Ray cluster of those nodes and set ray_kwargs.ray_init.address"
        yield (
            f"{asked} {'asks' if len(pools) == 1 else 'ask'} for {wanted} GPU(s), but {source} has {available:g}; "
            f"Ray would wait for them and the run would hang. {fix}."
        )


def _rollout_replica_problems(config: DictConfig) -> Iterator[str]:
    """Each rollout replica takes tensor x data x pipeline parallel GPUs of its pool. On the trainer's
    pool (hybrid replicas) verl asserts that they divide the pool (engine_workers.py, after the actor
    has loaded); a standalone pool smaller than one replica starts none, and the first generation
    fails ("No available servers in load balancer")."""
    rollout = config.actor_rollout_ref.rollout
    if OmegaConf.select(config, "actor_rollout_ref.rollout.disaggregation.enabled", default=False):
        return  # prefill and decode replicas of their own sizes: left to verl
    try:
        pools = _gpu_pools(config)
        sizes = [int(rollout[key]) for key in ("tensor_model_parallel_size", "data_parallel_size",
                                               "pipeline_model_parallel_size")]  # fmt: skip
    except (TypeError, ValueError):  # text for a number: reported by the settings stage
        return
    replica = sizes[0] * sizes[1] * sizes[2]
    shape = (
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={sizes[0]} x data_parallel_size={sizes[1]} x "
        f"pipeline_model_parallel_size={sizes[2]} = {replica} GPU(s) per rollout replica"
    )
    fix = "Set actor_rollout_ref.rollout.tensor_model_parallel_size (recipes: ROLLOUT_TP) to"
    separate = "actor_rollout_ref.rollout" in pools
    if not (separate and not config.actor_rollout_ref.get("hybrid_engine", True)):
        gpus = pools["trainer"]
        if gpus % replica:
            yield (
                f"{shape}, which must divide the trainer's trainer.n_gpus_per_node x trainer.nnodes = {gpus} "
                f"GPU(s) (the replicas share them); verl would stop after loading the actor. {fix} a divisor of {gpus}."
            )
    if separate and 0 < pools["actor_rollout_ref.rollout"] < replica:  # an empty pool: see the settings stage
        gpus = pools["actor_rollout_ref.rollout"]
        yield (
            f"{shape}, but separate_async's rollout pool (actor_rollout_ref.rollout.n_gpus_per_node x nnodes) has "
            f"{gpus}: verl would start no standalone replica. {fix} at most {gpus}, or give the pool more GPUs."
        )


def resource_problems(config: DictConfig, *, connect: bool = False) -> tuple[list[str], list[str]]:
    """What the run will find: local data files (with their columns and data sources) and model path,
    the classes and functions it names (imported), rollout replicas that fit their GPUs, and the GPUs
    of its Ray cluster.

    Returns:
        (problems, not checked): each problem names the key and the fix; "not checked" lists what
        could not be checked here (remote files, hub ids, an existing cluster when not ``connect``).
    """
    not_checked: list[str] = []
    problems = list(_path_problems(config, not_checked))
    problems += data_problems(config, not_checked)
    problems += extern_object_problems(config)
    problems += _rollout_replica_problems(config)
    problems += _gpu_problems(config, not_checked, connect=connect)
    return problems, not_checked
