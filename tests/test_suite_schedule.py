"""How ``make test`` hands its two workers the test files (``tests/support/suite_schedule.py``): every file that
launches a trainer through a harness is in the one unit of work whose launches run one after another, and
every other file is a unit of its own."""

import ast
from pathlib import Path

import pytest
from suite_schedule import LAUNCHES, unit_of_work

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# The harnesses' launchers: each starts a trainer's processes (verl_cpu/job.py).
LAUNCHING_MODULES = {"verl_cpu.launch", "openrlhf_cpu.launch", "verl_cpu.job"}
LAUNCHING_NAMES = {("trl_cpu.harness", "launch")}


def launches_trainers(path: Path) -> bool:
    """Whether the test file imports a harness's launcher."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(alias.name in LAUNCHING_MODULES for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module in LAUNCHING_MODULES:
                return True
            if any((node.module, alias.name) in LAUNCHING_NAMES for alias in node.names):
                return True
            if any(f"{node.module}.{alias.name}" in LAUNCHING_MODULES for alias in node.names):
                return True
    return False


def test_every_file_that_launches_trainers_is_in_the_launching_unit():
    launching = {path.relative_to(REPO).as_posix() for path in TESTS.rglob("test_*.py") if launches_trainers(path)}
    assert {"tests/e2e/test_verl_cpu_e2e.py", "tests/patches/test_series_e2e.py"} <= launching  # the check sees them
    outside = sorted(path for path in launching if unit_of_work(f"{path}::test") != "launches")
    assert not outside, f"add these to LAUNCHES in tests/support/suite_schedule.py: {outside}"


def test_each_launching_path_exists():
    for path in LAUNCHES:
        assert (REPO / path).exists(), path


@pytest.mark.parametrize(
    ("nodeid", "unit"),
    [
        ("tests/e2e/test_verl_cpu_e2e.py::test_resumed_run", "launches"),
        ("tests/e2e/test_openrlhf_cpu_e2e.py::test_x[a::b]", "launches"),
        ("tests/patches/test_series_e2e.py::test_native", "launches"),
        ("tests/sandbox/test_kernels.py::test_the_printed_numbers", "launches"),
        ("tests/patches/test_avspo_patch.py::test_each[01]", "tests/patches/test_avspo_patch.py"),
        ("tests/core/test_advantage.py::TestGroups::test_one", "tests/core/test_advantage.py"),
    ],
)
def test_a_test_goes_with_its_file_or_with_the_launches(nodeid, unit):
    assert unit_of_work(nodeid) == unit
