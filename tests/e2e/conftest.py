"""Makes the CPU harnesses (``verl_cpu`` and ``openrlhf_cpu``, beside this file) importable in the
test process; the runs they launch find them through ``PYTHONPATH`` (see each ``launch.py``)."""

import sys
from pathlib import Path

HARNESS_ROOT = str(Path(__file__).resolve().parent)
if HARNESS_ROOT not in sys.path:
    sys.path.insert(0, HARNESS_ROOT)
