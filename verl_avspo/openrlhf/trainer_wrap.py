"""AVSPO and the ACR metrics inside OpenRLHF's PPO trainer (OpenRLHF 0.10.4 to 0.11.x): the
runtime wrapping of its trainer classes (not to be confused with ``patches/``, the diffs to
upstream sources). The advantage step itself is :mod:`verl_avspo.openrlhf.advantage_step`; the
check that OpenRLHF has what is wrapped, :mod:`verl_avspo.openrlhf.compat`.

OpenRLHF has no estimator registry: its group baselines are an if/elif on
``args.algo.advantage.estimator`` inside ``RemoteExperienceMaker.compute_advantages_and_returns``,
and that runs in the trainer's Ray actor, not in the launching process. :func:`install` wraps, in
the process it runs in:

- ``SamplesGenerator.generate_samples``: records the rewards of the groups dynamic filtering drops,
  and hands them on as an attribute of the returned rollout list (so they cross the async trainer's
  queue with it);
- ``RemoteExperienceMaker.compute_advantages_and_returns``: the experience maker's run tracker
  (:mod:`verl_avspo.openrlhf.advantage_step`) first measures the step's raw rewards, once, with the
  dropped groups; while OpenRLHF's method runs, its ``apply_length_penalties`` is followed by AVSPO's
  group step, and its ``compute_reward`` records each response's scalar advantage for
  ``acr/effective``. With AVSPO on, the estimator name is set to one that OpenRLHF's group if/elif
  does not match, so OpenRLHF leaves AVSPO's advantages as they are, while the per-token stage (which
  reads the maker's own ``advantage_estimator``) still turns them into ``group_norm``'s returns;
- ``BasePPOTrainer._compute_rollout_stats``: adds the step's ``acr/*`` and ``avspo/*`` metrics to
  the status OpenRLHF logs (wandb, TensorBoard, the console);
- ``BasePPOTrainer.save_logs_and_checkpoints`` / ``init_checkpoint_states``: the tracker's stall rule
  reads each step's metrics once and adds ``acr/stalled``; the tracker's state (AVSPO's controller and
  the alert's streak) is kept in the checkpoint's client states and restored on resume. With
  ``--acr.alert.action stop``, the stalled step is checkpointed and ``generate_samples`` then reports
  the prompts exhausted, so OpenRLHF's loop ends and the run saves its model and exits normally.

:func:`worker_setup` is the Ray ``worker_process_setup_hook`` that ``python -m verl_avspo.openrlhf``
sets: every worker of the job installs the wrappers as soon as it imports
``openrlhf.trainer.ppo_trainer``, which the trainer actors (sync and async) do first.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from verl_avspo.core.prompt_history import prompt_key
from verl_avspo.core.prompt_refill import skip_and_refill
from verl_avspo.openrlhf.advantage_step import (
    ACR_FLAGS,
    AdvantageStep,
    acr_settings_from_env,
    settings_from_env,
)
from verl_avspo.openrlhf.compat import check_openrlhf, trainer_modules

__all__ = ["STATE_KEY", "CLIENT_STATES_FILE", "METRICS_ATTR", "GeneratedRollout", "install", "worker_setup"]

logger = logging.getLogger(__name__)

# A name OpenRLHF's group if/elif and its batch whitening do not match: rewards pass unchanged.
_PASS_THROUGH = "avspo"
_TRIGGER_MODULE = "openrlhf.trainer.ppo_trainer"
# The checkpoint client state that holds the run tracker's state.
STATE_KEY = "verl_avspo"
# DeepSpeed's file of a checkpoint's client states (in --ckpt.path/_actor/global_step<N>/).
CLIENT_STATES_FILE = "mp_rank_00_model_states.pt"
_STEP = "_verl_avspo_step"
_DROPPED = "_verl_avspo_dropped"
_RECORDED = "_verl_avspo_rewards"
_CARRIED = "_verl_avspo_carried"
_INSTALLED = "_verl_avspo_installed"
_STOPPED = "_verl_avspo_stopped"
_TRACKER = "_verl_avspo_tracker"
METRICS_ATTR = "verl_avspo_metrics"

# The advantage step of the compute_advantages_and_returns call now running (this thread).
_ACTIVE: ContextVar[AdvantageStep | None] = ContextVar("verl_avspo_openrlhf_step", default=None)


@dataclass
class Generation:
    """One ``generate_samples`` call's prompt draws: the run tracker that counts them (and, with the skip
    rule on, decides which prompts go out), the group size, and the draws sent to generation so far (the
    step's batch and each prompt dynamic filtering replaces: OpenRLHF's generation batches)."""

    tracker: Any
    group_size: int
    draws: int = 0


# While generate_samples runs in the trainer's actor (the synchronous trainer): its run tracker's draws.
_GENERATION: ContextVar[Generation | None] = ContextVar("verl_avspo_openrlhf_generation", default=None)


class GeneratedRollout(list):
    """The rollout samples ``SamplesGenerator.generate_samples`` returns, plus ``dropped_rewards``:
    (num_dropped, n_samples_per_prompt) float64 rewards of the groups dynamic filtering dropped while
    generating them, or None where nothing was dropped, rewards come later (a reward model) or
    nothing was generated (samples served from the buffer); and ``dropped_prompts``, their prompt
    texts (None where a response carried none), for the per-prompt history."""

    def __init__(self, samples: list, dropped_rewards: torch.Tensor | None, dropped_prompts: list | None = None):
        super().__init__(samples)
        self.dropped_rewards = dropped_rewards
        self.dropped_prompts = dropped_prompts


def _advantage_step(maker: Any) -> AdvantageStep:
    """The experience maker's advantage step and run tracker (one per maker, made on first use)."""
    step = getattr(maker, _STEP, None)
    if step is None:
        step = AdvantageStep(maker.advantage_estimator, settings_from_env(), acr_settings_from_env())
        setattr(maker, _STEP, step)
    return step


