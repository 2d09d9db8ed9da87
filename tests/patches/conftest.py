"""Makes ``verl_tree`` (beside this file) importable by the tests here, and gives them the verl 0.9.1
sources with the whole series applied, built once per session."""

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from verl_tree import SERIES, patched_tree  # noqa: E402


@pytest.fixture(scope="session")
def series_tree(tmp_path_factory):
    """The verl 0.9.1 sources with the whole series applied in order."""
    return patched_tree(tmp_path_factory.mktemp("verl-0.9.1-series"), SERIES)
