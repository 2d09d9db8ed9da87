"""Reading logs: verl's file-logger JSONL (merging, malformed lines and steps, a resume appended to the
log), a custom loop's flat JSONL and metrics logged as text, wandb CSV steps, which files count as
logs, run naming, and one run's files merged."""

import io
import json

import pandas as pd
import pytest

from verl_avspo.tools.logs import find_logs, merge_frames, read_metrics, read_run, run_names, write_record


def test_round_trip_merges_records_of_one_step(tmp_path):
    stream = io.StringIO()
    write_record(stream, 1, {"acr/rate": 0.5, "note": "text"})
    write_record(stream, 1, {"val-core/math/acc/mean@1": 0.25})
    write_record(stream, 2, {"acr/rate": 0.25, "flag": True})
    path = tmp_path / "run.jsonl"
    path.write_text(stream.getvalue())
    frame = read_metrics(path)
    assert frame.index.tolist() == [1, 2]
    assert frame.loc[1, "acr/rate"] == 0.5 and frame.loc[1, "val-core/math/acc/mean@1"] == 0.25
    assert "note" not in frame.columns and "flag" not in frame.columns  # non-numeric values dropped


def test_a_truncated_or_corrupt_log_keeps_every_readable_step_and_names_the_lines(tmp_path):
    path = tmp_path / "run.jsonl"
    records = [json.dumps({"step": step, "data": {"acr/rate": step / 10}}) for step in (1, 2, 3)]
    # A corrupt first line, a foreign record, and the last line of a killed run cut mid-record.
    path.write_text("\x00garbage\n" + records[0] + "\n" + '{"oops": 1}\n' + records[1] + "\n" + records[2][:15])
    with pytest.warns(
        UserWarning, match=r"skipped 3 line\(s\).*kept the 2 step\(s\).*run.jsonl:1 .*run.jsonl:3 .*run.jsonl:5"
    ):
        frame = read_metrics(path)
    assert frame["acr/rate"].to_dict() == {1: 0.1, 2: 0.2}


def test_an_empty_or_wholly_unreadable_log_is_named(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"empty.jsonl is empty"):
        read_metrics(empty)
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\nnor this\n")
    with pytest.raises(ValueError, match=r"junk.jsonl holds no metrics record .*junk.jsonl:1 .* and 1 more"):
        read_metrics(junk)


def test_directories_yield_only_metric_logs(tmp_path):
    (tmp_path / "validation").mkdir()
    (tmp_path / "validation" / "0.jsonl").write_text(json.dumps({"input": "q", "output": "a"}) + "\n")
    (tmp_path / "train.jsonl").write_text(json.dumps({"step": 1, "data": {"acr/rate": 0.1}}) + "\n")
    assert find_logs([tmp_path]) == [tmp_path / "train.jsonl"]
    # A corrupt first line does not hide a log in a folder.
    (tmp_path / "cut.jsonl").write_text('{"step": 1, "da\n' + json.dumps({"step": 2, "data": {"acr/rate": 0.1}}) + "\n")
    assert find_logs([tmp_path]) == [tmp_path / "cut.jsonl", tmp_path / "train.jsonl"]
    # A file named explicitly is kept, so that its problem is reported rather than hidden.
    assert find_logs([tmp_path / "validation" / "0.jsonl"]) == [tmp_path / "validation" / "0.jsonl"]
    with pytest.raises(FileNotFoundError, match="no such log file or directory"):
        find_logs([tmp_path / "missing"])


def test_steps_that_are_not_non_negative_integers_are_refused_by_line_and_the_rest_is_read(tmp_path):
    path = tmp_path / "run.jsonl"
    steps = [1, 1.7, True, "abc", -1, "3", 2.0, 3]
    path.write_text("".join(json.dumps({"step": step, "data": {"acr/rate": 0.1}}) + "\n" for step in steps))
    with pytest.warns(UserWarning) as caught:
        frame = read_metrics(path)
    message = str(caught[0].message)
    assert "skipped 5 line(s)" in message and "kept the 3 step(s)" in message
    for line, step in ((2, "1.7"), (3, "true"), (4, '"abc"')):  # the first three are named; -1 and "3" too
        assert f"run.jsonl:{line} (step {step} is not a non-negative integer)" in message
    assert frame.index.tolist() == [1, 2, 3]


