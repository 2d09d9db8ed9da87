"""``verl-avspo report`` and ``table`` on TRL's logs: the ``trainer_state.json`` that TRL's own
``GRPOTrainer`` wrote (in a checkpoint folder, or found in the output folder), the same log history
as a wandb CSV export and the Trainer's TensorBoard callback name it (``train/`` prefix), a cut-off
file, and the diagnosis of a TRL run with and without our ``acr/*`` metrics (TRL's
``frac_reward_zero_std``, labelled as TRL's).

The fixtures in ``fixtures/trl/`` come from a real CPU run of TRL 1.16's ``GRPOTrainer`` (12 steps,
``scale_rewards="group"``, an evaluation at steps 6 and 12); ``fixtures/make_trl_logs.py`` says how
they were made and makes them again.
"""

import json
import shutil
import warnings
from pathlib import Path

import pytest

from verl_avspo import cli
from verl_avspo.tools.diagnosis import diagnose
from verl_avspo.tools.logs import collect_runs, read_run, read_trainer_state
from verl_avspo.tools.stats import rate_problem, score_column, validation_columns
from verl_avspo.tools.table import table_rows

FIXTURES = Path(__file__).parent / "fixtures" / "trl"
OUTPUT = FIXTURES / "grpo"  # TRL's output_dir, with checkpoint-6/ and checkpoint-12/
STATE = OUTPUT / "checkpoint-12" / "trainer_state.json"
WANDB = FIXTURES / "wandb_export.csv"


def _history(path=STATE):
    """The log_history of a trainer_state.json: training rows and evaluation rows, by step."""
    entries = json.loads(path.read_text())["log_history"]
    training = {e["step"]: e for e in entries if "frac_reward_zero_std" in e}
    evaluation = {e["step"]: e for e in entries if "eval_reward" in e}
    return training, evaluation


def test_trainer_state_gives_one_row_per_step_with_trls_values():
    training, evaluation = _history()
    assert sorted(training) == list(range(1, 13)) and sorted(evaluation) == [6, 12]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = read_run(STATE)
    assert list(frame.index) == list(range(1, 13))
    for step, entry in training.items():
        for name in ("frac_reward_zero_std", "reward", "reward_std", "rewards/contains_sum/mean", "loss"):
            assert frame.loc[step, name] == entry[name], (step, name)
    for step, entry in evaluation.items():
        assert frame.loc[step, "eval_reward"] == entry["eval_reward"]
    # The run summary (train_runtime, train_loss) and the Trainer's epoch are not metrics of a step.
    assert not {"train_runtime", "train_loss", "epoch", "step"} & set(frame.columns)
    assert score_column(frame) == "reward" and validation_columns(frame) == ["eval_reward"]


def test_an_output_folder_is_one_run_read_from_its_latest_checkpoint():
    # checkpoint-6's history is the first half of checkpoint-12's: not a second attempt, no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runs = collect_runs([OUTPUT])
        early = collect_runs([OUTPUT / "checkpoint-6"])
    assert list(runs) == ["grpo"] and list(early) == ["grpo"]
    assert runs["grpo"].equals(read_trainer_state(STATE))
    assert list(early["grpo"].index) == list(range(1, 7))
    assert early["grpo"].equals(runs["grpo"].loc[1:6, list(early["grpo"].columns)])


def test_wandb_export_reads_trls_train_names_like_the_trainer_state():
    state, exported = read_run(STATE), read_run(WANDB)
    assert list(exported.index) == list(state.index)
    for name in ("frac_reward_zero_std", "reward_std", "rewards/contains_sum/mean"):
        assert f"train/{name}" not in exported  # read without the prefix
        assert exported[name].equals(state[name]), name
    assert score_column(exported) == "train/reward" and exported["train/reward"].equals(state["reward"])
    assert validation_columns(exported) == ["eval/reward"]
    assert exported["eval/reward"].dropna().equals(state["eval_reward"].dropna())


