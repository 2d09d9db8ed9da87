"""The ACR hook's overrides for stock ``python -m verl.trainer.main_ppo``, and the one setting that makes
verl ignore them, told from a command line before verl composes its config. Standard library only: the
entry point (:mod:`verl_avspo.verl_plugin.register`) imports this in every verl process.

verl builds ``trainer.v1.sampler.custom_sampler`` only in its V1 trainers; with ``trainer.use_v1=False``
its legacy trainer never builds the hook, so the run would log no ``acr/*``, keep no state and give no
alert, and say nothing of it. The launcher's checks (``checks.settings.hook_problems``), ``verl-avspo
doctor`` and stock ``main_ppo``'s own process (:func:`refuse_legacy_hook`) all refuse it with
:data:`LEGACY_HOOK_PROBLEM`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

__all__ = [
    "SAMPLER_PATH",
    "SAMPLER_NAME",
    "HOOK_OVERRIDES",
    "LEGACY_HOOK_PROBLEM",
    "legacy_hook_problem",
    "refuse_legacy_hook",
]

SAMPLER_PATH = "pkg://verl_avspo.verl_plugin.sampler"
SAMPLER_NAME = "ACRSampler"
_SAMPLER_KEY = "trainer.v1.sampler.custom_sampler"
HOOK_OVERRIDES = (f"{_SAMPLER_KEY}.path={SAMPLER_PATH}", f"{_SAMPLER_KEY}.name={SAMPLER_NAME}")

LEGACY_HOOK_PROBLEM = (
    f"{_SAMPLER_KEY} (the ACR hook) is a V1 replay buffer, and trainer.use_v1=False runs the legacy trainer, which "
    "builds none: the run would log no acr/*, save no run state and give no stall alert. Set trainer.use_v1=True, "
    "or use `python -m verl_avspo.main_ppo`, which logs ACR with the legacy trainer too."
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


def legacy_hook_problem(overrides: Sequence[str]) -> str | None:
    """:data:`LEGACY_HOOK_PROBLEM` when ``overrides`` name the hook and set ``trainer.use_v1`` false, else None."""
    settings = _settings(overrides)
    names_hook = settings.get(f"{_SAMPLER_KEY}.path") == SAMPLER_PATH or settings.get(f"{_SAMPLER_KEY}.name") == (
        SAMPLER_NAME
    )
    legacy = settings.get("trainer.use_v1", "true").lower() in _FALSE
    return LEGACY_HOOK_PROBLEM if names_hook and legacy else None


def _runs_stock_main(argv: Sequence[str], orig_argv: Sequence[str]) -> bool:
    """Whether this process is stock ``main_ppo``: run as a script, or with ``-m`` (while ``-m`` imports the
    module's packages, ``verl`` among them, ``sys.argv[0]`` is ``"-m"``; the interpreter's own command line
    names the module)."""
    if argv and argv[0] == "-m":
        return any(flag == "-m" and module == _STOCK_MODULE for flag, module in pairwise(orig_argv))
    return bool(argv) and Path(argv[0]).parts[-3:] == _STOCK_FILE


def refuse_legacy_hook(argv: Sequence[str] | None = None, orig_argv: Sequence[str] | None = None) -> None:
    """In stock ``main_ppo``'s own process, end it (before Hydra composes the config, before Ray starts) when
    its command line (``sys.argv``; ``sys.orig_argv``, the interpreter's) names the hook with
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
    problem = legacy_hook_problem(argv[1:])
    if problem:
        raise SystemExit(f"verl-avspo: {problem}")
