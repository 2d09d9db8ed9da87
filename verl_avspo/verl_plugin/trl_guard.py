"""Let verl 0.9.1 train next to a TRL that has no ``AutoModelForCausalLMWithValueHead``.

verl 0.9.1's ``apply_monkey_patch`` (``verl/models/transformers/monkey_patch.py``), which runs on
every actor, reference and critic model, imports that class from ``trl.experimental.ppo`` or
``trl`` whenever TRL is importable, only to replace its ``state_dict``. TRL 1.16 has it in neither
place, so with TRL installed every verl run (GRPO included, which has no value head) failed at
actor init. Upstream, ``patches/02-trl-value-head-import.patch`` moves that import to where a
value-head model is built; this module is the same fix for an unpatched verl, installed by the
``verl.plugins`` entry point (:mod:`verl_avspo.verl_plugin.register`) in every verl process.

:func:`install` has two verl modules changed right after they execute (the wing's one import hook,
:mod:`verl_avspo.verl_plugin.after_import`), and only when they still have the code in question (so a verl
with patch 02 is left as it is):

- ``monkey_patch.is_trl_available`` answers "is TRL importable *and* has the class", so the
  ``state_dict`` patch is skipped when the class does not exist (no model of that class can be
  built then, so there is nothing to patch);
- ``verl.utils.model.load_valuehead_model`` (a critic whose checkpoint is not a token-classification
  model) turns verl's bare "cannot import name" into an error naming the TRL version and the fixes.

Whether TRL has the class is decided on the first call, inside verl's model set-up, where verl
imported TRL anyway: installing the guard imports nothing (this module is stdlib only), and with a
TRL that has the class, verl behaves exactly as without the guard. See docs/troubleshooting.md.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from verl_avspo.verl_plugin.after_import import after_import

__all__ = ["VALUE_HEAD", "GuardState", "install", "state", "trl_without_value_head"]

VALUE_HEAD = "AutoModelForCausalLMWithValueHead"
MONKEY_PATCH = "verl.models.transformers.monkey_patch"
MODEL_UTILS = "verl.utils.model"
# Where verl 0.9.1 looks for the class, in its order.
VALUE_HEAD_MODULES = ("trl.experimental.ppo", "trl")
# Set on the functions this module puts into verl, so that they are never wrapped twice.
MARK = "__verl_avspo_trl_guard__"

logger = logging.getLogger(__name__)


def _has_value_head(module_name: str) -> bool:
    try:
        return hasattr(importlib.import_module(module_name), VALUE_HEAD)
    except ImportError:
        return False


@functools.cache
def trl_without_value_head() -> str | None:
    """The installed TRL's version when TRL imports but has ``AutoModelForCausalLMWithValueHead``
    neither in ``trl.experimental.ppo`` nor in ``trl``; ``None`` when TRL is absent or has it.
    Imports TRL (once per process)."""
    if importlib.util.find_spec("trl") is None:
        return None
    if any(_has_value_head(name) for name in VALUE_HEAD_MODULES):
        return None
    return str(getattr(sys.modules.get("trl"), "__version__", "?"))


def _guard_is_trl_available(original: Callable[[], bool]) -> Callable[[], bool]:
    @functools.wraps(original)
    def is_trl_available() -> bool:
        if not original():
            return False
        version = trl_without_value_head()
        if version is None:
            return True
        logger.info(
            "trl %s has no %s: verl's state_dict patch for it is skipped (verl-avspo's TRL guard; no model of "
            "that class can be built with this TRL)",
            version,
            VALUE_HEAD,
        )
        return False

    setattr(is_trl_available, MARK, True)
    return is_trl_available


def _guard_load_valuehead_model(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_valuehead_model(local_path, *args, **kwargs):
        try:
            return original(local_path, *args, **kwargs)
        except ImportError as error:
            version = trl_without_value_head()
            if version is None:
                raise
            raise ImportError(
                f"The critic's checkpoint {local_path!r} is not a token-classification model, so verl builds it "
                f"with trl's {VALUE_HEAD}, but trl {version} has it neither in trl.experimental.ppo nor in trl. "
                "Fix: give the critic a checkpoint that AutoModelForTokenClassification loads, install a trl "
                "release that still has the class, or apply verl-avspo's patches/02-trl-value-head-import.patch "
                "to verl (see docs/troubleshooting.md)."
            ) from error

    setattr(load_valuehead_model, MARK, True)
    return load_valuehead_model


def _guard_monkey_patch(module: ModuleType) -> bool:
    # A verl with patch 02 no longer calls is_trl_available in this module.
    current = getattr(module, "is_trl_available", None)
    if current is None or hasattr(current, MARK):
        return False
    module.is_trl_available = _guard_is_trl_available(current)
    return True


def _guard_model_utils(module: ModuleType) -> bool:
    # A verl with patch 02 has get_trl_value_head_class, which raises its own clear error.
    current = getattr(module, "load_valuehead_model", None)
    if current is None or hasattr(module, "get_trl_value_head_class") or hasattr(current, MARK):
        return False
    module.load_valuehead_model = _guard_load_valuehead_model(current)
    return True


GUARDS: dict[str, Callable[[ModuleType], bool]] = {MONKEY_PATCH: _guard_monkey_patch, MODEL_UTILS: _guard_model_utils}
_guarded: set[str] = set()
_installed = False


def _guard(module: ModuleType) -> None:
    if GUARDS[module.__name__](module):
        _guarded.add(module.__name__)


def install() -> bool:
    """Install the guard in this process when TRL is importable; ``True`` if it is installed (now or
    before). Modules already imported are guarded at once, the others right after they run (the wing's one
    import hook, :func:`~verl_avspo.verl_plugin.after_import.after_import`). Imports neither TRL nor the verl
    modules."""
    global _installed
    if _installed:
        return True
    if importlib.util.find_spec("trl") is None:
        return False
    _installed = True
    for name in GUARDS:
        after_import(name, _guard)
    return True


@dataclass(frozen=True)
class GuardState:
    """What the guard did in this process: ``installed`` (TRL is importable), ``guarded`` (the verl
    modules it changed so far; empty before verl imports them, or on a verl with patch 02) and
    ``trl_without_value_head`` (the TRL version that lacks the class, or ``None``; only filled in
    when ``check_trl`` is set, because it imports TRL)."""

    installed: bool
    guarded: tuple[str, ...]
    trl_without_value_head: str | None


def state(check_trl: bool = False) -> GuardState:
    return GuardState(_installed, tuple(sorted(_guarded)), trl_without_value_head() if check_trl else None)
