"""Makes the CPU harness (``verl_cpu``, beside this file) importable in the test process; the runs
it launches find it through ``PYTHONPATH`` (see ``verl_cpu.launch``)."""

import sys
from pathlib import Path

HARNESS_ROOT = str(Path(__file__).resolve().parent)
if HARNESS_ROOT not in sys.path:
    sys.path.insert(0, HARNESS_ROOT)
