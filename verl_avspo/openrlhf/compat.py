"""Whether the installed OpenRLHF has what the adapter's subclasses extend, decided by its version and by the
inventory's checks (:mod:`verl_avspo.openrlhf.surface`, ``EXTENDED``) before OpenRLHF is told to build them:
each overridden method is there and takes the arguments the adapter passes, each class the launcher selects
is a Ray actor class its caller looks up by name, the advantage method applies the length penalties through
its args, and a run of that method on a tiny batch leaves the rewards of an estimator named
``PASS_THROUGH`` unchanged (the group-step if/elif AVSPO relies on)."""

from __future__ import annotations

import importlib.metadata
import warnings
from types import ModuleType

from verl_avspo.core.surface import surface_problem
from verl_avspo.openrlhf.surface import EXTENDED

__all__ = [
    "SUPPORTED_VERSIONS",
    "CHECKED_VERSIONS",
    "OpenRLHFIncompatibleError",
    "trainer_modules",
    "check_openrlhf",
]

SUPPORTED_VERSIONS = ">=0.10.4,<0.12"
# 0.11.2 is installed and tested; 0.10.4 and 0.11.0 were compared with it source file by source file.
CHECKED_VERSIONS = ("0.10.4", "0.11.0", "0.11.2")


class OpenRLHFIncompatibleError(RuntimeError):
    """The installed OpenRLHF lacks the structure the adapter extends."""


def trainer_modules() -> tuple[ModuleType, ModuleType, ModuleType, ModuleType]:
    from openrlhf.trainer import ppo_trainer, ppo_trainer_async
    from openrlhf.trainer.ppo_utils import experience_maker, samples_generator

    return experience_maker, samples_generator, ppo_trainer, ppo_trainer_async


def check_openrlhf() -> str:
    """Check that the installed OpenRLHF has what the adapter extends; return its version.

    Raises:
        OpenRLHFIncompatibleError: OpenRLHF is missing, cannot be imported, or lacks a method or
            the group-step structure; the message names the version found and those supported.
    """
    supported = f"supported: openrlhf{SUPPORTED_VERSIONS} (checked: {', '.join(CHECKED_VERSIONS)})"
    try:
        version = importlib.metadata.version("openrlhf")
    except importlib.metadata.PackageNotFoundError:
        raise OpenRLHFIncompatibleError(
            f"OpenRLHF is not installed; {supported}. Install it with pip install 'openrlhf{SUPPORTED_VERSIONS}'."
        ) from None
    try:
        trainer_modules()
    except ImportError as error:
        raise OpenRLHFIncompatibleError(
            f"OpenRLHF {version} is installed but its trainer does not import ({error}); {supported}. "
            "Install OpenRLHF's own dependencies (vllm, deepspeed, flash-attn) on the machine that trains."
        ) from error
    missing = [problem for touch in EXTENDED if (problem := surface_problem(touch))]
    if missing:
        raise OpenRLHFIncompatibleError(
            f"OpenRLHF {version} lacks what verl_avspo.openrlhf extends: {'; '.join(missing)}. {supported}. "
            f"Install one with pip install 'openrlhf{SUPPORTED_VERSIONS}'."
        )
    from packaging.specifiers import SpecifierSet

    if version not in SpecifierSet(SUPPORTED_VERSIONS):
        warnings.warn(
            f"OpenRLHF {version} is outside the versions verl_avspo.openrlhf was checked against ({supported}); "
            "the structure it extends is there, so it goes on. Compare acr/* and the advantages with a short run.",
            stacklevel=2,
        )
    return version
