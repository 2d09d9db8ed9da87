"""How the user of each framework reads ``verl-avspo report``'s findings: which framework a log came from
(:func:`framework_of`), and, per framework (:data:`HOSTS`), how to log ``acr/*`` and try AVSPO there and how
the settings the findings name are spelled."""

from __future__ import annotations

import pandas as pd

from verl_avspo.tools.log_formats import is_trl_grpo

__all__ = ["HOSTS", "framework_of"]

# Each framework whose logs are told apart here, as its user reads the findings: how to get our metrics
# ("how") and AVSPO ("try_avspo") there, and how the settings the findings name are spelled ({} is the value);
# "temperature", "group" and "use_avspo" spell the stall advice (core.alert.stall_advice) as the host's adapter does.
HOSTS = {
    "verl": {
        "label": "verl",
        "how": "log acr/*: train with `python -m verl_avspo.main_ppo algorithm.adv_estimator=grpo ...`, or apply "
        "patches/03-acr-metrics.patch to verl",
        "try_avspo": "try AVSPO on the same setup: algorithm.adv_estimator=avspo",
        "temperature": "actor_rollout_ref.rollout.temperature",
        "use_avspo": "algorithm.adv_estimator=avspo",
        "group": "actor_rollout_ref.rollout.n",
        "apply_to": "algorithm.avspo.apply_to={}",
        "threshold_init": "algorithm.avspo.threshold_init",
        "preset": "algorithm.avspo.preset={}",
        "length": "data.max_response_length",
        "length_more": "or penalise overlong answers instead of scoring them 0 (DAPO's overlong buffer)",
        "weights": "the weight of that reward in your reward function (custom_reward_function)",
        "clip": "lower actor_rollout_ref.actor.optim.lr or actor_rollout_ref.actor.ppo_epochs",
    },
    "openrlhf": {
        "label": "OpenRLHF",
        "how": "log acr/*: train with `python -m verl_avspo.openrlhf` in place of "
        "`python -m openrlhf.cli.train_ppo_ray` (docs/integration.md section 7)",
        "try_avspo": "try AVSPO on the same setup: --algo.advantage.estimator avspo",
        "temperature": "--rollout.temperature",
        "use_avspo": "--algo.advantage.estimator avspo",
        "group": "--rollout.n_samples_per_prompt",
        "apply_to": "--avspo.apply_to {}",
        "threshold_init": "--avspo.threshold_init",
        "preset": "--avspo.preset {}",
        "length": "--rollout.max_new_tokens",
        "length_more": "or penalise overlong answers in the reward function instead of scoring them 0",
        "weights": "the weight of that reward in your reward function",
        "clip": "lower the actor's learning rate or the number of epochs per batch",
    },
    "other": {
        "label": "custom loop's",
        "how": "log the fraction of groups whose rewards are all equal as acr/rate, and its all-correct and "
        "all-wrong parts as acr/all_correct and acr/all_wrong (docs/diagnostics.md)",
        "try_avspo": "try AVSPO: verl_avspo.core.estimators (docs/method.md)",
        "temperature": "the generator's temperature",
        "use_avspo": "the avspo estimator",
        "group": "the group size",
        "apply_to": "apply_to={}",
        "threshold_init": "threshold_init",
        "preset": "preset={}",
        "length": "the completion length cap",
        "length_more": "or penalise overlong answers instead of scoring them 0",
        "weights": "that reward's weight",
        "clip": "lower the learning rate or the number of updates per batch",
    },
    "trl": {
        "label": "TRL",
        "how": "log acr/* (with the all-correct/all-wrong split and the stall alert): train with "
        "verl_avspo.trl.AVSPOGRPOTrainer in place of trl.GRPOTrainer (docs/trl.md)",
        "try_avspo": "try AVSPO on the same setup: verl_avspo.trl.AVSPOGRPOTrainer(..., estimator='avspo')",
        "temperature": "GRPOConfig.temperature",
        "use_avspo": "AVSPOGRPOTrainer(..., estimator='avspo')",
        "group": "GRPOConfig.num_generations",
        "apply_to": "avspo={{'apply_to': '{}'}}",
        "threshold_init": "avspo={'threshold_init': ...}",
        "preset": "avspo={{'preset': '{}'}}",
        "length": "GRPOConfig.max_completion_length",
        "length_more": "or set GRPOConfig.mask_truncated_completions=True so cut completions do not count as wrong",
        "weights": "GRPOConfig.reward_weights (or drop the function)",
        "clip": "lower GRPOConfig.learning_rate or GRPOConfig.num_iterations",
    },
}

# Metric names only OpenRLHF's trainer logs (verl's are actor/pg_loss and critic/*, TRL's loss and reward_std).
_OPENRLHF_ONLY = ("policy_loss", "group_reward_std")
# Metric groups verl's trainer (and the CPU sandbox, and ours) log.
_VERL_PREFIXES = ("critic/", "actor/", "response_length/", "val-core/", "acr/", "avspo/", "train/", "eval/")


def framework_of(frame: pd.DataFrame) -> str:
    """``trl`` for a TRL GRPO log (:func:`verl_avspo.tools.log_formats.is_trl_grpo`), ``openrlhf`` for
    OpenRLHF's (its ``policy_loss`` or ``group_reward_std``, under ``train/`` or not), ``verl`` for verl's
    (and the sandbox's and ours), else ``other`` (a custom loop's log)."""
    if is_trl_grpo(frame) or any(str(column).startswith("rewards/") for column in frame):
        return "trl"
    if any(str(column).removeprefix("train/") in _OPENRLHF_ONLY for column in frame):
        return "openrlhf"
    if any(str(column).startswith(_VERL_PREFIXES) for column in frame):
        return "verl"
    return "other"
