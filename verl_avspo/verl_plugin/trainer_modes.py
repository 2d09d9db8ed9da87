"""Our V1 trainer modes: their names in verl's trainer registry, verl's mode each one runs, and the one setting
that makes verl ignore them, told from a command line before verl composes its config. Standard library only:
the entry point (:mod:`verl_avspo.verl_plugin.register`) imports this in every verl process.

Stock ``python -m verl.trainer.main_ppo`` builds its trainer with ``get_trainer_cls(config.trainer.v1.trainer_mode)``
(``verl/trainer/main_ppo.py:141``); :mod:`verl_avspo.verl_plugin.trainer_v1` registers one trainer per verl mode
under the names of :data:`MODES`, so ``trainer.v1.trainer_mode=avspo_sync`` is the whole route. Each of our
trainers presents verl's own name to verl (it sets ``trainer.v1.trainer_mode`` back before verl's ``__init__``),
because verl compares the mode string literally (docs/architecture.md, "Trainer modes").

With ``trainer.use_v1=False`` verl runs its legacy trainer and never reads ``trainer.v1.trainer_mode``: the run
would log no ``acr/*``, keep no state and give no alert, and say nothing of it. The launcher's checks, ``verl-avspo
doctor`` and stock ``main_ppo``'s own process (:func:`refuse_legacy_mode`) all refuse it with
:func:`legacy_mode_problem`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

__all__ = [
    "MODE_KEY",
    "MODES",
    "DEFAULT_MODE",
    "MODE_OVERRIDE",
    "is_ours",
    "misspelt_mode",
    "verl_mode",
    "our_mode",
    "legacy_mode_problem",
    "command_line_problem",
    "refuse_legacy_mode",
]

MODE_KEY = "trainer.v1.trainer_mode"
# Our mode -> the verl mode it runs (and presents to verl).
MODES = {f"avspo_{mode}": mode for mode in ("sync", "colocate_async", "separate_async")}
DEFAULT_MODE = "avspo_sync"
MODE_OVERRIDE = f"{MODE_KEY}={DEFAULT_MODE}"


def is_ours(mode: object) -> bool:
    """Whether ``mode`` names one of our trainers."""
    return mode in MODES


def misspelt_mode(mode: object) -> bool:
    """Whether ``mode`` looks like one of our trainers' names (``avspo_...``, any case) and is none of them."""
    return isinstance(mode, str) and mode.lower().startswith("avspo") and not is_ours(mode)


def verl_mode(mode: object) -> object:
    """verl's mode for ``mode`` (ours or verl's own, which is returned as it is)."""
    return MODES.get(mode, mode)  # type: ignore[arg-type]


def our_mode(mode: object) -> object:
    """Our mode for verl's ``mode`` (``sync`` -> ``avspo_sync``); ours, or a mode we have no trainer for, as it is."""
    return f"avspo_{mode}" if f"avspo_{mode}" in MODES else mode


def legacy_mode_problem(mode: object) -> str:
    """Why our trainer ``mode`` does nothing with ``trainer.use_v1=False``, and the fix."""
    return (
        f"{MODE_KEY}={mode} is a V1 trainer, and trainer.use_v1=False runs verl's legacy trainer, which never reads "
        "it: the run would log no acr/*, save no run state and give no stall alert. Set trainer.use_v1=True."
    )


# How Hydra reads a command line's false for verl's untyped `use_v1` (`if config.trainer.use_v1:`).
_FALSE = ("false", "0")
# Stock main_ppo: its module, and its file as a script's path ends.
_STOCK_MODULE = "verl.trainer.main_ppo"
_STOCK_FILE = ("verl", "trainer", "main_ppo.py")


def _settings(overrides: Sequence[str]) -> dict[str, str]:
    """``key -> value`` of Hydra overrides (``key=value``, ``+key=value``, ``++key=value``), the last winning."""
    settings = {}
    for override in overrides:
        key, has_value, value = override.lstrip("+").partition("=")
        if has_value:
            settings[key] = value.strip().strip("'\"")
    return settings


def command_line_problem(overrides: Sequence[str]) -> str | None:
    """:func:`legacy_mode_problem` when ``overrides`` name our mode and set ``trainer.use_v1`` false, else None."""
    settings = _settings(overrides)
    mode = settings.get(MODE_KEY)
    legacy = settings.get("trainer.use_v1", "true").lower() in _FALSE
    return legacy_mode_problem(mode) if is_ours(mode) and legacy else None


def _runs_stock_main(argv: Sequence[str], orig_argv: Sequence[str]) -> bool:
    """Whether this process is stock ``main_ppo``: run as a script, or with ``-m`` (while ``-m`` imports the
    module's packages, ``verl`` among them, ``sys.argv[0]`` is ``"-m"``; the interpreter's own command line
    names the module)."""
    if argv and argv[0] == "-m":
        return any(flag == "-m" and module == _STOCK_MODULE for flag, module in pairwise(orig_argv))
    return bool(argv) and Path(argv[0]).parts[-3:] == _STOCK_FILE


def refuse_legacy_mode(argv: Sequence[str] | None = None, orig_argv: Sequence[str] | None = None) -> None:
    """In stock ``main_ppo``'s own process, end it (before Hydra composes the config, before Ray starts) when
    its command line (``sys.argv``; ``sys.orig_argv``, the interpreter's) names our mode with
    ``trainer.use_v1=False``. Any other program (a Ray worker, the launcher, ``verl-avspo doctor``) is left
    alone.

    Raises:
        SystemExit: with the problem and the fix. (verl's plugin loader swallows an ``Exception`` at DEBUG
            level; ``SystemExit`` is none, so it ends the process with the message.)
    """
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, "orig_argv", ()) if orig_argv is None else orig_argv
    if not _runs_stock_main(argv, orig_argv):
        return
    problem = command_line_problem(argv[1:])
    if problem:
        raise SystemExit(f"verl-avspo: {problem}")
