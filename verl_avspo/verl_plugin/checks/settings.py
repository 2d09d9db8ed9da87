"""The first stage of the launcher's checks, which imports no verl (about a second): the group
size, the rollout engine, every ``algorithm.avspo``, ``algorithm.dcpo``, ``algorithm.intrinsic`` and
``algorithm.prompts`` value, and how they combine with the trainer, the data and the policy loss.

Pure: :func:`settings_problems` returns the problems (the config cannot train) and the warnings
(it trains, but not as a user may expect); the caller raises and logs them.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

import verl_avspo.verl_plugin.checks.resources as resources
import verl_avspo.verl_plugin.checks.values as values
from verl_avspo.core.baseline_settings import DCPOConfig, IntrinsicConfig, resolve_dcpo, resolve_intrinsic
from verl_avspo.core.config import ACRConfig, AVSPOConfig, resolve_run_settings
from verl_avspo.core.prompt_skip import PromptSkipConfig
from verl_avspo.core.validation import Problems
from verl_avspo.verl_plugin.checks.prompt_index import prompt_index_problems
from verl_avspo.verl_plugin.checks.prompts import prompts_problems
from verl_avspo.verl_plugin.checks.values import filters_groups, v1_mode
from verl_avspo.verl_plugin.prompt_identity import PromptsConfig, resolve_prompts
from verl_avspo.verl_plugin.trainer_modes import MODE_KEY, MODES, is_ours, legacy_mode_problem, misspelt_mode

__all__ = ["SettingsCheck", "mode_problems", "settings_problems"]


def _sync_v1(config: DictConfig) -> bool:
    return v1_mode(config) == "sync"


def _rollout_problems(config: DictConfig) -> Iterator[str]:
    n = config.actor_rollout_ref.rollout.n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        yield (
            f"actor_rollout_ref.rollout.n={n!r} is invalid: it is the number of responses sampled per prompt "
            "(the group size), a positive integer. Set actor_rollout_ref.rollout.n=8 (the paper's group size)."
        )
    required = ["actor_rollout_ref.rollout.name"]
    if config.reward.reward_model.enable:
        required.append("reward.reward_model.rollout.name")
    for key in required:
        if OmegaConf.select(config, key) is None:  # None also for verl's mandatory `???`
            yield f"{key} is required: set the rollout engine, for example {key}=vllm (or sglang)."


# verl settings that recipes set from the environment (LR=, N_GPUS=, ...) and that verl reads only
# once the models load: (key, integer?, lowest, lowest excluded?, highest).
_NUMBERS = (
    ("actor_rollout_ref.actor.optim.lr", False, 0.0, True, math.inf),
    ("actor_rollout_ref.rollout.temperature", False, 0.0, False, math.inf),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", False, 0.0, True, 1.0),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", True, 1, False, math.inf),
    ("data.train_batch_size", True, 1, False, math.inf),
    ("data.max_prompt_length", True, 1, False, math.inf),
    ("data.max_response_length", True, 1, False, math.inf),
    ("trainer.n_gpus_per_node", True, 1, False, math.inf),
    ("trainer.nnodes", True, 1, False, math.inf),
    ("trainer.total_epochs", True, 1, False, math.inf),
    # Compared with 0 after the first step (-1 or 0: off); text fails there with a TypeError.
    ("trainer.save_freq", True, -1, False, math.inf),
    ("trainer.test_freq", True, -1, False, math.inf),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", True, 1, False, math.inf),
)


def _number_problems(config: DictConfig) -> Iterator[str]:
    """Text or out-of-range values where verl expects a number (a recipe's ``LR=abc``, ``N_GPUS=0``)."""
    for key, integer, low, low_open, high in _NUMBERS:
        value = OmegaConf.select(config, key, default=None)
        if value is None:
            continue
        kind = "an integer" if integer else "a number"
        is_number = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
        if not is_number or (value <= low if low_open else value < low) or value > high or value != value:
            bounds = f"> {low}" if low_open else f">= {low}"
            bounds += f" and <= {high}" if high != math.inf else ""
            yield (
                f"{key}={value!r} is invalid: expected {kind} {bounds}. Fix the value (in a recipe, its "
                "environment variable)."
            )


def _separate_async_problems(config: DictConfig) -> Iterator[str]:
    """What verl's separate_async trainer asserts when it is built (trainer_separate_async.py:55-76),
    after Ray has started: a rollout pool of its own, a checkpoint engine that can ship weights to
    it, and one parameter sync per mini-batch step."""
    if v1_mode(config) != "separate_async":
        return
    rollout = config.actor_rollout_ref.rollout
    for key in ("nnodes", "n_gpus_per_node"):
        value = rollout.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            yield (
                f"actor_rollout_ref.rollout.{key}={value!r} is invalid with trainer.v1.trainer_mode=separate_async, "
                "which generates on a rollout pool of its own GPUs: set actor_rollout_ref.rollout.nnodes=1 and "
                "actor_rollout_ref.rollout.n_gpus_per_node to that pool's GPUs (ray_kwargs.ray_init.num_gpus, or "
                "the cluster, must hold both pools)."
            )
    if rollout.checkpoint_engine.backend == "naive":
        yield (
            "actor_rollout_ref.rollout.checkpoint_engine.backend=naive cannot send weights to separate_async's "
            "rollout pool: set it to nccl (or nixl, mooncake)."
        )
    batch, mini_batch = config.data.train_batch_size, config.actor_rollout_ref.actor.ppo_mini_batch_size
    sync_step = config.trainer.v1.separate_async.parameter_sync_step
    if all(isinstance(v, int) for v in (batch, mini_batch, sync_step)) and batch != sync_step * mini_batch:
        yield (
            f"data.train_batch_size={batch} must equal trainer.v1.separate_async.parameter_sync_step={sync_step} x "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch} in separate_async: set "
            f"data.train_batch_size={sync_step * mini_batch}, or change the other two."
        )
    reward = config.reward.reward_model
    if reward.enable and not reward.enable_resource_pool:
        yield (
            "reward.reward_model.enable=True with enable_resource_pool=False (colocated) is not supported by "
            "separate_async, whose rollout pool never pauses to free GPU memory: set "
            "reward.reward_model.enable_resource_pool=True."
        )


