"""How verl's estimator functions reach the run's :class:`~verl_avspo.core.run_tracker.RunTracker`.

verl calls an advantage estimator as a plain function of the batch and ``config.algorithm``, so the state
that must persist across steps (AVSPO's controller, DCPO's reward history) cannot travel with the call. One
way carries it: our trainer wraps verl's advantage stage in :func:`advantage_stage` with its own tracker (as
verl's trainer hands ``apply_kl_penalty`` its ``kl_ctrl``), and the estimator called inside uses that one
(:func:`tracker_for`).

Only where verl's ``compute_advantage`` runs with no trainer of ours around it (stock ``main_ppo`` without our
trainer mode, verl's legacy trainer, a direct call) does the estimator fall back to a tracker of this process,
started at its first call for the settings it is called with: it lives as long as the process, is not
checkpointed, and says so once, with the fix for each of verl's trainers. There prompt skipping and the rollout
allocator, which act before the rollout, are refused, and so is our trainer mode named with verl's legacy
trainer, which never reads it (:func:`tracker_for`: verl's ``config.algorithm`` is a node of the run's config,
so the trainer's settings are read relative to it).

Imports nothing from verl.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from verl_avspo.core.acr_config import ACR_SECTION
from verl_avspo.core.alert import stall_advice
from verl_avspo.core.baseline_settings import dcpo_settings
from verl_avspo.core.config import RunSettings, resolve_run_settings
from verl_avspo.core.run_tracker import RunTracker
from verl_avspo.verl_plugin.prompt_identity import (
    ALLOCATION_SECTION,
    SKIP_SECTION,
    PromptsConfig,
    prompt_key_setting,
    resolve_prompts,
)
from verl_avspo.verl_plugin.trainer_modes import MODE_KEY, MODE_OVERRIDE, is_ours, legacy_mode_problem

__all__ = [
    "VERL_ADVICE",
    "WITHOUT_OUR_TRAINER_FIX",
    "before_rollout_problem",
    "legacy_trainer_problem",
    "run_settings",
    "start_run",
    "advantage_stage",
    "tracker_for",
    "reset",
]

logger = logging.getLogger(__name__)

# What the stall alert advises, in verl's settings.
VERL_ADVICE = stall_advice(
    "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.n", "algorithm.adv_estimator=avspo"
)

# The tracker of the trainer whose advantage stage is running (advantage_stage).
_stage: contextvars.ContextVar[RunTracker | None] = contextvars.ContextVar("verl_avspo_stage", default=None)
# The tracker the estimators started where no trainer of ours called them (tracker_for).
_fallback: RunTracker | None = None


def _plain(value: Any) -> Any:
    """DictConfig/ListConfig (or any mapping/sequence) to plain containers, for caching."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


@functools.lru_cache(maxsize=64)
def _resolve_canonical(canonical: str, estimator: str | None) -> RunSettings:
    return resolve_run_settings(json.loads(canonical), estimator)


def run_settings(algorithm_config: Any, estimator: str | None = None) -> RunSettings:
    """The validated ACR and AVSPO settings of verl's ``config.algorithm`` (validated, and its
    deprecation warnings given, once per distinct setting in this process)."""
    keys = ("adv_estimator", "acr", "avspo")
    plain = {} if algorithm_config is None else {k: _plain(algorithm_config.get(k, None)) for k in keys}
    try:
        canonical = json.dumps(plain, sort_keys=True)
    except TypeError:  # an unserialisable value: validate directly for the error message
        return resolve_run_settings(plain, estimator)
    return _resolve_canonical(canonical, estimator)


def start_run(algorithm_config: Any) -> RunTracker:
    """A fresh tracker for the run that verl's ``config.algorithm`` describes."""
    settings = run_settings(algorithm_config)
    norm_adv_by_std = bool(algorithm_config.get("norm_adv_by_std_in_grpo", True))
    dcpo = dcpo_settings(algorithm_config) if settings.estimator == "dcpo" else None
    prompts = resolve_prompts(algorithm_config)
    tracker = RunTracker(
        settings.acr,
        settings.avspo,
        dcpo,
        norm_adv_by_std,
        acr_section=ACR_SECTION,
        advice=VERL_ADVICE,
        prompt_skip=prompts.skip,
        prompt_identity=prompt_key_setting(algorithm_config),
    )
    tracker.set_prompt_allocation(prompts.allocation)
    return tracker


