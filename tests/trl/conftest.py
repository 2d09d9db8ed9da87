"""Makes the TRL CPU harness (``tests/e2e/trl_cpu``, and the ``verl_cpu`` assets it builds on)
importable here: the trainer's tests build its tiny model, as the e2e runs do."""

import sys
from pathlib import Path

HARNESS_ROOT = str(Path(__file__).resolve().parents[1] / "e2e")
if HARNESS_ROOT not in sys.path:
    sys.path.insert(0, HARNESS_ROOT)
