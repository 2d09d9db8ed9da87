"""Every command README.md and docs/ give, as written: the CPU harnesses' (``python tests/e2e/run_cpu_*.py``), the
``verl-avspo`` tools' (also ``python -m verl_avspo``), and the launchers' (``python -m verl_avspo.main_ppo``,
stock ``python -m verl.trainer.main_ppo``, ``python -m verl_avspo.openrlhf``), taken from the code blocks and the
inline code of each page. Each is parsed as its program parses it: argparse for the tools and harnesses; for
verl's launchers, Hydra's override parser and the composition of the overrides with the config they go to (ours,
or verl's ``ppo_trainer`` for stock ``main_ppo``, where our keys need a ``+``); our OpenRLHF flags with the
OpenRLHF launcher's own reading. The cheap ones run: ``--help`` of every harness and tool named, and
``verl-avspo demo``. A placeholder stands for the user's own arguments: ``<log>`` is given as a value (and
left out of overrides), ``...`` left out; inline code that only names a program, or quotes one of its messages,
is no command."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from verl_avspo.cli import COMMANDS

pytestmark = pytest.mark.verl  # verl's config folder, the demo through verl

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# How each command we check starts (after any VAR=value prefixes).
_PROGRAM = re.compile(
    r"^(?:[A-Z_]+=\S+\s+)*(?:python3? (?:-m (?:verl_avspo(?:\.main_ppo|\.openrlhf)?|verl\.trainer\.main_ppo)\b"
    r"|tests/e2e/run_cpu_\w+\.py)|verl-avspo\b)"
)
# A placeholder for one value (``<log>``), and ``...`` for more of the user's arguments (left out).
_VALUE = re.compile(r"<[^<>]*>")
_MORE = re.compile(r"(?<!\S)\.\.\.(?!\S)")
PLACEHOLDER = "PLACEHOLDER"


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    inline: bool

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def _commands(page: Path) -> list[Command]:
    """The commands of one page: each line of a code block (with its ``\\`` continuations) and each inline code
    span that starts with one of the programs."""
    lines, found, in_block = page.read_text().splitlines(), [], False
    name = str(page.relative_to(ROOT))
    number = 0
    while number < len(lines):
        line = lines[number]
        if line.lstrip().startswith("```"):
            in_block = not in_block
        elif in_block:
            text, start = line.strip().removeprefix("$ "), number
            while text.endswith("\\") and number + 1 < len(lines):
                number += 1
                text = text[:-1].rstrip() + " " + lines[number].strip()
            if _PROGRAM.match(text):
                found.append(Command(name, start + 1, text, inline=False))
        else:
            found += [Command(name, number + 1, span.strip(), True) for span in re.findall(r"`([^`]+)`", line)]
        number += 1
    return [command for command in found if _PROGRAM.match(command.text)]


def _argv(command: Command) -> list[str] | None:
    """The command's words without its environment prefix, ``...`` and comment, each ``<placeholder>`` as
    :data:`PLACEHOLDER`; None where the inline code quotes a message (``verl-avspo prompts: --out: ...``)."""
    if any(word.endswith(":") for word in command.text.split()[:3]):
        return None
    words = shlex.split(_MORE.sub(" ", _VALUE.sub(PLACEHOLDER, command.text)), comments=True)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words.pop(0)
    return words


def _values(words: list[str]) -> list[str]:
    """The words without placeholders, for the programs that read ``key=value`` words (the user's own)."""
    return [word for word in words if word != PLACEHOLDER]


COMMANDS_IN_DOCS = [command for page in PAGES for command in _commands(page)]


def test_the_docs_give_commands_of_every_kind():
    programs = {" ".join(_argv(c)[:3]) for c in COMMANDS_IN_DOCS if _argv(c)}
    for expected in (
        "python tests/e2e/run_cpu_ppo.py",
        "python -m verl_avspo.main_ppo",
        "python -m verl.trainer.main_ppo",
        "verl-avspo report runs/",
    ):
        assert any(program.startswith(expected) for program in programs), expected


class _Parsed(Exception):
    """Raised by argparse's ``parse_args`` once it parsed: the program stops before it does anything."""

    def __init__(self, namespace: argparse.Namespace):
        self.namespace = namespace


@pytest.fixture
def parse_only(monkeypatch):
    """Every argparse parser stops the program right after parsing, with what it parsed (:class:`_Parsed`)."""
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(parse_args(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)


def _harness(script: str):
    spec = importlib.util.spec_from_file_location(f"docs_{Path(script).stem}", ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parse(main, argv: list[str], command: Command) -> argparse.Namespace:
    """What ``main(argv)`` parses; a usage error fails the test with argparse's message. Inline code that names
    an option taking a value (``verl-avspo sandbox --estimators``) is parsed with a placeholder value."""
    try:
        main(argv)
    except _Parsed as parsed:
        return parsed.namespace
    except SystemExit as error:
        if error.code == 0 and "--help" in argv:
            return argparse.Namespace()
        if command.inline and argv[-1].startswith("--") and "=" not in argv[-1]:
            return _parse(main, [*argv, PLACEHOLDER], dataclasses.replace(command, inline=False))
        pytest.fail(f"{command}\n  does not parse (exit {error.code})")
    pytest.fail(f"{command}\n  ran past its parser")


def _cli(argv: list[str], command: Command) -> argparse.Namespace | None:
    """``verl-avspo <name> ...`` as :func:`verl_avspo.cli.main` parses it; None for the bare name."""
    if not argv:
        return None  # the program's name
    if argv[0] not in COMMANDS:
        pytest.fail(f"{command}\n  names no verl-avspo command ({', '.join(COMMANDS)})")
    if len(argv) == 1:
        return None
    from verl_avspo import cli

    return _parse(cli.main, argv, command)


def _hydra_overrides(overrides: list[str], command: Command) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        OverridesParser.create().parse_overrides(overrides)
    except HydraException as error:
        pytest.fail(f"{command}\n  Hydra cannot parse its overrides: {error}")


def _compose_ours(overrides: list[str], command: Command) -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from verl_avspo.verl_plugin.launcher import compose_config

    _hydra_overrides(overrides, command)
    try:
        compose_config(overrides, import_verl=False)
    except (HydraException, OmegaConfBaseException) as error:
        pytest.fail(f"{command}\n  does not compose with verl_avspo.main_ppo's config: {error} {error.__cause__}")


def _compose_stock(overrides: list[str], command: Command) -> None:
    from verl_avspo.verl_plugin.doctor import _stock_config

    _hydra_overrides(overrides, command)
    try:
        _stock_config(overrides)
    except RuntimeError as error:
        pytest.fail(f"{command}\n  stock main_ppo would refuse it: {error}")


def _launcher(argv: list[str], command: Command) -> None:
    """``python -m verl_avspo.main_ppo [--dry-run | --cfg job | --help] <overrides>``."""
    flags = {"--dry-run": 0, "--cfg": 1, "--help": 0, "-h": 0}
    overrides, position = [], 0
    while position < len(argv):
        word = argv[position]
        if word in flags:
            position += 1 + flags[word]
            continue
        if word.startswith("-"):
            pytest.fail(f"{command}\n  {word} is no flag of the launcher")
        overrides.append(word)
        position += 1
    _compose_ours(overrides, command)


def _openrlhf(argv: list[str], command: Command) -> None:
    from verl_avspo.openrlhf.flags import UsageError
    from verl_avspo.openrlhf.launcher import resolve_arguments

    try:
        resolve_arguments(argv)
    except UsageError as error:
        pytest.fail(f"{command}\n  the OpenRLHF launcher refuses it: {error}")


@pytest.mark.parametrize("command", COMMANDS_IN_DOCS, ids=str)
def test_each_command_in_the_docs_parses_as_written(command, parse_only):
    _check(command)


@pytest.mark.parametrize(
    "text",
    [
        "python -m verl.trainer.main_ppo algorithm.avspo.preset=paper",  # our key without + on stock main_ppo
        "python -m verl_avspo.main_ppo algorithm.avspo.presett=paper",  # no such key
        "python -m verl_avspo.main_ppo --dry-rn",  # no such flag
        "python tests/e2e/run_cpu_ppo.py --stepz 2",
        "python tests/e2e/run_cpu_ppo.py -- algorithm.adv_estimatorr=grpo",
        "verl-avspo report --outt report/",
        "verl-avspo reprot runs/",
        "python -m verl_avspo.openrlhf --avspo.preset papr",
    ],
)
def test_a_command_that_would_fail_fails_the_check(text, parse_only):
    with pytest.raises(pytest.fail.Exception):
        _check(Command("a page", 1, text, inline=False))


def _check(command: Command) -> None:
    """Parse ``command`` as its program would; fail the test, naming it, where it does not."""
    argv = _argv(command)
    if argv is None:
        return  # a quoted message
    if argv[0] == "verl-avspo":
        _cli(argv[1:], command)
        return
    if argv[0] not in ("python", "python3"):
        pytest.fail(f"{command}\n  no check for {argv[0]}")
    if argv[1].startswith("tests/e2e/"):
        script = _harness(argv[1])
        parsed = _parse(script.main, argv[2:], command)
        if argv[1].endswith("run_cpu_ppo.py") and _values(parsed.overrides):
            (_compose_stock if parsed.stock else _compose_ours)(_values(parsed.overrides), command)
        return
    module, rest = argv[2], argv[3:]
    if not rest:  # the program's name: it must exist
        if importlib.util.find_spec(module) is None:
            pytest.fail(f"{command}\n  no module {module}")
    elif module == "verl_avspo":
        _cli(rest, command)
    elif module == "verl_avspo.main_ppo":
        _launcher(_values(rest), command)
    elif module == "verl.trainer.main_ppo":
        _compose_stock(_values(rest), command)
    elif module == "verl_avspo.openrlhf":
        _openrlhf(_values(rest), command)
    else:
        pytest.fail(f"{command}\n  no check for {module}")


def _helps() -> list[list[str]]:
    """``--help`` of each harness and each verl-avspo command the docs name."""
    named = {tuple(argv[:2]) for argv in map(_argv, COMMANDS_IN_DOCS) if argv and len(argv) > 1}
    helps = sorted({(word,) for program, word in named if program == "verl-avspo" and word in COMMANDS})
    scripts = sorted({word for program, word in named if word.startswith("tests/e2e/")})
    return (
        [["verl-avspo", "--help"]]
        + [["verl-avspo", name, "--help"] for (name,) in helps]
        + [[sys.executable, script, "--help"] for script in scripts]
    )


@pytest.mark.parametrize("argv", _helps(), ids=" ".join)
def test_the_help_of_each_program_named_runs(argv, capsys):
    if argv[0] == "verl-avspo":
        from verl_avspo import cli

        with pytest.raises(SystemExit) as stopped:
            if cli.main(argv[1:]) == 0:  # verl-avspo --help returns; a command's --help exits
                raise SystemExit(0)
    else:
        with pytest.raises(SystemExit) as stopped:
            _harness(argv[1]).main(argv[2:])
    assert stopped.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_the_demo_runs_as_written():
    assert any(_argv(command) == ["verl-avspo", "demo"] for command in COMMANDS_IN_DOCS)
    demo = [sys.executable, "-m", "verl_avspo", "demo"]
    result = subprocess.run(demo, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "acr" in result.stdout.lower()
