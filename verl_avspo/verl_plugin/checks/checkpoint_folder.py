"""The check of ``trainer.default_local_dir``, where verl's trainers save each checkpoint (the run state
first, then verl's own files): before Ray starts, that the folder can be made and written in, and that
its disk is not full. Such a folder used to pass the dry run and stop the real run at its first save,
after the model had loaded and a step had trained.

A resumed run's state file is read here too (:func:`resume_state_problems`): a torn ``avspo_state.pt`` used
to be refused inside the TaskRunner, about a minute later, in a Ray traceback. The refusal gives the override
that resumes from the previous checkpoint (:func:`previous_checkpoint_fix`), also where our trainer itself
finds it torn."""

from __future__ import annotations

import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from verl_avspo.core.files import FileWriteError, check_folder
from verl_avspo.core.state_file import STATE_FILE, RunStateError, checkpoint_step, read_state

__all__ = [
    "MIN_FREE_BYTES",
    "LOW_FREE_BYTES",
    "saves_checkpoints",
    "checkpoint_folder_problems",
    "previous_checkpoint_fix",
    "resume_state_problems",
]

KEY = "trainer.default_local_dir"
# Below this not even the run state and verl's small files fit: refused.
MIN_FREE_BYTES = 100 * 2**20
# Below this a warning: a checkpoint holds the actor's weights and optimizer state.
LOW_FREE_BYTES = 5 * 2**30


def saves_checkpoints(config: DictConfig) -> str | None:
    """What makes the run save checkpoints, as the messages say it (None: it saves none)."""
    try:
        save_freq = int(OmegaConf.select(config, "trainer.save_freq", default=-1))
    except (TypeError, ValueError):  # text for a number: reported by the settings stage
        return None
    if save_freq > 0:
        return f"trainer.save_freq={save_freq}"
    if OmegaConf.select(config, "algorithm.acr.alert.action", default=None) == "stop":
        return "algorithm.acr.alert.action=stop saves one when it stops the run"
    return None


def _gib(size: float) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


def checkpoint_folder_problems(config: DictConfig) -> tuple[list[str], list[str]]:
    """Refuse a ``trainer.default_local_dir`` the run cannot save its checkpoints in: under a file, in a
    folder that takes no new file (read-only, not the user's), or on a disk with less than
    :data:`MIN_FREE_BYTES` free; warn under :data:`LOW_FREE_BYTES`. Nothing is checked for a run that
    saves no checkpoint.

    Returns:
        (problems, warnings), each naming the key, the path and the fix.
    """
    resume = resume_state_problems(config)
    problems, warnings = _folder_problems(config)
    return resume + problems, warnings


def _folder_problems(config: DictConfig) -> tuple[list[str], list[str]]:
    why = saves_checkpoints(config)
    folder = OmegaConf.select(config, KEY, default=None)
    if why is None or folder is None:
        return [], []
    setting = f"{KEY}={folder}"
    try:
        existing = check_folder(str(folder))
    except FileWriteError as err:
        return [
            f"{setting}: verl's trainer saves each checkpoint there ({why}), but {err}. Set {KEY} to a folder "
            "you can write to."
        ], []
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        return [
            f"{setting}: its disk ({existing}) has {_gib(free)} free, too little for one checkpoint ({why}); the "
            f"run would stop at its first save, after the model loaded. Free space there, or set {KEY} to a folder "
            "on another disk."
        ], []
    if free < LOW_FREE_BYTES:
        return [], [
            f"{setting}: its disk ({existing}) has only {_gib(free)} free, and each checkpoint ({why}) holds the "
            "actor's weights and optimizer state (several GiB for a model of a billion parameters): a save may run "
            f"out of space. Free space there, set trainer.max_actor_ckpt_to_keep, or set {KEY} to another disk."
        ]
    return [], []


def previous_checkpoint_fix(folder: str | Path) -> str:
    """How to resume from the checkpoint before ``folder`` (a ``global_step_N``) whose run state reads: the
    overrides with its path; or, where there is none, what else to do."""
    folder = Path(folder)
    step = checkpoint_step(folder)
    earlier = sorted(
        (earlier_step, path)
        for path in folder.parent.glob("global_step_*")
        if (earlier_step := checkpoint_step(path)) is not None and (step is None or earlier_step < step)
    )
    for _, path in reversed(earlier):
        try:
            read_state(path / STATE_FILE)
        except RunStateError:
            continue
        return (
            f"To resume from the previous checkpoint, add trainer.resume_mode=resume_path "
            f"trainer.resume_from_path={path.resolve()}"
        )
    return (
        f"No earlier checkpoint in {folder.parent} holds a readable {STATE_FILE}: move {folder / STATE_FILE} away to "
        "resume with the run state started afresh, or start a new run with trainer.resume_mode=disable"
    )


def resume_state_problems(config: DictConfig) -> list[str]:
    """The run state of the checkpoint verl would resume from (verl's own rule: ``trainer.resume_mode``,
    ``latest_checkpointed_iteration.txt`` or ``trainer.resume_from_path``), when it cannot be read, with the
    override that resumes from the previous checkpoint. A checkpoint without the file is left to the trainer
    (it starts the state afresh, with a warning)."""
    mode = OmegaConf.select(config, "trainer.resume_mode", default="disable")
    if mode == "disable":
        return []
    from verl.utils.checkpoint.checkpoint_manager import get_checkpoint_tracker_filename

    from verl_avspo.verl_plugin.file_log import resume_folder  # imports verl: only for a run that may resume

    local_dir = OmegaConf.select(config, KEY, default=None)
    if mode == "auto" and (local_dir is None or not Path(get_checkpoint_tracker_filename(str(local_dir))).exists()):
        return []  # a fresh start (and verl's finder would print that it found no tracker file)

    try:
        folder = resume_folder(config.trainer)
    except (OSError, ValueError):  # an unreadable latest_checkpointed_iteration.txt: verl names it
        return []
    if folder is None or not (Path(folder) / STATE_FILE).exists():
        return []
    try:
        read_state(Path(folder) / STATE_FILE)
    except RunStateError as err:
        return [
            f"trainer.resume_mode={config.trainer.resume_mode} resumes from {folder}, but {err}. "
            f"{previous_checkpoint_fix(folder)}."
        ]
    return []