def _after_length_penalties(original: Callable) -> Callable:
    @functools.wraps(original)
    def apply_length_penalties(experiences, args, *rest, **kwargs):
        result = original(experiences, args, *rest, **kwargs)
        step = _ACTIVE.get()
        if step is not None:
            step.shape(experiences, args.rollout.n_samples_per_prompt)
        return result

    return apply_length_penalties


def _recording_rewards(original: Callable) -> Callable:
    @functools.wraps(original)
    def compute_reward(r, *rest, **kwargs):
        step = _ACTIVE.get()
        if step is not None:
            step.outputs.append(r.detach().reshape(-1).clone())
        return original(r, *rest, **kwargs)

    return compute_reward


def _compute_advantages_and_returns(original: Callable) -> Callable:
    @functools.wraps(original)
    def compute_advantages_and_returns(self, experiences, *rest, **kwargs):
        step = _advantage_step(self)
        dropped_rewards, dropped_prompts = getattr(self, _DROPPED, None) or (None, None)
        setattr(self, _DROPPED, None)
        group_size = self.strategy.args.rollout.n_samples_per_prompt
        step.measure(experiences, group_size, dropped_rewards, dropped_prompts)
        advantage_args = self.strategy.args.algo.advantage
        token = _ACTIVE.set(step)
        if step.avspo_on:
            advantage_args.estimator = _PASS_THROUGH
        try:
            experiences = original(self, experiences, *rest, **kwargs)
        finally:
            advantage_args.estimator = step.estimator
            _ACTIVE.reset(token)
        step.restore_reward_stds(experiences)
        setattr(self, METRICS_ATTR, step.batch_metrics(experiences, group_size))
        return experiences

    return compute_advantages_and_returns


def _make_experience_batch(original: Callable) -> Callable:
    @functools.wraps(original)
    def make_experience_batch(self, rollout_samples, *rest, **kwargs):
        dropped = (getattr(rollout_samples, name, None) for name in ("dropped_rewards", "dropped_prompts"))
        setattr(self, _DROPPED, tuple(dropped))
        return original(self, rollout_samples, *rest, **kwargs)

    return make_experience_batch


def _generate_samples(original: Callable) -> Callable:
    @functools.wraps(original)
    def generate_samples(self, *rest, **generate_kwargs):
        if getattr(self, _STOPPED, False):  # the stall alert stopped the run: no samples, prompts exhausted
            return GeneratedRollout([], None), None, 0, True
        group_size = generate_kwargs.get("n_samples_per_prompt", self.args.rollout.n_samples_per_prompt)
        setattr(self, _RECORDED, [])
        tracker = getattr(self, _TRACKER, None)
        generation = Generation(tracker, group_size) if tracker is not None else None
        token = _GENERATION.set(generation)
        try:
            result = original(self, *rest, **generate_kwargs)
            recorded = getattr(self, _RECORDED)
        finally:
            setattr(self, _RECORDED, None)
            _GENERATION.reset(token)
        if generation is not None:  # every response generated, those dynamic filtering dropped included
            tracker.count_rollouts(len(recorded), generation.draws)
        kept = [*result[0], *getattr(self, "_sample_buffer", ())]  # trained now, or served by a later step
        dropped = _joined_groups(getattr(self, _CARRIED, (None, None)), _dropped_groups(recorded, kept, group_size))
        # A call whose groups filtering all dropped trains no step (OpenRLHF draws again, or starts its next
        # episode): its groups are measured with the next step, which also counts their rollouts.
        setattr(self, _CARRIED, (None, None) if result[0] else dropped)
        return (GeneratedRollout(result[0], *dropped), *result[1:])

    return generate_samples


