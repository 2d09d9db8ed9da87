"""verl's own CPU tests stay green with this plugin installed.

They run in a separate process: ``test_core_algos_on_cpu.py`` replaces and clears verl's
estimator registry in setUp/tearDown, which would unregister ``avspo`` in this process.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.verl

VERL_TESTS = Path(importlib.util.find_spec("verl").origin).parent.parent / "tests" / "trainer" / "ppo"
SUITES = ["test_core_algos_on_cpu.py", "test_metric_utils_on_cpu.py"]


@pytest.mark.skipif(not VERL_TESTS.is_dir(), reason=f"verl's tests are not installed at {VERL_TESTS}")
def test_verl_cpu_tests_pass_beside_the_plugin(tmp_path):
    paths = [str(VERL_TESTS / name) for name in SUITES]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), *paths],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
