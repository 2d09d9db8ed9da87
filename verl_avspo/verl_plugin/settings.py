"""Every verl-avspo setting of verl's ``config.algorithm``, parsed in one place: :func:`parse_settings`.

Our trainer parses them once, at start-up, and hands the result to the parts that act on it (the tracker, prompt
skipping, the rollout allocator, the intrinsic reward); the launcher and ``doctor`` describe and check the same
object; the estimators parse them only on the bare-estimator route (stock ``main_ppo`` without our trainer
mode: :mod:`verl_avspo.verl_plugin.run_state`). A distinct setting is parsed (and its deprecation warnings
given) once per process.

The launcher's checks (:mod:`verl_avspo.verl_plugin.checks.settings`) collect every problem of a config at once,
part by part, before this runs; here the first bad part raises. Imports nothing from verl.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_avspo.core.acr_config import ACRConfig
from verl_avspo.core.baseline_settings import DCPOConfig, IntrinsicConfig, resolve_dcpo, resolve_intrinsic
from verl_avspo.core.config import AVSPOConfig, RunSettings, resolve_run_settings
from verl_avspo.verl_plugin.prompt_identity import PromptsConfig, resolve_prompts

__all__ = ["VerlSettings", "parse_settings"]

# The keys of config.algorithm that the settings are read from.
_KEYS = ("adv_estimator", "acr", "avspo", "dcpo", "intrinsic", "prompts", "norm_adv_by_std_in_grpo")


@dataclass(frozen=True)
class VerlSettings:
    """What verl's ``config.algorithm`` says to verl-avspo for one run."""

    run: RunSettings
    """The estimator's name, ``algorithm.acr`` and (``avspo`` only) ``algorithm.avspo``."""
    dcpo: DCPOConfig | None
    """``algorithm.dcpo``; None unless the estimator is ``dcpo``."""
    intrinsic: IntrinsicConfig
    """``algorithm.intrinsic``: RENT's or INTUITOR's reward in place of the verifier's (off by default)."""
    prompts: PromptsConfig
    """``algorithm.prompts``: the prompt key, skipping before rollout and the rollout allocator."""
    norm_adv_by_std: bool
    """verl's ``algorithm.norm_adv_by_std_in_grpo``."""

    @property
    def estimator(self) -> str:
        return self.run.estimator

    @property
    def acr(self) -> ACRConfig:
        return self.run.acr

    @property
    def avspo(self) -> AVSPOConfig | None:
        return self.run.avspo


def _plain(value: Any) -> Any:
    """DictConfig/ListConfig (or any mapping/sequence) to plain containers, for caching."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def _parse(algorithm: Mapping[str, Any], estimator: str | None) -> VerlSettings:
    run = resolve_run_settings(algorithm, estimator)
    return VerlSettings(
        run=run,
        dcpo=resolve_dcpo(algorithm.get("dcpo", None)) if run.estimator == "dcpo" else None,
        intrinsic=resolve_intrinsic(algorithm.get("intrinsic", None)),
        prompts=resolve_prompts({**algorithm, "adv_estimator": run.estimator}),
        norm_adv_by_std=bool(algorithm.get("norm_adv_by_std_in_grpo", True)),
    )


@functools.lru_cache(maxsize=64)
def _parse_canonical(canonical: str, estimator: str | None) -> VerlSettings:
    return _parse(json.loads(canonical), estimator)


def parse_settings(algorithm_config: Any, estimator: str | None = None) -> VerlSettings:
    """The validated settings of verl's ``config.algorithm`` (absent keys take their defaults).

    Args:
        algorithm_config: verl's ``config.algorithm`` (a DictConfig or a mapping; None: every default).
        estimator: overrides ``algorithm.adv_estimator`` (an estimator function knows its own name).

    Raises:
        SettingsError (a ValueError): the bad keys of the first part that has any, each with its fix.
    """
    given = algorithm_config if algorithm_config is not None else {}
    plain = {key: _plain(given.get(key, None)) for key in _KEYS if key in given}
    try:
        canonical = json.dumps(plain, sort_keys=True)
    except TypeError:  # an unserialisable value: parse directly for the error message
        return _parse(plain, estimator)
    return _parse_canonical(canonical, estimator)