def _collect_kept_prompts(original: Callable) -> Callable:
    """OpenRLHF's prompt draw for rollout (the step's batch, and one prompt for each that dynamic filtering
    drops), counted as a generation batch; with the skip rule on, less the prompts the run tracker's rule
    rejects, drawn again by the core's loop (``core.prompt_refill``) until ``num_prompts`` are kept or the
    dataloader is exhausted (as OpenRLHF's own draw ends). Every place is refilled (re-selections): OpenRLHF
    trains on as many groups as it first sent out, so a place left open would shrink the step's batch."""

    @functools.wraps(original)
    def collect_prompt_batch(dataloader_iter, num_prompts: int, *rest, **kwargs):
        generation = _GENERATION.get()
        drawn = original(dataloader_iter, num_prompts, *rest, **kwargs)
        if generation is None:
            return drawn
        exhausted = drawn[3]
        if generation.tracker.skipper is not None and drawn[0]:

            def draw(missing: int):
                nonlocal exhausted
                if exhausted:
                    return None
                more = original(dataloader_iter, missing, *rest, **kwargs)
                exhausted = more[3]
                return more if more[0] else None

            picked = skip_and_refill(
                drawn,
                lambda chunk: [prompt_key(prompt) for prompt in chunk[0]],
                lambda keys, at_least, refill: generation.tracker.select_prompts(
                    keys, generation.group_size, at_least, refill
                ),
                draw,
                num_prompts,
            )
            prompts, labels, images = (
                [chunk[part][i] for chunk, chosen in picked.chunks for i in chosen] for part in range(3)
            )
            drawn = (prompts, labels, images, exhausted)
        generation.draws += bool(drawn[0])
        return drawn

    return collect_prompt_batch


def _dropped_groups(
    recorded: list[tuple[Any, float | None]], kept: list, group_size: int
) -> tuple[torch.Tensor | None, list | None]:
    """The generated groups none of whose responses was ``kept`` (those dynamic filtering dropped):
    their (num_dropped, group_size) rewards and their prompts, or (None, None). Each prompt's
    responses are processed one after the other, so the recorded (experience, reward) pairs come a
    group at a time."""
    if not recorded or len(recorded) % group_size or any(reward is None for _, reward in recorded):
        return None, None
    kept_ids = {id(experience) for experience in kept}
    groups = [recorded[i : i + group_size] for i in range(0, len(recorded), group_size)]
    dropped = [group for group in groups if all(id(experience) not in kept_ids for experience, _ in group)]
    if not dropped:
        return None, None
    rewards = torch.tensor([[reward for _, reward in group] for group in dropped], dtype=torch.float64)
    return rewards, [(group[0][0].prompts or [None])[0] for group in dropped]


def _joined_groups(
    first: tuple[torch.Tensor | None, list | None], second: tuple[torch.Tensor | None, list | None]
) -> tuple[torch.Tensor | None, list | None]:
    """Two calls' dropped groups (rewards, prompts) as one, either of them (None, None) where it has none."""
    if first[0] is None:
        return second
    if second[0] is None:
        return first
    prompts = None if first[1] is None or second[1] is None else [*first[1], *second[1]]
    return torch.cat([first[0], second[0]]), prompts


def _process_response(original: Callable) -> Callable:
    @functools.wraps(original)
    def process_response_into_experience(self, response, *rest, **kwargs):
        experience = original(self, response, *rest, **kwargs)
        recorded = getattr(self, _RECORDED, None)
        if recorded is not None:
            reward = response.get("reward")
            recorded.append((experience, None if reward is None else float(reward)))
        return experience

    return process_response_into_experience


def _rollout_stats(original: Callable) -> Callable:
    @functools.wraps(original)
    def compute_rollout_stats(self, experiences, *rest, **kwargs):
        stats = original(self, experiences, *rest, **kwargs)
        stats.update(getattr(self.experience_maker, METRICS_ATTR, {}))
        return stats

    return compute_rollout_stats


def _stop_after(trainer: Any, global_step: int, save: Callable[[], Any]) -> None:
    """Checkpoint ``global_step`` now (whatever ``--ckpt.save_steps`` says) and end the run: the
    next ``generate_samples`` reports the prompts exhausted, so OpenRLHF's loop ends normally."""
    ckpt = trainer.args.ckpt
    save_steps, ckpt.save_steps = ckpt.save_steps, 1  # OpenRLHF saves when global_step % save_steps == 0
    try:
        save()
    finally:
        ckpt.save_steps = save_steps
    generator = getattr(trainer, "samples_generator", None)
    if generator is None:  # the asynchronous trainer generates in another actor (the launcher refuses this)
        logger.error(
            "%s.alert.action stop: step %d is checkpointed; this trainer cannot be stopped", ACR_FLAGS, global_step
        )
        return
    setattr(generator, _STOPPED, True)
    logger.error(
        "stopping the run after step %d (%s.alert.action stop); checkpoint: %s. Change the setup as advised "
        "above, then resume with --ckpt.load_enable.",
        global_step,
        ACR_FLAGS,
        os.path.join(ckpt.path, "_actor", f"global_step{global_step}"),
    )


