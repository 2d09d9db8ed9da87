"""The core's tests need torch and numpy only (``make test-core``).

With ``AVSPO_CORE_ONLY=1`` (set by ``make test-core``, which also deselects the tests marked
``verl``), importing a framework fails at once, so a core test that reached for one would fail
instead of passing here only because the framework happens to be installed.
"""

import importlib.abc
import os
import sys

FRAMEWORKS = ("verl", "ray", "transfer_queue", "openrlhf", "deepspeed", "vllm", "hydra", "omegaconf")


class _BlockFrameworks(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FRAMEWORKS:
            raise ImportError(f"{name} imported by a core test: mark the test `verl` or move it out of tests/core")
        return None


if os.environ.get("AVSPO_CORE_ONLY") == "1":
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in FRAMEWORKS)
    assert not loaded, f"already imported before the core tests: {loaded}"
    sys.meta_path.insert(0, _BlockFrameworks())
