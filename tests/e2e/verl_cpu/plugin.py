"""The ``VERL_USE_EXTERNAL_MODULES`` entry of the CPU harness; verl imports it on every ``import verl``.

The platform is registered first: verl reads the device name when some of its modules are imported
(the workers module below imports them), and a process whose first ``get_platform()`` call came
before this registration would stay on nvidia. verl logs plugin import errors of entry points only at
debug level, but modules named in ``VERL_USE_EXTERNAL_MODULES`` raise, so a broken harness fails loudly.

With ``VERL_PLATFORM=nvidia`` (a machine with a GPU, ``run_cpu_ppo.py --device cuda``) verl's own
platform, engines and workers run and only the ``hf`` rollout backend is added: the GPU trains and
the tiny model generates on the CPU.
"""

import os

from verl.plugin.platform import get_platform

from verl_cpu import platform

_PLATFORM_DEVICES = {platform.NAME: "cpu", "nvidia": "cuda"}
_requested = os.environ.get("VERL_PLATFORM", "").strip().lower()
if _requested not in _PLATFORM_DEVICES:
    raise RuntimeError(f"verl_cpu.plugin is loaded but VERL_PLATFORM is {_requested!r}: set it to cpu (or nvidia)")
if get_platform().device_name != _PLATFORM_DEVICES[_requested]:
    raise RuntimeError(f"verl chose its platform before verl_cpu registered one: {type(get_platform()).__name__}")

from verl_cpu import checkpoint_engine, hf_rollout, request_ids  # noqa: E402, F401  (registration on import)

if _requested == platform.NAME:
    from verl_cpu import workers  # noqa: E402, F401  (the gloo workers and the cpu engines)
