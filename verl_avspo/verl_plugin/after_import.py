"""The verl wing's one import hook: run a function of ours right after a named verl module has executed, in
whatever process imports it, without importing it ourselves. Standard library only.

Two things need it, both installed by the entry point (:mod:`verl_avspo.verl_plugin.register`), which runs in
every verl process and must stay cheap there:

- our V1 trainers are registered as soon as verl's ``verl.trainer.ppo.v1`` is imported (importing them in
  every worker would cost tens of seconds of TransferQueue and agent-loop imports);
- the TRL guard (:mod:`verl_avspo.verl_plugin.trl_guard`) changes two functions of verl's model code once
  those modules have run.

:func:`after_import` calls the function at once when the module is imported already. Otherwise one
``sys.meta_path`` finder (:class:`_AfterImportFinder`, at most one per process) finds the module as the other
finders would and wraps its loader so that the function runs after the module's code; it handles only the
names asked for, each once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["after_import", "waiting"]

# Module name -> what runs once it has executed (removed as it runs).
_waiting: dict[str, list[Callable[[ModuleType], None]]] = {}


def waiting() -> tuple[str, ...]:
    """The modules whose import this process's hook still waits for."""
    return tuple(sorted(_waiting))


def after_import(name: str, run: Callable[[ModuleType], None]) -> None:
    """Run ``run(module)`` right after the module ``name`` has executed in this process (now, if it has)."""
    module = sys.modules.get(name)
    if module is not None:
        run(module)
        return
    runs = _waiting.setdefault(name, [])
    if run not in runs:
        runs.append(run)
    if not any(isinstance(finder, _AfterImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder())


class _RunAfterLoader:
    """The module's own loader, with the waiting functions run right after the module executes."""

    def __init__(self, loader: Any, runs: list[Callable[[ModuleType], None]]):
        self._loader = loader
        self._runs = runs

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        for run in self._runs:
            run(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._loader, name)


class _AfterImportFinder:
    """A ``sys.meta_path`` finder for the waiting modules only: it asks the other finders for the module's spec
    and hands its loader to :class:`_RunAfterLoader`."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname not in _waiting:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _RunAfterLoader(spec.loader, _waiting.pop(fullname))
            return spec
        return None