def _alert_problems(config: DictConfig, acr: ACRConfig) -> Iterator[str]:
    if acr.alert.action == "stop" and not config.trainer.use_v1:
        yield (
            "algorithm.acr.alert.action=stop needs verl-avspo's V1 trainer; with trainer.use_v1=False verl's legacy "
            "trainer runs the estimator alone and nothing watches ACR. Set trainer.use_v1=True or "
            "algorithm.acr.alert.action=warn."
        )


def mode_problems(config: Any) -> list[str]:
    """Why our trainer mode named in ``config`` (verl's whole config) would not run; empty if it runs. A name
    of ours misspelt (``avspo_synk``) is refused here, before verl is imported (the other names are checked
    against verl's registry with it)."""
    mode = config.trainer.v1.trainer_mode
    if misspelt_mode(mode):
        close = difflib.get_close_matches(str(mode).lower(), MODES, n=1)
        hint = f" Did you mean {MODE_KEY}={close[0]}?" if close else ""
        return [f"{MODE_KEY}={mode} is none of verl-avspo's trainers.{hint} Ours: {', '.join(MODES)}."]
    return [legacy_mode_problem(mode)] if is_ours(mode) and not config.trainer.use_v1 else []


def _dcpo_clip_problems(value: Any, warnings: list[str]) -> Iterator[str]:
    """``clip_ratio_c`` caps DCPO's upper ratio bound and dual-clips negative advantages (a cap
    below DCPO's 10 is added to ``warnings``)."""
    try:
        cap = float(value)
    except (TypeError, ValueError):
        cap = float("nan")
    if not cap > 1:
        yield (
            f"actor_rollout_ref.actor.clip_ratio_c={value!r} is invalid with policy_loss.loss_mode=dcpo: it caps "
            "DCPO's upper ratio bound and dual-clips negative advantages, so it must be a number > 1. Set it to 10 "
            "(DCPO's)."
        )
    elif cap < 10:
        warnings.append(
            f"actor_rollout_ref.actor.clip_ratio_c={value} with policy_loss.loss_mode=dcpo caps DCPO's upper ratio "
            f"bound at {cap}; DCPO's released code uses 10 (verl's default is 3). Set "
            "actor_rollout_ref.actor.clip_ratio_c=10 to match it."
        )