def test_a_wandb_csv_drops_rows_whose_step_is_not_a_step(tmp_path):
    path = tmp_path / "history.csv"
    path.write_text("_step,acr/rate\n1,0.5\n1.7,0.4\n-2,0.3\n2,0.2\n")
    with pytest.warns(UserWarning, match=r"history.csv: skipped 2 row\(s\) whose step is not .*\(-2.0, 1.7\)"):
        frame = read_run(path)
    assert frame["acr/rate"].to_dict() == {1: 0.5, 2: 0.2}


def test_a_resume_appended_to_the_log_keeps_the_last_value_of_each_step_and_says_so(tmp_path):
    path = tmp_path / "run.jsonl"
    with path.open("w") as stream:
        for step in (1, 2, 3, 4, 5):  # the first attempt, which crashed after step 5
            write_record(stream, step, {"acr/rate": 0.9, "critic/score/mean": 0.1})
        write_record(stream, 3, {"val-core/math/acc/mean@1": 0.5})  # a validation record is not a repeat
        for step in (4, 5, 6):  # resumed from the checkpoint of step 3, appended to the same file
            write_record(stream, step, {"acr/rate": 0.2, "critic/score/mean": 0.6})
    with pytest.warns(
        UserWarning,
        match=r"run.jsonl: step\(s\) 4, 5 logged more than once, every one with other values \(a restarted run's new "
        r"attempt\?\), first at .*run.jsonl:7",
    ):
        frame = read_metrics(path)
    assert frame["acr/rate"].to_dict() == {1: 0.9, 2: 0.9, 3: 0.9, 4: 0.2, 5: 0.2, 6: 0.2}
    assert frame.attrs["repeated_steps"] == [4, 5] and frame.loc[3, "val-core/math/acc/mean@1"] == 0.5


def test_run_names_tell_different_runs_apart_and_keep_one_runs_logs_together(tmp_path):
    def names(*paths):
        return run_names([tmp_path / path for path in paths])

    assert names("projA/exp.jsonl", "projB/exp.jsonl") == ["projA/exp", "projB/exp"]
    assert names("a/run1/metrics.jsonl", "b/run1/metrics.jsonl") == ["a/run1", "b/run1"]
    assert names("runs/grpo/seed0.jsonl", "runs/avspo/seed0.jsonl", "runs/avspo/seed1.jsonl") == [
        "grpo/seed0",
        "avspo/seed0",
        "seed1",
    ]
    assert names("x/a/run/metrics.jsonl", "y/a/run/metrics.jsonl") == ["x/a/run", "y/a/run"]
    # One run: the recipes' training log and final evaluation, a resumed run's TensorBoard files.
    assert names("runs/r/metrics.jsonl", "runs/r/eval.jsonl") == ["r", "r"]
    assert names("tb/r/events.out.tfevents.1.host", "tb/r/events.out.tfevents.2.host") == ["r", "r"]


def test_one_runs_files_merge_into_one_frame_keeping_the_later_files_values(tmp_path):
    first, second = tmp_path / "r" / "events.out.tfevents.1.a", tmp_path / "r" / "events.out.tfevents.2.a"
    frames = [
        pd.DataFrame({"acr/rate": [0.9, 0.9, 0.9]}, index=pd.Index([1, 2, 3], name="step")),
        pd.DataFrame({"acr/rate": [0.2, 0.2]}, index=pd.Index([3, 4], name="step")),
    ]
    with pytest.warns(UserWarning, match=r"run r: step\(s\) 3 logged by more than one of its files"):
        merged = merge_frames("r", frames)
    assert merged["acr/rate"].to_dict() == {1: 0.9, 2: 0.9, 3: 0.2, 4: 0.2}
    assert merged.attrs["repeated_steps"] == [3]
    assert run_names([first, second]) == ["r", "r"]


def test_flat_jsonl_and_metrics_logged_as_text_are_read(tmp_path):
    # A custom loop's log: flat records with a step key; a rate logged as a string is read as a number.
    path = tmp_path / "custom.jsonl"
    path.write_text("\n".join(json.dumps({"step": s, "reward": 0.5, "acr/rate": "0.25", "note": "x"}) for s in (1, 2)))
    with pytest.warns(UserWarning, match="logged as text"):
        frame = read_run(path)
    assert frame["acr/rate"].tolist() == [0.25, 0.25] and "note" not in frame and frame.index.tolist() == [1, 2]
