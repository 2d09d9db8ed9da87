"""The TRL adapter's settings (docs/trl.md): the estimator, AVSPO's and ACR's settings, the
``GRPOConfig`` options they cannot be combined with and the ``GRPOConfig`` values TRL itself checks
only at its first step, all checked at once before TRL loads a model; a warning for checkpoints that
would fall inside a generation.

Imports neither TRL nor transformers: ``GRPOConfig`` is read by attribute. AVSPO's and ACR's keys are
validated by the core (``core.config``, ``core.acr_config``); a TRL user passes them as the trainer's
``avspo=`` and ``acr=`` arguments, so the messages name them ``avspo.KEY`` and ``acr.KEY`` (the core
takes the sections' names).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from verl_avspo.core.acr_config import ACR_KEYS, ACRConfig, resolve_acr
from verl_avspo.core.alert import stall_advice
from verl_avspo.core.config import AVSPOConfig, resolve_avspo
from verl_avspo.core.validation import Problems, choice, fail, unknown_key_problem
from verl_avspo.trl.prompts import TRLPrompts, resolve_trl_prompts

__all__ = [
    "ESTIMATORS",
    "TRL_EPSILON",
    "TRL_ADVICE",
    "TRL_CHOICES",
    "TRLSettings",
    "resolve_trl_settings",
]

# grpo: TRL's own advantages, with ACR measured; avspo: AVSPO's advantages replace them.
ESTIMATORS = ("grpo", "avspo")
# TRL's GRPO divides by std + 1e-4. AVSPO uses it too unless ``avspo.epsilon`` is given, so that the
# groups AVSPO leaves alone get exactly TRL's advantage (the authors' released code, a fork of TRL's
# trainer, used the same 1e-4).
TRL_EPSILON = 1e-4
ACR_SECTION = "acr"
AVSPO_SECTION = "avspo"
# What the stall alert advises, in the trainer's arguments.
TRL_ADVICE = stall_advice(
    "GRPOConfig.temperature", "GRPOConfig.num_generations", "AVSPOGRPOTrainer(..., estimator='avspo')"
)
# The keys avspo= takes: AVSPOConfig's (ACR's tau, reward_range and alert are acr='s here).
AVSPO_ARGUMENT_KEYS = tuple(f.name for f in fields(AVSPOConfig))
# The values TRL 1.16's GRPOTrainer accepts for the GRPOConfig options it checks only at the first
# generation or the first loss (grpo_trainer.py: "Invalid value for scale_rewards", "Unknown loss type").
TRL_CHOICES = {
    "scale_rewards": ("group", "batch", "none"),
    "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
    "loss_type": ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"),
}


@dataclass(frozen=True)
class TRLSettings:
    """One TRL run's resolved settings."""

    estimator: str
    """``grpo`` (TRL's advantages) or ``avspo``."""
    acr: ACRConfig
    """The collapse test, the reward range and the stall alert (``acr=``)."""
    avspo: AVSPOConfig | None
    """AVSPO's settings (``avspo=``); None with ``estimator='grpo'``."""
    norm_adv_by_std: bool
    """Divide by the group's std: ``GRPOConfig.scale_rewards`` is ``group`` (True) or ``none`` (False)."""
    prompts: TRLPrompts
    """The prompt key of the per-prompt history and the skip rule (``prompts=``)."""


def _as_mapping(settings: Any) -> Any:
    """A settings dataclass (``AVSPOConfig``, ``ACRConfig``) as its mapping; anything else as given."""
    return settings.to_dict() if isinstance(settings, (AVSPOConfig, ACRConfig)) else settings


def _resolve_avspo(avspo: Any, problems: Problems) -> AVSPOConfig | None:
    avspo = {} if avspo is None else _as_mapping(avspo)
    if isinstance(avspo, Mapping):
        for key in sorted(set(avspo) & set(ACR_KEYS)):
            problems.messages.append(
                f"{AVSPO_SECTION}.{key}={avspo[key]!r} is ACR's setting, not AVSPO's: pass it as "
                f"{ACR_SECTION}={{{key!r}: {avspo[key]!r}}}."
            )
        for key in sorted(set(avspo) - set(ACR_KEYS) - set(AVSPO_ARGUMENT_KEYS), key=str):
            problems.messages.append(
                unknown_key_problem(f"{AVSPO_SECTION}.{key}", AVSPO_ARGUMENT_KEYS)
                + f" (ACR's tau, reward_range and alert are {ACR_SECTION}=.)"
            )
        avspo = {key: value for key, value in avspo.items() if key in AVSPO_ARGUMENT_KEYS}
        if avspo.get("epsilon") is None:
            avspo = {**avspo, "epsilon": TRL_EPSILON}
    return problems.check(resolve_avspo, avspo, section=AVSPO_SECTION, acr_section=ACR_SECTION)


