"""How verl's estimator functions reach the run's :class:`~verl_avspo.core.run_tracker.RunTracker`.

verl calls an advantage estimator as a plain function of the batch and its run's ``config.algorithm``, so the
state that must persist across steps (AVSPO's controller, DCPO's reward history) cannot travel with the call.
Our trainer therefore hands the estimators its tracker once, at start-up, for the ``config.algorithm`` node that
verl's advantage stage passes them (:func:`start_run`; as verl's trainer hands ``apply_kl_penalty`` its
``kl_ctrl``), and the estimator called with that node uses it (:func:`tracker_for`).

The bare-estimator route is the only other one: where verl's ``compute_advantage`` runs with no trainer of ours
(stock ``main_ppo`` without our trainer mode, verl's legacy trainer, a direct call), the estimator falls back to
the one module global, a tracker of this process started at its first call for the settings it is called with:
it lives as long as the process, is not checkpointed, and says so once, with the fix for each of verl's
trainers. There prompt skipping and the rollout allocator, which act before the rollout, are refused, and so is
our trainer mode named with verl's legacy trainer, which never reads it (:func:`tracker_for`: verl's
``config.algorithm`` is a node of the run's config, so the trainer's settings are read relative to it).

Imports nothing from verl.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from verl_avspo.core.acr_config import ACR_SECTION
from verl_avspo.core.alert import stall_advice
from verl_avspo.core.run_tracker import RunTracker
from verl_avspo.verl_plugin.prompt_identity import ALLOCATION_SECTION, SKIP_SECTION, PromptsConfig
from verl_avspo.verl_plugin.settings import VerlSettings, parse_settings
from verl_avspo.verl_plugin.trainer_modes import MODE_KEY, MODE_OVERRIDE, is_ours, legacy_mode_problem

__all__ = [
    "VERL_ADVICE",
    "WITHOUT_OUR_TRAINER_FIX",
    "before_rollout_problem",
    "legacy_trainer_problem",
    "start_run",
    "tracker_for",
    "reset",
]

logger = logging.getLogger(__name__)

# What the stall alert advises, in verl's settings.
VERL_ADVICE = stall_advice(
    "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.n", "algorithm.adv_estimator=avspo"
)

# The trackers our trainers serve, by the id of their run's config.algorithm node (start_run): the node, held weakly
# (an entry leaves with its node), and the tracker.
_served: dict[int, tuple[weakref.ref, RunTracker]] = {}
# The bare-estimator route's tracker, started where no trainer of ours serves the estimator (tracker_for).
_fallback: RunTracker | None = None


def start_run(algorithm_config: DictConfig, settings: VerlSettings | None = None) -> RunTracker:
    """A fresh tracker for the run whose ``config.algorithm`` is ``algorithm_config``, served from now on to
    verl's estimator calls with this very node (the one verl's advantage stage passes them). Our trainer calls it
    once, at start-up, with the settings it parsed (``settings``; else they are parsed here)."""
    tracker = _new_tracker(settings if settings is not None else parse_settings(algorithm_config))
    key = id(algorithm_config)
    _served[key] = (weakref.ref(algorithm_config, lambda _: _served.pop(key, None)), tracker)
    return tracker


def _new_tracker(settings: VerlSettings) -> RunTracker:
    tracker = RunTracker(
        settings.acr,
        settings.avspo,
        settings.dcpo,
        settings.norm_adv_by_std,
        acr_section=ACR_SECTION,
        advice=VERL_ADVICE,
        prompt_skip=settings.prompts.skip,
        prompt_identity=settings.prompts.key,
    )
    tracker.set_prompt_allocation(settings.prompts.allocation)
    return tracker


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
    """The tracker for ``estimator`` called with verl's ``config.algorithm``: the one our trainer serves for that
    node (:func:`start_run`); else the bare-estimator route's, started now when there is none or it was built for
    other settings (a new run in this process)."""
    global _fallback
    node, served = _served.get(id(algorithm_config), (None, None))
    if node is not None and node() is algorithm_config:
        return served
    settings = parse_settings(algorithm_config, estimator)
    tracker = _fallback
    fits = tracker is not None and tracker.acr == settings.acr and tracker.avspo == settings.avspo
    if estimator == "dcpo":
        fits = fits and tracker.dcpo == settings.dcpo and tracker.prompt_identity == settings.prompts.key
    if not fits:
        problem = legacy_trainer_problem(algorithm_config) or before_rollout_problem(settings.prompts)
        if problem:
            raise ValueError(problem)
        logger.warning(
            "verl-avspo: %s runs without our trainer: its state lives in this process only and is not checkpointed, "
            "and no acr/* is logged. %s",
            estimator,
            WITHOUT_OUR_TRAINER_FIX,
        )
        tracker = _fallback = _new_tracker(settings)
    return tracker


def reset() -> None:
    """Forget the bare-estimator route's tracker (a fresh run in the same process, or tests)."""
    global _fallback
    _fallback = None
