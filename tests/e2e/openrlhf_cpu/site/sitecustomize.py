"""CPU patches for OpenRLHF 0.11.2 and DeepSpeed 0.19.6, applied after the module they patch is imported.

Python imports ``sitecustomize`` in every process whose ``PYTHONPATH`` holds this folder: the launching
process and every Ray worker. Nothing is imported here until a patched module is; no installed file
is changed. Each patch names the line it stands in for and why.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
import warnings

# Fake accelerators for Ray's placement: OpenRLHF asks for {"GPU": 1, "CPU": 1} bundles
# (cli/train_ppo_ray.py:48, trainer/ray/vllm_engine.py:249-251, trainer/ray/launcher.py:245) and
# actors with num_gpus=1 (trainer/ray/ppo_actor.py:493). Without them Ray waits forever.
RAY_RESOURCES = {"num_gpus": 4, "num_cpus": 8, "include_dashboard": False}


# Ray waits a fixed 30 s for its raylet to register (ray/_private/node.py:428); on a 2-core machine running the
# other e2e module's Ray cluster beside this one, that start-up can take longer. A timed-out start is retried.
RAY_START_ATTEMPTS = 3


def _ray(ray):
    """OpenRLHF calls ray.init itself with a runtime_env only (cli/train_ppo_ray.py:24)."""
    init = ray.init

    @functools.wraps(init)
    def ray_init(*args, **kwargs):
        for attempt in range(1, RAY_START_ATTEMPTS + 1):
            try:
                return init(*args, **{**RAY_RESOURCES, **kwargs})
            except Exception as err:
                if "timed out during startup" not in str(err) or attempt == RAY_START_ATTEMPTS:
                    raise
                warnings.warn(f"Ray's start-up timed out (attempt {attempt}); starting it again", stacklevel=2)
                ray.shutdown()

    ray.init = ray_init


def _torch_cuda_on_cpu(_openrlhf):
    """OpenRLHF calls torch.cuda directly: set_device (utils/deepspeed/deepspeed.py:97), current_device
    as the device to put tensors on (trainer/ray/ppo_actor.py:148,171,627; trainer/ray/launcher.py:136,190;
    utils/deepspeed/deepspeed.py:614,633), synchronize (utils/distributed_util.py:10,
    trainer/ray/ppo_actor.py:605) and current_stream (trainer/ray/ppo_actor.py:436). A CPU torch build
    raises "Torch not compiled with CUDA enabled" on each; here they answer for the CPU."""
    import torch

    torch.cuda.set_device = lambda device: None
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.current_stream = lambda device=None: None


def _replay_buffer(module):
    """NaiveReplayBuffer.__init__ builds torch.device(f"cuda:{torch.cuda.current_device()}")
    (trainer/ppo_utils/replay_buffer.py:40): build it with index 0, then keep experiences on the CPU."""
    import torch

    init = module.NaiveReplayBuffer.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        current_device, torch.cuda.current_device = torch.cuda.current_device, lambda: 0
        try:
            init(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = current_device
        self.target_device = torch.device("cpu")

    module.NaiveReplayBuffer.__init__ = __init__


def _torch_adam(module):
    """OpenRLHF always asks DeepSpeed for "AdamW" (utils/deepspeed/deepspeed.py:358-366), which DeepSpeed
    serves with its fused C++ Adam, compiled on first use (deepspeed/runtime/engine.py:2196, about a
    minute). torch_adam=True makes DeepSpeed use torch.optim.AdamW (engine.py:2172-2175)."""
    get_config = module.DeepspeedStrategy.get_ds_train_config

    @functools.wraps(get_config)
    def get_ds_train_config(self, *args, **kwargs):
        config = get_config(self, *args, **kwargs)
        if "optimizer" in config:
            config["optimizer"].setdefault("params", {})["torch_adam"] = True
        return config

    module.DeepspeedStrategy.get_ds_train_config = get_ds_train_config


def _no_shared_memory_op(module):
    """DeepSpeed's CPU backend compiles a shared-memory collective op on start (deepspeed/comm/torch.py:191,
    build_shm_op, about half a minute); without it, its collectives use gloo."""
    module.build_shm_op = lambda: None


PATCHES = {
    "ray": _ray,
    "openrlhf": _torch_cuda_on_cpu,
    "openrlhf.trainer.ppo_utils.replay_buffer": _replay_buffer,
    "openrlhf.utils.deepspeed.deepspeed": _torch_adam,
    "deepspeed.comm.torch": _no_shared_memory_op,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``PATCHES[name]`` on a module of that name right after it is first executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, PATCHES[fullname]

        class Patched(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                patch(module)

            def __getattr__(self, name):
                return getattr(loader, name)

        spec.loader = Patched()
        return spec


sys.meta_path.insert(0, _PatchAfterImport())
