"""ACR, the stall alert and the run's checkpointed state in stock ``python -m verl.trainer.main_ppo``:
a replay-buffer hook for every V1 trainer mode.

    python -m verl.trainer.main_ppo <your overrides> \\
        trainer.v1.sampler.custom_sampler.path=pkg://verl_avspo.verl_plugin.sampler \\
        trainer.v1.sampler.custom_sampler.name=ACRSampler

verl 0.9.1 builds a user-named replay buffer in every V1 mode (``sync``, ``colocate_async``,
``separate_async``; ``trainer_base.py:139-185``), from the trainer's ``__init__``, and hands it the
trainer's bound ``_add_prompts_to_generate`` as ``refill_fn``. :class:`ACRSampler` is verl's own buffer
for the mode, built exactly as verl builds it without a custom sampler (so DAPO's
``algorithm.filter_groups`` keeps working: verl hands a custom sampler none of those arguments). Its one
other act is to *adopt* the trainer that built it (:func:`verl_avspo.verl_plugin.trainer_v1.adopt`): the
trainer becomes the launcher's V1 trainer for its mode, so stock ``main_ppo`` logs, saves and resumes
exactly as ``python -m verl_avspo.main_ppo`` does:

- every ``acr/*`` metric, ``acr/effective`` and ``acr/stalled`` included, and with
  ``algorithm.adv_estimator=avspo`` the estimator's ``avspo/*``, all in the step they describe;
- the run's state (AVSPO's controller, the alert's streak) in every checkpoint
  (``global_step_N/avspo_state.pt``, written before verl's own files), restored on resume;
- ``algorithm.acr.alert.action=stop``: a checkpoint of the stalled step, then a clean end;
- a resumed run's ``file`` log keeps its rows up to the resumed step (verl's ``FileLogger`` truncates it).

Adoption happens while verl's trainer is being built, before ``init_workers`` loads any model or
checkpoint. verl's ``trainer.checkpoint_callback_class`` is not needed: it has no load event and fires
after the checkpoint tracker file is written. The scores are the reward loop's ``rm_scores``; a
colocated reward model (``reward.reward_model.enable=True`` without ``enable_resource_pool``) scores
only after sampling (``trainer_base.py:575-578``), so the hook refuses that setup.
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import open_dict
from transfer_queue import KVBatchMeta

from verl_avspo.verl_plugin.checks import HOOK_OVERRIDES, SAMPLER_NAME, hook_problems
from verl_avspo.verl_plugin.file_log import install_resumed_file_logger
from verl_avspo.verl_plugin.trainer_v1 import adopt

__all__ = ["ACRSampler"]

logger = logging.getLogger(__name__)


def _stock_replay_buffer(trainer: Any) -> Any:
    """verl's own replay buffer for the trainer's mode, built by the trainer's own
    ``_build_replay_buffer`` with the custom sampler hidden for the call (so every argument verl
    gives its built-in buffer, DAPO's included, is given, whatever verl version computes them)."""
    custom = trainer.config.trainer.v1.sampler.custom_sampler
    path = custom.path
    with open_dict(custom):
        custom.path = None
    try:
        return trainer._build_replay_buffer()
    finally:
        with open_dict(custom):
            custom.path = path


class ACRSampler:
    """verl's replay buffer for the trainer mode; building it adopts the trainer (module docstring).

    verl constructs it with ``trainer_mode, trainer_config, max_off_policy_*, sampler_kwargs,
    refill_fn`` (``trainer_base.py:155-185``); ``refill_fn`` is the trainer's bound
    ``_add_prompts_to_generate``. Every attribute (``sample``, ``wait_for_sampleable``,
    ``get_sampleable_count``, ...) is the built-in buffer's.
    """

    def __init__(self, *, refill_fn: Any = None, **kwargs: Any):
        trainer = getattr(refill_fn, "__self__", None)
        if trainer is None or not hasattr(trainer, "_build_replay_buffer"):
            raise TypeError(
                f"{SAMPLER_NAME} wraps the replay buffer of verl's V1 trainer and is built by it: name it in "
                f"{' '.join(HOOK_OVERRIDES)} instead of constructing it directly."
            )
        problems = hook_problems(trainer.config)
        if problems:
            raise ValueError("\n".join(problems))
        self.buffer = _stock_replay_buffer(trainer)
        adopt(trainer)
        install_resumed_file_logger(trainer.config)
        if not trainer.measures_collapse:
            logger.warning(
                "algorithm.adv_estimator=%s compares no groups of responses: the ACR hook logs nothing for it",
                trainer.config.algorithm.adv_estimator,
            )

    def __getattr__(self, name: str) -> Any:
        # Only for what this class lacks; the buffer is set first in __init__.
        if name == "buffer":
            raise AttributeError(name)
        return getattr(self.buffer, name)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """verl's ``sample`` (the adopted trainer measures the batch at its advantage stage)."""
        return self.buffer.sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
