"""``verl-avspo table`` on logs in verl's file-logger format, with validation keys produced by
verl's own V1 ``PPOTrainer._val_metrics_update`` (the function that names them in a real run); on
the sandbox's logs and OpenRLHF's TensorBoard; one row per run, named as ``report`` names it; and
the notes that say what a log lacks (steps, acr/*, validation); a non-zero exit when a log cannot
be read."""

import numpy as np
import pytest
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from verl_avspo.cli import main
from verl_avspo.tools.logs import write_record
from verl_avspo.tools.table import table_rows

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
    (summary,) = table_rows([tmp_path], final_window=10, early_steps=100)
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
    assert (
        "no logs (JSONL metrics, console logs, events.out.tfevents.*, *.csv, trainer_state.json) found in"
        in capsys.readouterr().err
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main(["table", str(bad)]) == 1
    assert f"{bad} holds no metrics record" in capsys.readouterr().err
    assert main(["table", str(bad), "--final-window", "0"]) == 2  # refused before any log is read
    assert "must be at least 1; got 0 and 100" in capsys.readouterr().err


def last_rows(capsys) -> list[str]:
    return capsys.readouterr().out.split("\n\n")[0].splitlines()[2:]


def test_runs_of_the_same_file_name_in_different_folders_are_different_rows(tmp_path, capsys):
    # verl's <project>/<experiment>.jsonl with one experiment name in two projects.
    write_run(tmp_path / "projA" / "exp.jsonl", [0.5] * 3, {3: {"math500": [1.0]}})
    write_run(tmp_path / "projB" / "exp.jsonl", [0.25] * 3, {3: {"math500": [0.0]}})
    assert main(["table", str(tmp_path / "projA" / "exp.jsonl"), str(tmp_path / "projB" / "exp.jsonl")]) == 0
    assert last_rows(capsys) == [
        "| projA/exp | 100.0 | 100.0 | 0.50 | 0.50 | 0.25 | 3 |",
        "| projB/exp | 0.0 | 0.0 | 0.25 | 0.25 | 0.12 | 3 |",
    ]
    # The recipes' runs/<run>/metrics.jsonl, one run name in two folders: two rows, not their mean.
    write_run(tmp_path / "a" / "run1" / "metrics.jsonl", [0.8] * 3, {3: {"math500": [1.0]}})
    write_run(tmp_path / "b" / "run1" / "metrics.jsonl", [0.2] * 3, {3: {"math500": [0.0]}})
    assert main(["table", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert last_rows(capsys) == [
        "| a/run1 | 100.0 | 100.0 | 0.80 | 0.80 | 0.40 | 3 |",
        "| b/run1 | 0.0 | 0.0 | 0.20 | 0.20 | 0.10 | 3 |",
    ]


def test_the_sandboxs_estimators_with_the_same_seed_are_not_merged(tmp_path, capsys, sandbox_log):
    # The sandbox writes runs/<estimator>/seed<N>.jsonl: before, both were "seed0" and one row
    # averaged GRPO's and AVSPO's effective ACR (0.28 for runs at 0.54 and 0.07).
    sandbox_log(tmp_path / "runs" / "grpo" / "seed0.jsonl", 0.54, 0.54)
    sandbox_log(tmp_path / "runs" / "avspo" / "seed0.jsonl", 0.54, 0.07)
    assert main(["table", str(tmp_path / "runs")]) == 0
    printed = capsys.readouterr().out
    rows = printed.split("\n\n")[0].splitlines()[2:]
    assert rows == ["| avspo/seed0 | – | 0.54 | 0.54 | 0.07 | 4 |", "| grpo/seed0 | – | 0.54 | 0.54 | 0.54 | 4 |"]
    assert printed.endswith(
        "Notes:\n- no run logs validation per benchmark (verl's val-core/<data_source>/acc/mean@N, "
        "OpenRLHF's eval/eval_<data_source>_pass1), so no pass@1.\n"
    )


def test_a_tensorboard_directory_reads_and_a_log_without_acr_says_why_its_row_is_empty(
    tmp_path, capsys, openrlhf_tensorboard
):
    rows = {step: {"reward": 0.5, "acr/rate": 0.25, "acr/effective": 0.25, "policy_loss": 0.1} for step in range(1, 5)}
    openrlhf_tensorboard(tmp_path / "tb", "or", rows, {4: {"eval_math500_pass1": 0.75}})
    write_run(tmp_path / "plain" / "metrics.jsonl", [], {1: {"math500": [0.0]}})  # validation only, no acr/*
    assert main(["table", str(tmp_path / "tb"), str(tmp_path / "plain")]) == 0
    table, notes = capsys.readouterr().out.split("\n\n")
    assert table.splitlines()[2:] == [
        "| or | 75.0 | 75.0 | 0.25 | 0.25 | 0.25 | 4 |",
        "| plain | 0.0 | 0.0 | – | – | – | 1 |",
    ]
    assert notes.splitlines() == [
        "Notes:",
        "- plain: no ACR: the log holds no collapse measure (acr/*, frac_reward_zero_std, reward_std, "
        "critic/score/max and min); `verl-avspo report` says how to log acr/*.",
    ]


def test_table_says_when_a_log_starts_late_has_gaps_or_an_unusable_acr(tmp_path, capsys):
    path = tmp_path / "resumed.jsonl"  # verl's file logger after a resume at step 3: steps 1-3 are gone
    with path.open("w") as stream:
        for step in (4, 5, 7, 8):
            write_record(stream, step, {"acr/rate": 0.5, "acr/effective": 0.5})
        write_record(stream, 8, verl_validation_metrics({"math500": [1.0]}))
    odd = tmp_path / "odd.jsonl"
    with odd.open("w") as stream:
        for step in (1, 2):
            write_record(stream, step, {"acr/rate": 5.0})
        write_record(stream, 2, verl_validation_metrics({"math500": [1.0]}))
    assert main(["table", str(path), str(odd)]) == 0
    table, notes = capsys.readouterr().out.split("\n\n")
    assert table.splitlines()[2:] == [
        "| resumed | 100.0 | 100.0 | 0.50 | 0.50 | 0.50 | 8 |",
        "| odd | 100.0 | 100.0 | – | – | – | 2 |",
    ]
    assert notes.splitlines()[1] == (
        "- resumed: the log starts at step 4: steps 1–3 are not in it (a resumed run whose "
        "earlier rows were lost?); it has 1 gap(s): steps 6 missing."
    )
    assert notes.splitlines()[2].startswith(
        "- odd: no ACR: acr/rate holds 2 value(s) outside [0, 1] (5 at step 1, 5 at step 2)"
    )


def test_table_exits_non_zero_when_a_log_cannot_be_read(tmp_path, capsys):
    good = tmp_path / "runs" / "good.jsonl"
    good.parent.mkdir()
    with good.open("w") as stream:
        write_record(stream, 1, {"acr/rate": 0.5})
    (tmp_path / "runs" / "broken.jsonl").write_text("\x00 not json\n")
    assert main(["table", str(tmp_path / "runs")]) == 1
    captured = capsys.readouterr()
    assert "| good |" in captured.out and "not read:" in captured.err and "broken.jsonl" in captured.err
