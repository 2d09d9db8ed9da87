"""Whether the installed OpenRLHF has the structure :mod:`verl_avspo.openrlhf.trainer_wrap` wraps,
decided by its version and by probes before any wrapping: the methods it wraps are there, the advantage
method reaches the length penalties and the per-token stage through its module's names, and a run of
that method on a tiny batch leaves the rewards of an estimator named :data:`PASS_THROUGH` to the
per-token stage unchanged (the group-step if/elif AVSPO relies on)."""

from __future__ import annotations

import importlib.metadata
import inspect
import warnings
from types import ModuleType, SimpleNamespace

__all__ = [
    "PASS_THROUGH",
    "SUPPORTED_VERSIONS",
    "CHECKED_VERSIONS",
    "OpenRLHFIncompatibleError",
    "trainer_modules",
    "check_openrlhf",
]

SUPPORTED_VERSIONS = ">=0.10.4,<0.12"
# 0.11.2 is installed and tested; 0.10.4 and 0.11.0 were compared with it source file by source file.
CHECKED_VERSIONS = ("0.10.4", "0.11.0", "0.11.2")
# The estimator name AVSPO runs OpenRLHF's group_norm under: its group if/elif and batch whitening match
# no such name, so the rewards AVSPO wrote reach the per-token stage unchanged.
PASS_THROUGH = "avspo"


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
    where = "RemoteExperienceMaker.compute_advantages_and_returns"
    method = inspect.unwrap(experience_maker.RemoteExperienceMaker.compute_advantages_and_returns)
    # The length-penalty and per-token stages are reached through the module's own names, where the adapter
    # follows them: the method's code must look those globals up.
    called = set(getattr(getattr(method, "__code__", None), "co_names", ()))
    missing = [
        f"a call of {name} in {where}" for name in ("apply_length_penalties", "compute_reward") if name not in called
    ]
    return missing or _pass_through_problems(experience_maker, method, where)


def _pass_through_problems(experience_maker: ModuleType, method, where: str) -> list[str]:
    """Run OpenRLHF's own ``method`` (``compute_advantages_and_returns``) on two prompts of two responses,
    with the args' estimator set to :data:`PASS_THROUGH` and the maker's own to ``group_norm``: the group
    step must leave the rewards unchanged (its if/elif matches no such name) and the per-token stage must
    still turn each reward into the response's advantage on every action token."""
    import torch

    ns = SimpleNamespace
    args = ns(
        rollout=ns(n_samples_per_prompt=2),
        algo=ns(advantage=ns(estimator=PASS_THROUGH, gamma=1.0, lambd=1.0, no_std_norm=False)),
        reward=ns(clip_range=None, overlong_buffer_len=None, stop_properly_penalty_coef=None),
    )
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])  # the second prompt collapsed: group_norm would zero it
    experiences = [
        ns(
            rewards=rewards[i : i + 2].clone(),
            index=[i, i + 1],
            info={"reward": rewards[i : i + 2].clone()},
            kl=torch.zeros(2, 3),
            action_mask=torch.ones(2, 3, dtype=torch.bool),
            values=None,
            truncated=None,
            response_length=torch.tensor([3, 3]),
        )
        for i in (0, 2)
    ]
    try:
        maker = experience_maker.RemoteExperienceMaker(None, None, None, None, ns(value=0.0), ns(args=args), None)
        maker.advantage_estimator = "group_norm"
        method(maker, experiences)
        advantages = torch.cat([experience.advantages for experience in experiences])
    except Exception as error:  # any failure means the structure is not the one the adapter relies on
        return [f"{where} run with estimator {PASS_THROUGH!r} on a group_norm maker ({type(error).__name__}: {error})"]
    if not torch.equal(advantages, rewards[:, None].expand(-1, 3)):
        return [f"{where} leaving the rewards of an estimator named {PASS_THROUGH!r} to the per-token stage unchanged"]
    return []


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
