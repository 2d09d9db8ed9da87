"""Reading verl's file-logger JSONL: merging, malformed lines, and which files count as logs; keeping a
resumed run's history (keep_history)."""

import io
import json

import pytest

from verl_avspo.tools.logs import find_logs, keep_history, read_metrics, write_record


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
    with pytest.raises(ValueError, match=r"junk.jsonl holds no verl file-logger record .*junk.jsonl:1 .* and 1 more"):
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


def test_keep_history_keeps_steps_up_to_the_resumed_one_and_drops_the_crashed_attempts_rest(tmp_path):
    path = tmp_path / "run.jsonl"
    with path.open("w") as stream:
        for step in (0, 1, 2, 3, 3, 4, 5):  # two records of step 3: training and validation
            write_record(stream, step, {"acr/rate": step / 10})
    assert keep_history(path, 3) == 5
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3, 3]
    with path.open("a") as stream:  # the resumed run appends its steps once
        for step in (4, 5, 6):
            write_record(stream, step, {"acr/rate": step / 10})
    assert read_metrics(path).index.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert keep_history(path, 0) == 1 and keep_history(tmp_path / "absent.jsonl", 3) == 0
    assert not (tmp_path / "absent.jsonl").exists()


def test_keep_history_drops_a_truncated_last_line_with_a_warning(tmp_path):
    path = tmp_path / "run.jsonl"
    records = [json.dumps({"step": step, "data": {"acr/rate": 0.5}}) for step in (1, 2, 3)]
    path.write_text("\n".join(records[:2]) + "\n" + records[2][:12])  # killed while writing step 3
    with pytest.warns(UserWarning, match=r"dropped 1 line\(s\).*run.jsonl:3"):
        assert keep_history(path, 5) == 2
    assert path.read_text() == "\n".join(records[:2]) + "\n"
    assert not (tmp_path / "run.jsonl.partial").exists()
