"""``python -m verl_avspo`` runs the ``verl-avspo`` command (``verl_avspo/__main__.py``, ``cli.py``)."""

import subprocess
import sys


def _module(*argv):
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=120)


def test_python_m_verl_avspo_is_the_command():
    listed = _module("verl_avspo", "--help")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("usage: verl-avspo <command> [options]") and "  doctor  " in listed.stdout
    assert _module("verl_avspo", "--version").stdout.strip() == "0.1.0"
    unknown = _module("verl_avspo", "tabel")
    assert unknown.returncode == 2 and unknown.stderr.startswith("verl-avspo: unknown command 'tabel'")