def _check_trl_choices(args: Any, problems: Problems) -> bool:
    """The options of :data:`TRL_CHOICES`, whatever the estimator; True if all are valid."""
    valid = True
    for option, allowed in TRL_CHOICES.items():
        valid &= problems.check(choice, f"GRPOConfig.{option}", getattr(args, option), allowed) is not None
    return valid


def _warn_inexact_resume(args: Any) -> None:
    """A checkpoint inside a generation buffer resumes inexactly (docs/trl.md, "Limits"): TRL regenerates
    at the first step after a resume, so the tracker measures one generation more."""
    strategy = getattr(args.save_strategy, "value", args.save_strategy)
    save_steps = args.save_steps
    if strategy != "steps" or not float(save_steps).is_integer():  # a fraction of the run: known at train()
        return
    generation = args.steps_per_generation * args.num_iterations
    if (int(save_steps) * args.gradient_accumulation_steps) % generation:
        warnings.warn(
            f"GRPOConfig.save_steps={int(save_steps)} (x gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps}) is not a multiple of steps_per_generation={args.steps_per_generation}"
            f" x num_iterations={args.num_iterations}: a checkpoint saved inside a generation does not resume "
            "exactly (TRL regenerates at the first step after a resume, and the tracker measures one generation "
            "more). Set save_steps to a multiple of "
            f"{generation // math.gcd(generation, args.gradient_accumulation_steps)} for checkpoints that resume "
            "exactly.",
            UserWarning,
            stacklevel=4,
        )


def _check_trl_args(args: Any, problems: Problems) -> None:
    """The ``GRPOConfig`` options AVSPO's advantage cannot stand in for."""
    if args.scale_rewards == "batch":
        problems.check(
            fail,
            "GRPOConfig.scale_rewards",
            args.scale_rewards,
            "with estimator='avspo' each group is normalised by its own std (with its virtual samples); set "
            "scale_rewards='group' (TRL's default), or 'none' for A = r - mean, or keep 'batch' with "
            "estimator='grpo' (TRL's advantages, ACR measured)",
        )
    if args.multi_objective_aggregation != "sum_then_normalize":
        problems.check(
            fail,
            "GRPOConfig.multi_objective_aggregation",
            args.multi_objective_aggregation,
            "AVSPO computes its advantage from one score per completion, the weighted sum of the reward functions; "
            "set multi_objective_aggregation='sum_then_normalize' (TRL's default), or keep it with "
            "estimator='grpo' (TRL's advantages, ACR measured on the weighted sum)",
        )


def resolve_trl_settings(
    estimator: str, avspo: Any = None, acr: Any = None, args: Any = None, prompts: Any = None, train_dataset: Any = None
) -> TRLSettings:
    """Validate the trainer's ``estimator``, ``avspo`` and ``acr`` arguments (mappings of the keys of
    docs/configuration.md, or an ``AVSPOConfig`` / ``ACRConfig``) and its ``prompts`` (``key``, ``skip``:
    :mod:`verl_avspo.trl.prompts`) against its ``GRPOConfig`` ``args`` (None: TRL's defaults) and its
    ``train_dataset`` (None: not known yet).

    Raises:
        SettingsError (a ValueError): one message per problem, each naming the key, the value and the fix.
    """
    problems = Problems()
    estimator = problems.check(choice, "estimator", estimator, ESTIMATORS)
    acr_config = problems.check(resolve_acr, _as_mapping(acr), section=ACR_SECTION)
    avspo_config = None
    if args is not None and _check_trl_choices(args, problems) and estimator == "avspo":
        _check_trl_args(args, problems)
    if estimator == "avspo":
        avspo_config = _resolve_avspo(avspo, problems)
    elif avspo is not None:
        problems.messages.append(
            f"{AVSPO_SECTION}={_as_mapping(avspo)!r} was given with estimator={estimator!r}: AVSPO's settings apply "
            f"only to estimator='avspo'. Set estimator='avspo', or remove {AVSPO_SECTION}= (ACR's own settings are "
            f"{ACR_SECTION}=)."
        )
    prompt_settings = resolve_trl_prompts(prompts, args, train_dataset, problems)
    problems.raise_any()
    if args is not None:
        _warn_inexact_resume(args)
    scale_rewards = "group" if args is None else args.scale_rewards
    return TRLSettings(
        estimator, acr_config, avspo_config, norm_adv_by_std=scale_rewards != "none", prompts=prompt_settings
    )
