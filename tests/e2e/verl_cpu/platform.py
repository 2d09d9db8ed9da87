"""A verl platform for machines without an accelerator: tensors on ``cpu``, collectives on ``gloo``.

verl 0.9.1 registers nvidia, huawei and amd platforms only and falls back to nvidia when none is
found (``verl/plugin/platform/platform_manager.py``). This one is registered as ``cpu`` and chosen
with ``VERL_PLATFORM=cpu``.

Ray integration: verl's resource pools always ask for accelerators (``use_gpu=True`` and bundles
keyed by ``ray_resource_name()``), so the platform names Ray's ``GPU`` resource and the run declares
logical GPUs with ``+ray_kwargs.ray_init.num_gpus=N``: one per FSDP rank, none of them a device.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

import psutil
import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

NAME = "cpu"


class _CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the ``torch.cuda`` calls verl makes on its device module (memory
    stats, caches, RNG state), answered the way a host-memory device answers them."""

    def __init__(self):
        super().__init__("verl_cpu.device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def set_device(device: Any) -> None:
        """There is one CPU device; every rank uses it."""

    @staticmethod
    def empty_cache() -> None:
        """Host memory has no caching allocator to flush."""

    ipc_collect = empty_cache

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        """Not applicable to host memory."""

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return psutil.Process().memory_info().rss

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        """No peak statistics are kept for host memory."""

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"


@PlatformRegistry.register(platform=NAME)
class PlatformCPU(PlatformBase):
    """Host CPU as verl's device: ``torch.device("cpu")``, ``gloo``, Ray's ``GPU`` as a rank slot."""

    _device_module = _CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self) -> str:
        # verl passes this to tensor.to() and torch.device(); an int would mean cuda:<int>.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        """Every rank shares the one CPU device."""

    def synchronize(self, device_index: int | None = None) -> None:
        """CPU kernels run synchronously."""

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        """The CPU allocator takes no settings."""

    def empty_cache(self) -> None:
        """Host memory has no caching allocator to flush."""

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # What Ray sets for the logical GPUs of an actor; nothing reads it on CPU.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        """No device profiler on CPU."""

    def profiler_stop(self) -> None:
        """No device profiler on CPU."""

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None
