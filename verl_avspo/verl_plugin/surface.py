"""Every verl name the verl wing relies on that verl does not document as an extension point: where it is used
and why no public door serves (verl 0.9.1; docs/integration.md). verl's documented doors are used as such and
not listed: ``register_adv_est``/``get_adv_estimator_fn``, ``register_policy_loss``/``get_policy_loss_fn``,
``register_trainer``/``get_trainer_cls``, ``trainer.v1.trainer_mode``, ``agent_loop_manager_class``,
``__rollout_n__`` (``agent_loop_tq.py``: "user can dynamically adjust n for each sample here"),
``find_latest_ckpt_path``, ``compute_advantage``. ``tests/verl_plugin/test_verl_surface.py`` checks every entry
against the installed verl (present, callable as we call it, its format or rule still verl's: the probe) and
that the wing's source touches no other private verl name.

For every name here, ``patches/`` proposes the public door upstream (the table in ``patches/README.md``).

Importing this module imports no verl: the probes import it when they run.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import tempfile
from types import SimpleNamespace
from unittest import mock

from verl_avspo.core.surface import Touch, resolve

__all__ = ["SURFACE", "namespaces"]

V1 = "verl.trainer.ppo.v1"
TRAINER = f"{V1}.trainer_base:PPOTrainer"
BUFFER = f"{V1}.replay_buffer:ReplayBuffer"
WORKER = f"{V1}.agent_loop_tq:AgentLoopWorkerTQ.__ray_actor_class__"
MANAGER = f"{V1}.agent_loop_tq:AgentLoopManagerTQ"
TRACKING = "verl.utils.tracking"
CHECKPOINTS = "verl.utils.checkpoint.checkpoint_manager"

NO_TRAINER_HOOK = "verl's V1 trainer has no hook at this stage; the method is overridden, calling verl's"
NO_BUFFER_HOOK = "verl's replay buffer has no hook there; its bound method is wrapped on the trainer's buffer"


def _code_holds(name: str, *constants: str, names: tuple[str, ...] = ()):
    """A probe: the compiled code of ``name`` still holds the string constants ``constants`` (a key or a format
    it writes) and the global or attribute names ``names`` (a call it makes). Reads verl's code objects, not its
    source."""

    def probe() -> str | None:
        code = getattr(inspect.unwrap(resolve(name)), "__code__", None)
        if code is None:
            return f"{name} has no code to check"
        held = set()
        for constant in code.co_consts:  # a call's keyword names and a dict's keys are tuples of constants
            held.update(constant if isinstance(constant, tuple) else (constant,))
        missing = [c for c in constants if c not in held] + [n for n in names if n not in code.co_names]
        return f"{name} no longer uses {', '.join(map(repr, missing))}" if missing else None

    return probe


def _probe_run_prompt() -> str | None:
    """verl's ``_run_prompt`` protocol, which our worker's pilot path repeats: the prompt's ``running`` status,
    ``__rollout_n__`` and ``__do_sample__`` popped off the prompt, one ``_run_agent_loop(params, trajectory=,
    trace=, session_id=i, **prompt)`` per session, then one terminal ``finished`` status under the uid."""
    from omegaconf import OmegaConf

    module = resolve(f"{V1}.agent_loop_tq")
    statuses, sessions = [], []

    async def put(key, partition_id, tag):
        statuses.append((key, partition_id, tag.get("status")))

    async def run_agent_loop(params, trajectory, trace, session_id, **prompt):
        sessions.append((session_id, sorted(prompt)))

    rollout = {"n": 4, "val_kwargs": {"n": 1}}
    worker = SimpleNamespace(config=OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}}))
    worker._run_agent_loop = run_agent_loop
    prompt = {"uid": "u", "agent_name": "single_turn_agent", "__rollout_n__": 2, "__do_sample__": True}
    try:
        with mock.patch.object(module.tq, "async_kv_put", put):
            asyncio.run(resolve(f"{WORKER}._run_prompt")(worker, prompt, {}, {"validate": False}))
    except Exception as error:  # any failure means the protocol is not the one our worker repeats
        return f"AgentLoopWorkerTQ._run_prompt on a stand-in worker failed ({type(error).__name__}: {error})"
    expected_statuses = [("u", "train", "running"), ("u", "train", "finished")]
    expected_sessions = [(0, ["agent_name", "uid"]), (1, ["agent_name", "uid"])]
    if statuses != expected_statuses or sessions != expected_sessions:
        return (
            f"AgentLoopWorkerTQ._run_prompt put statuses {statuses} and ran sessions {sessions}, not "
            f"{expected_statuses} and {expected_sessions}"
        )
    return None


def _probe_reward_score() -> str | None:
    fields = getattr(resolve("verl.experimental.agent_loop.agent_loop:AgentLoopOutput"), "model_fields", {})
    return None if "reward_score" in fields else "AgentLoopOutput has no field reward_score"


def _probe_surplus_key() -> str | None:
    prefix = resolve(f"{BUFFER}._metrics_prefix")("train")
    if prefix != "training":
        return f"ReplayBuffer._metrics_prefix('train') is {prefix!r}, not 'training'"
    return _code_holds(f"{BUFFER}.sample", "/filter_groups/discarded_surplus_samples")()


def _probe_clear_groups() -> str | None:
    """``_clear_groups(partition_id, uids)`` removes the groups whose keys start with ``{uid}_`` from
    ``partitions`` (the ``{uid}_{session}_{output}`` key format our reads of the buffer split)."""
    module = resolve(f"{V1}.replay_buffer")
    buffer = SimpleNamespace(partitions={"train": {"a_0_0": {}, "a_1_0": {}, "b_0_0": {}, "a": {"is_prompt": True}}})
    for attribute in ("pending_keys", "running_keys", "finished_keys", "failure_keys"):
        setattr(buffer, attribute, {"train": {"a", "b"}})
    buffer.prompt_global_steps = {"train": {"a": 1, "b": 1}}
    buffer._dapo_classification_cache = {"train": {}}
    try:
        with mock.patch.object(module.tq, "kv_clear", lambda *args, **kwargs: None):
            resolve(f"{BUFFER}._clear_groups")(buffer, "train", {"a"})
    except Exception as error:
        return f"ReplayBuffer._clear_groups on a stand-in buffer failed ({type(error).__name__}: {error})"
    if set(buffer.partitions["train"]) != {"b_0_0"} or buffer.finished_keys["train"] != {"b"}:
        return f"ReplayBuffer._clear_groups left {buffer.partitions['train']} and {buffer.finished_keys['train']}"
    return None


def _probe_file_logger_path() -> str | None:
    """Where verl's ``FileLogger`` writes, as ``file_log.file_log_path`` copies it; its ``fp`` is the open file."""
    from verl_avspo.verl_plugin.file_log import file_log_path

    with tempfile.TemporaryDirectory() as root:
        with mock.patch.dict(os.environ, {"VERL_FILE_LOGGER_ROOT": root}):
            os.environ.pop("VERL_FILE_LOGGER_PATH", None)  # restored on leaving the block
            file_logger = resolve(f"{TRACKING}:FileLogger")("project", "experiment")
            ours = file_log_path("project", "experiment")
        file_logger.fp.close()
    if file_logger.filepath != ours:
        return f"FileLogger writes {file_logger.filepath}, file_log_path says {ours}"
    return None


