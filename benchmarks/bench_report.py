"""How long ``verl-avspo report`` takes on one log, beside ``rldoctor diagnose`` where it is installed.

    .venv/bin/python benchmarks/bench_report.py                       # the synthetic shapes below
    .venv/bin/python benchmarks/bench_report.py --logs a.log b.json   # your logs too
    .venv/bin/python benchmarks/bench_report.py --rldoctor /tmp/rld/bin/rldoctor
    git archive <rev> verl_avspo | tar -x -C /tmp/base
    .venv/bin/python benchmarks/bench_report.py --against /tmp/base        # another commit in the same run

Each command runs as a user runs it, a fresh process (imports, reading, the findings, the figures and
summary.md), ``--repeats`` times; the table gives the median wall time in seconds, the median CPU time
(user and system) in brackets and the exit status when it is not 0, for ``report`` as it is and with
``--no-figures`` (no PNG, no matplotlib), then the slowest log of each. The header names the commit, the
CPU and the load average at the start. The synthetic logs are the shapes of
``tests/tools/fixtures/wild_logs.py`` at the sizes of real runs: a verl console log of 2600 steps, TRL's
printed dicts over 1200 steps, a Tinker
``metrics.jsonl`` of 200 steps and a verl file log of 500 steps. ``rldoctor`` (``pip install rldoctor``
into a separate environment, not this one) is timed on the same files where given, and so is
``--against``'s copy of the package (``report`` as it was at another commit: the load of a shared machine
changes by the minute, so a change is timed against its base in the same run).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _shapes(folder: Path) -> dict[str, Path]:
    spec = importlib.util.spec_from_file_location("wild_logs", ROOT / "tests" / "tools" / "fixtures" / "wild_logs.py")
    shapes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shapes)
    verl_file = folder / "verl_file.jsonl"
    with verl_file.open("w") as stream:
        for step in range(1, 501):
            rate = 0.2 + 0.6 * step / 500
            data = {"acr/rate": rate, "acr/all_correct": rate / 2, "acr/all_wrong": rate / 2}
            data |= {"critic/score/mean": 0.3, "response_length/clip_ratio": 0.05, "actor/grad_norm": 0.3}
            stream.write(f'{{"step": {step}, "data": {data}}}\n'.replace("'", '"'))
    return {
        "verl console, 2600 steps": shapes.verl_console(folder / "verl_console.log", 2600, 3000, collapse_from=1000),
        "TRL printed dicts, 1200 steps / 600 rows": shapes.trl_console(folder / "trl_console.log", 1200, 2),
        "Tinker metrics.jsonl, 200 steps": shapes.tinker_metrics(folder / "metrics.jsonl", 200),
        "verl file log, 500 steps": verl_file,
    }


def _time(command: list[str], repeats: int, package: str | None = None) -> tuple[float, float, int]:
    """The median wall time of ``command``, its median CPU time (user and system: what other jobs on the
    machine change least) and its exit status; ``package``: a folder holding another copy of ``verl_avspo``,
    imported instead of this one."""
    environment = os.environ | ({"PYTHONPATH": package} if package else {})
    walls, cpus, status = [], [], 0
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        status = subprocess.run(  # run from the copy's folder: `python -m` puts the working folder first
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment, cwd=package, check=False
        ).returncode
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus), status


def _commit() -> str:
    result = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() or "unknown"


def _cpu() -> str:
    """The CPU's model name (Linux), for the table's caption."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "CPU unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "CPU unknown")


def _label(log: Path) -> str:
    """A log's name with its folder's: public logs are often all called trainer_state.json."""
    return f"{log.name}/" if log.is_dir() else f"{log.parent.name}/{log.name}"


def _cell(seconds: float, cpu: float, status: int) -> str:
    return f"{seconds:.2f} ({cpu:.2f})" + ("" if status == 0 else f" (exit {status})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", nargs="*", default=[], help="more logs to time (each alone)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per command; the median is shown")
    parser.add_argument("--rldoctor", default=shutil.which("rldoctor"), help="rldoctor's command, if installed")
    parser.add_argument("--against", help="a folder holding verl_avspo as at another commit, timed beside")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        logs = _shapes(Path(folder)) | {_label(Path(log)): Path(log) for log in args.logs}
        load = os.getloadavg()[0]
        print(f"commit {_commit()}, {_cpu()}, {os.cpu_count()} CPUs, load average {load:.1f} at the start")
        print("(other jobs slow every figure alike)\n")
        against = [f"report at --against {args.against} (s)"] if args.against else []
        header = ["log", "verl-avspo report (s)", "report --no-figures (s)", *against, "rldoctor diagnose (s)"]
        print(f"| {' | '.join(header)} |")
        print("|---" * len(header) + "|")
        slowest = [0.0, 0.0]
        for name, log in logs.items():
            report = [sys.executable, "-m", "verl_avspo.cli", "report", str(log), "--out", str(Path(folder) / "out")]
            ours = [_time(report, args.repeats), _time([*report, "--no-figures"], args.repeats)]
            slowest = [max(worst, seconds) for worst, (seconds, _, _) in zip(slowest, ours, strict=True)]
            theirs = _time([args.rldoctor, "diagnose", str(log)], args.repeats) if args.rldoctor else None
            cells = [_cell(*ours[0]), _cell(*ours[1])]
            cells += [_cell(*_time(report, args.repeats, args.against))] if args.against else []
            cells += ["not installed" if theirs is None else _cell(*theirs)]
            print(f"| {name} | {' | '.join(cells)} |")
        print(
            f"\nslowest: {slowest[0]:.2f} s, {slowest[1]:.2f} s with --no-figures; "
            f"load average {os.getloadavg()[0]:.1f} at the end"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