def test_tensorboard_files_of_the_trainers_callback_read_like_the_trainer_state(tmp_path):
    # transformers' own TensorBoardCallback replays the run's log history (train/ and eval/ names).
    from torch.utils.tensorboard import SummaryWriter
    from transformers import TrainerControl, TrainerState
    from transformers.integrations import TensorBoardCallback

    callback = TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(tmp_path / "runs" / "grpo")))
    state = TrainerState()
    for entry in json.loads(STATE.read_text())["log_history"]:
        state.global_step = entry["step"]
        callback.on_log(None, state, TrainerControl(), logs={k: v for k, v in entry.items() if k != "step"})
    callback.on_train_end(None, state, TrainerControl())
    frame, expected = collect_runs([tmp_path / "runs"])["grpo"], read_run(STATE)
    for name in ("frac_reward_zero_std", "reward_std", "rewards/contains_sum/mean"):
        assert frame[name].to_numpy() == pytest.approx(expected[name].to_numpy()), name  # float32 in event files
    assert validation_columns(frame) == ["eval/reward"] and diagnose("grpo", frame).values["acr_source"] == (
        "frac_reward_zero_std"
    )


def test_a_cut_off_trainer_state_keeps_its_complete_entries(tmp_path):
    text = STATE.read_text()
    entries = json.loads(text)["log_history"]
    # Cut inside the entry after step 8's training row: steps 1-8 and the evaluation at 6 are complete.
    cut = tmp_path / "checkpoint-12" / "trainer_state.json"
    cut.parent.mkdir()
    index = next(i for i, e in enumerate(entries) if e["step"] == 9)
    cut.write_text(text[: text.index('"step": 9,')])
    with pytest.warns(UserWarning, match=rf"{cut} is cut off or corrupt .*read the {index} complete log_history"):
        frame = read_run(cut)
    full = read_run(STATE)
    assert list(frame.index) == list(range(1, 9))
    assert frame.equals(full.loc[1:8, list(frame.columns)])
    # Cut before the history: nothing to read, said so.
    cut.write_text(text[: text.index('"log_history"')])
    with pytest.raises(ValueError, match="no log_history"):
        read_run(cut)


def test_entries_without_a_step_are_skipped_with_a_warning(tmp_path):
    state = json.loads(STATE.read_text())
    state["log_history"][2]["step"] = 2.5
    del state["log_history"][4]["step"]
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state))
    with pytest.warns(UserWarning, match=r"skipped 2 log_history entry\(s\) .*log_history\[2\] \(step 2.5 is not"):
        frame = read_run(path)
    assert 3 not in frame.index and 5 not in frame.index and 4 in frame.index
    path.write_text(json.dumps({"global_step": 3}))
    with pytest.raises(ValueError, match="not a Hugging Face trainer_state.json"):
        read_run(path)


def test_a_trl_run_without_our_metrics_is_diagnosed_on_trls_rate_labelled_as_trls():
    frame = read_run(STATE)
    diagnosis = diagnose("grpo", frame)
    values, findings = diagnosis.values, diagnosis.findings
    assert values["acr_source"] == "frac_reward_zero_std"
    assert values["mean_acr"] == pytest.approx(frame["frac_reward_zero_std"].mean())
    assert values["all_correct"] is None and values["effective"] is None
    assert diagnosis.row["mean ACR"] == f"{frame['frac_reward_zero_std'].mean():.3f} (TRL)"
    note = findings[0]
    assert note.startswith("grpo: no acr/* metrics; the collapse rate below is TRL's frac_reward_zero_std, read as")
    assert "scale_rewards='group' (TRL's default) or 'none'" in note and "whole batch is equal" in note
    assert "verl_avspo.trl.AVSPOGRPOTrainer" in note
    stall, early = findings[1:3]
    assert stall.startswith("grpo: no stalled window") and early.startswith("grpo: ACR (read from TRL's")
    assert stall.endswith("(read from TRL's frac_reward_zero_std).") and "ACR_100) = 0.500" in early
    assert findings[-1].endswith("verl_avspo.trl.AVSPOGRPOTrainer(..., estimator='avspo').")


def test_a_trl_log_without_any_collapse_rate_says_how_to_get_one():
    frame = read_run(STATE).drop(columns=["frac_reward_zero_std"])
    (finding,) = [f for f in diagnose("grpo", frame).findings if "no collapse rate" in f]
    assert finding.startswith("grpo: neither acr/* nor TRL's frac_reward_zero_std metrics; no collapse rate can be")
    assert finding.endswith("train with verl_avspo.trl.AVSPOGRPOTrainer in place of trl.GRPOTrainer (docs/trl.md).")


