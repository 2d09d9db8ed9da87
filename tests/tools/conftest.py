"""Logs in the formats the project's own runs write, for the tests of ``report`` and ``table``: the
CPU sandbox's JSONL (``verl_avspo.sandbox.loop``'s metric names) and OpenRLHF's TensorBoard files
(written by OpenRLHF's own ``TensorboardLogger``)."""

from types import SimpleNamespace

import pytest

from verl_avspo.tools.logs import write_record

SANDBOX_EVALUATION = {"eval/acc_level_1": 0.5, "eval/pass@4_level_1": 0.75, "eval/acc_mean": 0.5}


@pytest.fixture
def sandbox_log():
    """Write a log as the sandbox does: an evaluation at step 0, then per-step training metrics
    (ACR ``acr``, effective ACR ``effective``), evaluated again at the last step."""

    def write(path, acr: float, effective: float, steps: int = 4, reward: float = 0.4):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as stream:
            write_record(stream, 0, {**SANDBOX_EVALUATION, "train/rollouts_cumulative": 0})
            for step in range(1, steps + 1):
                data = {
                    "acr/rate": acr,
                    "acr/all_correct": acr / 2,
                    "acr/all_wrong": acr / 2,
                    "acr/groups": 16.0,
                    "acr/singletons": 0.0,
                    "acr/reward_mean": reward,
                    "acr/effective": effective,
                    "train/reward_mean": reward,
                    "actor/pg_loss": 0.1,
                }
                write_record(stream, step, {**data, **(SANDBOX_EVALUATION if step == steps else {})})
        return path

    return write


@pytest.fixture
def openrlhf_tensorboard():
    """Write ``rows`` (step -> OpenRLHF's logs_dict) and ``evaluations`` (step -> its eval logs) with
    OpenRLHF's TensorboardLogger into ``<folder>/<run>``; returns that folder."""
    logging_utils = pytest.importorskip("openrlhf.utils.logging_utils", reason="needs OpenRLHF and tensorboard")

    def write(folder, run: str, rows: dict, evaluations: dict | None = None):
        args = SimpleNamespace(logger=SimpleNamespace(tensorboard_dir=str(folder), wandb=SimpleNamespace(run_name=run)))
        logger = logging_utils.TensorboardLogger(args)
        for step, logs in rows.items():
            logger.log_train(step, logs)
        for step, logs in (evaluations or {}).items():
            logger.log_eval(step, logs)
        logger.close()
        return folder / run

    return write
