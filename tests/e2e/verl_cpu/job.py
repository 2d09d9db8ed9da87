"""One launch of a trainer to its end, shared by the verl, OpenRLHF and TRL harnesses.

A run starts its own Ray cluster (or torchrun's workers): killing only the launched process would leave
those behind, loading the two cores the rest of the suite runs on. The job therefore gets a session of
its own, and at its time limit the whole process group is killed. The limit is then written at the end
of the console log and the job ends with ``-SIGKILL``, so that only the tests about this run fail, each
with the end of its log, instead of the module fixture that launched it erroring every test of the file.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

# Every launch ends within this many seconds (a misconfigured Ray job waits for resources silently). A run
# takes one to three minutes alone; on a 2-core machine under the rest of the suite, some took over 300 s.
TIMEOUT_S = 600


def run_to_end(
    command: Sequence[str],
    *,
    log: Path,
    timeout: float = TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run ``command``, its console (stdout and stderr) to ``log``, for at most ``timeout`` seconds."""
    with log.open("w") as out:
        process = subprocess.Popen(
            list(command), env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            out.write(f"\n[e2e harness] killed with its process group after the harness's {timeout:.0f} s limit\n")
            returncode = -signal.SIGKILL
    return subprocess.CompletedProcess(list(command), returncode)
