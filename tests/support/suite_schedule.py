"""How ``make test``'s two pytest-xdist workers are handed the test files (tests/conftest.py installs it).

Whole files each (``--dist loadfile``), in collection order (``--no-loadscope-reorder``), except that the files
that launch trainers are one unit of work: each launch is a Ray cluster (or torchrun's processes) of several
processes, and beside each other on a 2-core machine they slowed one another until launches passed their time
limit. They run one after another on one worker, handed out first as the longest unit, while the other worker
takes every other file.
"""

from __future__ import annotations

LAUNCHES = ("tests/e2e/", "tests/patches/test_series_e2e.py", "tests/sandbox/test_kernels.py")
"""The files that launch trainers (tests/test_suite_schedule.py checks that every harness launch is in one): the
frameworks' end to end, and the sandbox trainer's kernel tests, which start 3 and 4 sandbox runs at once (beside
the launches on the other worker they took 4 to 5 minutes each, against under one alone)."""


def unit_of_work(nodeid: str) -> str:
    """The unit a test goes to a worker with: ``launches`` for the launching files, else its file."""
    path = nodeid.split("::", 1)[0]
    return "launches" if path.startswith(LAUNCHES) else path


def make_scheduler(config, log):
    """pytest-xdist's ``loadfile`` scheduler with the launching files as one unit; None (pytest-xdist's own
    scheduler) for another ``--dist``. Its ``loadgroup`` marks cannot do this: pytest 9.2 ignores the test ids
    that pytest-xdist 3.8 rewrites for them."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LaunchesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    return LaunchesTogether(config, log)
