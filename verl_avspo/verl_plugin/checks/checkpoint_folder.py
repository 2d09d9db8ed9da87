"""The check of ``trainer.default_local_dir``, where verl's trainers save each checkpoint (the run state
first, then verl's own files): before Ray starts, that the folder can be made and written in, and that
its disk is not full. Such a folder used to pass the dry run and stop the real run at its first save,
after the model had loaded and a step had trained."""

from __future__ import annotations

import shutil

from omegaconf import DictConfig, OmegaConf

from verl_avspo.core.files import FileWriteError, check_folder

__all__ = ["MIN_FREE_BYTES", "LOW_FREE_BYTES", "saves_checkpoints", "checkpoint_folder_problems"]

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
