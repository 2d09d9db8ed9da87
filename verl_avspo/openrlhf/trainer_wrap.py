"""The trainer side of the OpenRLHF adapter (OpenRLHF 0.10.4 to 0.11.x): :class:`MakerMixin` and
:class:`TrainerMixin`, the overrides that :mod:`verl_avspo.openrlhf.extension` puts into subclasses of
OpenRLHF's experience maker and trainers. Imports no OpenRLHF (``tools/prompts`` reads the checkpoint
constants here). The advantage step itself is :mod:`verl_avspo.openrlhf.advantage_step`; the generator's side,
:mod:`verl_avspo.openrlhf.generation`.

OpenRLHF has no estimator registry: its group baselines are an if/elif on ``args.algo.advantage.estimator``
inside ``RemoteExperienceMaker.compute_advantages_and_returns``, which runs in the trainer's Ray actor.

- ``compute_advantages_and_returns`` (:class:`MakerMixin`): the run tracker first measures the step's raw
  rewards, once, with the dropped groups (``make_experience_batch`` takes them off the rollout list); then,
  in OpenRLHF's own order, the rewards are promoted to float32 and OpenRLHF's ``apply_length_penalties``
  runs, AVSPO's group step follows, and OpenRLHF's method runs with its length penalties off (they are
  applied) and, with AVSPO on, an estimator name its group if/elif does not match, so AVSPO's advantages
  reach the per-token stage (which reads the maker's own ``advantage_estimator``) unchanged. Without AVSPO,
  each response's scalar advantage for ``acr/effective`` comes from OpenRLHF's own method run on one-token
  copies of the rewards (``advantage_step.one_token_copies``);
- ``_compute_rollout_stats`` (:class:`TrainerMixin`): adds the step's ``acr/*`` and ``avspo/*`` metrics to the
  status OpenRLHF logs (wandb, TensorBoard, the console);
- ``save_logs_and_checkpoints`` / ``init_checkpoint_states``: the tracker's stall rule reads each step's
  metrics once and adds ``acr/stalled``; the tracker's state (AVSPO's controller and the alert's streak) is kept
  in the checkpoint's client states and restored on resume. With ``--acr.alert.action stop``, the stalled step
  is checkpointed and ``generate_samples`` then reports the prompts exhausted, so OpenRLHF's loop ends and the
  run saves its model and exits normally.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from verl_avspo.openrlhf.advantage_step import (
    ACR_FLAGS,
    AdvantageStep,
    acr_settings_from_env,
    one_token_copies,
    settings_from_env,
)
from verl_avspo.openrlhf.generation import attach_tracker, stop_generation
from verl_avspo.openrlhf.surface import PASS_THROUGH

__all__ = ["STATE_KEY", "CLIENT_STATES_FILE", "MakerMixin", "TrainerMixin", "adopt"]

logger = logging.getLogger(__name__)

# The checkpoint client state that holds the run tracker's state.
STATE_KEY = "verl_avspo"
# DeepSpeed's file of a checkpoint's client states (in --ckpt.path/_actor/global_step<N>/).
CLIENT_STATES_FILE = "mp_rank_00_model_states.pt"
# The length-penalty settings OpenRLHF's advantage method reads (off while it runs: they are applied first).
_LENGTH_PENALTIES = {"overlong_buffer_len": None, "stop_properly_penalty_coef": None}

T = TypeVar("T")


def adopt(cls: type[T], instance: Any) -> T:
    """``instance`` (built by OpenRLHF) as an instance of its subclass ``cls``, with the state it has."""
    if isinstance(instance, cls):
        return instance
    adopted = cls.__new__(cls)
    vars(adopted).update(vars(instance))
    return adopted


@contextmanager
def _overriding(namespace: Any, **values: Any) -> Iterator[None]:
    """``namespace``'s attributes set to ``values`` for the block (a part of OpenRLHF's args), then put back."""
    saved = {name: getattr(namespace, name, None) for name in values}
    for name, value in values.items():
        setattr(namespace, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(namespace, name, value)


class MakerMixin:
    """The overrides of OpenRLHF's ``RemoteExperienceMaker`` (put first in a subclass of it)."""

    _verl_avspo_step: AdvantageStep | None = None
    _verl_avspo_dropped: tuple | None = None
    # The last step's acr/* and avspo/* metrics, read by the trainer's rollout stats.
    verl_avspo_metrics: dict[str, float] = {}

    @property
    def advantage_step(self) -> AdvantageStep:
        """This maker's advantage step and run tracker (made on first use)."""
        if self._verl_avspo_step is None:
            self._verl_avspo_step = AdvantageStep(
                self.advantage_estimator, settings_from_env(), acr_settings_from_env()
            )
        return self._verl_avspo_step

    def make_experience_batch(self, rollout_samples, *rest, **kwargs):
        dropped = (getattr(rollout_samples, name, None) for name in ("dropped_rewards", "dropped_prompts"))
        self._verl_avspo_dropped = tuple(dropped)
        return super().make_experience_batch(rollout_samples, *rest, **kwargs)

    def compute_advantages_and_returns(self, experiences, *rest, **kwargs):
        from openrlhf.trainer.ppo_utils import experience_maker

        step = self.advantage_step
        dropped_rewards, dropped_prompts = self._verl_avspo_dropped or (None, None)
        self._verl_avspo_dropped = None
        args = self.strategy.args
        group_size = args.rollout.n_samples_per_prompt
        step.measure(experiences, group_size, dropped_rewards, dropped_prompts)
        # OpenRLHF's own first steps, in its order: rewards in at least float32, then the length penalties.
        for experience in experiences:
            experience.rewards = experience.rewards.to(torch.promote_types(experience.rewards.dtype, torch.float32))
        experience_maker.apply_length_penalties(experiences, args)
        with _overriding(args.reward, **_LENGTH_PENALTIES):
            if step.avspo_on:
                step.shape(experiences, group_size)
                with _overriding(args.algo.advantage, estimator=PASS_THROUGH):
                    experiences = super().compute_advantages_and_returns(experiences, *rest, **kwargs)
            else:
                if step.measures_effective:
                    step.outputs = self._group_step_outputs(experiences)
                experiences = super().compute_advantages_and_returns(experiences, *rest, **kwargs)
        step.restore_reward_stds(experiences)
        self.verl_avspo_metrics = step.batch_metrics(experiences, group_size)
        return experiences

    def _group_step_outputs(self, experiences: list) -> list[torch.Tensor]:
        """Each response's scalar advantage from OpenRLHF's own group step (before its reward clip), per
        experience: its advantage method run on one-token copies of the (penalised) rewards."""
        copies = one_token_copies([e.rewards for e in experiences], [e.index for e in experiences])
        with _overriding(self.strategy.args.reward, clip_range=None):
            super().compute_advantages_and_returns(copies)
        return [copy.advantages[:, 0].clone() for copy in copies]


