"""Reading verl's file-logger JSONL: merging, malformed lines, and which files count as logs."""

import io
import json

import pytest

from verl_avspo.tools.logs import find_logs, read_metrics, write_record


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


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps({"step": 1, "data": {}}) + "\n" + '{"oops": 1}\n')
    with pytest.raises(ValueError, match=r"run.jsonl:2 is not a verl file-logger record"):
        read_metrics(path)


def test_directories_yield_only_metric_logs(tmp_path):
    (tmp_path / "validation").mkdir()
    (tmp_path / "validation" / "0.jsonl").write_text(json.dumps({"input": "q", "output": "a"}) + "\n")
    (tmp_path / "train.jsonl").write_text(json.dumps({"step": 1, "data": {"acr/rate": 0.1}}) + "\n")
    assert find_logs([tmp_path]) == [tmp_path / "train.jsonl"]
    # A file named explicitly is kept, so that its problem is reported rather than hidden.
    assert find_logs([tmp_path / "validation" / "0.jsonl"]) == [tmp_path / "validation" / "0.jsonl"]
    with pytest.raises(FileNotFoundError, match="no such log file or directory"):
        find_logs([tmp_path / "missing"])