def _save_logs_and_checkpoints(original: Callable) -> Callable:
    @functools.wraps(original)
    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None, *rest, **kwargs):
        tracker = _advantage_step(self.experience_maker).tracker
        # Once per training step, on the step's logged metrics (a call without acr/rate is no step's).
        is_step = logs_dict is not None and "acr/rate" in logs_dict
        newly_stalled = is_step and tracker.observe_step(global_step, logs_dict)
        # In place: OpenRLHF hands the same dict on to save_best_checkpoint.
        client_states = {} if client_states is None else client_states
        client_states[STATE_KEY] = tracker.state_dict()
        if newly_stalled and tracker.acr.alert.action == "stop":
            return _stop_after(
                self, global_step, lambda: original(self, global_step, logs_dict, client_states, *rest, **kwargs)
            )
        return original(self, global_step, logs_dict, client_states, *rest, **kwargs)

    return save_logs_and_checkpoints


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


def _init_checkpoint_states(original: Callable) -> Callable:
    @functools.wraps(original)
    def init_checkpoint_states(self, *rest, **kwargs):
        states = original(self, *rest, **kwargs)
        tracker = _advantage_step(self.experience_maker).tracker
        if states.get("global_step", 0) > 0:  # a resume (a fresh run's states are OpenRLHF's defaults)
            _load_run_state(tracker, states.get(STATE_KEY))
        generator = getattr(self, "samples_generator", None)  # the synchronous trainer's, in this actor
        if generator is not None:
            setattr(generator, _TRACKER, tracker)  # the skip rule decides from this run's history
        return states

    return init_checkpoint_states


def install() -> str:
    """Wrap OpenRLHF's trainer classes in this process (idempotent); return OpenRLHF's version.

    Raises:
        OpenRLHFIncompatibleError: see :func:`check_openrlhf`.
    """
    version = check_openrlhf()
    experience_maker, samples_generator, ppo_trainer = trainer_modules()
    maker = experience_maker.RemoteExperienceMaker
    if getattr(maker, _INSTALLED, False):
        return version
    wrappers = [
        (experience_maker, "apply_length_penalties", _after_length_penalties),
        (experience_maker, "compute_reward", _recording_rewards),
        (maker, "make_experience_batch", _make_experience_batch),
        (maker, "compute_advantages_and_returns", _compute_advantages_and_returns),
        (samples_generator.SamplesGenerator, "generate_samples", _generate_samples),
        (samples_generator.SamplesGenerator, "_process_response_into_experience", _process_response),
        (ppo_trainer.BasePPOTrainer, "_compute_rollout_stats", _rollout_stats),
        (ppo_trainer.BasePPOTrainer, "save_logs_and_checkpoints", _save_logs_and_checkpoints),
        (ppo_trainer.BasePPOTrainer, "init_checkpoint_states", _init_checkpoint_states),
    ]
    if callable(getattr(samples_generator, "_collect_prompt_batch", None)):  # OpenRLHF 0.11's prompt draw
        wrappers.append((samples_generator, "_collect_prompt_batch", _collect_kept_prompts))
    for owner, name, wrap in wrappers:
        setattr(owner, name, wrap(getattr(owner, name)))
    setattr(maker, _INSTALLED, True)
    what = "ACR metrics and AVSPO" if settings_from_env() is not None else "ACR metrics"
    logger.info("verl_avspo: %s installed in OpenRLHF %s", what, version)
    return version


class _ThenRun(importlib.abc.Loader):
    """A module loader that runs ``action`` once the module has executed."""

    def __init__(self, loader: importlib.abc.Loader, action: Callable[[], Any]):
        self._loader, self._action = loader, action

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._action()

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... of the real loader
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``action`` right after ``module`` is first imported (one shot)."""

    def __init__(self, module: str, action: Callable[[], Any]):
        self.module, self.action = module, action

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenRun(spec.loader, self.action)
        return spec


def worker_setup() -> None:
    """Ray ``worker_process_setup_hook``: install the wrappers once this worker imports OpenRLHF's
    trainer. Workers that never do (vLLM engines, model shards) import nothing more."""
    if _TRIGGER_MODULE in sys.modules:
        install()
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(_TRIGGER_MODULE, install))