@contextlib.contextmanager
def advantage_stage(tracker: RunTracker) -> Iterator[RunTracker]:
    """The estimators called inside this block use ``tracker`` (our trainer wraps verl's advantage stage in it)."""
    token = _stage.set(tracker)
    try:
        yield tracker
    finally:
        _stage.reset(token)


# What to do where an estimator of ours runs without our trainer: verl's two trainers need different fixes.
WITHOUT_OUR_TRAINER_FIX = (
    f"With verl's V1 trainer (trainer.use_v1=True, verl's default) add {MODE_OVERRIDE} (docs/integration.md) or "
    "launch with `python -m verl_avspo.main_ppo`; verl's legacy trainer (trainer.use_v1=False) cannot run ours, so "
    "set trainer.use_v1=True there."
)


def before_rollout_problem(prompts: PromptsConfig) -> str | None:
    """Why the ``algorithm.prompts`` settings that act before the rollout (skipping, the allocator) cannot run
    where the estimator is called without our trainer (after the rollout), with the fix; None if none is on."""
    on = [
        section
        for section, part in ((SKIP_SECTION, prompts.skip), (ALLOCATION_SECTION, prompts.allocation))
        if part.enable
    ]
    if not on:
        return None
    return (
        f"{' and '.join(f'{section}.enable=True' for section in on)}, but no verl-avspo trainer runs in this process, "
        "so nothing reads the prompts before their rollout (verl's own trainer reaches verl-avspo only at the "
        "advantage stage, after the rollout): every prompt would get rollout.n rollouts and no prompts/* would be "
        f"logged. Set {' and '.join(f'{section}.enable=False' for section in on)}, or: {WITHOUT_OUR_TRAINER_FIX}"
    )


def legacy_trainer_problem(algorithm_config: Any) -> str | None:
    """:func:`~verl_avspo.verl_plugin.trainer_modes.legacy_mode_problem` when the run whose ``config.algorithm``
    verl hands the estimator names our trainer mode with ``trainer.use_v1`` false (verl's legacy trainer, which
    reads the flag as ``if config.trainer.use_v1:``); None otherwise, or where the node has no run config above
    it (a direct call)."""
    if not isinstance(algorithm_config, DictConfig):
        return None
    try:
        mode = OmegaConf.select(algorithm_config, f"..{MODE_KEY}")
        use_v1 = OmegaConf.select(algorithm_config, "..trainer.use_v1", default=True)
    except ConfigKeyError:  # the node is a config's root: no trainer settings to read
        return None
    return legacy_mode_problem(mode) if is_ours(mode) and not use_v1 else None


def tracker_for(algorithm_config: Any, estimator: str) -> RunTracker:
    """The tracker for ``estimator`` called with verl's ``config.algorithm``: the one of the trainer whose
    :func:`advantage_stage` is running; else this process's fallback, started now when there is none or it
    was built for other settings (a new run in this process)."""
    global _fallback
    current = _stage.get()
    if current is not None:
        return current
    settings = run_settings(algorithm_config, estimator)
    tracker = _fallback
    fits = tracker is not None and tracker.acr == settings.acr and tracker.avspo == settings.avspo
    if estimator == "dcpo":
        fits = fits and tracker.dcpo == dcpo_settings(algorithm_config)
        fits = fits and tracker.prompt_identity == prompt_key_setting(algorithm_config)
    if not fits:
        problem = legacy_trainer_problem(algorithm_config) or before_rollout_problem(resolve_prompts(algorithm_config))
        if problem:
            raise ValueError(problem)
        logger.warning(
            "verl-avspo: %s runs without our trainer: its state lives in this process only and is not checkpointed, "
            "and no acr/* is logged. %s",
            estimator,
            WITHOUT_OUR_TRAINER_FIX,
        )
        config = dict(algorithm_config or {})
        config["adv_estimator"] = estimator
        tracker = _fallback = start_run(config)
    return tracker


def reset() -> None:
    """Forget the fallback tracker (a fresh run in the same process, or tests)."""
    global _fallback
    _fallback = None
