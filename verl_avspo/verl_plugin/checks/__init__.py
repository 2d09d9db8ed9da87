"""The launcher's config checks: what verl itself never checks, before any model or Ray starts.

Every check reports all of a config's problems at once (one :class:`ConfigCheckError`), each
message naming the key, the value and the fix. The checks are pure: they return problems and
warnings and log nothing; the caller (the launcher) raises the problems and gives each warning
once. They come in two stages:

- :func:`settings_problems` (:mod:`.settings`) needs no verl import (about a second): the group
  size, the rollout engine, every ``algorithm.avspo``, ``algorithm.dcpo`` and
  ``algorithm.intrinsic`` value, and how they combine with the trainer, the data (DCPO's prompt
  indices, :mod:`.prompt_index`) and the policy loss; ``algorithm.prompts`` (the key, skipping and the
  rollout allocator, :mod:`.prompts`); text given for a boolean (:mod:`.values`).
  The launcher runs it first, so a typo is refused in seconds rather than after verl's imports.
- :func:`registry_problems` (here) imports verl: the estimator, the policy loss and the V1 trainer
  mode against verl's registries, and verl's own ``validate_config``.

:func:`resource_problems` (:mod:`.resources`) checks what the run will find on the machine: local
data files with their columns and data sources (:mod:`.data`), a local model path or a hub id that
can load (:mod:`.hub`), the classes and functions the config names (:mod:`.extern`), and whether
the Ray cluster can supply the GPUs the config asks for; it also says what it could not check.
:func:`checkpoint_folder_problems` (:mod:`.checkpoint_folder`) checks that ``trainer.default_local_dir``
can take the run's checkpoints (writable, not under a file, its disk not full).
"""

from __future__ import annotations

import difflib
import importlib
import re
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl_avspo.core.baseline_settings import DCPOConfig, IntrinsicConfig
from verl_avspo.core.config import ACRConfig, AVSPOConfig
from verl_avspo.verl_plugin.checks.checkpoint_folder import checkpoint_folder_problems, saves_checkpoints
from verl_avspo.verl_plugin.checks.hub import hub_offline
from verl_avspo.verl_plugin.checks.prompt_index import prompt_index_problems
from verl_avspo.verl_plugin.checks.resources import (
    cluster_gpus,
    resource_problems,
    verl_has_self_certainty,
    verl_package_dir,
)
from verl_avspo.verl_plugin.checks.settings import SettingsCheck, mode_problems, settings_problems
from verl_avspo.verl_plugin.estimators import is_group_estimator
from verl_avspo.verl_plugin.trainer_modes import misspelt_mode

__all__ = [
    "ConfigCheckError",
    "CheckedConfig",
    "SettingsCheck",
    "mode_problems",
    "verl_package_dir",
    "is_group_estimator",
    "settings_problems",
    "registry_problems",
    "check_config",
    "prompt_index_problems",
    "verl_has_self_certainty",
    "cluster_gpus",
    "resource_problems",
    "checkpoint_folder_problems",
    "saves_checkpoints",
    "preflight",
]

# Said when only the first stage ran, so that a user knows more may follow.
NOT_YET_CHECKED = (
    "Not yet checked, because verl is not imported until these are fixed: the estimator, policy-loss and trainer-mode "
    "names against verl's registries, verl's own validate_config, and the data files, model path and GPUs."
)


class ConfigCheckError(ValueError):
    """A config that cannot train. ``problems`` holds one message per problem; ``note`` says what
    was not checked; ``warnings`` what the checks would also have said of a config that trains."""

    def __init__(self, problems: list[str], note: str = "", warnings: list[str] | None = None):
        self.problems = list(problems)
        self.note = note
        self.warnings = list(warnings or [])
        if len(self.problems) == 1:
            text = self.problems[0]
        else:
            text = f"{len(self.problems)} problems in the config:\n" + "\n".join(
                f"  {number}. {problem}" for number, problem in enumerate(self.problems, 1)
            )
        super().__init__(f"{text}\n{note}" if note else text)


def _unregistered(key: str, value: Any, registered: Iterable[str], what: str) -> str | None:
    """The problem with ``key=value`` when ``value`` is not in one of verl's registries (None when it
    is), with the closest registered name when one is close."""
    known = sorted(registered)
    if value in known:
        return None
    close = difflib.get_close_matches(str(value).lower(), known, n=1)  # AVSPO -> avspo
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{key}={value!r} is not a registered {what}.{hint} Registered: {', '.join(known)}."


def _estimator_problems(name: str) -> Iterator[str]:
    from verl.trainer.ppo import core_algos

    if name not in core_algos.ADV_ESTIMATOR_REGISTRY and name in ("avspo", "dcpo"):
        try:
            importlib.import_module("verl_avspo.verl_plugin.register")
        except Exception as err:  # the real error, which verl's entry-point loader would swallow
            yield (
                f"algorithm.adv_estimator={name} is unknown because the verl-avspo plugin failed to load: "
                f"{type(err).__name__}: {err}. Fix that error (run `verl-avspo doctor`), then retry."
            )
            return
    problem = _unregistered("algorithm.adv_estimator", name, core_algos.ADV_ESTIMATOR_REGISTRY, "advantage estimator")
    if problem:
        yield problem


