"""A stand-in ``trl`` package for tests of verl next to TRL releases that keep
``AutoModelForCausalLMWithValueHead`` in different places (or have none, as TRL 1.16), and the
fresh interpreters that put it first on ``sys.path``. Imported as ``trl_stand_in`` (tests/conftest.py
puts this folder on the path)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

__all__ = ["LAYOUTS", "VERSION", "run_python", "stand_in_trl"]

VERSION = "0.0.fake"
# Where the class is: nowhere (TRL 1.16), trl.experimental.ppo (TRL >= 0.27), top-level trl (older).
LAYOUTS = ("none", "experimental", "top")

VALUE_HEAD_CLASS = """
import torch

class AutoModelForCausalLMWithValueHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pretrained_model = torch.nn.Linear(2, 2)
        self.v_head = torch.nn.Linear(2, 1)

    def state_dict(self, *args, **kwargs):
        return {"folded": torch.zeros(1)}
"""


def stand_in_trl(root: Path, layout: str) -> Path:
    """A ``trl`` package under ``root`` with the value-head class where ``layout`` says; returns ``root``."""
    assert layout in LAYOUTS, layout
    package = root / "trl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"__version__ = {VERSION!r}\n" + (VALUE_HEAD_CLASS if layout == "top" else ""))
    if layout == "experimental":
        (package / "experimental" / "ppo").mkdir(parents=True)
        (package / "experimental" / "__init__.py").write_text("")
        (package / "experimental" / "ppo" / "__init__.py").write_text(VALUE_HEAD_CLASS)
    return root


def run_python(script: str, first_on_path: Sequence = (), **env: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter with ``first_on_path`` at the front of ``sys.path`` (PYTHONPATH,
    so that Ray workers would inherit it too) and ``env`` added to the environment."""
    environment = {**os.environ, **env}
    paths = [str(p) for p in first_on_path] + [p for p in [environment.get("PYTHONPATH")] if p]
    environment["PYTHONPATH"] = os.pathsep.join(paths)
    code = textwrap.dedent(script)
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=300)
