"""The ``VERL_USE_EXTERNAL_MODULES`` entry of the CPU harness; verl imports it on every ``import verl``.

The platform is registered first: verl reads the device name when some of its modules are imported
(the workers module below imports them), and a process whose first ``get_platform()`` call came
before this registration would stay on nvidia. verl logs plugin import errors of entry points only at
debug level, but modules named in ``VERL_USE_EXTERNAL_MODULES`` raise, so a broken harness fails loudly.
"""

import os

from verl.plugin.platform import get_platform

from verl_cpu import platform

if os.environ.get("VERL_PLATFORM", "").strip().lower() != platform.NAME:
    raise RuntimeError(f"verl_cpu.plugin is loaded but VERL_PLATFORM is not {platform.NAME!r}: set VERL_PLATFORM=cpu")
if get_platform().device_name != "cpu":
    raise RuntimeError(f"verl chose its platform before verl_cpu registered one: {type(get_platform()).__name__}")

from verl_cpu import checkpoint_engine, hf_rollout, workers  # noqa: E402, F401  (registration on import)