def _baseline_problems(
    config: DictConfig,
    prompt_key: str | None,
    intrinsic: IntrinsicConfig | None,
    warnings: list[str],
) -> Iterator[str]:
    """DCPO (estimator and policy loss) and the intrinsic rewards (INTUITOR, RENT), given the run's
    prompt key and the intrinsic settings (None where the settings themselves were invalid); warnings
    go to ``warnings``."""
    algorithm, actor = config.algorithm, config.actor_rollout_ref.actor
    estimator = algorithm.adv_estimator
    intrinsic_on = intrinsic is not None and intrinsic.enabled
    if OmegaConf.select(actor, "policy_loss.loss_mode", default="vanilla") == "dcpo":
        yield from _dcpo_clip_problems(actor.get("clip_ratio_c", 3.0), warnings)
    needs = []
    if estimator == "dcpo":
        needs.append("algorithm.adv_estimator=dcpo (its prompt identity is passed by our V1 trainer)")
    if intrinsic_on:
        needs.append(f"algorithm.intrinsic.reward={intrinsic.reward} (computed in our V1 trainer)")
    if needs and not _sync_v1(config):
        yield (
            f"{' and '.join(needs)} needs the V1 sync trainer; this config has trainer.use_v1="
            f"{config.trainer.use_v1}, trainer.v1.trainer_mode={config.trainer.v1.trainer_mode}. Set "
            "trainer.use_v1=True trainer.v1.trainer_mode=sync."
        )
    filtering = filters_groups(algorithm)
    if intrinsic_on and filtering:
        yield (
            f"algorithm.intrinsic.reward={intrinsic.reward} with algorithm.filter_groups.enable=True: verl filters "
            "groups while sampling, on the verifier's reward, before our trainer replaces it by the intrinsic one, so "
            "this 'no verifier' baseline would train only on the groups the verifier kept. Set "
            "algorithm.filter_groups.enable=False."
        )
    if estimator == "dcpo" and filtering:
        warnings.append(
            "algorithm.filter_groups.enable=True removes collapsed groups before the advantage stage, so DCPO's "
            "per-prompt history never records those visits, the ones its smooth standardization is for; the "
            "DCPO paper trains without dynamic sampling."
        )
    if estimator == "dcpo" and prompt_key == "index":
        if OmegaConf.select(config, "data.custom_cls.path", default=None):
            warnings.append(
                "data.custom_cls is set: its dataset may fill index its own way, so the train files' "
                "extra_info.index is not checked for DCPO; different prompts sharing an index within a batch are "
                "still refused during training"
            )
        else:
            index_problems, index_warnings = prompt_index_problems(config.data.get("train_files", None))
            warnings.extend(index_warnings)
            yield from index_problems
    if not intrinsic_on:
        return
    rollout_correction = algorithm.get("rollout_correction", None)
    if rollout_correction is not None and rollout_correction.get("bypass_mode", False):
        yield (
            f"algorithm.intrinsic.reward={intrinsic.reward} reads the old policy's per-token distribution "
            "statistics, which verl skips with algorithm.rollout_correction.bypass_mode=True (old log-probs are "
            "the rollout's). Set algorithm.rollout_correction.bypass_mode=False."
        )
    if intrinsic.reward != "self_certainty":
        return
    if not resources.verl_has_self_certainty():  # looked up here, so that tests can patch it
        yield (
            "algorithm.intrinsic.reward=self_certainty (INTUITOR) needs each token's mean log-probability over "
            "the vocabulary, which verl 0.9.1's actor does not return. Apply patches/verl-0.9.1-intrinsic.patch "
            "to verl (see patches/README.md), or use algorithm.intrinsic.reward=negative_entropy (RENT), which "
            "verl supports as is."
        )
    if str(actor.strategy) not in ("fsdp", "fsdp2"):
        yield (
            f"algorithm.intrinsic.reward=self_certainty with actor_rollout_ref.actor.strategy={actor.strategy}: "
            "the intrinsic patch adds self-certainty to verl's FSDP engine only. Use strategy fsdp or fsdp2."
        )
    if config.actor_rollout_ref.model.get("use_fused_kernels", False):
        yield (
            "algorithm.intrinsic.reward=self_certainty with actor_rollout_ref.model.use_fused_kernels=True: "
            "fused kernels never materialise the logits that self-certainty needs. Set it to False."
        )