def _probe_resume_rule() -> str | None:
    """verl's resume rule, which checks/checkpoint_folder.py, file_log.py and tools/prompts.py read: the tracker
    file ``latest_checkpointed_iteration.txt`` names N, the folder is ``global_step_N``."""
    tracker = resolve(f"{CHECKPOINTS}:get_checkpoint_tracker_filename")("/run")
    if tracker != os.path.join("/run", "latest_checkpointed_iteration.txt"):
        return f"verl's checkpoint tracker file is {tracker}, not /run/latest_checkpointed_iteration.txt"
    folder_format = inspect.signature(resolve(f"{CHECKPOINTS}:find_latest_ckpt_path")).parameters["directory_format"]
    if folder_format.default != "global_step_{}":
        return f"find_latest_ckpt_path's folders are {folder_format.default!r}, not 'global_step_{{}}'"
    return _code_holds(f"{TRAINER}._save_checkpoint", "global_step_", "latest_checkpointed_iteration.txt")()


def _probe_registry(name: str):
    def probe() -> str | None:
        return None if isinstance(resolve(name), dict) else f"{name} is no longer a dict of names"

    return probe


SURFACE = (
    # The trainer: methods our V1 trainer overrides (each calls verl's own).
    Touch(
        f"{TRAINER}._compute_advantage",
        "trainer.py",
        f"{NO_TRAINER_HOOK}: the step's collapse is measured around verl's advantage stage (scores before, the "
        "trained advantages after) and the estimator reaches our tracker inside it",
        call=(3, ()),
    ),
    Touch(
        f"{TRAINER}.step",
        "trainer.py",
        f"{NO_TRAINER_HOOK} after a step: the stall rule reads the step's aggregated metrics",
        call=(3, ()),
    ),
    Touch(
        f"{TRAINER}._compute_old_log_prob",
        "trainer.py",
        f"{NO_TRAINER_HOOK}: the intrinsic rewards (RENT, INTUITOR) need the old log-probabilities' entropy",
        call=(3, ()),
    ),
    Touch(
        f"{TRAINER}._save_checkpoint",
        "trainer.py",
        "no save hook that runs before verl writes latest_checkpointed_iteration.txt (trainer.checkpoint_callback_"
        "class fires after it and has no load event): our run state is written first",
        call=(1, ()),
    ),
    Touch(
        f"{TRAINER}._load_checkpoint",
        "trainer.py",
        "no load hook: our run state is read back after verl resumed",
        call=(1, ()),
    ),
    Touch(
        f"{TRAINER}._next_train_batch",
        "trainer.py",
        f"{NO_TRAINER_HOOK}: every dispatch of prompts to rollout, where skipping and the allocator act",
        call=(2, ()),
    ),
    Touch(
        f"{TRAINER}._fetch_one_gen_batch",
        "trainer.py",
        "the dataloader's next chunk, drawn to refill the places of skipped prompts; no public draw",
        call=(1, ()),
    ),
    Touch(
        f"{TRAINER}._add_prompts_to_generate",
        "trainer.py",
        "dispatching prompts to rollout from the replay buffer's poll (DAPO's top-up of skipped places)",
        call=(2, ()),
    ),
    Touch(
        f"{TRAINER}._step_once",
        "trainer.py",
        f"{NO_TRAINER_HOOK}: the replay buffer is asked for the step's groups less those the budget left out",
        call=(4, ()),
    ),
    Touch(
        "verl.trainer.ppo.padding_utils:construct_minimal_padding_template",
        "v1_batch.py, prompt_hooks.py",
        "the padding rows verl's _balance_batch appends carry the tag is_padding (made here), which our reads of "
        "a batch skip: they are no responses",
        probe=_code_holds("verl.trainer.ppo.padding_utils:construct_minimal_padding_template", "is_padding"),
    ),
    Touch(f"{TRAINER}.replay_buffer", "trainer.py", "the trainer's replay buffer", set_by="__init__"),
    Touch(f"{TRAINER}.trainer_mode", "trainer.py", "verl's mode name the trainer runs", set_by="__init__"),
    Touch(
        f"{TRAINER}.parameter_sync_step",
        "trainer.py",
        "the async modes' updates per step: a step's groups are train_batch_size over it",
        set_by="__init__",
    ),
    Touch(
        f"{TRAINER}.total_training_steps",
        "trainer.py",
        "the alert's stop makes the current step the last (fit's loop condition reads it)",
        set_by="_init_dataloader",
    ),
    Touch(
        f"{TRAINER}.train_dataloader",
        "trainer.py",
        "an epoch's length bounds skipping's refills",
        set_by="_init_dataloader",
    ),
    Touch(
        f"{TRAINER}.global_steps",
        "trainer.py",
        "the step, which names the checkpoint folder; parsed by verl from the folder name on resume",
        set_by="_load_checkpoint",
    ),
    # The replay buffer: what our trainer wraps and reads on verl's own buffer object.
    Touch(
        f"{BUFFER}._clear_groups",
        "prompt_hooks.py",
        f"{NO_BUFFER_HOOK}: the groups it clears unsampled (evicted, DAPO's surplus) go to the prompt history",
        call=(3, ()),
        probe=_probe_clear_groups,
    ),
    Touch(
        f"{BUFFER}._wait_for_next_poll",
        "prompt_hooks.py",
        f"{NO_BUFFER_HOOK}: DAPO's sync buffer polling with nothing in flight is when skipped places are refilled",
        call=(3, ()),
    ),
    Touch(f"{BUFFER}.partitions", "prompt_hooks.py", "each key's tags (is_prompt)", set_by="__init__"),
    Touch(f"{BUFFER}.finished_keys", "prompt_hooks.py", "the finished groups' uids", set_by="__init__"),
    Touch(f"{BUFFER}.failure_keys", "prompt_hooks.py", "the failed groups' uids", set_by="__init__"),
    Touch(f"{BUFFER}.pending_keys", "prompt_hooks.py", "the groups waiting for rollout", set_by="__init__"),
    Touch(f"{BUFFER}.running_keys", "prompt_hooks.py", "the groups in rollout", set_by="__init__"),
    Touch(
        f"{V1}.replay_buffer:DAPO_FILTERED_REWARD_COUNTS_KEY",
        "v1_batch.py",
        "the eviction metric of the groups DAPO filtering dropped, by shared score (for ACR)",
    ),
    Touch(
        f"{BUFFER}.sample",
        "v1_batch.py",
        "the surplus-metric key training/filter_groups/discarded_surplus_samples (DAPO's surplus groups, for ACR), "
        "a string verl exports as no constant",
        probe=_probe_surplus_key,
    ),
    # The agent loop: the allocator's worker, which extends a pilot in the same step.
    Touch(
        f"{WORKER}._run_prompt",
        "rollout_allocation.py",
        "one prompt's sessions and its group's terminal status; a pilot's second pass must run before that status "
        "is published, and verl has no per-prompt hook (its statuses, running/finished/failure, and the "
        "__do_sample__ field are repeated for pilots)",
        call=(4, ("trace",)),
        probe=_probe_run_prompt,
    ),
    Touch(
        "verl.experimental.agent_loop.agent_loop:AgentLoopWorker._run_agent_loop",
        "rollout_allocation.py",
        "one session of a pilot, as verl's _run_prompt runs it",
        call=(2, ("trajectory", "trace", "session_id", "agent_name")),
    ),
    Touch(
        "verl.experimental.agent_loop.agent_loop:AgentLoopWorker._compute_score",
        "rollout_allocation.py",
        "the one place a session's reward exists inside the worker, for the pilot's spread test",
        call=(3, ()),
        probe=_probe_reward_score,
    ),
    Touch(
        f"{V1}.agent_loop_tq:AgentLoopWorkerTQ.__ray_actor_class__",
        "rollout_allocation.py",
        "verl's worker is a Ray actor class; our worker subclasses the class inside it",
    ),
    Touch(
        f"{MANAGER}.agent_loop_workers_class",
        "rollout_allocation.py",
        "the worker class verl's manager starts; set to ours (no config key names the worker)",
        set_by="__init__",
    ),
    Touch(
        f"{V1}.agent_loop_tq:AgentLoopWorkerTQ.__ray_actor_class__._agent_loop_postprocess",
        "rollout_allocation.py, v1_batch.py",
        "the response key format {uid}_{session}_{output} that our reads split (a pilot's sessions per uid)",
        probe=_code_holds(
            f"{V1}.agent_loop_tq:AgentLoopWorkerTQ.__ray_actor_class__._agent_loop_postprocess", "_", "status"
        ),
    ),
    # Logging and checkpoints.
    Touch(
        f"{TRAINER}.logger",
        "trainer.py, file_log.py",
        "verl's FileLogger truncates its file on open and has no append setting, so a resumed run would lose its "
        "log: our trainer takes fit's assignment of its Tracking and writes the kept rows first (patches/01 "
        "proposes the resume upstream)",
        set_by="fit",
    ),
    Touch(
        f"{TRACKING}:Tracking.logger",
        "file_log.py",
        "the backends by name, where the file logger is found ('file')",
        set_by="__init__",
        probe=_code_holds(f"{TRACKING}:Tracking.__init__", "file", names=("FileLogger",)),
    ),
    Touch(
        f"{TRACKING}:FileLogger.fp",
        "file_log.py",
        "the open log file the kept history is written to, where verl's path rule (copied in file_log_path) puts it",
        set_by="__init__",
        probe=_probe_file_logger_path,
    ),
    Touch(
        f"{TRACKING}:FileLogger.filepath",
        "file_log.py",
        "named in the log line that says what was kept",
        set_by="__init__",
    ),
    Touch(
        f"{CHECKPOINTS}:get_checkpoint_tracker_filename",
        "checks/checkpoint_folder.py, file_log.py, trainer.py (tools/prompts.py spells the file name)",
        "verl's resume rule (the tracker file names N, the folder is global_step_N), read to check a resume's "
        "run state before Ray and to name the folder ours is saved to",
        call=(1, ()),
        probe=_probe_resume_rule,
    ),
    # The TRL guard (verl 0.9.1 next to a TRL without the value-head class; patches/02 is the upstream fix).
    Touch(
        "verl.models.transformers.monkey_patch:is_trl_available",
        "trl_guard.py",
        "replaced in that module after it runs (verl's apply_monkey_patch, on every model, calls it by its module "
        "name to decide whether to patch TRL's value-head class; no setting turns it off): a TRL without the class "
        "answers false",
        call=(0, ()),
        probe=_code_holds("verl.models.transformers.monkey_patch:apply_monkey_patch", names=("is_trl_available",)),
    ),
    Touch(
        "verl.utils.model:load_valuehead_model",
        "trl_guard.py",
        "replaced in that module after it runs, to turn verl's bare 'cannot import name' into the fix (a critic "
        "checkpoint that is not a token-classification model needs TRL's value-head class)",
        call=(4, ()),
    ),
    # verl's registries, read for their names (verl has a getter per name, no listing).
    Touch(
        "verl.trainer.ppo.core_algos:ADV_ESTIMATOR_REGISTRY",
        "checks/__init__.py, doctor.py",
        "the registered estimators' names, listed in our messages",
        probe=_probe_registry("verl.trainer.ppo.core_algos:ADV_ESTIMATOR_REGISTRY"),
    ),
    Touch(
        "verl.trainer.ppo.core_algos:POLICY_LOSS_REGISTRY",
        "checks/__init__.py, doctor.py",
        "the registered losses' names, listed in our messages",
        probe=_probe_registry("verl.trainer.ppo.core_algos:POLICY_LOSS_REGISTRY"),
    ),
    Touch(
        f"{V1}.trainer_base:TRAINER_REGISTRY",
        "checks/__init__.py, doctor.py",
        "the registered V1 trainers' names, listed in our messages",
        probe=_probe_registry(f"{V1}.trainer_base:TRAINER_REGISTRY"),
    ),
)


def namespaces() -> list:
    """verl's modules and classes whose private names the wing could touch (for the source scan)."""
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1 import agent_loop_tq, replay_buffer, trainer_base
    from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils import tracking
    from verl.utils.checkpoint import checkpoint_manager

    return [
        core_algos,
        trainer_base,
        replay_buffer,
        agent_loop_tq,
        tracking,
        checkpoint_manager,
        trainer_base.PPOTrainer,
        PPOTrainerSync,
        PPOTrainerColocateAsync,
        PPOTrainerSeparateAsync,
        replay_buffer.ReplayBuffer,
        replay_buffer.ReplayBufferAsync,
        agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__,
        agent_loop_tq.AgentLoopManagerTQ,
        tracking.Tracking,
        tracking.FileLogger,
    ]
