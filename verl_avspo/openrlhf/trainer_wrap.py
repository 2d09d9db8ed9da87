"""AVSPO and the ACR metrics inside OpenRLHF's PPO trainer (OpenRLHF 0.10.4 to 0.11.x): the
runtime wrapping of its trainer classes (not to be confused with ``patches/``, the diffs to
upstream sources). The advantage step itself is :mod:`verl_avspo.openrlhf.advantage_step`; the
check that OpenRLHF has what is wrapped, :mod:`verl_avspo.openrlhf.compat`.

OpenRLHF has no estimator registry: its group baselines are an if/elif on
``args.algo.advantage.estimator`` inside ``RemoteExperienceMaker.compute_advantages_and_returns``,
and that runs in the trainer's Ray actor, not in the launching process. :func:`install` wraps, in
the process it runs in:

- ``SamplesGenerator.generate_samples``: records the rewards of every generated group before
  dynamic filtering drops any, and hands them on as an attribute of the returned rollout list (so
  they cross the async trainer's queue with it);
- ``RemoteExperienceMaker.compute_advantages_and_returns``: while it runs, the experience maker's
  ``apply_length_penalties`` is followed by AVSPO's group step, and its ``compute_reward`` records
  each response's scalar advantage for ``acr/effective``. With AVSPO on, the estimator name is set
  to one that OpenRLHF's group if/elif does not match, so OpenRLHF leaves AVSPO's advantages as
  they are, while the per-token stage (which reads the maker's own ``advantage_estimator``) still
  turns them into ``group_norm``'s returns;
- ``BasePPOTrainer._compute_rollout_stats``: adds the step's ``acr/*`` and ``avspo/*`` metrics to
  the status OpenRLHF logs (wandb, TensorBoard, the console);
- ``BasePPOTrainer.save_logs_and_checkpoints`` / ``init_checkpoint_states``: the stall alert
  (:mod:`verl_avspo.openrlhf.alert`) reads each step's metrics and adds ``acr/stalled``; AVSPO's state
  and the alert's are kept in the checkpoint's client states and restored on resume. With
  ``alert.action: stop``, the stalled step is checkpointed and ``generate_samples`` then reports the
  prompts exhausted, so OpenRLHF's loop ends and the run saves its model and exits normally.

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

import torch

from verl_avspo.openrlhf.advantage_step import AdvantageStep, settings_from_env
from verl_avspo.openrlhf.alert import STATE_KEY as ALERT_STATE_KEY
from verl_avspo.openrlhf.compat import check_openrlhf, trainer_modules

__all__ = ["METRICS_ATTR", "GeneratedRollout", "install", "worker_setup"]

logger = logging.getLogger(__name__)

# A name OpenRLHF's group if/elif and its batch whitening do not match: rewards pass unchanged.
_PASS_THROUGH = "avspo"
_TRIGGER_MODULE = "openrlhf.trainer.ppo_trainer"
_STATE_KEY = "verl_avspo"
_STEP = "_verl_avspo_step"
_PREFILTER = "_verl_avspo_prefilter"
_RECORDED = "_verl_avspo_rewards"
_INSTALLED = "_verl_avspo_installed"
_STOPPED = "_verl_avspo_stopped"
METRICS_ATTR = "verl_avspo_metrics"

# The advantage step of the compute_advantages_and_returns call now running (this thread).
_ACTIVE: ContextVar[AdvantageStep | None] = ContextVar("verl_avspo_openrlhf_step", default=None)


class GeneratedRollout(list):
    """The rollout samples ``SamplesGenerator.generate_samples`` returns, plus
    ``prefilter_rewards``: (num_groups, n_samples_per_prompt) float64 rewards of every group
    generated for it, those dynamic filtering dropped included, or None where rewards come
    later (a reward model) or nothing was generated (samples served from the buffer)."""

    def __init__(self, samples: list, prefilter_rewards: torch.Tensor | None):
        super().__init__(samples)
        self.prefilter_rewards = prefilter_rewards


def _advantage_step(maker: Any) -> AdvantageStep:
    step = getattr(maker, _STEP, None)
    if step is None:
        step = AdvantageStep(maker.advantage_estimator, settings_from_env())
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
        prefilter = getattr(self, _PREFILTER, None)
        setattr(self, _PREFILTER, None)
        advantage_args = self.strategy.args.algo.advantage
        step.outputs = []
        token = _ACTIVE.set(step)
        if step.avspo is not None:
            advantage_args.estimator = _PASS_THROUGH
        try:
            experiences = original(self, experiences, *rest, **kwargs)
        finally:
            advantage_args.estimator = step.estimator
            _ACTIVE.reset(token)
        step.restore_reward_stds(experiences)
        group_size = self.strategy.args.rollout.n_samples_per_prompt
        setattr(self, METRICS_ATTR, step.metrics(experiences, group_size, prefilter))
        return experiences

    return compute_advantages_and_returns


def _make_experience_batch(original: Callable) -> Callable:
    @functools.wraps(original)
    def make_experience_batch(self, rollout_samples, *rest, **kwargs):
        setattr(self, _PREFILTER, getattr(rollout_samples, "prefilter_rewards", None))
        return original(self, rollout_samples, *rest, **kwargs)

    return make_experience_batch


def _generate_samples(original: Callable) -> Callable:
    @functools.wraps(original)
    def generate_samples(self, *rest, **generate_kwargs):
        if getattr(self, _STOPPED, False):  # the stall alert stopped the run: no samples, prompts exhausted
            return GeneratedRollout([], None), None, 0, True
        group_size = generate_kwargs.get("n_samples_per_prompt", self.args.rollout.n_samples_per_prompt)
        setattr(self, _RECORDED, [])
        try:
            result = original(self, *rest, **generate_kwargs)
            rewards = getattr(self, _RECORDED)
        finally:
            setattr(self, _RECORDED, None)
        prefilter = None
        if rewards and None not in rewards and len(rewards) % group_size == 0:
            prefilter = torch.tensor(rewards, dtype=torch.float64).view(-1, group_size)
        return (GeneratedRollout(result[0], prefilter), *result[1:])

    return generate_samples


def _process_response(original: Callable) -> Callable:
    @functools.wraps(original)
    def process_response_into_experience(self, response, *rest, **kwargs):
        recorded = getattr(self, _RECORDED, None)
        if recorded is not None:
            reward = response.get("reward")
            recorded.append(None if reward is None else float(reward))
        return original(self, response, *rest, **kwargs)

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
        logger.error("--avspo.alert.action stop: step %d is checkpointed; this trainer cannot be stopped", global_step)
        return
    setattr(generator, _STOPPED, True)
    logger.error(
        "stopping the run after step %d (--avspo.alert.action stop); checkpoint: %s. Change the setup as advised "
        "above, then resume with --ckpt.load_enable.",
        global_step,
        os.path.join(ckpt.path, "_actor", f"global_step{global_step}"),
    )


def _save_logs_and_checkpoints(original: Callable) -> Callable:
    @functools.wraps(original)
    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None, *rest, **kwargs):
        step = _advantage_step(self.experience_maker)
        newly_stalled = logs_dict is not None and step.alert.observe(logs_dict, global_step)
        # In place: OpenRLHF hands the same dict on to save_best_checkpoint.
        client_states = {} if client_states is None else client_states
        client_states[ALERT_STATE_KEY] = step.alert.state_dict()
        if step.avspo is not None:
            client_states[_STATE_KEY] = step.avspo.state_dict()
        if newly_stalled and step.alert.stops:
            return _stop_after(
                self, global_step, lambda: original(self, global_step, logs_dict, client_states, *rest, **kwargs)
            )
        return original(self, global_step, logs_dict, client_states, *rest, **kwargs)

    return save_logs_and_checkpoints


def _init_checkpoint_states(original: Callable) -> Callable:
    @functools.wraps(original)
    def init_checkpoint_states(self, *rest, **kwargs):
        states = original(self, *rest, **kwargs)
        step = _advantage_step(self.experience_maker)
        if states.get(ALERT_STATE_KEY) is not None:
            step.alert.load_state_dict(states[ALERT_STATE_KEY])
        avspo = step.avspo
        saved = states.get(_STATE_KEY)
        if avspo is not None and saved is not None:
            avspo.load_state_dict(saved)
        elif avspo is not None and states.get("global_step", 0) > 0:
            logger.warning(
                "resuming at step %s from a checkpoint without AVSPO state: the adaptive threshold starts afresh",
                states["global_step"],
            )
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