def test_a_trl_run_with_our_metrics_is_read_like_a_verl_log(tmp_path):
    # The adapter logs acr/* and avspo/* under verl's names beside TRL's own metrics.
    state = json.loads(STATE.read_text())
    for entry in state["log_history"]:
        if "frac_reward_zero_std" in entry:
            rate = entry["frac_reward_zero_std"]
            entry.update({"acr/rate": rate, "acr/all_correct": 0.0, "acr/all_wrong": rate, "acr/effective": rate / 4})
            entry.update({"avspo/triggered": 0.5, "avspo/threshold": 0.3, "avspo/signal": rate})
    path = tmp_path / "avspo" / "checkpoint-12" / "trainer_state.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(state, indent=2))
    diagnosis = diagnose("avspo", collect_runs([tmp_path / "avspo"])["avspo"])
    assert diagnosis.values["acr_source"] == "acr/rate"
    assert diagnosis.row["mean ACR"] == f"{read_run(STATE)['frac_reward_zero_std'].mean():.3f}"
    assert not any("TRL's frac_reward_zero_std" in finding for finding in diagnosis.findings)
    (dominance,) = [finding for finding in diagnosis.findings if "all-wrong groups dominate collapse" in finding]
    # What to try, in TRL's spelling of the settings, not verl's.
    assert "a larger GRPOConfig.num_generations, or AVSPO with avspo={'apply_to': 'all_wrong'}" in dominance
    assert "actor_rollout_ref" not in " ".join(diagnosis.findings)
    assert diagnosis.values["effective"] == pytest.approx(diagnosis.values["mean_acr"] / 4)
    assert diagnosis.values["avspo_triggered"] == 0.5


def test_trls_rate_outside_zero_one_is_not_used(tmp_path):
    state = json.loads(STATE.read_text())
    for entry in state["log_history"]:
        if "frac_reward_zero_std" in entry:
            entry["frac_reward_zero_std"] = 4.0
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state))
    frame = read_run(path)
    assert "TRL logs it as a fraction of completions" in rate_problem(frame, "frac_reward_zero_std")
    diagnosis = diagnose("odd", frame)
    assert diagnosis.values["acr_source"] is None and diagnosis.values["mean_acr"] is None


def test_report_on_a_trl_output_folder_draws_trls_metrics(tmp_path, capsys):
    out = tmp_path / "report"
    assert cli.main(["report", str(OUTPUT), str(WANDB), "--out", str(out), "--json", str(tmp_path / "r.json")]) == 0
    for figure in ("acr.png", "reward.png", "reward_functions.png", "reward_std.png", "accuracy.png"):
        assert (out / figure).stat().st_size > 0, figure
    summary = (out / "summary.md").read_text()
    assert "| grpo | 12 | 0.125 | eval_reward 0.062 | 0.500 (TRL) | 0.500 (TRL) |" in summary
    assert "its ACR is TRL's frac_reward_zero_std" in summary and "Not drawn: acr_split.png" in summary
    document = json.loads((tmp_path / "r.json").read_text())
    assert [run["acr_source"] for run in document["runs"]] == ["frac_reward_zero_std"] * 2


def test_table_on_a_trl_output_folder_takes_trls_rate_with_a_note(tmp_path, capsys):
    shutil.copytree(OUTPUT, tmp_path / "grpo")
    (row,) = table_rows([tmp_path])
    frame = read_run(STATE)["frac_reward_zero_std"]
    assert row.acr_final == pytest.approx(frame.iloc[-10:].mean()) and row.acr_early == pytest.approx(frame.mean())
    assert row.effective_final is None and row.steps == 12
    assert row.notes == [
        "ACR is TRL's frac_reward_zero_std (the log has no acr/*): it equals ACR only with scale_rewards 'group' or "
        "'none' (`verl-avspo report` says more)"
    ]
    assert cli.main(["table", str(tmp_path)]) == 0
    assert "| grpo |" in capsys.readouterr().out
