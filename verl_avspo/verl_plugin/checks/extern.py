"""The classes and functions a config names by ``path`` and ``name`` (a custom replay buffer's
``trainer.v1.sampler.custom_sampler``, a custom dataset, reward function, reward manager or async
server): imported here as verl would import them, so that a misspelt module or name is refused
before Ray starts, not 40 s into the run inside a Ray actor.

Importing runs the named module's code, as verl's own loader does later; this module imports verl
only when a config names something.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from omegaconf import DictConfig, OmegaConf

__all__ = ["EXTERN_SECTIONS", "extern_object_problems"]

# Each section verl loads with verl.utils.import_utils (load_extern_object, load_module), and the kind of
# object its ``name`` must be.
EXTERN_SECTIONS = {
    "trainer.v1.sampler.custom_sampler": "class",
    "data.custom_cls": "class",
    "reward.custom_reward_function": "function",
    "reward.reward_manager.module": "class",
    "actor_rollout_ref.rollout.agent.custom_async_server": "class",
}
_SAMPLER_SECTION = "trainer.v1.sampler.custom_sampler"
_PKG = "pkg://"


def _load(path: str) -> ModuleType:
    from verl.utils.import_utils import load_module

    return load_module(path)


def _section_problems(section: str, kind: str, path: str, name: str | None) -> Iterator[str]:
    if name is None:
        yield (
            f"{section}.path={path} is set without {section}.name, so verl would ignore it: set {section}.name to "
            f"the {kind} in that module, or remove {section}.path."
        )
        return
    where = f"{section}.path={path}"
    module_name = path.removeprefix(_PKG).replace("/", ".")
    try:
        module = _load(path)
    except ModuleNotFoundError as err:
        if not (path.startswith(_PKG) and err.name and module_name.startswith(err.name)):
            yield f"{where} fails to import: {type(err).__name__}: {err}. Fix that error (run the module on its own)."
            return
        fix = f"check the module name after {_PKG} (a dotted import path, importable in this environment)"
        yield f"{where} cannot be imported: {err}. Fix the path: {fix}."
        return
    except FileNotFoundError:
        return  # a missing file: resources._path_problems names it (or verl's loader would)
    except Exception as err:  # the module's own code fails: the user's to fix, shown as it is
        cause = err.__cause__ or err  # verl's loader wraps a file's error in a RuntimeError
        yield f"{where} fails to import: {type(cause).__name__}: {cause}. Fix that error (run the module on its own)."
        return
    found = getattr(module, str(name), None)
    if found is None:
        public = [attr for attr in dir(module) if not attr.startswith("_")]
        close = difflib.get_close_matches(str(name), public, n=1)
        hint = f" Did you mean {section}.name={close[0]}?" if close else ""
        yield f"{section}.name={name}: {where} has no {name}.{hint} Set {section}.name to a {kind} of that module."
    elif kind == "class" and not isinstance(found, type):
        yield f"{section}.name={name}: {where} defines {name}, but not as a class ({type(found).__name__})."
    elif kind == "function" and not callable(found):
        yield f"{section}.name={name}: {where} defines {name}, but it is not callable ({type(found).__name__})."


def extern_object_problems(config: DictConfig) -> list[str]:
    """Every ``path``/``name`` pair of :data:`EXTERN_SECTIONS` that verl would fail to load.

    A file that does not exist is left to the path checks; the custom sampler's section is read only with
    the V1 trainer, the one that has a sampler.
    """
    problems = []
    for section, kind in EXTERN_SECTIONS.items():
        node = OmegaConf.select(config, section, default=None)
        if node is None or not node.get("path"):
            continue
        if section == _SAMPLER_SECTION and OmegaConf.select(config, "trainer.use_v1") is not True:
            continue  # the legacy trainer has no sampler and never reads it
        path = str(node.path)
        if not path.startswith(_PKG) and not Path(path.removeprefix("file://")).expanduser().exists():
            continue
        name = node.get("name")
        problems.extend(_section_problems(section, kind, path, None if name is None else str(name)))
    return problems
