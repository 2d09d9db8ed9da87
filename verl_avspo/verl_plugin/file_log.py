"""A resumed run keeps its metrics log: verl's ``FileLogger`` with the history before the resume kept.

verl 0.9.1's ``FileLogger`` opens ``VERL_FILE_LOGGER_PATH`` (or ``<root>/<project>/<experiment>.jsonl``)
with ``"wb"`` (``verl/utils/tracking.py:541``), so a resumed run's log starts at the resumed step and
every earlier row is lost. Our trainer (``AVSPOTrainer.logger``) reads, at start-up, the rows with
step <= the resumed step (:func:`log_history`; the rows a crashed attempt wrote after it are dropped, since
they are logged again) and writes them into verl's file logger as soon as verl's ``fit`` has built its
``Tracking``, before the first row is logged (:func:`write_log_history`); a fresh run behaves as verl's.
verl's ``FileLogger`` is not replaced; stock ``main_ppo`` without our trainer keeps verl's behaviour.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

from verl_avspo.core.log_record import parse_record
from verl_avspo.core.state_file import checkpoint_step

__all__ = ["resume_folder", "resumed_step", "file_log_path", "kept_rows", "log_history", "write_log_history"]

logger = logging.getLogger(__name__)


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
    return checkpoint_step(folder) if folder else None


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


def log_history(config: Any) -> bytes:
    """At our trainer's start-up, before verl's ``FileLogger`` reopens (truncates) the log: the rows up to the step
    this run resumes from (none for a fresh run, or without verl's ``file`` logger)."""
    trainer = config.trainer
    step = resumed_step(trainer)
    if step is None or "file" not in trainer.get("logger", ()):  # verl's own test of its backends
        return b""
    return kept_rows(file_log_path(trainer.project_name, trainer.experiment_name), step)


def write_log_history(tracking: Any, history: bytes) -> None:
    """Write ``history`` (:func:`log_history`) into the file logger of verl's ``tracking`` (just built by verl's
    ``fit``, before it logs anything); nothing without one."""
    file_logger = getattr(tracking, "logger", {}).get("file")
    if history and file_logger is not None:
        file_logger.fp.write(history)
        logger.info("kept %d log rows of the resumed run in %s", history.count(b"\n"), file_logger.filepath)