def _stop_after(trainer: Any, global_step: int, save: Callable[[], Any]) -> None:
    """Checkpoint ``global_step`` now (whatever ``--ckpt.save_steps`` says) and end the run: the
    next ``generate_samples`` reports the prompts exhausted, so OpenRLHF's loop ends normally."""
    ckpt = trainer.args.ckpt
    with _overriding(ckpt, save_steps=1):  # OpenRLHF saves when global_step % save_steps == 0
        save()
    generator = getattr(trainer, "samples_generator", None)
    if generator is None:  # the asynchronous trainer generates in another actor (the launcher refuses this)
        logger.error(
            "%s.alert.action stop: step %d is checkpointed; this trainer cannot be stopped", ACR_FLAGS, global_step
        )
        return
    stop_generation(generator)
    logger.error(
        "stopping the run after step %d (%s.alert.action stop); checkpoint: %s. Change the setup as advised "
        "above, then resume with --ckpt.load_enable.",
        global_step,
        ACR_FLAGS,
        os.path.join(ckpt.path, "_actor", f"global_step{global_step}"),
    )


def _load_run_state(tracker, saved: dict[str, Any] | None) -> None:
    """Restore the run tracker from a resumed checkpoint's client state ``saved`` (None: the run that wrote
    it trained without verl-avspo, and the tracker starts afresh, with a warning)."""
    if saved is None:
        logger.warning(
            "the resumed checkpoint holds no %r client state (written by a run without verl-avspo?): the AVSPO "
            "threshold, the stall streak and the prompt history start afresh",
            STATE_KEY,
        )
        return
    tracker.load_state_dict(saved)


class TrainerMixin:
    """The overrides of OpenRLHF's trainers (``BasePPOTrainer``'s subclasses; put first in a subclass of one).
    ``maker_class`` and ``generator_class`` are the subclasses of OpenRLHF's experience maker and samples
    generator the trainer's own (built by OpenRLHF's ``__init__``) become."""

    maker_class: type
    generator_class: type

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.experience_maker = adopt(self.maker_class, self.experience_maker)
        if getattr(self, "samples_generator", None) is not None:  # the synchronous trainer's, in this actor
            self.samples_generator = adopt(self.generator_class, self.samples_generator)

    @property
    def tracker(self):
        return self.experience_maker.advantage_step.tracker

    def _compute_rollout_stats(self, experiences, *rest, **kwargs):
        stats = super()._compute_rollout_stats(experiences, *rest, **kwargs)
        stats.update(self.experience_maker.verl_avspo_metrics)
        return stats

    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None, *rest, **kwargs):
        tracker = self.tracker
        # Once per training step, on the step's logged metrics (a call without acr/rate is no step's).
        is_step = logs_dict is not None and "acr/rate" in logs_dict
        newly_stalled = is_step and tracker.observe_step(global_step, logs_dict)
        # In place: OpenRLHF hands the same dict on to save_best_checkpoint.
        client_states = {} if client_states is None else client_states
        client_states[STATE_KEY] = tracker.state_dict()

        def save():
            return super(TrainerMixin, self).save_logs_and_checkpoints(
                global_step, logs_dict, client_states, *rest, **kwargs
            )

        if newly_stalled and tracker.acr.alert.action == "stop":
            return _stop_after(self, global_step, save)
        return save()

    def init_checkpoint_states(self, *rest, **kwargs):
        states = super().init_checkpoint_states(*rest, **kwargs)
        if states.get("global_step", 0) > 0:  # a resume (a fresh run's states are OpenRLHF's defaults)
            _load_run_state(self.tracker, states.get(STATE_KEY))
        generator = getattr(self, "samples_generator", None)  # the synchronous trainer's, in this actor
        if generator is not None:
            attach_tracker(generator, self.tracker)  # the skip rule decides from this run's history
        return states
