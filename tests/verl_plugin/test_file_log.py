"""A resumed run keeps its metrics log (verl_plugin.file_log): the rows up to the resumed step are kept and a
crashed attempt's later ones dropped (a torn last line with a warning), read by our trainer at start-up and
written into verl's own FileLogger (not replaced) when verl's fit builds its Tracking, before the first row;
the resumed step is found as verl's _load_checkpoint finds the folder; a fresh run truncates as verl's does."""

import json
import logging

import pytest
from omegaconf import OmegaConf
from verl.utils import tracking

from verl_avspo.tools.logs import read_metrics, write_record
from verl_avspo.verl_plugin import file_log

pytestmark = pytest.mark.verl


def write_log(path, steps):
    with path.open("w") as stream:
        for step in steps:
            write_record(stream, step, {"acr/rate": step / 10})


def trainer_config(tmp_path, mode="auto", path=None):
    return OmegaConf.create(
        {"trainer": {"resume_mode": mode, "default_local_dir": str(tmp_path / "ckpt"), "resume_from_path": path}}
    )


def test_kept_rows_are_those_up_to_the_resumed_step(tmp_path):
    path = tmp_path / "run.jsonl"
    write_log(path, (0, 1, 2, 3, 3, 4, 5))  # two records of step 3: training and validation
    kept = file_log.kept_rows(str(path), 3)
    assert [json.loads(line)["step"] for line in kept.splitlines()] == [0, 1, 2, 3, 3]
    assert file_log.kept_rows(str(tmp_path / "absent.jsonl"), 3) == b""


def test_a_torn_last_line_is_dropped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "run.jsonl"
    records = [json.dumps({"step": step, "data": {"acr/rate": 0.5}}) for step in (1, 2, 3)]
    path.write_text("\n".join(records[:2]) + "\n" + records[2][:12])  # killed while writing step 3
    with caplog.at_level(logging.WARNING, logger="verl_avspo.verl_plugin.file_log"):
        kept = file_log.kept_rows(str(path), 5)
    assert kept.decode() == "\n".join(records[:2]) + "\n"
    assert "run.jsonl:3 is not a readable log row" in caplog.text


def test_the_resumed_step_is_found_as_verl_finds_its_folder(tmp_path):
    assert file_log.resumed_step(trainer_config(tmp_path).trainer) is None  # nothing saved yet: a fresh run
    (tmp_path / "ckpt" / "global_step_4").mkdir(parents=True)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("4")
    assert file_log.resumed_step(trainer_config(tmp_path).trainer) == 4
    assert file_log.resumed_step(trainer_config(tmp_path, "disable").trainer) is None
    given = trainer_config(tmp_path, "resume_path", str(tmp_path / "ckpt" / "global_step_2")).trainer
    assert file_log.resumed_step(given) == 2


@pytest.mark.parametrize("resumed", [None, 3])
def test_our_trainer_keeps_the_history_in_verls_own_file_logger_on_a_resume_only(tmp_path, monkeypatch, resumed):
    """Our trainer reads the kept rows at start-up; verl's fit builds its Tracking (verl's own FileLogger, which
    truncates the file) and assigns it to the trainer's `logger`, which writes them back before the first row."""
    from verl_avspo.verl_plugin.trainer_v1 import AVSPOTrainerSync

    path = tmp_path / "metrics.jsonl"
    write_log(path, (1, 2, 3, 4))  # a crashed attempt that got to step 4 after its step-3 checkpoint
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    monkeypatch.setattr(file_log, "resumed_step", lambda trainer: resumed)
    trainer = object.__new__(AVSPOTrainerSync)  # verl's __init__ needs workers; only the log's part runs here
    config = {"logger": ["console", "file"], "project_name": "p", "experiment_name": "e"}
    trainer._log_history = file_log.log_history(OmegaConf.create({"trainer": config}))  # as __init__ does
    trainer.logger = tracking.Tracking(project_name="p", experiment_name="e", default_backend=["file"])  # as fit does
    trainer.logger.log({"acr/rate": 0.9}, step=(resumed or 0) + 1)
    trainer.logger.logger["file"].finish()
    frame = read_metrics(path)
    assert frame.index.tolist() == ([1, 2, 3, 4] if resumed else [1])
    assert frame["acr/rate"].iloc[-1] == 0.9  # the crashed attempt's step 4 was dropped, the new one appended
    assert tracking.FileLogger.__module__ == "verl.utils.tracking"  # verl's own, not replaced


def test_without_verls_file_logger_nothing_is_read_or_written(tmp_path, monkeypatch):
    from verl_avspo.verl_plugin.trainer_v1 import AVSPOTrainerSync

    monkeypatch.setattr(file_log, "resumed_step", lambda trainer: 3)
    monkeypatch.setattr(file_log, "kept_rows", lambda *args: pytest.fail("read a log no logger writes"))
    trainer = object.__new__(AVSPOTrainerSync)
    trainer._log_history = file_log.log_history(OmegaConf.create({"trainer": {"logger": ["console"]}}))
    trainer.logger = tracking.Tracking(project_name="p", experiment_name="e", default_backend=["console"])
    assert "file" not in trainer.logger.logger
