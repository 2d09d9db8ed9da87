"""Values verl would read with another meaning than the user's, found without importing verl:
text where verl expects True or False (``trainer.use_v1=Flase`` is a non-empty string, so Python
reads it as true); and two readings of the config that several checks share (DAPO's filter, the V1 mode).

Pure: one message per problem, naming the key, the value and the fix.
"""

from __future__ import annotations

import difflib
import functools

from omegaconf import DictConfig, OmegaConf

import verl_avspo.verl_plugin.checks.resources as resources
from verl_avspo.verl_plugin.trainer_modes import verl_mode

__all__ = ["boolean_keys", "boolean_problems", "filters_groups", "v1_mode"]

# Keys read as booleans whose default in verl's YAML is null (so not found by their default's type).
_NULL_DEFAULT_BOOLEANS = ("critic.enable",)
# The booleans the launcher's checks and trainers read themselves: checked even if a verl release
# stops shipping its generated full config.
_READ_HERE = (
    "trainer.use_v1",
    "reward.reward_model.enable",
    "reward.reward_model.enable_resource_pool",
    "algorithm.filter_groups.enable",
    "algorithm.rollout_correction.bypass_mode",
    "actor_rollout_ref.hybrid_engine",
    "actor_rollout_ref.model.use_fused_kernels",
    "actor_rollout_ref.rollout.disaggregation.enabled",
)


def _walk_booleans(node: DictConfig, prefix: str) -> list[str]:
    keys = []
    for name in node.keys():
        if OmegaConf.is_interpolation(node, name) or OmegaConf.is_missing(node, name):
            continue  # a default taken from elsewhere is not a boolean default of its own
        child, key = node[name], f"{prefix}{name}"
        if isinstance(child, DictConfig):
            keys += _walk_booleans(child, f"{key}.")
        elif isinstance(child, bool):
            keys.append(key)
    return keys


@functools.cache
def boolean_keys() -> tuple[str, ...]:
    """Every key of verl's PPO config whose default is True or False (verl's generated full config,
    ``_generated_ppo_trainer.yaml``, read as a file), and those read here."""
    generated = resources.verl_package_dir() / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    keys = _walk_booleans(OmegaConf.load(generated), "") if generated.is_file() else []
    return tuple(dict.fromkeys([*keys, *_READ_HERE, *_NULL_DEFAULT_BOOLEANS]))


def boolean_problems(config: DictConfig) -> list[str]:
    """A key verl reads as a boolean given anything else (text, a number): ``if "Flase":`` is true."""
    problems = []
    for key in boolean_keys():
        value = OmegaConf.select(config, key, default=None, throw_on_missing=False)
        if value is None or isinstance(value, bool):
            continue
        text = isinstance(value, str) and value != ""
        close = difflib.get_close_matches(str(value).capitalize(), ("True", "False"), n=1) if text else []
        hint = f" Did you mean {key}={close[0]}?" if close else f" Set {key}=True or {key}=False."
        read_as = f"verl would read it as {bool(value)}{' (any non-empty text is true)' if text else ''}"
        problems.append(f"{key}={value!r} is not a boolean, and {read_as}.{hint}")
    return problems


def filters_groups(algorithm: DictConfig) -> bool:
    """Whether DAPO's dynamic sampling (``algorithm.filter_groups``) is on."""
    filter_groups = algorithm.get("filter_groups", None)
    return filter_groups is not None and bool(filter_groups.get("enable", False))


def v1_mode(config: DictConfig) -> str | None:
    """verl's name of the V1 mode the config runs (ours mapped to verl's); None with the legacy trainer."""
    return verl_mode(config.trainer.v1.trainer_mode) if config.trainer.use_v1 else None
