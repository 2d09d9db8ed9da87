"""Makes the TRL CPU harness (``tests/e2e/trl_cpu``, and the ``verl_cpu`` assets it builds on)
importable here, and builds its tiny random Qwen2 once per module that asks for it (``tiny``): the
trainer's tests train it, as the e2e runs do. Without TRL nothing is imported (the tests skip)."""

import sys
from pathlib import Path

import pytest

HARNESS_ROOT = str(Path(__file__).resolve().parents[1] / "e2e")
if HARNESS_ROOT not in sys.path:
    sys.path.insert(0, HARNESS_ROOT)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The harness's model, tokenizer and 4 ``a+b=`` prompts."""
    from trl_cpu.harness import TinyAssets

    return TinyAssets.build(tmp_path_factory.mktemp("trl_tiny"), prompts=4)
