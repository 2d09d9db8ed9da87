"""A resumed run keeps its metrics log: verl's ``FileLogger`` with the history before the resume kept.

verl 0.9.1's ``FileLogger`` opens ``VERL_FILE_LOGGER_PATH`` (or ``<root>/<project>/<experiment>.jsonl``)
with ``"wb"`` (``verl/utils/tracking.py:541``), so a resumed run's log starts at the resumed step and
every earlier row is lost. Our trainer installs :class:`ResumedFileLogger` in its process before verl builds
its ``Tracking``: on a resume it keeps the rows with step <= the resumed
step (the rows a crashed attempt wrote after it are dropped, since they are logged again) and appends
after them; a fresh run behaves as verl's. Stock ``main_ppo`` without our trainer keeps verl's logger.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from verl.utils import tracking
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

from verl_avspo.core.log_record import parse_record

__all__ = ["resume_folder", "resumed_step", "file_log_path", "kept_rows", "install_resumed_file_logger"]

logger = logging.getLogger(__name__)

_STEP_FOLDER = re.compile(r"global_step_(\d+)")


def resume_folder(trainer_config: Any) -> str | None:
    """The ``global_step_N`` folder verl's ``_load_checkpoint`` resumes from under ``trainer_config``
    (``trainer.resume_mode``, ``default_local_dir``, ``resume_from_path``), found as verl finds it;
    None for a fresh start."""
    mode = trainer_config.resume_mode
    if mode == "auto":
        return find_latest_ckpt_path(os.path.abspath(str(trainer_config.default_local_dir)))
    if mode == "resume_path" and trainer_config.resume_from_path:
        return os.path.abspath(str(trainer_config.resume_from_path))
    return None


def resumed_step(trainer_config: Any) -> int | None:
    """The step a run under ``trainer_config`` resumes after (None for a fresh start)."""
    folder = resume_folder(trainer_config)
    match = _STEP_FOLDER.search(os.path.basename(folder)) if folder else None
    return int(match.group(1)) if match else None


def file_log_path(project_name: str, experiment_name: str) -> str:
    """Where verl's ``FileLogger`` writes (``verl/utils/tracking.py``'s rule)."""
    path = os.getenv("VERL_FILE_LOGGER_PATH", None)
    if path is None:
        root = os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", "."))
        path = os.path.join(root, project_name, f"{experiment_name}.jsonl")
    return path


def kept_rows(path: str, last_step: int) -> bytes:
    """The lines of the JSONL log at ``path`` whose step is at most ``last_step``, as they are; a line
    that cannot be read (a crash cut it) is dropped with a warning naming it."""
    if not os.path.exists(path):
        return b""
    kept = []
    with open(path, "rb") as log:
        for number, line in enumerate(log, 1):
            try:
                step, _ = parse_record(line)
            except ValueError:  # json's decode errors are ValueErrors too
                if line.strip():
                    logger.warning("%s:%d is not a readable log row; it is not kept", path, number)
                continue
            if step <= last_step:
                kept.append(line if line.endswith(b"\n") else line + b"\n")
    return b"".join(kept)


class ResumedFileLogger(tracking.FileLogger):
    """verl's ``FileLogger`` that keeps the rows up to :attr:`resumed_step` of the file it reopens."""

    resumed_step: int | None = None

    def __init__(self, project_name: str, experiment_name: str):
        history = b""
        if self.resumed_step is not None:
            history = kept_rows(file_log_path(project_name, experiment_name), self.resumed_step)
        super().__init__(project_name, experiment_name)
        if history:
            self.fp.write(history)
            logger.info("kept %d log rows up to step %d in %s", history.count(b"\n"), self.resumed_step, self.filepath)


def install_resumed_file_logger(config: Any) -> None:
    """Make verl's ``Tracking`` in this process keep the log's history on resume. Call inside the
    TaskRunner actor, before the trainer is built."""
    ResumedFileLogger.resumed_step = resumed_step(config.trainer)
    tracking.FileLogger = ResumedFileLogger
