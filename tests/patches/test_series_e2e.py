"""verl 0.9.1 with the whole upstream series, end to end on CPU: verl's own ``main_ppo`` (no plugin)
trains ``avspo`` natively, logs ``acr/*`` and ``avspo/*`` every step, saves the estimator's state
with its checkpoints, and on a resume keeps the metrics file's history and continues the threshold.

Two launches of the CPU harness of ``tests/e2e`` (a tiny random Qwen2, one gloo rank, the V1
trainer): 3 steps with checkpoints at steps 2 and 3; then the step-3 checkpoint is removed, as
after a crash that came after step 3's metrics were written, and the run resumes from step 2 in
the same folder. The patched sources reach the Ray workers through ``PYTHONPATH``.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from verl_cpu.launch import VERL_ENTRY, TinyRun  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.verl, pytest.mark.ray]

OVERRIDES = [
    "algorithm.adv_estimator=avspo",
    "algorithm.avspo.threshold_init=0.2",
    "trainer.save_freq=2",
    "trainer.total_training_steps=3",
]
ACR_KEYS = {"acr/rate", "acr/all_correct", "acr/all_wrong", "acr/effective", "acr/groups", "acr/singletons"}
AVSPO_KEYS = {"avspo/threshold", "avspo/signal", "avspo/triggered", "avspo/virtual_k"}


def _rows(run: TinyRun) -> list[dict]:
    return [json.loads(line) for line in run.metrics_path().read_text().splitlines()]


def test_native_avspo_run_checkpoints_its_state_and_a_resume_keeps_the_log(series_tree, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(series_tree))
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")  # the native avspo, not the plugin's
    run = TinyRun.prepare(tmp_path, num_ranks=1)

    first = run.launch(VERL_ENTRY, OVERRIDES)
    assert first.returncode == 0, (tmp_path / "metrics.log").read_text()[-6000:]
    uninterrupted = _rows(run)
    assert [row["step"] for row in uninterrupted] == [1, 2, 3]
    for row in uninterrupted:
        assert ACR_KEYS | AVSPO_KEYS <= set(row["data"]), sorted(row["data"])
    assert (run.checkpoints / "global_step_2" / "avspo_estimator_state.pt").exists()

    shutil.rmtree(run.checkpoints / "global_step_3")
    (run.checkpoints / "latest_checkpointed_iteration.txt").write_text("2")
    resumed = run.launch(VERL_ENTRY, [*OVERRIDES, "trainer.resume_mode=auto"])
    assert resumed.returncode == 0, (tmp_path / "metrics.log").read_text()[-6000:]
    rows = _rows(run)
    # steps 1 and 2 kept as they were, the crashed attempt's step 3 replaced by the resumed one
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert rows[:2] == uninterrupted[:2]
    # θ_3 follows from steps 1 and 2 only, so restored from avspo_estimator_state.pt it equals the uninterrupted
    # run's (a restart would log threshold_init, 0.2; this harness's θ_3 was 0.1945 when written)
    assert rows[2]["data"]["avspo/threshold"] == uninterrupted[2]["data"]["avspo/threshold"]
