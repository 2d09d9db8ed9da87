"""The tools layer's shared pieces, each defined once: early ACR (full, short, sparse and resumed
logs; one early-window rule; the same number from ``report``, ``table``, the sandbox's summary and
``benchmarks/diagnostic_study.py``), window means, last
values, the latest validation, Markdown tables and run naming (the statistics over seeds:
test_seed_stats.py)."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from verl_avspo.sandbox.summary import run_statistics
from verl_avspo.tools.diagnosis import diagnose
from verl_avspo.tools.logs import read_run, run_names, write_record
from verl_avspo.tools.markdown import render_table
from verl_avspo.tools.stats import (
    EARLY_STEPS,
    EarlyACR,
    early_acr,
    early_window,
    last_value,
    latest_validation,
    window_mean,
)
from verl_avspo.tools.table import table_rows


def acr_series(steps, values) -> pd.Series:
    return pd.Series(values, index=pd.Index(steps, name="step"), dtype=float)


def test_early_acr_averages_the_steps_numbered_up_to_n():
    acr = acr_series(range(1, 151), [s / 1000 for s in range(1, 151)])
    assert early_acr(acr, 100) == EarlyACR(pytest.approx(np.mean(np.arange(1, 101)) / 1000), 1, 100, 100, False)


def test_early_acr_counts_by_step_number_on_a_sparse_log_and_averages_what_a_short_one_has():
    sparse = acr_series(range(1, 400, 4), [0.2] * 25 + [0.8] * 75)  # steps 1, 5, ..., 97 are 25 rows
    assert early_acr(sparse, 100) == EarlyACR(pytest.approx(0.2), 1, 97, 25, False)
    short = acr_series(range(1, 41), [0.5] * 40)
    assert early_acr(short, 100) == EarlyACR(pytest.approx(0.5), 1, 40, 40, False)


def test_early_acr_of_a_resumed_log_is_its_earliest_logged_steps_and_says_so():
    resumed = acr_series(range(201, 401), [0.3] * 100 + [0.9] * 100)
    assert early_acr(resumed, 100) == EarlyACR(pytest.approx(0.3), 201, 300, 100, True)


def test_early_acr_skips_unlogged_steps_and_is_none_only_without_any_value():
    acr = acr_series([0, 1, 2, 3], [math.nan, 0.2, math.nan, 0.4])  # step 0: a validation-only record
    assert early_acr(acr, 100) == EarlyACR(pytest.approx(0.3), 1, 3, 2, False)
    assert early_acr(acr_series([1, 2], [math.nan, math.nan])) is None


def test_one_early_window_rule_the_paper_s_100_steps_or_the_first_fifth_of_a_run_of_known_length():
    assert early_window() == EARLY_STEPS == 100  # report and table: a log of unknown length
    assert [early_window(steps) for steps in (1, 4, 5, 9, 10, 80, 500, 1000)] == [1, 1, 1, 1, 2, 16, 100, 200]


def test_the_sandbox_summary_and_the_diagnostic_study_average_the_same_early_window():
    # A 12-step sandbox log: ACR 0.2 on steps 1-2 (the first fifth), 0.8 after.
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "diagnostic_study.py"
    spec = importlib.util.spec_from_file_location("diagnostic_study", path)
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    rates = [math.nan] + [0.2, 0.2] + [0.8] * 10
    frame = pd.DataFrame(
        {
            **{key: rates for key in ("acr/rate", "acr/effective", "acr/all_correct", "acr/all_wrong")},
            **{key: [0.5] + [math.nan] * 11 + [0.7] for key in ("eval/acc_level_1", "eval/acc_mean")},
            "eval/pass@4_level_1": [0.75] + [math.nan] * 12,
        },
        index=pd.Index(range(13), name="step"),
    )
    sandbox = run_statistics(frame, num_levels=1, pass_k=4, first_steps=early_window(12))["acr_first"]
    assert study.run_statistics(frame, steps=12)["acr_early"] == sandbox == pytest.approx(0.2)


def write_resumed_log(path, first_step=201, steps=200):
    """A run resumed from a checkpoint at step ``first_step - 1``: its log starts there; ACR 0.3 on
    its first 100 logged steps and 0.9 after; a final evaluation on the last step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as stream:
        for position in range(steps):
            rate = 0.3 if position < 100 else 0.9
            data = {key: rate for key in ("acr/rate", "acr/effective", "acr/all_correct", "acr/all_wrong")}
            if position == steps - 1:
                data.update({"eval/acc_level_1": 0.5, "eval/acc_mean": 0.5, "eval/pass@4_level_1": 0.75})
            write_record(stream, first_step + position, data)
    return path


def test_report_table_and_sandbox_agree_on_a_resumed_log(tmp_path):
    log = write_resumed_log(tmp_path / "resumed" / "metrics.jsonl")
    diagnosis = diagnose("resumed", read_run(log))
    assert diagnosis.row["ACR_100"] == "0.300"
    assert "ACR_100 (steps 201–300) 0.300 (the log starts after step 100: its earliest steps)" in diagnosis.text()
    (row,) = table_rows([tmp_path])
    assert row.acr_early == pytest.approx(0.3)  # before one home for early ACR the table gave None here
    assert run_statistics(read_run(log), num_levels=1, pass_k=4, first_steps=100)["acr_first"] == pytest.approx(0.3)


def test_window_mean_last_value_and_latest_validation():
    series = acr_series([1, 2, 3, 4], [0.1, math.nan, 0.3, 0.5])
    assert window_mean(series) == pytest.approx(0.3)
    assert window_mean(series, last=2) == pytest.approx(0.4)
    assert window_mean(acr_series([1], [math.nan])) is None and window_mean(None) is None
    assert last_value(series) == 0.5 and last_value(None) is None
    frame = pd.DataFrame(
        {
            "val-core/b/acc/mean@1": [0.1, math.nan, 0.2, math.nan],
            "acr/rate": [0.5, 0.5, 0.5, 0.5],
            "val-core/a/acc/mean@1": [math.nan, 0.7, math.nan, math.nan],
            "val-core/never/acc/mean@1": [math.nan] * 4,
        }
    )
    assert list(latest_validation(frame).items()) == [("val-core/b/acc/mean@1", 0.2), ("val-core/a/acc/mean@1", 0.7)]


def test_render_table():
    assert render_table(["a", "b"], [["1", "2"], ["3", "4"]]) == "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |"
    assert render_table(["a"], []) == "| a |\n|---|"


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("runs/qwen_grpo/metrics.jsonl", "qwen_grpo"),
        ("runs/qwen_grpo/eval.jsonl", "qwen_grpo"),
        ("tb/qwen_avspo/events.out.tfevents.1700000000.host", "qwen_avspo"),
        ("proj/exp1.jsonl", "exp1"),
        ("exports/history.csv", "history"),
    ],
)
def test_run_name(path, name):
    assert run_names([path]) == [name]
