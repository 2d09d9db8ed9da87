"""The TRL adapter's settings (docs/trl.md): the estimator, AVSPO's and ACR's settings, and the
``GRPOConfig`` options they cannot be combined with, all checked at once before TRL loads a model.

Imports neither TRL nor transformers: ``GRPOConfig`` is read by attribute. AVSPO's and ACR's keys are
validated by the core (``core.config``, ``core.acr_config``); a TRL user passes them as the trainer's
``avspo=`` and ``acr=`` arguments, so the messages name them ``avspo.KEY`` and ``acr.KEY``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verl_avspo.core.acr_config import ACR_KEYS, ACRConfig, resolve_acr
from verl_avspo.core.alert import HOST_ADVICE
from verl_avspo.core.config import AVSPOConfig, resolve_avspo
from verl_avspo.core.validation import Problems, SettingsError, choice, fail
from verl_avspo.trl.prompts import TRLPrompts, resolve_trl_prompts

__all__ = ["ESTIMATORS", "TRL_EPSILON", "TRL_ADVICE", "TRLSettings", "resolve_trl_settings"]

# grpo: TRL's own advantages, with ACR measured; avspo: AVSPO's advantages replace them.
ESTIMATORS = ("grpo", "avspo")
# TRL's GRPO divides by std + 1e-4. AVSPO uses it too unless ``avspo.epsilon`` is given, so that the
# groups AVSPO leaves alone get exactly TRL's advantage (the authors' released code, a fork of TRL's
# trainer, used the same 1e-4).
TRL_EPSILON = 1e-4
TRL_ADVICE = HOST_ADVICE["trl"]
ACR_SECTION = "acr"
AVSPO_SECTION = "avspo"


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
        avspo = {key: value for key, value in avspo.items() if key not in ACR_KEYS}
        if avspo.get("epsilon") is None:
            avspo = {**avspo, "epsilon": TRL_EPSILON}
    try:
        return resolve_avspo(avspo)
    except SettingsError as error:
        problems.messages += [message.replace("algorithm.avspo", AVSPO_SECTION) for message in error.problems]
        return None


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
    if estimator == "avspo":
        avspo_config = _resolve_avspo(avspo, problems)
        if args is not None:
            _check_trl_args(args, problems)
    elif avspo is not None:
        problems.messages.append(
            f"{AVSPO_SECTION}={_as_mapping(avspo)!r} was given with estimator={estimator!r}: AVSPO's settings apply "
            f"only to estimator='avspo'. Set estimator='avspo', or remove {AVSPO_SECTION}= (ACR's own settings are "
            f"{ACR_SECTION}=)."
        )
    prompt_settings = resolve_trl_prompts(prompts, args, train_dataset, problems)
    problems.raise_any()
    scale_rewards = "group" if args is None else args.scale_rewards
    return TRLSettings(
        estimator, acr_config, avspo_config, norm_adv_by_std=scale_rewards != "none", prompts=prompt_settings
    )
