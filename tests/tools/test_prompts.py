"""``verl-avspo prompts``: a run state's per-prompt history by class, and a verl parquet written
without the classes named or with the history's columns, matched by the key the run used
(``extra_info.index``, or the hash of the prompt messages). What it refuses, each with the fix: a bad
state file (torn, empty, text, a folder, a newer release, an OpenRLHF checkpoint without our state), a
parquet whose index is shared by different prompts or a JSON file, and an ``--out`` it cannot or must not write (checked
before the listing; an existing file is replaced only with ``--force``, and a failed write leaves it
whole). Its run on a real run's checkpoint is in tests/e2e/test_verl_cpu_e2e.py."""

import argparse
import errno
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from verl_avspo.cli import main
from verl_avspo.core.prompt_history import PromptHistory, prompt_key
from verl_avspo.core.run_tracker import STATE_VERSION
from verl_avspo.openrlhf.trainer_wrap import CLIENT_STATES_FILE, STATE_KEY
from verl_avspo.tools.prompts import VERL_TRACKER_FILE, load_history

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
        saved = recorded if step == steps[-1] else PromptHistory()
        state = {"version": STATE_VERSION, "prompt_history": saved.state_dict()}
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
            {"version": STATE_VERSION, "prompt_history": history().state_dict()},
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


def test_a_missing_step_is_refused_listing_the_steps_there(tmp_path, capsys):
    run = save_run(tmp_path / "ckpt", history(), steps=(1, 2, 3))
    with pytest.raises(ValueError, match=r"no run state of step 9 under .*ckpt: its checkpoints hold steps 1, 2, 3\. "
                       r"Give --step one of them\."):  # fmt: skip
        load_history(run, step=9)
    assert main(["prompts", str(run), "--step", "9"]) == 1
    assert "its checkpoints hold steps 1, 2, 3" in capsys.readouterr().err


def test_a_verl_folder_is_read_at_the_step_verl_resumes_from(tmp_path, caplog):
    """After a save that failed (a full disk), global_step_2 lies behind the tracker file, which names step 1:
    verl resumes from step 1, and so the command reads step 1, saying why step 2 is not read."""
    run = save_run(tmp_path / "ckpt", history(), steps=(2, 1))  # step 1 holds the history, step 2 an empty one
    (run / "latest_checkpointed_iteration.txt").write_text("1")
    with caplog.at_level("WARNING"):
        saved = load_history(run)
    assert saved.step == 1 and len(saved.history) == 4
    assert "names step 1, the step verl resumes from; global_step_2 is later, from a save that did not finish" in (
        caplog.text
    )
    assert "--step 2 reads it anyway" in caplog.text
    with pytest.raises(ValueError, match="global_step_2/avspo_state.pt has no per-prompt history"):
        load_history(run, step=2)  # asked for: read
    # A tracker naming a step without a state (or unreadable): the latest, as before.
    (run / "latest_checkpointed_iteration.txt").write_text("7")
    with pytest.raises(ValueError, match="is empty"):
        load_history(run)


def test_the_tracker_file_is_verls():
    checkpoint_manager = pytest.importorskip("verl.utils.checkpoint.checkpoint_manager")
    assert os.path.basename(checkpoint_manager.get_checkpoint_tracker_filename("run")) == VERL_TRACKER_FILE


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


def test_a_state_of_another_version_is_refused_naming_it(tmp_path, capsys):
    (tmp_path / "global_step_3").mkdir()
    torch.save({"version": 2, "controller": None, "stagnation": None, "dcpo": None},
               tmp_path / "global_step_3" / "avspo_state.pt")  # fmt: skip
    assert main(["prompts", str(tmp_path)]) == 1
    assert "the run state has version 2, and this verl-avspo reads version 4 only" in capsys.readouterr().err


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


def state_file(run, step=2):
    return run / f"global_step_{step}" / "avspo_state.pt"


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (lambda path: path.write_bytes(path.read_bytes()[:100]), "is not a readable run state (torn"),
        (lambda path: path.write_bytes(b""), "is empty (a save that was killed or ran out of space)"),
        (lambda path: path.write_text("not a state\n"), "is not a readable run state"),
        (lambda path: path.unlink() or path.mkdir(), "is a folder, not a run state file"),
        (lambda path: torch.save({"version": STATE_VERSION + 1}, path), "reads version 4 only: upgrade verl-avspo"),
    ],
)
def test_a_bad_state_file_is_named_with_the_fix(tmp_path, capsys, spoil, says):
    run = save_run(tmp_path / "ckpt", history())
    spoil(state_file(run))
    assert main(["prompts", str(run)]) == 1
    err = capsys.readouterr().err
    assert says in err and str(state_file(run)) in err
    assert "Traceback" not in err and "weights_only" not in err
    if "upgrade" in says:
        assert "upgrade verl-avspo" in err
    else:
        assert "previous checkpoint" in err and "--step reads another checkpoint (1 here)" in err


def test_an_openrlhf_checkpoint_is_read_from_its_client_states(tmp_path, capsys):
    """OpenRLHF keeps the state among DeepSpeed's client states (pickled objects of its own beside it)."""
    folder = tmp_path / "_actor" / "global_step4"
    folder.mkdir(parents=True)
    states = {
        "module": None,
        "args": argparse.Namespace(lr=1e-6),
        STATE_KEY: {"version": STATE_VERSION, "prompt_history": history().state_dict()},
    }
    torch.save(states, folder / CLIENT_STATES_FILE)
    assert main(["prompts", str(tmp_path)]) == 0
    assert f"global_step4/{CLIENT_STATES_FILE} (step 4, 4 prompts seen" in capsys.readouterr().out
    torch.save({"module": None}, folder / CLIENT_STATES_FILE)
    assert main(["prompts", str(tmp_path)]) == 1
    assert f"holds no run state (no {STATE_KEY!r} entry): its run was trained without verl-avspo" in (
        capsys.readouterr().err
    )


