"""Whether the installed OpenRLHF has the structure :mod:`verl_avspo.openrlhf.trainer_wrap` wraps:
the methods it replaces and the group-step if/elif it relies on, checked on the source before any
wrapping, with the versions it was checked against."""

from __future__ import annotations

import importlib.metadata
import inspect
import warnings
from types import ModuleType

__all__ = ["SUPPORTED_VERSIONS", "CHECKED_VERSIONS", "OpenRLHFIncompatibleError", "trainer_modules", "check_openrlhf"]

SUPPORTED_VERSIONS = ">=0.10.4,<0.12"
# 0.11.2 is installed and tested; 0.10.4 and 0.11.0 were compared with it source file by source file.
CHECKED_VERSIONS = ("0.10.4", "0.11.0", "0.11.2")


class OpenRLHFIncompatibleError(RuntimeError):
    """The installed OpenRLHF lacks the structure the adapter wraps."""


def trainer_modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    from openrlhf.trainer import ppo_trainer
    from openrlhf.trainer.ppo_utils import experience_maker, samples_generator

    return experience_maker, samples_generator, ppo_trainer


def _missing_structure(experience_maker: ModuleType, samples_generator: ModuleType, ppo_trainer: ModuleType):
    needed = {
        "RemoteExperienceMaker.make_experience_batch": (experience_maker, "RemoteExperienceMaker"),
        "RemoteExperienceMaker.compute_advantages_and_returns": (experience_maker, "RemoteExperienceMaker"),
        "SamplesGenerator.generate_samples": (samples_generator, "SamplesGenerator"),
        "SamplesGenerator._process_response_into_experience": (samples_generator, "SamplesGenerator"),
        "BasePPOTrainer._compute_rollout_stats": (ppo_trainer, "BasePPOTrainer"),
        "BasePPOTrainer.save_logs_and_checkpoints": (ppo_trainer, "BasePPOTrainer"),
        "BasePPOTrainer.init_checkpoint_states": (ppo_trainer, "BasePPOTrainer"),
    }
    missing = []
    for name, (module, owner) in needed.items():
        if not callable(getattr(getattr(module, owner, None), name.split(".")[1], None)):
            missing.append(f"{module.__name__}.{name}")
    for name in ("apply_length_penalties", "compute_reward"):
        if not callable(getattr(experience_maker, name, None)):
            missing.append(f"{experience_maker.__name__}.{name}")
    if missing:
        return missing
    # The pass-through relies on the group step being an if/elif on the args' estimator name that
    # runs after the length penalties, and on the per-token stage reading the maker's own name.
    try:
        source = inspect.getsource(experience_maker.RemoteExperienceMaker.compute_advantages_and_returns)
    except (OSError, TypeError):
        return ["the source of RemoteExperienceMaker.compute_advantages_and_returns"]
    expected = (
        "apply_length_penalties(",
        "compute_reward(",
        'args.algo.advantage.estimator == "group_norm"',
        "self.advantage_estimator",
    )
    where = "RemoteExperienceMaker.compute_advantages_and_returns"
    return [f"`{text}` in {where}" for text in expected if text not in source]


def check_openrlhf() -> str:
    """Check that the installed OpenRLHF has what the adapter wraps; return its version.

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
        modules = trainer_modules()
    except ImportError as error:
        raise OpenRLHFIncompatibleError(
            f"OpenRLHF {version} is installed but its trainer does not import ({error}); {supported}. "
            "Install OpenRLHF's own dependencies (vllm, deepspeed, flash-attn) on the machine that trains."
        ) from error
    missing = _missing_structure(*modules)
    if missing:
        raise OpenRLHFIncompatibleError(
            f"OpenRLHF {version} lacks what verl_avspo.openrlhf wraps: {'; '.join(missing)}. {supported}. "
            f"Install one with pip install 'openrlhf{SUPPORTED_VERSIONS}'."
        )
    from packaging.specifiers import SpecifierSet

    if version not in SpecifierSet(SUPPORTED_VERSIONS):
        warnings.warn(
            f"OpenRLHF {version} is outside the versions verl_avspo.openrlhf was checked against ({supported}); "
            "the structure it wraps is there, so it goes on. Compare acr/* and the advantages with a short run.",
            stacklevel=2,
        )
    return version
