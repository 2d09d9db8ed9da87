"""``verl-avspo prompts``: a run state's per-prompt history by class, and a verl parquet written
without the classes named or with the history's columns, matched by the key the run used
(``extra_info.index``, or the hash of the prompt messages). Its run on a real run's checkpoint is in
tests/e2e/test_verl_cpu_e2e.py."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from verl_avspo.cli import main
from verl_avspo.core.prompt_history import PromptHistory, prompt_key
from verl_avspo.tools.prompts import load_history

# Prompt 0 always solved, 1 never solved, 2 mixed, 3 collapsed once each way (mixed); 4 never visited.
VISITS = [
    ([0, 1, 2, 3], [1.0, 0.0, 0.5, 1.0], [True, False, False, True], [False, True, False, False]),
    ([0, 1, 2, 3], [1.0, 0.0, 1.0, 0.0], [True, False, True, False], [False, True, False, True]),
]


def messages(i: int) -> list[dict]:
    return [{"content": f"{i}+{i}=", "role": "user"}]


def history(keyed_by_hash: bool = False) -> PromptHistory:
    recorded = PromptHistory()
    for step, (rows, rates, correct, wrong) in enumerate(VISITS, 1):
        keys = [prompt_key(messages(row)) for row in rows] if keyed_by_hash else rows
        recorded.record(keys, rates, correct, wrong, step)
    return recorded


def save_run(folder, recorded: PromptHistory, steps=(1, 2)):
    """A verl checkpoint folder: global_step_N/avspo_state.pt for each step (the last holds ``recorded``)."""
    for step in steps:
        (folder / f"global_step_{step}").mkdir(parents=True)
        state = {"version": 3, "prompt_history": (recorded if step == steps[-1] else PromptHistory()).state_dict()}
        torch.save(state, folder / f"global_step_{step}" / "avspo_state.pt")
    return folder


def write_parquet(path, rows=range(5), with_index=True):
    """verl's layout: prompt messages, data_source, reward_model, extra_info with index."""
    table = {
        "data_source": ["sum"] * len(rows),
        "prompt": [messages(i) for i in rows],
        "reward_model": [{"ground_truth": str(2 * i), "style": "rule"} for i in rows],
        "extra_info": [{"index": i, "split": "train"} if with_index else {"split": "train"} for i in rows],
    }
    pq.write_table(pa.table(table), path)
    return path


def test_the_summary_counts_each_class(tmp_path, capsys):
    run = save_run(tmp_path / "ckpt", history())
    assert main(["prompts", str(run)]) == 0
    out = capsys.readouterr().out
    assert "global_step_2" in out and "(step 2, 4 prompts seen, keyed by an integer index)" in out
    assert "always_solved         1   25.0%" in out
    assert "never_solved          1   25.0%" in out
    assert "mixed                 2   50.0%" in out


