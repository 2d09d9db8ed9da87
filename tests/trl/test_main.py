"""``python -m verl_avspo.trl`` says how TRL users use the adapter (a trainer class, no command) and fails."""

import subprocess
import sys

import pytest

pytest.importorskip("trl", reason="TRL is not installed (pip install 'verl-avspo[trl]')")  # the package imports it


def test_python_m_verl_avspo_trl_says_how_to_use_the_adapter():
    result = subprocess.run([sys.executable, "-m", "verl_avspo.trl"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and result.stdout == ""
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("verl_avspo.trl has no command: it is TRL's GRPOTrainer with ACR and AVSPO.")
    assert "`from verl_avspo.trl import AVSPOGRPOTrainer` instead of `from trl import GRPOTrainer`" in message
    assert "see docs/trl.md" in message
