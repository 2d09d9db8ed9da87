"""AVSPO and the ACR metrics inside OpenRLHF's PPO trainer (OpenRLHF 0.10.4 to 0.11.x): the
runtime wrapping of its trainer classes (not to be confused with ``patches/``, the diffs to
upstream sources). The advantage step itself is :mod:`verl_avspo.openrlhf.advantage_step`; the
check that OpenRLHF has what is wrapped, :mod:`verl_avspo.openrlhf.compat`.

OpenRLHF has no estimator registry: its group baselines are an if/elif on
``args.algo.advantage.estimator`` inside ``RemoteExperienceMaker.compute_advantages_and_returns``,
and that runs in the trainer's Ray actor, not in the launching process. :func:`install` wraps, in
the process it runs in:

- ``SamplesGenerator`` and OpenRLHF 0.11's prompt draw: :mod:`verl_avspo.openrlhf.generation`;
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
from types import ModuleType
from typing import Any

from verl_avspo.openrlhf.advantage_step import (
    ACR_FLAGS,
    AdvantageStep,
    acr_settings_from_env,
    settings_from_env,
)
from verl_avspo.openrlhf.compat import check_openrlhf, trainer_modules
from verl_avspo.openrlhf.generation import (
    GENERATOR_WRAPPERS,
    PROMPT_DRAW_WRAPPER,
    attach_tracker,
    stop_generation,
)
from verl_avspo.openrlhf.surface import PASS_THROUGH

__all__ = ["STATE_KEY", "CLIENT_STATES_FILE", "METRICS_ATTR", "install", "worker_setup"]

logger = logging.getLogger(__name__)

_TRIGGER_MODULE = "openrlhf.trainer.ppo_trainer"
# The checkpoint client state that holds the run tracker's state.
STATE_KEY = "verl_avspo"
# DeepSpeed's file of a checkpoint's client states (in --ckpt.path/_actor/global_step<N>/).
CLIENT_STATES_FILE = "mp_rank_00_model_states.pt"
_STEP = "_verl_avspo_step"
_DROPPED = "_verl_avspo_dropped"
_INSTALLED = "_verl_avspo_installed"
METRICS_ATTR = "verl_avspo_metrics"

# The advantage step of the compute_advantages_and_returns call now running (this thread).
_ACTIVE: ContextVar[AdvantageStep | None] = ContextVar("verl_avspo_openrlhf_step", default=None)


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
            advantage_args.estimator = PASS_THROUGH
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
    stop_generation(generator)
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
            attach_tracker(generator, tracker)  # the skip rule decides from this run's history
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
        *((samples_generator.SamplesGenerator, name, wrap) for name, wrap in GENERATOR_WRAPPERS.items()),
        (ppo_trainer.BasePPOTrainer, "_compute_rollout_stats", _rollout_stats),
        (ppo_trainer.BasePPOTrainer, "save_logs_and_checkpoints", _save_logs_and_checkpoints),
        (ppo_trainer.BasePPOTrainer, "init_checkpoint_states", _init_checkpoint_states),
    ]
    draw, wrap_draw = PROMPT_DRAW_WRAPPER
    if callable(getattr(samples_generator, draw, None)):  # OpenRLHF 0.11's prompt draw
        wrappers.append((samples_generator, draw, wrap_draw))
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