def test_a_trl_output_folder_is_read_at_its_latest_checkpoint_and_matched_by_an_index_column(tmp_path, capsys):
    """TRL's trainer writes output_dir/checkpoint-N/avspo_state.pt; a run keyed by a dataset column
    (``prompts.key="index"``) matches a file's top-level ``index`` column."""
    output_dir = tmp_path / "out"
    for step in (2, 4):
        (output_dir / f"checkpoint-{step}").mkdir(parents=True)
        torch.save(
            {"version": 3, "prompt_history": history().state_dict()},
            output_dir / f"checkpoint-{step}" / "avspo_state.pt",
        )
    data, out = tmp_path / "trl.parquet", tmp_path / "kept.parquet"
    pq.write_table(pa.table({"prompt": [f"{i}+{i}=" for i in range(5)], "index": list(range(5))}), data)
    args = ["prompts", str(output_dir), "--data", str(data), "--drop", "never_solved", "--out", str(out)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "has no extra_info.index column" in err and "--index-column the column holding it (prompt, index)" in err
    assert main([*args, "--index-column", "index"]) == 0
    assert "checkpoint-4/avspo_state.pt (step 4, 4 prompts seen" in capsys.readouterr().out
    assert pq.read_table(out).column("index").to_pylist() == [0, 2, 3, 4]


def test_an_earlier_step_is_read_when_asked(tmp_path):
    run = save_run(tmp_path / "ckpt", history(), steps=(1, 2))
    assert len(load_history(run).history) == 4
    with pytest.raises(ValueError, match="is empty"):
        load_history(run, step=1)


def test_drop_writes_the_parquet_without_those_classes(tmp_path, capsys):
    run = save_run(tmp_path / "ckpt", history())
    data, out = write_parquet(tmp_path / "train.parquet"), tmp_path / "kept.parquet"
    code = main(["prompts", str(run), "--data", str(data), "--drop", "always_solved,never_solved", "--out", str(out)])
    assert code == 0
    kept = pq.read_table(out)
    assert kept.schema == pq.read_table(data).schema  # the same verl layout, rows removed
    assert [row["index"] for row in kept.column("extra_info").to_pylist()] == [2, 3, 4]  # 4: never visited, kept
    assert "3 of 5 rows, 2 dropped" in capsys.readouterr().out


def test_annotate_adds_the_history_by_the_prompt_hash(tmp_path):
    run = save_run(tmp_path / "ckpt", history(keyed_by_hash=True))
    data, out = write_parquet(tmp_path / "train.parquet", with_index=False), tmp_path / "annotated.parquet"
    assert main(["prompts", str(run), "--data", str(data), "--annotate", "--out", str(out)]) == 0
    rows = pq.read_table(out).to_pandas()
    assert rows["prompt_class"].tolist() == ["always_solved", "never_solved", "mixed", "mixed", "unseen"]
    assert rows["prompt_visits"].tolist()[:4] == [2, 2, 2, 2] and rows["prompt_visits"].isna().tolist()[4]
    assert rows["prompt_last_pass_rate"].tolist()[:4] == [1.0, 0.0, 1.0, 0.0]
    assert rows["prompt_all_wrong"].tolist()[:4] == [0, 2, 0, 1]


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (lambda tmp: tmp / "nowhere", [], "does not exist"),
        (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", [], "no run state under"),
        (lambda tmp: save_run(tmp / "ckpt", PromptHistory()), [], "is empty: the run passed no prompt identity"),
    ],
)
def test_a_run_without_a_history_names_the_fix(tmp_path, capsys, setup, args, message):
    assert main(["prompts", str(setup(tmp_path)), *args]) == 1
    assert message in capsys.readouterr().err


def test_a_state_of_an_earlier_release_says_so(tmp_path, capsys):
    (tmp_path / "global_step_3").mkdir()
    torch.save({"version": 2, "controller": None, "stagnation": None, "dcpo": None},
               tmp_path / "global_step_3" / "avspo_state.pt")  # fmt: skip
    assert main(["prompts", str(tmp_path)]) == 1
    assert "saved by an earlier verl-avspo release" in capsys.readouterr().err


def test_a_parquet_whose_rows_have_no_key_is_refused(tmp_path, capsys):
    run = save_run(tmp_path / "ckpt", history())
    data = write_parquet(tmp_path / "train.parquet", with_index=False)
    assert main(["prompts", str(run), "--data", str(data), "--annotate", "--out", str(tmp_path / "o.parquet")]) == 1
    assert "has no extra_info.index column" in capsys.readouterr().err
    other = write_parquet(tmp_path / "other.parquet", rows=range(10, 13))
    assert main(["prompts", str(run), "--data", str(other), "--annotate", "--out", str(tmp_path / "o.parquet")]) == 1
    assert "none of the 3 rows" in capsys.readouterr().err


def test_drop_needs_data_and_out(tmp_path, capsys):
    run = save_run(tmp_path / "ckpt", history())
    assert main(["prompts", str(run), "--drop", "mixed"]) == 2
    assert "need --data" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["prompts", str(run), "--drop", "solved"])
