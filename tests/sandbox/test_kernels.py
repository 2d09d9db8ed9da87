"""The sandbox's pinned floating-point kernels (verl_avspo.sandbox.kernels): the `verl-avspo sandbox`
command prints the same numbers whichever kernels torch, MKL and oneDNN would pick on this CPU and
with 1 or 2 threads, and a control run that imports torch first (so nothing is pinned) shows that
the same tiny run does tell those kernels apart. `verl-avspo sandbox --fingerprint` prints one line under
each of those selections, with the samples hash the docs quote. Each run is a fresh process, as the environment is
read when torch loads."""

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import transformers

from verl_avspo.sandbox import fingerprint_match
from verl_avspo.sandbox.kernels import PINNED_KERNELS

pytestmark = pytest.mark.verl

TINY = ["--estimators", "grpo", "--steps", "2", "--seeds", "1", "--sft-steps", "20", "--eval-size", "8"]
TINY += ["--eval-every", "2", "--no-cache"]


def _widest() -> tuple[str, str]:
    """ATen's and MKL's widest kernels on this CPU: AVX-512 where it has them (asking for them elsewhere
    ends the process with an illegal instruction), else AVX2."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return ("avx512", "AVX512") if "avx512f" in flags else ("avx2", "AVX2")


# Two kernel selections a machine could make on its own, neither of them the pinned one: ATen's and MKL's
# widest, and ATen's plain C++ kernels with MKL's SSE4.2 path.
SELECTIONS = {
    "widest": {
        "ATEN_CPU_CAPABILITY": _widest()[0],
        "MKL_ENABLE_INSTRUCTIONS": _widest()[1],
        "ONEDNN_MAX_CPU_ISA": "ALL",
    },
    "plain": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
# The control: the sandbox called from Python after torch was imported, which cannot pin anything.
UNPINNED = "import sys, torch; from verl_avspo.cli import main; sys.exit(main(sys.argv[1:]))"


def _env(selection: dict[str, str]) -> dict[str, str]:
    return {**{key: value for key, value in os.environ.items() if key not in PINNED_KERNELS}, **selection}


def _run_all(commands: dict[str, tuple[list[str], dict[str, str]]]) -> dict[str, subprocess.CompletedProcess]:
    """The commands side by side: each spends most of its time importing verl."""
    started = {
        name: subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, (argv, env) in commands.items()
    }
    done = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        assert process.returncode == 0, f"{name}: {stderr[-3000:]}"
    return done


def _log(out) -> str:
    return (out / "runs" / "grpo" / "seed0.jsonl").read_text()


def _tables(out) -> str:
    """summary.md from its results on (the setup above it names the kernels)."""
    summary = (out / "summary.md").read_text()
    return summary[summary.index("## Result") :]


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"), reason="the pinned path needs a CPU with AVX2"
)
def test_the_printed_numbers_do_not_depend_on_the_cpus_kernels(tmp_path):
    commands = {}
    for name, selection in SELECTIONS.items():
        for how, argv in (
            ("pinned", [sys.executable, "-m", "verl_avspo.cli", "sandbox"]),
            ("unpinned", [sys.executable, "-c", UNPINNED, "sandbox"]),
        ):
            # The pinned plain run also takes 2 threads: the numbers must not depend on them either.
            threads = ["--threads", "2"] if (how, name) == ("pinned", "plain") else []
            commands[how, name] = ([*argv, *TINY, *threads, "--out", str(tmp_path / how / name)], _env(selection))
    runs = _run_all(commands)
    control = {name: _log(tmp_path / "unpinned" / name) for name in SELECTIONS}
    # The control: the tiny run's metrics differ between the two selections when nothing is pinned.
    assert control["widest"] != control["plain"]
    assert "The numbers depend on this CPU." in (tmp_path / "unpinned" / "plain" / "summary.md").read_text()

    logs = {name: _log(tmp_path / "pinned" / name) for name in SELECTIONS}
    assert logs["widest"] == logs["plain"]  # every metric of every step, to the last bit
    assert _tables(tmp_path / "pinned" / "widest") == _tables(tmp_path / "pinned" / "plain")
    assert [json.loads(line)["step"] for line in logs["plain"].splitlines()] == [0, 1, 2]
    assert "one code path on any x86-64 CPU with AVX2" in runs["pinned", "plain"].stdout


def test_the_command_pins_the_kernels_before_torch_loads():
    check = "from verl_avspo.sandbox.kernels import pin_kernels, pinned; pin_kernels(); print(pinned())"
    selection = _env({"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AVX2"})
    pinned = subprocess.run([sys.executable, "-c", check], env=selection, capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "True"
    # After torch has loaded, pinning would reach only child processes: the environment is left alone.
    late = f"import os, torch; {check}; print(os.environ['ATEN_CPU_CAPABILITY'], os.environ['MKL_CBWR'])"
    unpinned = subprocess.run([sys.executable, "-c", late], env=selection, capture_output=True, text=True, check=True)
    assert unpinned.stdout.split() == ["False", "default", "AVX2"]


ROOT = Path(__file__).resolve().parents[2]
QUOTED = re.compile(r"sandbox fingerprint: (weights \w+, samples \w+) \(torch (\S+), transformers (\S+)\)")


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"), reason="the pinned path needs a CPU with AVX2"
)
def test_the_fingerprint_is_the_one_the_docs_quote_whatever_the_kernels_and_threads():
    # The documented fingerprint has one home, sandbox.fingerprint_match (tests/sandbox/test_end_to_end.py checks
    # docs/results.md against it); the other pages that quote it quote the same.
    documented = fingerprint_match.DOCUMENTED_FINGERPRINT
    (reference, *_) = documented.weights
    line = f"weights {reference}, samples {documented.samples}"
    for page in ("docs/sandbox_calibration.md", "docs/reproduction.md"):
        assert line in " ".join((ROOT / page).read_text().split()), f"{page} does not quote {line}"
    if (documented.torch, documented.transformers) != (torch.__version__, transformers.__version__):
        pytest.skip(
            f"the docs quote the fingerprint of torch {documented.torch} and transformers {documented.transformers}"
        )
    command = [sys.executable, "-m", "verl_avspo.cli", "sandbox", "--fingerprint"]
    runs = _run_all(
        {
            "as installed": (command, _env({})),
            **{name: ([*command, "--threads", "2"], _env(selection)) for name, selection in SELECTIONS.items()},
        }
    )
    printed = {name: QUOTED.search(run.stdout) for name, run in runs.items()}
    assert all(printed.values()), {name: run.stdout for name, run in runs.items()}
    # On one machine the kernels and threads change nothing: every run prints the same line.
    assert len({match[0] for match in printed.values()}) == 1, {name: m[0] for name, m in printed.items()}
    # Across machines the samples (the run's decisions) are the docs'. The weights' last bits may round
    # otherwise on another vendor's CPU (docs/results.md says what each case means), so a difference
    # there is reported, not failed: an AMD EPYC without AVX-512 prints other weights and the same samples.
    weights, samples = printed["as installed"][1].split(", ")
    assert samples == f"samples {documented.samples}", f"{printed['as installed'][0]} against the docs' {line}"
    if weights.removeprefix("weights ") not in documented.weights:
        warnings.warn(f"this CPU rounds the weights otherwise: {printed['as installed'][0]}", stacklevel=1)
