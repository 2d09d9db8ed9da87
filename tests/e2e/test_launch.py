"""The verl and OpenRLHF CPU harnesses' jobs (``verl_cpu/launch.py``, ``openrlhf_cpu/launch.py``): a work folder
given relative to the caller's folder (``run_cpu_ppo.py --out runs/cpu``, as docs/integration.md writes it) gives
the job, which runs inside that folder, absolute paths that name the files the harness wrote."""

import os
from pathlib import Path

from verl_cpu.launch import VERL_ENTRY, TinyRun, harness_environment

_PATH_KEYS = (
    "data.train_files",
    "data.val_files",
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.tokenizer_path",
)


def test_a_relative_work_folder_gives_the_job_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = TinyRun.prepare(Path("runs") / "cpu", num_prompts=2)
    assert run.workdir == tmp_path / "runs" / "cpu"
    settings = dict(arg.lstrip("+").split("=", 1) for arg in run.command(VERL_ENTRY)[3:])
    os.chdir(run.workdir)  # where the job runs (job.run_to_end's cwd)
    for key in _PATH_KEYS:
        assert Path(settings[key]).is_absolute() and Path(settings[key]).exists(), (key, settings[key])
    assert settings["trainer.default_local_dir"] == str(tmp_path / "runs" / "cpu" / "checkpoints")
    assert Path(harness_environment(run.metrics_path())["VERL_FILE_LOGGER_PATH"]).is_absolute()


def test_the_openrlhf_harness_makes_a_relative_work_folder_absolute(tmp_path, monkeypatch):
    from openrlhf_cpu.launch import TinyRun as OpenRLHFRun

    monkeypatch.chdir(tmp_path)
    run = OpenRLHFRun.prepare(Path("runs") / "openrlhf", num_prompts=2)
    assert run.workdir == tmp_path / "runs" / "openrlhf"
    assert run.model.is_absolute() and run.prompts.is_absolute() and run.prompts.exists()