def test_an_index_shared_by_different_prompts_is_refused_naming_the_values_and_the_fix(tmp_path, capsys):
    """Every row used to be matched to one prompt's history ("8 rows matched a visited prompt")."""
    run = save_run(tmp_path / "ckpt", history())
    data, out = tmp_path / "train.parquet", tmp_path / "kept.parquet"
    rows = {"prompt": [messages(i) for i in range(8)], "extra_info": [{"index": 1}] * 7 + [{"index": 0}]}
    pq.write_table(pa.table(rows), data)
    args = ["prompts", str(run), "--data", str(data), "--drop", "never_solved", "--out", str(out)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"extra_info.index of {data} gives one value to different prompts (1)" in err
    assert "give the parquet the run trained on, or --index-column" in err and not out.exists()
    # One prompt listed twice under its own index is one prompt: both rows take its history.
    rows = {"prompt": [messages(1), messages(0), messages(1)], "extra_info": [{"index": 1}, {"index": 0}, {"index": 1}]}
    pq.write_table(pa.table(rows), data)
    assert main([*args[:-4], "--annotate", "--out", str(out)]) == 0
    assert pq.read_table(out).column("prompt_class").to_pylist() == ["never_solved", "always_solved", "never_solved"]


def test_a_json_file_is_refused_with_how_to_convert_it(tmp_path, capsys):
    run = save_run(tmp_path / "ckpt", history(keyed_by_hash=True))
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"input": "1+1=", "label": "2"}\n')
    assert main(["prompts", str(run), "--data", str(data), "--annotate", "--out", str(tmp_path / "o.parquet")]) == 1
    err = capsys.readouterr().err
    assert "is JSON, not parquet" in err and "pd.read_json" in err and "--data.input_key" in err


def test_show_takes_a_count_of_zero_or_more(tmp_path, capsys):
    run = save_run(tmp_path / "ckpt", history())
    with pytest.raises(SystemExit):
        main(["prompts", str(run), "--show", "-5"])
    assert "'-5': give a count of 0 or more" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("out", "says"),
    [
        (lambda tmp: tmp / "train.parquet" / "kept.parquet", "a part of the path is a file, not a folder"),
        (lambda tmp: tmp, "it is a folder; name a file to write instead"),
        (lambda tmp: tmp / "missing" / "kept.parquet", "its folder does not exist"),
        (lambda tmp: "/proc/kept.parquet", "/proc takes no new files"),
        (lambda tmp: "/dev/full", "it is not a regular file"),
    ],
)
def test_an_unwritable_out_is_refused_before_the_listing(tmp_path, capsys, out, says):
    run = save_run(tmp_path / "ckpt", history())
    data = write_parquet(tmp_path / "train.parquet")
    target = str(out(tmp_path))
    assert main(["prompts", str(run), "--data", str(data), "--annotate", "--out", target]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before the state was read and listed
    assert f"--out: cannot write {target}: {says}" in captured.err
    if target == "/dev/full":
        assert os.path.exists(target)  # the device node is left alone (the parquet writer removed it)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_a_read_only_out_folder_is_refused_before_the_listing(tmp_path, capsys):
    run = save_run(tmp_path / "ckpt", history())
    data = write_parquet(tmp_path / "train.parquet")
    (tmp_path / "locked").mkdir(mode=0o555)
    assert (
        main(["prompts", str(run), "--data", str(data), "--annotate", "--out", str(tmp_path / "locked" / "o.parquet")])
        == 1
    )
    captured = capsys.readouterr()
    assert captured.out == "" and "permission denied" in captured.err


def test_an_existing_out_is_replaced_only_with_force(tmp_path, capsys):
    run = save_run(tmp_path / "ckpt", history())
    data, out = write_parquet(tmp_path / "train.parquet"), tmp_path / "kept.parquet"
    out.write_text("the user's file")
    args = ["prompts", str(run), "--data", str(data), "--drop", "never_solved", "--out", str(out)]
    assert main(args) == 1
    captured = capsys.readouterr()
    assert (
        captured.out == "" and f"{out} exists and would be overwritten: name another file (pass --force" in captured.err
    )
    assert out.read_text() == "the user's file"
    assert main([*args, "--force"]) == 0
    assert pq.read_table(out).num_rows == 4


def test_a_failed_write_leaves_the_existing_out_whole_and_names_it(tmp_path, capsys, monkeypatch):
    """A full disk while the parquet is written: the parquet writer used to remove its target."""
    run = save_run(tmp_path / "ckpt", history())
    data, out = write_parquet(tmp_path / "train.parquet"), tmp_path / "kept.parquet"
    out.write_text("the user's file")

    def full_disk(table, where, **kwargs):
        open(where, "wb").write(b"PAR1 half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full_disk)
    assert main(["prompts", str(run), "--data", str(data), "--annotate", "--out", str(out), "--force"]) == 1
    assert f"cannot write {out}: no space left on the device" in capsys.readouterr().err
    assert out.read_text() == "the user's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "kept.parquet", "train.parquet"]
