"""``verl-avspo report`` and ``table`` on TRL's logs: the ``trainer_state.json`` that TRL's own
``GRPOTrainer`` wrote (in a checkpoint folder, or found in the output folder), the same log history
as a wandb CSV export and the Trainer's TensorBoard callback name it (``train/`` prefix), a cut-off
file, and the diagnosis of a TRL run with and without our ``acr/*`` metrics (TRL's
``frac_reward_zero_std``, labelled with its source); and the shapes of TRL logs from the wild, in
small logs written here: older TRL's names (``completion_length``, ``rewards/<f>``, ``reward_std`` 0
as every group collapsed) in a bare ``log_history`` list, ``logging_steps`` 10 (no late start, steps
counted as steps in ``report`` and ``table``), and completions cut at the length cap.

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
from verl_avspo.tools.report import write_report
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
    values = diagnosis.values
    assert values["acr_source"] == "frac_reward_zero_std" and values["framework"] == "trl"
    assert values["mean_acr"] == pytest.approx(frame["frac_reward_zero_std"].mean())
    assert values["all_correct"] is None and values["effective"] is None
    assert diagnosis.row["mean ACR"] == f"{frame['frac_reward_zero_std'].mean():.3f} *"
    collapse = diagnosis.findings[0]
    assert collapse.headline.endswith("(frac_reward_zero_std)")
    assert "docs/diagnostics.md#what-the-report-reads-collapse-from" in collapse.evidence[0]
    assert any("verl_avspo.trl.AVSPOGRPOTrainer" in action for action in collapse.actions)


def test_a_trl_log_without_any_collapse_rate_says_so_once():
    frame = read_run(STATE).drop(columns=["frac_reward_zero_std", "reward_std"])
    (finding,) = [f for f in diagnose("grpo", frame).findings if "collapse measure" in f.headline]
    assert finding.headline == "No collapse measure in this log"
    assert "trl.GRPOTrainer" in finding.actions[0]


def trl_rows(steps, every=1, older=False, **metrics):
    """TRL log_history entries every ``every`` steps, with TRL's names of the older release (completion_length,
    rewards/<f>) or the recent one (completions/*, rewards/<f>/mean and /std); ``metrics`` by step position."""
    rows = []
    for position, step in enumerate(range(every, steps + 1, every)):
        row = {"step": step, "epoch": step / steps, "loss": 0.0, "reward": 0.5, "reward_std": 0.2}
        row |= {"completion_length": 200.0} if older else {"completions/mean_length": 200.0}
        row |= {key: value(position) if callable(value) else value for key, value in metrics.items()}
        rows.append(row)
    return rows


def test_older_trl_reward_std_zero_is_every_group_collapsed_and_a_bare_log_history_reads(tmp_path):
    # Older TRL: no frac_reward_zero_std; reward_std is the mean of the per-group stds, so 0 means every group
    # of the step scored the same. 24 of 40 rows at 0 (a bare log_history list, as notebooks save it).
    rows = trl_rows(
        40, older=True, reward_std=lambda i: 0.0 if i < 24 else 0.3, reward=lambda i: 0.0 if i < 24 else 0.4
    )
    for row in rows:
        row |= {"rewards/correctness_reward_func": row["reward"], "rewards/format_reward_func": 0.5}
    path = tmp_path / "log_history.json"
    path.write_text(json.dumps(rows))
    diagnosis = diagnose("old", read_run(path))
    collapse = diagnosis.findings[0]
    assert collapse.headline == "Every group collapsed on 24 of 40 logged rows (reward_std == 0)"
    assert "older TRL's mean of per-group reward stds" in collapse.evidence[0] and collapse.severity == "ALERT"
    assert diagnosis.values["collapse"]["lower_bound"] is True
    saturated = [f for f in diagnosis.findings if "format_reward_func gives no signal" in f.headline]
    assert saturated and "GRPOConfig.reward_weights" in saturated[0].actions[0]
    # Older TRL's rewards/<f> (no /mean) are drawn.
    _, files = write_report({"old": read_run(path)}, tmp_path / "out")
    assert "reward_functions.png" in [f.name for f in files]


def test_logging_every_ten_steps_is_not_a_late_start_and_counts_steps(tmp_path, capsys):
    state = {"global_step": 200, "logging_steps": 10, "log_history": trl_rows(200, every=10, frac_reward_zero_std=0.9)}
    path = tmp_path / "run" / "trainer_state.json"
    path.parent.mkdir()
    path.write_text(json.dumps(state))
    diagnosis = diagnose("run", read_run(path))
    assert diagnosis.values["coverage"]["starts_late"] is False and diagnosis.steps == 200
    assert "200 steps, 20 rows logged every 10" in diagnosis.heading
    assert not any(f.headline.startswith("Incomplete log") for f in diagnosis.findings)
    # The flat reward and high collapse stall over 200 training steps (20 rows: never under the old row count).
    assert diagnosis.values["stalled"] is True and diagnosis.values["stalls"][0]["last_step"] == 200
    assert cli.main(["report", str(path), "--out", str(tmp_path / "out"), "--fail-on", "incomplete"]) == 0
    assert "--fail-on incomplete holds" not in capsys.readouterr().err
    (row,) = table_rows([path])
    assert row.steps == 200 and row.acr_early == pytest.approx(0.9)


def test_completions_at_the_length_cap_are_named_as_the_cause_where_the_log_ties_them(tmp_path):
    # Collapse 0.8 where 90% are cut, 0.1 where 10% are: more truncation on the collapsed rows.
    cut = {"completions/clipped_ratio": lambda i: 0.9 if i % 2 else 0.1}
    rows = trl_rows(50, frac_reward_zero_std=lambda i: 0.8 if i % 2 else 0.1, reward=0.0, **cut)
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": rows}))
    diagnosis = diagnose("cut", read_run(path))
    cause = next(f for f in diagnosis.findings if f.headline.startswith("Likely cause of collapse"))
    assert "50% of completions cut at the length cap" in cause.headline
    assert "0.90 on rows with most groups collapsed vs 0.10 on the others" in cause.evidence
    assert "GRPOConfig.max_completion_length" in cause.actions[0]
    assert "mask_truncated_completions" in diagnosis.findings[0].actions[0]
    assert any(f.headline.startswith("No gain") and "while collapse is high" in f.headline for f in diagnosis.findings)


def test_truncation_not_tied_to_collapse_is_its_own_finding(tmp_path):
    # The log: 88% cut on the collapsed rows vs 95% on the others, i.e. collapsed rows are cut less.
    cut = {"completions/clipped_ratio": lambda i: 0.88 if i % 2 else 0.95}
    rows = trl_rows(50, frac_reward_zero_std=lambda i: 0.9 if i % 2 else 0.2, **cut)
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": rows}))
    diagnosis = diagnose("cut", read_run(path))
    assert not any(f.headline.startswith("Likely cause") for f in diagnosis.findings)
    cause = next(f for f in diagnosis.findings if "cut at the length cap" in f.headline)
    assert cause.headline.startswith("92% of completions cut at the length cap")
    assert "0.88 on rows with most groups collapsed vs 0.95 on the others: no more of it where collapse is" in (
        " ".join(cause.evidence)
    )
    assert "mask_truncated_completions" not in " ".join(diagnosis.findings[0].actions)
    # Collapse the same on every row: nothing to tie it to.
    rows = trl_rows(50, frac_reward_zero_std=0.8, **{"completions/clipped_ratio": 1.0})
    path.write_text(json.dumps({"log_history": rows}))
    diagnosis = diagnose("cut", read_run(path))
    cause = next(f for f in diagnosis.findings if "cut at the length cap" in f.headline)
    assert cause.headline.startswith("100% of completions") and "cannot tell whether this drives it" in str(cause)


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
    # What to try, in TRL's spelling of the settings, not verl's.
    assert "use a larger group (GRPOConfig.num_generations)" in diagnosis.text()
    assert "or AVSPO with avspo={'apply_to': 'all_wrong'}" in diagnosis.text()
    assert "actor_rollout_ref" not in diagnosis.text()
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
    # Not used: the collapse is read from the next source the log holds, TRL's reward_std.
    assert diagnosis.values["acr_source"] == "reward_std == 0"


def test_report_on_a_trl_output_folder_draws_trls_metrics(tmp_path, capsys):
    out = tmp_path / "report"
    assert cli.main(["report", str(OUTPUT), str(WANDB), "--out", str(out), "--json", str(tmp_path / "r.json")]) == 0
    for figure in ("acr.png", "reward.png", "reward_functions.png", "reward_std.png", "accuracy.png"):
        assert (out / figure).stat().st_size > 0, figure
    summary = (out / "summary.md").read_text()
    assert "| grpo | 12 |" in summary and "| eval_reward 0.062 | 0.500 * | — |" in summary
    assert "read from another collapse measure than acr/rate" in summary and "Not drawn: acr_split.png" in summary
    document = json.loads((tmp_path / "r.json").read_text())
    assert [run["acr_source"] for run in document["runs"]] == ["frac_reward_zero_std"] * 2


def test_table_on_a_trl_output_folder_takes_trls_rate_with_a_note(tmp_path, capsys):
    shutil.copytree(OUTPUT, tmp_path / "grpo")
    (row,) = table_rows([tmp_path])
    frame = read_run(STATE)["frac_reward_zero_std"]
    assert row.acr_final == pytest.approx(frame.iloc[-10:].mean()) and row.acr_early == pytest.approx(frame.mean())
    assert row.effective_final is None and row.steps == 12
    assert row.notes == [
        "ACR is frac_reward_zero_std: TRL's fraction of completions whose reward std is 0 (ACR with scale_rewards "
        "'group' or 'none') (docs/diagnostics.md)"
    ]
    assert cli.main(["table", str(tmp_path)]) == 0
    assert "| grpo |" in capsys.readouterr().out
