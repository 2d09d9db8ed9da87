"""The run's :class:`~verl_avspo.core.run_tracker.RunTracker` in this process, which verl's stateless
estimator functions reach.

verl calls an advantage estimator as a plain function of the batch and ``config.algorithm``, so the state
that must persist across steps (AVSPO's controller, DCPO's reward history) cannot travel with the call.
The host that owns the run (the launcher's trainer, the stock hook's adopted trainer, the sandbox) builds
the tracker with :func:`start_run` and binds it here; the estimators use the bound one. Where no host
bound one (verl's ``compute_advantage`` called directly), the first estimator call starts one, which
lives as long as the process and is not checkpointed.

Imports nothing from verl.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from verl_avspo.core.baseline_settings import DCPOConfig, dcpo_settings
from verl_avspo.core.config import RunSettings, resolve_run_settings
from verl_avspo.core.run_tracker import RunTracker
from verl_avspo.verl_plugin.prompt_identity import prompt_key_setting, resolve_prompts

__all__ = ["run_settings", "run_dcpo_settings", "start_run", "bound_tracker", "tracker_for", "reset"]

logger = logging.getLogger(__name__)

_bound: RunTracker | None = None


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


def run_dcpo_settings(algorithm_config: Any) -> DCPOConfig:
    """DCPO's settings with the run's prompt identity (``algorithm.prompts.key``, or DCPO's own spelling)."""
    return dataclasses.replace(dcpo_settings(algorithm_config), prompt_key=prompt_key_setting(algorithm_config))


def start_run(algorithm_config: Any) -> RunTracker:
    """A fresh tracker for the run that verl's ``config.algorithm`` describes, bound in this process."""
    global _bound
    settings = run_settings(algorithm_config)
    norm_adv_by_std = bool(algorithm_config.get("norm_adv_by_std_in_grpo", True))
    dcpo = run_dcpo_settings(algorithm_config) if settings.estimator == "dcpo" else None
    skip = resolve_prompts(algorithm_config).skip
    _bound = RunTracker(settings.acr, settings.avspo, dcpo, norm_adv_by_std, prompt_skip=skip)
    return _bound


def bound_tracker() -> RunTracker | None:
    """The tracker the run's host bound in this process, if any."""
    return _bound


def tracker_for(algorithm_config: Any, estimator: str) -> RunTracker:
    """The bound tracker, for ``estimator`` called with verl's ``config.algorithm``; one started now
    when no host bound one, or when the bound one was built for other settings (a new run in this process)."""
    settings = run_settings(algorithm_config, estimator)
    tracker = _bound
    fits = tracker is not None and tracker.acr == settings.acr and tracker.avspo == settings.avspo
    if estimator == "dcpo":
        fits = fits and tracker.dcpo == run_dcpo_settings(algorithm_config)
    if not fits:
        if resolve_prompts(algorithm_config).skip.enable:
            raise ValueError(
                "algorithm.prompts.skip.enable=True, but no verl-avspo trainer runs in this process, so nothing "
                "reads the prompts before their rollout (stock `python -m verl.trainer.main_ppo` with only the "
                "plugin installed reaches verl-avspo at the advantage stage, after the rollout). Launch with "
                "`python -m verl_avspo.main_ppo`, or add the ACR hook (trainer.v1.sampler.custom_sampler, "
                "docs/integration.md), or set algorithm.prompts.skip.enable=False."
            )
        logger.info(
            "verl-avspo: no run tracker bound for %s in this process; starting one (not checkpointed)", estimator
        )
        config = dict(algorithm_config or {})
        config["adv_estimator"] = estimator
        tracker = start_run(config)
    return tracker


def reset() -> None:
    """Unbind the tracker (a fresh run in the same process, or tests)."""
    global _bound
    _bound = None
