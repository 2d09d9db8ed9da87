"""What a wing's inventory of framework names is (docs/architecture.md, "Framework surface"): every private or
undocumented name, field, format or copied rule of a framework the package relies on, where it is used,
why no public door serves, and how it is checked against the installed framework. Each wing lists its own
(``openrlhf/surface.py``, ``trl/surface.py``); ``tests/<wing>/test_*surface*.py`` checks every entry with
:func:`surface_problem` and that the wing touches no other private name of its framework
(:func:`private_names_used`, :func:`framework_names`).

Framework-free: the framework is imported only by :func:`resolve`, when a test or a check asks.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["Touch", "resolve", "surface_problem", "private_names_used", "framework_names"]


@dataclass(frozen=True)
class Touch:
    """One framework name the package relies on.

    ``name`` is ``module:Owner.attribute`` (``module:function`` for a module's function). ``call`` is how the
    package calls or overrides it: the number of positional arguments (``self`` included) and the keywords it
    passes. An instance attribute, which no class holds, names in ``set_by`` the owner's method that sets or
    reads it. A format or a copied rule has a ``probe``: it returns None when the installed framework still
    has that format or rule, else what differs.
    """

    name: str
    used_in: str
    why: str
    call: tuple[int, tuple[str, ...]] | None = None
    set_by: str | None = None
    probe: Callable[[], str | None] | None = None

    @property
    def attribute(self) -> str:
        """The last part of the name: what the package's source spells."""
        return self.name.rpartition(":")[2].rpartition(".")[2]


def resolve(name: str) -> Any:
    """The object ``module:Owner.attribute`` names.

    Raises:
        LookupError: the module or an attribute is missing (the message says which).
    """
    module_name, _, path = name.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise LookupError(f"module {module_name} does not import ({error})") from error
    done = module_name
    for part in path.split(".") if path else ():
        if not hasattr(target, part):
            raise LookupError(f"{done}.{part} is missing")
        target, done = getattr(target, part), f"{done}.{part}"
    return target


def surface_problem(touch: Touch) -> str | None:
    """None when the installed framework has ``touch`` as the package uses it, else what is wrong."""
    if touch.set_by is not None:
        owner_name = touch.name.rpartition(".")[0]
        try:
            setter = resolve(f"{owner_name}.{touch.set_by}")
        except LookupError as error:
            return str(error)
        code = getattr(inspect.unwrap(setter), "__code__", None)
        if code is None or touch.attribute not in code.co_names:
            return f"{owner_name.replace(':', '.')}.{touch.set_by} no longer sets or reads .{touch.attribute}"
    else:
        try:
            target = resolve(touch.name)
        except LookupError as error:
            return str(error)
        if touch.call is not None:
            positional, keywords = touch.call
            try:
                signature = inspect.signature(inspect.unwrap(target))
            except (TypeError, ValueError):
                return f"{touch.name} has no signature to check"
            try:
                signature.bind(*[None] * positional, **dict.fromkeys(keywords))
            except TypeError as error:
                words = f" and keywords {', '.join(keywords)}" if keywords else ""
                return f"{touch.name}{signature} does not take {positional} positional arguments{words} ({error})"
    return touch.probe() if touch.probe is not None else None


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and len(name) > 1


def private_names_used(paths: Iterable[Path]) -> dict[str, list[str]]:
    """{private name: ["file:line", ...]} of every ``._name`` attribute access and every ``"_name"`` string
    (a ``getattr``/``setattr`` name) in the source files ``paths``."""
    found: dict[str, list[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                name = node.value
            else:
                continue
            if _is_private(name):
                found.setdefault(name, []).append(f"{path.name}:{node.lineno}")
    return found


def framework_names(namespaces: Iterable[ModuleType | type]) -> set[str]:
    """Every name the framework's ``namespaces`` hold: a module's or a class's attributes (its bases'
    included) and, for a class, every attribute name its methods' code touches (its instance attributes)."""
    names: set[str] = set()
    for namespace in namespaces:
        names.update(dir(namespace))
        if isinstance(namespace, type):
            for klass in inspect.getmro(namespace):
                for value in vars(klass).values():
                    code = getattr(inspect.unwrap(value), "__code__", None) if callable(value) else None
                    if code is not None:
                        names.update(code.co_names)
    return names