def _combination_warnings(config: DictConfig) -> Iterator[str]:
    """Settings that train, but not as a user may expect."""
    if config.algorithm.adv_estimator == "avspo" and filters_groups(config.algorithm):
        yield (
            "algorithm.filter_groups.enable=True removes collapsed groups before the advantage stage, so "
            "AVSPO sees (almost) none and rarely triggers; the logged acr/* rates are measured before filtering."
        )


@dataclass
class SettingsCheck:
    """What the first stage found."""

    problems: list[str]
    """One message per reason the config cannot train, each naming the key, the value and the fix."""
    warnings: list[str] = field(default_factory=list)
    """Settings that train, but not as a user may expect; the caller gives each once."""
    avspo: AVSPOConfig | None = None
    """The resolved AVSPO estimator settings of ``algorithm.avspo``; None for another estimator or where invalid."""
    acr: ACRConfig | None = None
    """The resolved ACR settings of ``algorithm.acr`` (``tau``, ``reward_range``, ``alert``); None where invalid."""
    dcpo: DCPOConfig | None = None
    """The resolved ``algorithm.dcpo`` settings; None where that section was invalid."""
    intrinsic: IntrinsicConfig | None = None
    """The resolved ``algorithm.intrinsic`` settings; None where that section was invalid."""


def settings_problems(config: DictConfig) -> SettingsCheck:
    """The first stage, without importing verl: every problem and warning, and the settings that
    resolved. Logs nothing."""
    algorithm = config.algorithm
    problems, warnings = Problems(), []
    problems.messages.extend(values.boolean_problems(config))
    problems.messages.extend(_rollout_problems(config))
    problems.messages.extend(_number_problems(config))
    problems.messages.extend(_separate_async_problems(config))
    # The resolvers take verl's DictConfig sections as they are (they are mappings).
    run = problems.check(resolve_run_settings, algorithm)
    avspo, acr = (run.avspo, run.acr) if run is not None else (None, None)
    dcpo = problems.check(resolve_dcpo, algorithm.get("dcpo", None))
    intrinsic = problems.check(resolve_intrinsic, algorithm.get("intrinsic", None))
    prompts = problems.check(resolve_prompts, algorithm)
    if acr is not None:
        problems.messages.extend(_alert_problems(config, acr))
    problems.messages.extend(mode_problems(config))
    prompt_key = prompts.key if prompts is not None and dcpo is not None else None
    problems.messages.extend(_baseline_problems(config, prompt_key, intrinsic, warnings))
    if prompts is None and OmegaConf.select(config, "algorithm.prompts.skip.enable", default=None) is True:
        prompts = PromptsConfig(skip=PromptSkipConfig(enable=True))  # another bad value: still check where it skips
    if prompts is not None:
        problems.messages.extend(prompts_problems(config, prompts, warnings))
    warnings.extend(_combination_warnings(config))
    return SettingsCheck(problems.messages, warnings, avspo, acr, dcpo, intrinsic)
