"""Fetch the public logs of ``ground_truth.csv`` and run ``verl-avspo report`` and ``rldoctor diagnose`` on each.

    .venv/bin/python benchmarks/wild_logs/run_tools.py --logs /tmp/wild --out /tmp/wild-results \\
        --rldoctor /tmp/rld/bin/rldoctor

Each log is downloaded once into ``--logs/<id>/`` from ``raw.githubusercontent.com`` at the commit the
ground truth names (a TensorBoard event file's folder is given to both tools); each tool's output goes to
``--out/<tool>_<id>.txt`` with its exit status on the last line. The logs are third-party files: they stay
out of this repository. Comparing the outputs with the ground truth is done by reading them; the counts
are in ``results.csv``.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fetch(row: dict[str, str], folder: Path) -> Path:
    """The log of ``row`` in ``folder/<id>/`` (downloaded if absent); a TensorBoard file's folder."""
    target = folder / row["id"] / Path(row["path"]).name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        url = f"https://raw.githubusercontent.com/{row['repo']}/{row['commit']}/{row['path']}"
        with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 (a fixed https URL)
            target.write_bytes(response.read())
    return target.parent if target.name.startswith("events.out.tfevents") else target


def run(command: list[str], output: Path) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    output.write_text(result.stdout + result.stderr + f"\nrc={result.returncode}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", type=Path, required=True, help="folder the logs are downloaded to")
    parser.add_argument("--out", type=Path, required=True, help="folder for each tool's output")
    parser.add_argument("--rldoctor", help="rldoctor's command (pip install rldoctor, in its own environment)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with (HERE / "ground_truth.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    for row in rows:
        log = fetch(row, args.logs)
        report = [
            sys.executable,
            "-m",
            "verl_avspo.cli",
            "report",
            str(log),
            "--out",
            str(args.out / f"report_{row['id']}"),
        ]
        run([*report, "--json", str(args.out / f"ours_{row['id']}.json")], args.out / f"ours_{row['id']}.txt")
        if args.rldoctor:
            run([args.rldoctor, "diagnose", str(log)], args.out / f"rldoctor_{row['id']}.txt")
        print(f"{row['id']}: {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
