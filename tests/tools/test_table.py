"""``verl-avspo table`` on logs in verl's file-logger format, with validation keys produced by
verl's own V1 ``PPOTrainer._val_metrics_update`` (the function that names them in a real run)."""

import numpy as np
import pytest
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from verl_avspo.cli import main
from verl_avspo.tools.logs import write_record
from verl_avspo.tools.table import group_runs, table_row

pytestmark = pytest.mark.verl


def verl_validation_metrics(accuracy: dict[str, list[float]]) -> dict[str, float]:
    """What verl logs after a validation whose responses scored ``accuracy[data_source]``
    (the reward manager stores a float score as both ``reward`` and ``acc``)."""
    sources = [source for source, scores in accuracy.items() for _ in scores]
    scores = [score for values in accuracy.values() for score in values]
    uids = [f"p{i}" for i in range(len(scores))]
    extra = {"reward": scores, "acc": scores}
    # The method uses nothing of the trainer instance; it only names and reduces the metrics.
    return PPOTrainer._val_metrics_update(None, np.array(sources, dtype=object), uids, extra, [])


def write_run(path, acr: list[float], validations: dict[int, dict[str, list[float]]]):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as stream:
        for step, value in enumerate(acr, start=1):
            write_record(stream, step, {"acr/rate": value, "acr/effective": value / 2, "actor/pg_loss": 0.1})
        for step, accuracy in validations.items():
            write_record(stream, step, verl_validation_metrics(accuracy))


def test_verl_names_validation_metrics_as_the_table_expects():
    metrics = verl_validation_metrics({"math500": [1.0, 0.0], "openai/gsm8k": [1.0]})
    assert metrics["val-core/math500/acc/mean@1"] == 0.5
    assert metrics["val-core/openai/gsm8k/acc/mean@1"] == 1.0


def test_table_from_run_directories(tmp_path, capsys):
    runs = tmp_path / "runs"
    # GRPO: ACR 0.4 throughout; validation at steps 0 and 150 (the latest counts).
    write_run(
        runs / "m_grpo" / "metrics.jsonl",
        [0.4] * 150,
        {
            0: {"math500": [0.0, 0.0], "gsm8k": [0.0]},
            150: {"math500": [1.0, 0.0, 0.0, 0.0], "gsm8k": [1.0, 1.0], "amc23": [0.0]},
        },
    )
    # AVSPO: ACR falls linearly, step s has ACR s/1000; the final evaluation (eval.jsonl) wins.
    write_run(
        runs / "m_avspo" / "metrics.jsonl",
        [s / 1000 for s in range(1, 151)],
        {150: {"math500": [0.0], "gsm8k": [0.0], "amc23": [0.0]}},
    )
    write_run(
        runs / "m_avspo" / "eval.jsonl",
        [],
        {0: {"math500": [1.0, 1.0, 0.0, 1.0], "gsm8k": [1.0, 0.0], "amc23": [1.0], "mmlu_pro": [0.0, 1.0]}},
    )
    # verl's dump of validation generations is JSONL too, in another format: not a run.
    (runs / "m_grpo" / "validation").mkdir()
    (runs / "m_grpo" / "validation" / "150.jsonl").write_text('{"input": "q", "output": "a", "score": 1.0}\n')
    assert main(["table", str(runs)]) == 0
    # avg is over the math sets; MMLU-Pro (out of domain) has its own column.
    # ACR (final) = mean of steps 141..150 = 0.1455; ACR (first 100) = mean of steps 1..100 = 0.0505.
    assert capsys.readouterr().out.splitlines() == [
        "| run | MATH-500 | GSM8K | AMC23 | avg | MMLU-Pro | ACR (final) | ACR (first 100) "
        "| effective ACR (final) | steps |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| m_avspo | 75.0 | 50.0 | 100.0 | 75.0 | 50.0 | 0.15 | 0.05 | 0.07 | 150 |",
        "| m_grpo | 25.0 | 100.0 | 0.0 | 41.7 | – | 0.40 | 0.40 | 0.20 | 150 |",
    ]


def test_acr_windows_and_missing_benchmarks(tmp_path):
    write_run(tmp_path / "a" / "metrics.jsonl", [s / 1000 for s in range(1, 151)], {150: {"math500": [1.0]}})
    (summary,) = [
        table_row(name, logs, final_window=10, early_steps=100) for name, logs in group_runs([tmp_path]).items()
    ]
    assert summary.acr_final == pytest.approx(np.mean(np.arange(141, 151)) / 1000)
    assert summary.acr_early == pytest.approx(np.mean(np.arange(1, 101)) / 1000)
    assert summary.effective_final == pytest.approx(summary.acr_final / 2)
    assert summary.pass_at_1 == {"math500": 1.0}


def test_plain_jsonl_files_are_one_run_each_and_avg_needs_every_math_set(tmp_path, capsys):
    # verl's default file-logger layout: <project>/<experiment>.jsonl
    write_run(tmp_path / "proj" / "exp1.jsonl", [0.5] * 3, {3: {"math500": [1.0], "aime2024": [0.0]}})
    write_run(tmp_path / "proj" / "exp2.jsonl", [0.25] * 3, {3: {"math500": [0.0]}})
    assert main(["table", str(tmp_path / "proj" / "exp1.jsonl"), str(tmp_path / "proj" / "exp2.jsonl")]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert rows == [
        "| exp1 | 100.0 | 0.0 | 50.0 | 0.50 | 0.50 | 0.25 | 3 |",
        "| exp2 | 0.0 | – | – | 0.25 | 0.25 | 0.12 | 3 |",
    ]


def test_errors_name_the_problem(tmp_path, capsys):
    assert main(["table", str(tmp_path / "missing")]) == 1
    assert f"no such log file or directory: {tmp_path / 'missing'}" in capsys.readouterr().err
    assert main(["table", str(tmp_path)]) == 1
    assert "no *.jsonl logs under" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main(["table", str(bad)]) == 1
    assert f"{bad} holds no verl file-logger record" in capsys.readouterr().err
    export = tmp_path / "wandb.csv"
    export.write_text("_step,acr/rate\n1,0.5\n")
    assert main(["table", str(export)]) == 1
    assert f"use `verl-avspo report {export}`" in capsys.readouterr().err
    assert main(["table", str(export), "--final-window", "0"]) == 2  # refused before any log is read
    assert "must be at least 1; got 0 and 100" in capsys.readouterr().err
