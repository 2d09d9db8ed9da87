"""The run state as a checkpoint keeps it: its layout's version, the file it is saved to, and reading it back
with every failure named (docs/architecture.md). :class:`~verl_avspo.core.run_tracker.RunTracker` writes
and restores it; ``tools/prompts.py`` reads it to report the per-prompt history."""

from __future__ import annotations

import io
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

from verl_avspo.core.files import atomic_write

__all__ = [
    "STATE_VERSION",
    "STATE_FILE",
    "RunStateError",
    "write_state",
    "read_state",
    "read_folder_state",
    "check_state_version",
    "checkpoint_step",
]

logger = logging.getLogger(__name__)

# {"version", "controller", "stagnation", "dcpo", "prompt_history", "prompt_skip", "rollouts_cumulative",
# "prompt_allocation" (absent from states saved before the allocator: read as none)};
# a state of any other version is refused (versions 1-3 were layouts of unreleased builds).
STATE_VERSION = 4
# The file the state is saved to in each checkpoint folder (verl's global_step_N/, TRL's checkpoint-N/;
# OpenRLHF keeps it in DeepSpeed's client states instead).
STATE_FILE = "avspo_state.pt"


# A checkpoint folder's name: global_step_12 (verl), global_step12 (OpenRLHF's DeepSpeed tag), checkpoint-12 (TRL).
_CHECKPOINT_FOLDER = re.compile(r"(?:global_step_?|checkpoint-)(\d+)$")


def checkpoint_step(folder: str | os.PathLike) -> int | None:
    """The training step a checkpoint folder was saved at, read from its name in any of the three frameworks'
    namings; None for a folder not so named."""
    match = _CHECKPOINT_FOLDER.search(Path(folder).name)
    return int(match.group(1)) if match else None


class RunStateError(ValueError):
    """A run state file that cannot be read: the message names the file and what to do."""


def write_state(state: dict[str, Any], folder: str | os.PathLike) -> Path:
    """Write the run ``state`` to ``folder``/:data:`STATE_FILE` (the folder must exist); returns the path."""
    path = Path(folder) / STATE_FILE
    # Serialised in memory first: torch's writer reports a full disk as an opaque RuntimeError, a plain
    # write as ENOSPC naming the file. Written beside it and renamed, so a killed save tears nothing.
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with atomic_write(path) as temporary:
        temporary.write_bytes(buffer.getvalue())
    return path


def read_folder_state(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The run state :func:`write_state` saved in ``folder``; None, with a warning, if it holds none.

    Raises:
        RunStateError: see :func:`read_state`.
    """
    path = Path(folder) / STATE_FILE
    if not path.exists():
        logger.warning(
            "%s has no %s (written by a run without verl-avspo?): the AVSPO threshold, the stall streak and the "
            "per-prompt history start fresh",
            folder,
            STATE_FILE,
        )
        return None
    state = read_state(path)
    logger.info("read the run tracker's state from %s", path)
    return state


def read_state(path: str | os.PathLike, *, within: str | None = None) -> dict[str, Any]:
    """The run state saved at ``path`` (tensors and plain Python only: ``weights_only`` loading).

    Args:
        within: the key the state is kept under in a file of other things: OpenRLHF keeps it among
            DeepSpeed's client states, which pickle DeepSpeed's own objects, so such a file is read with
            ``weights_only=False`` (only ever a checkpoint the user's own run wrote, as OpenRLHF reads it
            on resume).

    Raises:
        RunStateError: ``path`` is a folder, unreadable, empty, torn (a save killed or out of space, in a
            release that wrote in place), not a run state, or a state of a newer release; the message says
            what to do (resume from the previous checkpoint). Never advises ``weights_only=False``: the
            file is not trusted code.
    """
    path = Path(path)
    resume = (
        "resume from the previous checkpoint (its folder holds an intact state), or move this file away to "
        "resume with the AVSPO threshold, the stall streak and the prompt history started afresh"
    )
    if path.is_dir():
        raise RunStateError(f"{path} is a folder, not a run state file: {resume}")
    try:
        size = path.stat().st_size
        state = torch.load(path, map_location="cpu", weights_only=within is None) if size else None
    except OSError as err:
        raise RunStateError(f"cannot read the run state {path}: {err.strerror or err}") from err
    except Exception as err:  # torch's unpickler raises many types for a torn or foreign file
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "weights_only" in first:  # torch's advice to load it as trusted code: never for this file
            first = "it holds more than tensors and plain Python"
        raise RunStateError(
            f"{path} is not a readable run state (torn by a killed or failed save, or another file: {first[:200]}): "
            f"{resume}"
        ) from None
    if size == 0:
        raise RunStateError(f"{path} is empty (a save that was killed or ran out of space): {resume}")
    if within is not None and isinstance(state, dict):
        if within not in state:
            raise RunStateError(
                f"{path} holds no run state (no {within!r} entry): its run was trained without verl-avspo"
            )
        state = state[within]
    if not isinstance(state, dict):
        raise RunStateError(f"{path} holds a {type(state).__name__}, not a run state: {resume}")
    try:
        check_state_version(state)
    except ValueError as err:
        raise RunStateError(f"{path}: {err}") from None
    return state


def check_state_version(state: dict[str, Any]) -> int:
    """The version of a saved run state, :data:`STATE_VERSION`.

    Raises:
        ValueError: a state of another version (a newer release's, or an unreleased build's), which this
            one would misread.
    """
    version = state.get("version")
    if version != STATE_VERSION:
        fix = (
            "upgrade verl-avspo to read it"
            if isinstance(version, int) and version > STATE_VERSION
            else "resume from a checkpoint this verl-avspo wrote, or move the state away to resume with the AVSPO "
            "threshold, the stall streak and the prompt history started afresh"
        )
        raise ValueError(
            f"the run state has version {version}, and this verl-avspo reads version {STATE_VERSION} only: {fix}"
        )
    return version
