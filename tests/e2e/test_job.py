"""The harnesses' job runner (``verl_cpu/job.py``): a job past its limit is killed with every process it
started, its log says so, and it ends with ``-SIGKILL`` instead of raising; a job within it keeps its status."""

import signal
import sys
import time
from pathlib import Path

from verl_cpu.job import run_to_end


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a killed child that nobody has reaped yet, a zombie, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_job_past_its_limit_is_killed_with_its_children(tmp_path):
    child_pid = tmp_path / "child.pid"
    # A parent that starts a child (as a trainer starts Ray's processes) and waits on it.
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "child.wait()\n"
    )
    result = run_to_end([sys.executable, "-c", script], log=tmp_path / "run.log", timeout=3)
    assert result.returncode == -signal.SIGKILL
    log = (tmp_path / "run.log").read_text()
    assert log.startswith("started") and "killed with its process group after the harness's 3 s limit" in log
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_a_job_within_its_limit_keeps_its_status_and_console(tmp_path):
    result = run_to_end(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
        log=tmp_path / "run.log",
        timeout=60,
    )
    assert result.returncode == 3
    assert (tmp_path / "run.log").read_text().split() == ["out", "err"]
