"""Launcher: verl's own ``main_ppo`` with our trainer: ACR metrics, the stagnation alert and AVSPO state in
checkpoints.

    python -m verl_avspo.main_ppo <hydra overrides>            # train
    python -m verl_avspo.main_ppo --dry-run <hydra overrides>  # check the config, start nothing
    python -m verl_avspo.main_ppo --cfg job <hydra overrides>  # print the composed config (Hydra)

The config is ``verl_avspo/verl_plugin/config/avspo_trainer.yaml``: verl's ``ppo_trainer`` plus every
``algorithm.avspo.*`` key, with ``algorithm.adv_estimator=avspo``. Before Ray starts, the launcher
checks what verl itself never checks (the estimator name, the group size, the AVSPO settings) and
runs verl's own ``validate_config``; a config that fails gets one message listing every problem,
each with what to change. Then it runs verl's own ``main_ppo`` (its Hydra task, given the composed config)
with ``trainer.v1.trainer_mode`` set to our trainer for the mode asked for (``sync`` -> ``avspo_sync``,
:mod:`verl_avspo.verl_plugin.trainer_modes`): the same trainer, through the same door, as stock
``python -m verl.trainer.main_ppo trainer.v1.trainer_mode=avspo_sync``.

With ``trainer.use_v1=False`` verl's legacy trainer runs with the estimator alone (no ``acr/*``, no run state in
checkpoints, no alert), and the launcher says so at start-up (docs/integration.md, "The legacy trainer").

This module imports neither verl nor Ray at import time: the settings are checked first, against
verl's YAML read from its folder, so a typo in ``algorithm.avspo`` is refused in about a second.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl_avspo.core.config import ACR_KEYS, ALERT_KEYS, AVSPO_KEYS, misplaced_acr_key_problem, unknown_key_problem
from verl_avspo.core.prompt_allocation import FIELDS as PROMPT_ALLOCATION_KEYS
from verl_avspo.core.prompt_skip import FIELDS as PROMPT_SKIP_KEYS
from verl_avspo.verl_plugin.checks import (
    NOT_YET_CHECKED,
    CheckedConfig,
    ConfigCheckError,
    checkpoint_folder_problems,
    preflight,
    resource_problems,
    saves_checkpoints,
    settings_problems,
    verl_package_dir,
)
from verl_avspo.verl_plugin.estimators import is_group_estimator
from verl_avspo.verl_plugin.prompt_identity import (
    ALLOCATION_SECTION,
    PROMPTS_KEYS,
    PROMPTS_SECTION,
    SKIP_SECTION,
    resolve_prompt_identity,
)
from verl_avspo.verl_plugin.settings import parse_settings
from verl_avspo.verl_plugin.trainer_modes import our_mode

__all__ = ["CONFIG_DIR", "CONFIG_NAME", "LEGACY_LIMITS", "compose_config", "dry_run", "train", "main"]

logger = logging.getLogger(__name__)

# An absolute path: ``verl_avspo.verl_plugin.config`` is not a Python package, so Hydra cannot
# address this folder as ``pkg://``.
CONFIG_DIR = str(Path(__file__).resolve().parent / "config")
CONFIG_NAME = "avspo_trainer"


def compose_config(overrides: Sequence[str] = (), *, import_verl: bool = True) -> DictConfig:
    """Our config composed with verl's, as ``python -m verl_avspo.main_ppo`` would see it.

    With ``import_verl=False``, verl's YAML is read from its installed folder (``file://``) instead
    of its package (``pkg://``, which imports verl, the slow part); the two give the same config.
    A ``hydra.searchpath`` of the user's own is kept as given.
    """
    from hydra import compose, initialize_config_dir

    overrides = list(overrides)
    if not import_verl and not any(arg.lstrip("+~").startswith("hydra.searchpath") for arg in overrides):
        overrides.append(f"hydra.searchpath=[file://{verl_package_dir() / 'trainer' / 'config'}]")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=overrides)


def _describe(config: DictConfig, checked: CheckedConfig) -> str:
    mode = config.trainer.v1.trainer_mode
    trainer = f"V1 {our_mode(mode)}" if config.trainer.use_v1 else "legacy (use_v1=False): the estimator alone"
    lines = [
        f"algorithm.adv_estimator={config.algorithm.adv_estimator}  "
        f"actor_rollout_ref.rollout.n={config.actor_rollout_ref.rollout.n}  trainer={trainer}",
        "ACR settings (algorithm.acr, resolved):",
        *(f"  {key}: {value}" for key, value in checked.acr.to_dict().items()),
    ]
    if checked.avspo is not None:  # only the avspo estimator reads them
        lines.append("AVSPO settings (algorithm.avspo, resolved):")
        lines.extend(f"  {key}: {value}" for key, value in checked.avspo.to_dict().items())
    settings = parse_settings(config.algorithm)
    dcpo, intrinsic = settings.dcpo, settings.intrinsic
    if dcpo is not None:
        lines.append(
            "DCPO settings (algorithm.dcpo, resolved): " + ", ".join(f"{k}={v}" for k, v in dcpo.to_dict().items())
        )
    if intrinsic.enabled:
        lines.append(
            "intrinsic reward (algorithm.intrinsic, resolved): "
            + ", ".join(f"{k}={v}" for k, v in intrinsic.to_dict().items())
        )
    if is_group_estimator(str(config.algorithm.adv_estimator)):
        identity, prompts = resolve_prompt_identity(config), settings.prompts
        lines.append(f"prompts (algorithm.prompts, resolved): keyed by {identity.source} ({identity.reason})")
        for name, settings in (("skip", prompts.skip), ("allocation", prompts.allocation)):
            if settings.enable:
                lines.append(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in settings.to_dict().items()))
    loss_mode = OmegaConf.select(config, "actor_rollout_ref.actor.policy_loss.loss_mode", default="vanilla")
    lines.append(f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}")
    return "\n".join(lines)


def _fail(err: ConfigCheckError) -> None:
    print(f"verl-avspo: {err}", file=sys.stderr)
    raise SystemExit(1)


# Said after a dry run passes, so that nobody reads "OK" as "it will train".
DRY_RUN_LIMITS = (
    "Not checked by a dry run: that the model and tokenizer load and fit in GPU memory, the prompt lengths, the "
    "reward function's output, and the rollout engine (vllm/sglang) being installed."
)


def _checked(config: DictConfig, *, connect: bool) -> tuple[CheckedConfig, list[str]]:
    """The preflight checks, the resource checks and the checkpoint folder's, with every problem of all
    in one error, and each of their warnings logged once. Returns the checked settings and what could
    not be checked."""
    problems, not_checked = resource_problems(config, connect=connect)
    folder_problems, folder_warnings = checkpoint_folder_problems(config)
    problems += folder_problems
    try:
        checked = preflight(config)
    except ConfigCheckError as err:
        _warn(err.warnings + folder_warnings)
        raise ConfigCheckError(err.problems + problems) from None
    _warn(checked.warnings + folder_warnings)
    if problems:
        raise ConfigCheckError(problems)
    return checked, not_checked


def _warn(warnings: Sequence[str]) -> None:
    for warning in warnings:
        logger.warning(warning)


# Said at start-up with trainer.use_v1=False (docs/integration.md, "The legacy trainer").
LEGACY_LIMITS = (
    "trainer.use_v1=False runs verl's legacy trainer, which is deprecated in verl 0.9.1, with verl-avspo's "
    "estimator alone: no acr/* or prompts/* metrics, no stall alert, no run state in checkpoints (a resumed avspo "
    "run restarts its controller). For all of them set trainer.use_v1=True (verl's default)."
)


def train(config: DictConfig) -> None:
    """Check ``config`` and the resources it asks for, log the AVSPO settings once, then run verl's own
    ``main_ppo`` with our trainer's mode."""
    try:
        checked, _ = _checked(config, connect=True)
    except ConfigCheckError as err:
        _fail(err)
    from verl.trainer import main_ppo

    if config.trainer.use_v1:
        config.trainer.v1.trainer_mode = our_mode(config.trainer.v1.trainer_mode)
    else:
        logger.warning(LEGACY_LIMITS)
    logger.info("verl-avspo launcher\n%s", _describe(config, checked))
    main_ppo.main(config)  # Hydra's decorator runs verl's task with a config handed to it


# The sections whose keys our config declares, and their keys.
_DECLARED = {
    "algorithm.acr": ACR_KEYS,
    "algorithm.acr.alert": ALERT_KEYS,
    "algorithm.avspo": AVSPO_KEYS,
    PROMPTS_SECTION: PROMPTS_KEYS,
    SKIP_SECTION: PROMPT_SKIP_KEYS,
    ALLOCATION_SECTION: PROMPT_ALLOCATION_KEYS,
}


def _undeclared_key_problem(key: str) -> str | None:
    """The did-you-mean message for ``key`` when the deepest declared section it lies in lacks its next
    part (``algorithm.prompts.skip.enabel``, ``algorithm.prompts.skp.enable``); None otherwise."""
    parts = key.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        section = ".".join(parts[:depth])
        if section in _DECLARED:
            name = parts[depth]
            if name in _DECLARED[section]:
                return None
            if section == "algorithm.avspo" and name in ACR_KEYS:
                return misplaced_acr_key_problem(name)
            return unknown_key_problem(f"{section}.{name}", _DECLARED[section])
    return None


def _unknown_avspo_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """The overrides without those that set a key of a section our config declares (``algorithm.acr``,
    ``algorithm.avspo``, ``algorithm.prompts``) that it lacks, and a did-you-mean message for each of those
    (instead of Hydra's advice to add ``+``)."""
    kept, problems = [], []
    for override in overrides:
        key, has_value, _ = override.partition("=")
        problem = _undeclared_key_problem(key) if has_value else None
        if problem:
            problems.append(problem)
        else:
            kept.append(override)
    return kept, problems


def _settings_checked_config(overrides: Sequence[str]) -> DictConfig | None:
    """The config, composed without importing verl and through the first stage of the checks; None
    (after printing why: a bad override, or every problem of the settings) if it stops there."""
    from hydra.errors import HydraException

    overrides, unknown = _unknown_avspo_overrides(overrides)
    try:
        config = compose_config(overrides, import_verl=False)
    except (HydraException, OmegaConfBaseException) as err:
        cause = f" ({str(err.__cause__).splitlines()[0]})" if err.__cause__ else ""
        print(f"verl-avspo: invalid override: {err}{cause}", file=sys.stderr)
        return None
    # Its warnings are not given here: the full checks that follow run this stage again and give them.
    problems = unknown + settings_problems(config).problems
    if problems:
        print(f"verl-avspo: {ConfigCheckError(problems, NOT_YET_CHECKED)}", file=sys.stderr)
        return None
    return config


def dry_run(overrides: Sequence[str]) -> int:
    """Compose the config, run every check, print the AVSPO settings; start nothing."""
    config = _settings_checked_config(overrides)
    if config is None:
        return 1
    try:
        checked, not_checked = _checked(config, connect=False)
    except ConfigCheckError as err:
        print(f"verl-avspo: {err}", file=sys.stderr)
        return 1
    print(_describe(config, checked))
    saved = ", trainer.default_local_dir can take checkpoints" if saves_checkpoints(config) else ""
    print(
        "OK: the config composes and passes verl-avspo's and verl's checks; the local data files exist with verl's "
        "columns and data sources the reward scores, the model path exists, what the config names imports, the "
        f"trainer mode is registered{saved} and the GPUs asked for are there (dry run: nothing was started)"
    )
    print(DRY_RUN_LIMITS + "".join(f"\nNot checked: {item}." for item in not_checked))
    return 0


@hydra.main(config_path=CONFIG_DIR, config_name=CONFIG_NAME, version_base=None)
def _hydra_main(config: DictConfig) -> None:
    train(config)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:  # our usage first: Hydra's help knows nothing of --dry-run
        print(__doc__.split("\n\n")[1] + "\n\nverl's config (Hydra's help follows):\n")
    flags = [arg for arg in argv if arg.startswith("-") and arg != "--dry-run"]
    if "--dry-run" in argv:
        if flags:  # Hydra's own flags need Hydra's own run
            print(
                f"verl-avspo: --dry-run takes Hydra overrides (key=value) only, not {' '.join(flags)}. "
                "Use `python -m verl_avspo.main_ppo --cfg job <overrides>` to print the composed config, "
                "`--help` for verl's config.",
                file=sys.stderr,
            )
            return 2
        return dry_run([arg for arg in argv if arg != "--dry-run"])
    if not flags and _settings_checked_config(argv) is None:  # a training run: refuse before verl's imports
        return 1
    sys.argv = [sys.argv[0], *argv]  # Hydra parses sys.argv (overrides, --cfg, --multirun, ...)
    _hydra_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
