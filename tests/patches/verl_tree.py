"""The upstream series (``patches/NN-*.patch``) and copies of the installed verl 0.9.1 sources with
patches applied: its ``verl`` package and the ``tests`` package its wheel ships (the repository
layout), patched with ``git apply`` (or ``patch -p1``)."""

import importlib.util
import shutil
import subprocess
from pathlib import Path

PATCHES = Path(__file__).resolve().parents[2] / "patches"
SERIES = sorted(PATCHES.glob("[0-9][0-9]-*.patch"))


def patched_tree(root: Path, patches: list[Path]) -> Path:
    """A copy of the installed verl 0.9.1 sources in ``root`` with ``patches`` applied in order."""
    site = Path(importlib.util.find_spec("verl").origin).parents[1]
    for package in ("verl", "tests"):
        shutil.copytree(site / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    assert (root / "verl" / "version" / "version").read_text().strip() == "0.9.1"
    for patch in patches:
        if shutil.which("git"):
            command = ["git", "apply", "--verbose", str(patch)]
        else:
            command = ["patch", "-p1", "--forward", "--batch", "-i", str(patch)]
        result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{patch.name}: " + result.stdout + result.stderr
    return root
