"""The ``verl-avspo`` command line.

Each subcommand lives in its own module exposing ``configure(parser)`` and ``run(args) -> int``;
only the chosen one is imported, so ``verl-avspo --help`` stays fast and needs no verl import.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "verl_avspo.tools.demo",
        "ACR and AVSPO advantages on a synthetic batch, through verl's compute_advantage",
    ),
    "sandbox": ("verl_avspo.sandbox.cli", "small real RLVR run on CPU: GRPO vs AVSPO on synthetic arithmetic"),
    "table": ("verl_avspo.tools.table", "paper-style markdown table (pass@1 per benchmark, ACR) from verl JSONL logs"),
    "report": (
        "verl_avspo.tools.report",
        "plots and a collapse diagnosis (stalls, ACR_100, all-correct/wrong) from logs",
    ),
    "prompts": (
        "verl_avspo.tools.prompts",
        "a run's prompts by class (always/never solved, mixed); a training parquet without the classes named",
    ),
    "doctor": (
        "verl_avspo.verl_plugin.doctor",
        "check that every verl process (fresh import, Ray actor) sees the avspo plugin",
    ),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "usage: verl-avspo <command> [options]\n\ncommands:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from verl_avspo import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"verl-avspo: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, help_ = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"verl-avspo {name}", description=help_)
    module.configure(parser)
    return int(module.run(parser.parse_args(rest)) or 0)


if __name__ == "__main__":
    sys.exit(main())