def _trainer_mode_problems(config: DictConfig) -> Iterator[str]:
    """``trainer.v1.trainer_mode`` must be registered (verl looks it up only inside the TaskRunner)."""
    if not config.trainer.use_v1 or misspelt_mode(config.trainer.v1.trainer_mode):  # the latter: mode_problems
        return
    import verl.trainer.ppo.v1  # noqa: F401  (registers verl's modes, and ours: verl_plugin.register)
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    problem = _unregistered("trainer.v1.trainer_mode", config.trainer.v1.trainer_mode, TRAINER_REGISTRY, "V1 trainer")
    if problem:
        yield problem


def registry_problems(config: DictConfig) -> list[str]:
    """The second stage, which imports verl: the estimator and the policy loss must be registered,
    and a group estimator needs groups of at least 2."""
    from verl.trainer.ppo import core_algos

    problems = list(_estimator_problems(str(config.algorithm.adv_estimator)))
    estimator, n = str(config.algorithm.adv_estimator), config.actor_rollout_ref.rollout.n
    if not problems and isinstance(n, int) and n == 1 and is_group_estimator(estimator):
        problems.append(
            f"actor_rollout_ref.rollout.n={n} with algorithm.adv_estimator={estimator}: a group estimator "
            "compares the responses sampled for one prompt, so it needs at least 2 per prompt (with 1, every "
            "group is a singleton: verl gives it mean 0 and std 1, so its advantage is its raw score, with no "
            "baseline, and no group can collapse). Set actor_rollout_ref.rollout.n=8 (the paper's group size) or "
            "more."
        )
    problems.extend(_trainer_mode_problems(config))
    loss_mode = str(OmegaConf.select(config, "actor_rollout_ref.actor.policy_loss.loss_mode", default="vanilla"))
    problem = _unregistered(
        "actor_rollout_ref.actor.policy_loss.loss_mode", loss_mode, core_algos.POLICY_LOSS_REGISTRY, "policy loss"
    )
    if problem:
        problems.append(problem)
    return problems


def _unloadable_model_section(config: DictConfig, error: str) -> str | None:
    """The model section (``critic.model``, ...) whose config verl failed to build, when its path is
    not a local directory (a placeholder, a typo or a hub id: reported by the path checks)."""
    match = re.search(r"full_key: (\S+\.model)\b", error)
    if match is None:
        return None
    path = OmegaConf.select(config, f"{match.group(1)}.path", default=None)
    return match.group(1) if path is None or not Path(str(path)).expanduser().is_dir() else None


def _verl_validate_problems(config: DictConfig) -> list[str]:
    """verl's own launcher-side validation (batch sizes, micro batches, ...), which needs no GPU.
    verl stops at its first complaint, so this gives at most one."""
    import hydra
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    try:
        auto_set_device(config)
        with hub_offline():  # hub ids are checked with the resources; verl would retry for a minute
            validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except hydra.errors.InstantiationException as err:
        model = _unloadable_model_section(config, str(err))
        if model is not None:  # the path checks name it, with the fix
            return []
        return [f"verl's validate_config rejected the config: {err}"]
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None)
        fix = f" Set it on the command line: {key}=<value>." if key else ""
        return [f"verl's config is incomplete: {str(err).splitlines()[0]}.{fix}"]
    except (AssertionError, ValueError) as err:
        return [f"verl's validate_config rejected the config: {err}"]
    except TypeError as err:  # verl's YAML is untyped, so text given for a number fails in its arithmetic
        where = traceback.extract_tb(err.__traceback__)[-1].line
        return [
            f"verl's validate_config failed on a value of the wrong type: {err} (at `{where}`). A numeric setting "
            "was given text: check the numbers in your overrides (batch sizes, trainer.nnodes, n_gpus_per_node)."
        ]
    return []


@dataclass
class CheckedConfig:
    """A config that passed the checks: its resolved settings and what to warn about."""

    avspo: AVSPOConfig
    """The resolved AVSPO estimator settings of ``algorithm.avspo`` (read when the estimator is ``avspo``)."""
    acr: ACRConfig
    """The resolved ACR settings (``tau``, ``reward_range``, ``alert``), read on every run."""
    dcpo: DCPOConfig
    """The resolved ``algorithm.dcpo`` settings."""
    intrinsic: IntrinsicConfig
    """The resolved ``algorithm.intrinsic`` settings."""
    warnings: list[str] = field(default_factory=list)
    """Settings that train, but not as a user may expect; the caller gives each once."""


def check_config(config: DictConfig, *, verl_validate: bool = False) -> CheckedConfig:
    """Both stages of our checks (and verl's ``validate_config`` with ``verl_validate``). Logs nothing.

    Returns:
        The resolved settings and the warnings to give.

    Raises:
        ConfigCheckError: listing every problem found, each naming the key, the value and the fix
            (and carrying the warnings, for the caller to give too).
    """
    settings = settings_problems(config)
    problems = settings.problems + registry_problems(config)
    if verl_validate:
        problems += _verl_validate_problems(config)
    if problems:
        raise ConfigCheckError(problems, warnings=settings.warnings)
    return CheckedConfig(settings.avspo, settings.acr, settings.dcpo, settings.intrinsic, settings.warnings)


def preflight(config: DictConfig) -> CheckedConfig:
    """Everything checked before Ray starts: ours, then verl's, reported together."""
    return check_config(config, verl_validate=True)
