"""ACR metrics, the stall alert and AVSPO inside TRL's ``GRPOTrainer`` (docs/trl.md).

:class:`ACRTrainerMixin` goes in front of ``GRPOTrainer`` (or a subclass of it); :class:`AVSPOGRPOTrainer`
is the two together. The run's :class:`~verl_avspo.core.run_tracker.RunTracker` is called once per
generation batch, on every process, with the rewards TRL gathered from all of them:

- before TRL's ``_generate_and_score_completions`` (training only): every row's prompt key
  (``prompts.key``) is gathered and, with ``prompts.skip``, each group the skip rule skips is replaced
  in place by another dataset prompt (:mod:`verl_avspo.trl.prompts`); the keys feed the tracker's
  per-prompt history (``prompts/*``);
- ``_calculate_rewards`` (TRL gathers every process's rewards there) is kept as the step's rewards;
- after TRL's ``_generate_and_score_completions``, the tracker measures the scores (the weighted sum of
  the reward functions, as TRL's ``sum_then_normalize``), AVSPO computes the whole batch's advantages
  (``estimator='avspo'``, training only) and this process's rows replace ``output["advantages"]``;
  TRL's buffer then serves them to every optimizer step of the generation. ``acr/*``, ``avspo/*`` and
  ``acr/stalled`` join TRL's own metrics, so they reach its console, ``trainer_state.json`` and every
  ``report_to`` logger. Every process computes the same values from the same gathered rewards, so
  nothing more is communicated than the prompt keys (``estimator='grpo'`` gathers TRL's advantages
  for ``acr/effective``);
- ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: the tracker's state (AVSPO's controller, the
  alert's streak, the prompt history and the skip rule) is ``checkpoint-N/avspo_state.pt``, restored on
  every process on resume, where TRL keeps its own entropy controller's state;
- ``acr.alert.action='stop'``: the stalled step is checkpointed and training ends through TRL's
  ``TrainerControl``.

Whatever TRL would only fail on later, or not at all, is refused where it shows: a class with the mixin
behind ``GRPOTrainer`` (which would train plain GRPO) when it is defined; a reward function's value
that is no number, or is infinite, at the step, naming the function (:mod:`verl_avspo.trl.rewards`); a
checkpoint saved with other
``acr=`` / ``avspo=`` values or another ``prompts.key`` when ``train(resume_from_checkpoint=...)``
reads it, before the first step (an unreadable ``avspo_state.pt`` is the core's ``RunStateError``,
naming the file).

The hooks are TRL's private methods (TRL has no advantage hook: huggingface/trl#4525); a TRL outside
:data:`TESTED_TRL` gets a warning, and one that no longer gathers the rewards where this adapter reads
them is refused at the first step.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import numpy as np
import torch
from packaging.specifiers import SpecifierSet

try:
    import trl
    from trl import GRPOTrainer
except ImportError as error:
    raise ImportError(f"verl_avspo.trl needs TRL ({error}): pip install 'verl-avspo[trl]'") from error
from accelerate.utils import gather_object
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from verl_avspo.core.acr_config import ACR_KEYS
from verl_avspo.core.run_tracker import STATE_FILE, RunTracker
from verl_avspo.trl.prompts import (
    PROMPTS_SECTION,
    batch_keys,
    group_keys,
    refill_candidates,
    row_entry,
    row_key,
    select_groups,
)
from verl_avspo.trl.rewards import check_finite, checked_reward_funcs
from verl_avspo.trl.settings import ACR_SECTION, AVSPO_SECTION, TRL_ADVICE, resolve_trl_settings

__all__ = ["TESTED_TRL", "STATE_FILE", "ACRTrainerMixin", "AVSPOGRPOTrainer"]

logger = logging.getLogger(__name__)

# The TRL releases this adapter was tested with (the `trl` extra of pyproject.toml).
TESTED_TRL = ">=1.16,<1.17"

if trl.__version__ not in SpecifierSet(TESTED_TRL, prereleases=True):
    warnings.warn(
        f"verl_avspo.trl was tested with trl{TESTED_TRL}, and TRL {trl.__version__} is installed: the adapter "
        "overrides GRPOTrainer's private _calculate_rewards and _generate_and_score_completions, which may have "
        "changed. Install a tested TRL (pip install 'verl-avspo[trl]').",
        stacklevel=2,
    )


class _StopAfterStall(TrainerCallback):
    """Ends training after the step at which the stall alert fired with ``acr.alert.action='stop'``:
    that step is logged and checkpointed first (transformers' training loop saves, then stops)."""

    def __init__(self) -> None:
        self.requested = False

    def on_step_end(self, args, state, control, **kwargs):
        if self.requested:
            self.requested = False
            control.should_log = control.should_save = control.should_training_stop = True
            logger.error(
                "stopping the run after step %d (%s.alert.action='stop'); checkpoint: %s. Change the setup as "
                "advised above, then resume with trainer.train(resume_from_checkpoint=...).",
                state.global_step,
                ACR_SECTION,
                os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"),
            )
        return control


class _TRLRunTracker(RunTracker):
    """The run tracker, whose saved state also names the dataset column its per-prompt history is keyed by,
    and whose resume refuses, in the trainer's arguments, a checkpoint saved with other settings."""

    def __init__(self, *args: Any, prompts_key: str | None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.prompts_key = prompts_key

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "trl_prompts_key": self.prompts_key}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        problems = []
        saved_controller = state.get("controller") or {}
        if self.controller is not None and saved_controller.get("config") is not None:
            saved, current = saved_controller["config"], self.controller.state_dict()["config"]
            for key in sorted(k for k in current if saved.get(k) != current[k]):
                section = ACR_SECTION if key in ACR_KEYS else AVSPO_SECTION
                problems.append(f"{section}.{key}={saved.get(key)!r} in the checkpoint, {current[key]!r} here")
        history = state.get("prompt_history") or {}
        saved_key = state.get("trl_prompts_key", self.prompts_key)
        if history.get("key_kind") is not None and saved_key != self.prompts_key:
            problems.append(
                f"{PROMPTS_SECTION}.key={saved_key!r} keyed the checkpoint's per-prompt history, "
                f"{self.prompts_key!r} here (no prompt would match)"
            )
        if problems:
            raise ValueError(
                f"the checkpoint's {STATE_FILE} was saved with other settings: {'; '.join(problems)}. Resume with "
                f"the checkpoint's values (the trainer's {ACR_SECTION}=, {AVSPO_SECTION}= and {PROMPTS_SECTION}= "
                "arguments), or start a fresh run (train() without resume_from_checkpoint)."
            )
        super().load_state_dict(state)


class ACRTrainerMixin:
    """ACR metrics, the stall alert and (``estimator='avspo'``) AVSPO's advantages for a ``GRPOTrainer``.

    Keyword arguments, besides the trainer's own:
        estimator: ``'avspo'`` (default): AVSPO's advantages replace TRL's; ``'grpo'``: TRL's advantages,
            with every ``acr/*`` metric and the stall alert.
        avspo: AVSPO's settings (docs/configuration.md, ``algorithm.avspo``), e.g. ``{"preset": "paper"}``;
            ``epsilon`` defaults to TRL's 1e-4.
        acr: ACR's settings (``algorithm.acr``: ``tau``, ``reward_range``, ``alert``).
        prompts: the per-prompt history's key and the skip rule (:mod:`verl_avspo.trl.prompts`):
            ``key``, the training dataset's column that identifies a prompt (default: a hash of
            ``prompt``), and ``skip``, the core's ``PromptSkipConfig`` keys (``{"enable": True}``).

    Raises:
        SettingsError: at ``__init__``, before TRL loads the model, every bad setting and every
            ``GRPOConfig`` option the estimator does not support, each with its fix.
        TypeError: when a class puts the mixin behind ``GRPOTrainer`` (its methods would never run).
    """

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        order = cls.__mro__
        if GRPOTrainer in order and order.index(GRPOTrainer) < order.index(ACRTrainerMixin):
            raise TypeError(
                f"class {cls.__name__} puts ACRTrainerMixin behind GRPOTrainer in its bases, so GRPOTrainer's methods "
                "run instead of the mixin's (plain GRPO: no acr/* metrics, no AVSPO, no avspo= argument). Put "
                f"ACRTrainerMixin before GRPOTrainer: class {cls.__name__}(ACRTrainerMixin, GRPOTrainer), or "
                "(ACRTrainerMixin, MyGRPOTrainer)."
            )

    def __init__(
        self,
        *args: Any,
        estimator: str = "avspo",
        avspo: Any = None,
        acr: Any = None,
        prompts: Any = None,
        **kwargs: Any,
    ):
        grpo_config = kwargs.get("args", args[2] if len(args) > 2 else None)
        train_dataset = kwargs.get("train_dataset", args[3] if len(args) > 3 else None)
        self.avspo_settings = resolve_trl_settings(estimator, avspo, acr, grpo_config, prompts, train_dataset)
        super().__init__(*args, **kwargs)
        settings = self.avspo_settings
        self.tracker = _TRLRunTracker(
            settings.acr,
            settings.avspo,
            acr_section=ACR_SECTION,
            advice=TRL_ADVICE,
            prompt_skip=settings.prompts.skip,
            prompts_key=settings.prompts.key,
        )
        self.reward_funcs = checked_reward_funcs(self.reward_funcs, self.reward_func_names)
        self._gathered_rewards: torch.Tensor | None = None
        self._stop_after_stall = _StopAfterStall()
        self.add_callback(self._stop_after_stall)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        check_finite(rewards_per_func, self.reward_func_names)  # TRL would train on NaN advantages
        self._gathered_rewards = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        keys = None  # each group's prompt key (training only: evaluations stay out of the history)
        if training and self.avspo_settings.prompts.key is not None:
            keys = group_keys(self._gathered_prompt_keys(inputs), self.num_generations)
            if self.tracker.skipper is not None:
                inputs, keys = self._skip_prompts(inputs, keys)
        output = super()._generate_and_score_completions(inputs)
        rewards_per_func, self._gathered_rewards = self._gathered_rewards, None
        num_rows = len(inputs) * self.accelerator.num_processes
        captured = None if rewards_per_func is None else rewards_per_func.shape[0]
        if captured != num_rows:
            raise RuntimeError(
                f"verl_avspo.trl expected the rewards of all {num_rows} completions gathered by "
                f"GRPOTrainer._calculate_rewards, got {captured}: "
                f"TRL {trl.__version__} no longer computes them where this adapter reads them. Install "
                f"trl{TESTED_TRL} (pip install 'verl-avspo[trl]')."
            )
        mode = "train" if training else "eval"
        if training:  # one generation batch, of every process's rows
            self.tracker.count_rollouts(num_rows)
        group_size = self.num_generations if training else self.num_generations_eval
        # TRL's score of a completion: the weighted sum of its rewards; unscorable (every function
        # returned None) rows are NaN, left out of their group and given advantage 0, as TRL does.
        weights = self.reward_weights.to(rewards_per_func.device)
        scores = (rewards_per_func * weights).nansum(dim=1)
        scorable = ~torch.isnan(rewards_per_func).all(dim=1)
        if not bool(scorable.any()):  # nothing to measure; a training step still closes (its skipped prompts)
            if training:
                report: dict[str, float] = {}
                self.tracker.observe_step(self.state.global_step + 1, report)
                self._add_metrics(mode, report)
            return output
        index = (np.arange(num_rows) // group_size)[scorable.cpu().numpy()]
        self.tracker.measure(scores[scorable], index)
        if training and self.tracker.avspo is not None:
            advantages = self._avspo_advantages(scores, scorable, index)
            start = self.accelerator.process_index * len(inputs)
            output["advantages"] = advantages[start : start + len(inputs)].to(output["advantages"].dtype)
            self._log_completion_advantages(advantages)
        else:
            advantages = self.accelerator.gather(output["advantages"])  # TRL's own, for acr/effective
        if training:
            if keys is not None:
                self.tracker.set_prompt_keys(dict(enumerate(keys)))
            report = self.tracker.end_step(self.state.global_step + 1, advantages[scorable])
            if report.newly_stalled and self.tracker.acr.alert.action == "stop":
                self._stop_after_stall.requested = True
        else:  # an evaluation is no training step: no stall rule
            report = self.tracker.batch_metrics(advantages[scorable])
        self._add_metrics(mode, report)
        return output

    def _add_metrics(self, mode: str, report: dict[str, float]) -> None:
        """The tracker's metrics into TRL's own (``mode``: train or eval), which it logs and averages."""
        for key, value in report.items():
            self._metrics[mode][key].append(value)

    def _gathered_prompt_keys(self, inputs) -> list:
        """The prompt key of every row of the generation batch, in TRL's order (every process's rows,
        process by process, as TRL gathers the rewards). One ``gather_object`` of the small keys: TRL's
        own gathered prompts (``_logs["prompt"]``) are no dataset identity (an environment appends its
        observation, a multimodal prompt holds its images), and the rows do not carry their index.
        A key column other than ``prompt`` travels with the hash of each row's prompt, so that a key
        two prompts share is refused (an iterable dataset, which ``__init__`` could not read), and a
        row's bad key with the gather, so that every process refuses it (:func:`~verl_avspo.trl.prompts.row_entry`)."""
        column = self.avspo_settings.prompts.key
        return batch_keys(gather_object([row_entry(row, column) for row in inputs]), column)

    def _skip_prompts(self, inputs, keys: list) -> tuple[list, list]:
        """Before TRL generates: the skip rule's verdict on the batch's groups (the same on every
        process: the same history, the rule's own seeded generator); each skipped group's rows become, in
        place, another dataset prompt's (:func:`verl_avspo.trl.prompts.select_groups`), so every process
        keeps its rows and every group stays whole. Returns this process's rows and every group's key."""
        dataset, column, group_size = self.train_dataset, self.avspo_settings.prompts.key, self.num_generations
        replacements = select_groups(
            keys,
            lambda candidates, at_least, refill: self.tracker.select_prompts(candidates, group_size, at_least, refill),
            refill_candidates(len(dataset), self.tracker.skipper.config.seed, self.state.global_step + 1),
            lambda index: row_key(dataset[index], column),
        )
        if not replacements:
            return inputs, keys
        start = self.accelerator.process_index * len(inputs)
        rows = list(inputs)
        for position, row in enumerate(inputs):
            replaced = replacements.get((start + position) // group_size)
            if replaced is not None:  # the dataset row, with the columns TRL's dataloader handed over
                full = dataset[replaced[0]]
                rows[position] = {name: full[name] for name in row}
        keys = list(keys)
        for group, (_, key) in replacements.items():
            keys[group] = key
        return rows, keys

    def _avspo_advantages(self, scores: torch.Tensor, scorable: torch.Tensor, index: np.ndarray) -> torch.Tensor:
        """(num_rows,) AVSPO advantages of the gathered batch: 0 for unscorable rows and for groups left
        with one scorable row (no baseline: TRL's NaN std gives them 0 too)."""
        kept = scores[scorable].unsqueeze(1)
        output = self.tracker.avspo_advantages(
            kept, torch.ones_like(kept), index, norm_adv_by_std=self.avspo_settings.norm_adv_by_std
        )
        alone = output.stats.count[output.stats.ids] < 2
        advantages = torch.zeros_like(scores)
        advantages[scorable] = output.scalar_advantages.masked_fill(alone, 0.0).to(scores.dtype)
        return advantages

    def _log_completion_advantages(self, advantages: torch.Tensor) -> None:
        """The completions table (``log_completions``) shows the advantages trained on: TRL's own, the
        last ones it logged, are replaced."""
        logged = self._logs["advantages"]
        for _ in range(min(len(advantages), len(logged))):
            logged.pop()
        logged.extend(advantages.tolist())

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            self.tracker.save(os.path.join(self._get_output_dir(trial=trial), folder))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.tracker.load(checkpoint)


class AVSPOGRPOTrainer(ACRTrainerMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` with ACR metrics, the stall alert and AVSPO (:class:`ACRTrainerMixin`'s arguments)."""
