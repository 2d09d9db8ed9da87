"""``verl-avspo report`` on logs written in the format of verl's loggers (file logger JSONL,
TensorBoard event files through torch's SummaryWriter as verl uses it, wandb history and chart-panel
CSV, OpenRLHF's train/ names), and the bad inputs a user hands it: truncated and corrupt logs, an
empty file, a file as --out, an unreadable file in a folder (named and counted by --fail-on), an
unwritable --json and a full disk (named with the path); findings as headline, severity, evidence and
actions; stalls and ACR_100 in training steps; collapse read from verl's scores without acr/*."""

import json
import warnings
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

from verl_avspo import cli
from verl_avspo.core.config import AlertConfig
from verl_avspo.tools.diagnosis import diagnose
from verl_avspo.tools.logs import collect_runs, read_run, write_record
from verl_avspo.tools.report import write_report
from verl_avspo.verl_plugin.run_state import VERL_ADVICE as ADVICE

VAL = "val-core/HuggingFaceH4/MATH-500/acc/mean@1"


def write_log(path, acr, correct_share=0.8, avspo=False, every=1, val_every=25):
    """A verl-like JSONL: per-step training metrics, validation logged as its own record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as stream:
        for position, rate in enumerate(acr):
            step = 1 + position * every
            data = {
                "training/global_step": step,
                "critic/score/mean": 0.3 + 0.001 * position,
                "critic/score/max": 1.0,
                "response_length/mean": 512.0,
                "acr/rate": rate,
                "acr/all_correct": rate * correct_share,
                "acr/all_wrong": rate * (1 - correct_share),
                "acr/effective": rate / 2 if avspo else rate,
                "acr/groups": 128.0,
            }
            if avspo:
                data.update({"avspo/threshold": 0.5, "avspo/signal": rate, "avspo/triggered": 0.25})
            write_record(stream, step, data)
            if step % val_every == 0:
                write_record(stream, step, {VAL: 0.4 + 0.001 * step})
    return path


def headline(diagnosis, start):
    """The first finding whose headline starts with ``start``, as text (None when there is none)."""
    return next((str(f) for f in diagnosis.findings if f.headline.startswith(start)), None)


def test_stalled_window_reports_the_steps_and_the_advice(tmp_path):
    acr = [0.2] * 10 + [0.5] * 60 + [0.1] * 30  # steps 11-70 above 0.35
    frame = read_run(write_log(tmp_path / "grpo.jsonl", acr))
    stall = headline(diagnose("grpo", frame, AlertConfig(rule="acr")), "Stalled")
    assert stall.startswith("[ALERT] Stalled at steps 11–70 (60 steps): most groups gave no gradient there")
    assert "rule `acr`: ACR above 0.35 for 50 consecutive steps" in stall and f"1. try to {ADVICE}" in stall
    # The same log judged on its all-wrong part (20% of ACR here, 0.1): no stall.
    assert headline(diagnose("grpo", frame, AlertConfig(rule="all_wrong")), "No stalled window") is not None


def test_the_default_rule_reads_the_score_and_stalls_a_flat_run(tmp_path):
    # acr_no_gain on verl's critic/score/mean (logs without acr/reward_mean): flat scores stall.
    flat = read_run(write_log(tmp_path / "flat.jsonl", [0.9] * 120))
    flat["critic/score/mean"] = 0.3
    assert headline(diagnose("flat", flat), "Stalled") is not None
    rising = read_run(write_log(tmp_path / "rising.jsonl", [0.9] * 120))
    assert headline(diagnose("rising", rising), "No stalled window") is not None
    # 80 steps cannot show acr_no_gain's 2 x 50 steps of history: said, not silently passed.
    short = diagnose("short", read_run(write_log(tmp_path / "short.jsonl", [0.9] * 80)))
    assert "it needs 100 steps of history and the log has 80" in headline(short, "Stall rule not checked")
    assert short.values["stalled"] is None


def test_stall_rule_counts_training_steps_not_rows(tmp_path):
    # Logged every 2 steps: rows 5-14 are steps 11-29, each row standing for its 2 steps (10-29: 20 steps).
    frame = read_run(write_log(tmp_path / "sparse.jsonl", [0.1] * 5 + [0.4] * 10 + [0.1] * 5, every=2))
    assert "Stalled at steps 10–29 (20 steps)" in headline(
        diagnose("sparse", frame, AlertConfig(window=20, rule="acr")), "Stalled"
    )
    quiet = diagnose("sparse", frame, AlertConfig(window=21, rule="acr"))
    assert "longest streak above 0.35: 20 steps" in headline(quiet, "No stalled window")
    strictly_above = AlertConfig(window=10, threshold=0.4, rule="acr")
    assert headline(diagnose("sparse", frame, strictly_above), "No stalled window") is not None


def test_acr_100_and_the_paper_fit_only_for_runs_that_long(tmp_path):
    acr = [0.4] * 50 + [0.2] * 50 + [0.9] * 20  # the first 100 steps average 0.3
    summary = diagnose("run", read_run(write_log(tmp_path / "run.jsonl", acr)))
    assert summary.row["ACR_100"] == "0.300"
    fit = headline(summary, "Paper's fit")
    assert f"{51.4 - 29.6 * 0.3:.1f}% MATH-500" in fit and "not a prediction for this run" in fit
    assert "fit on the paper's math runs" in fit

    short = diagnose("short", read_run(write_log(tmp_path / "short.jsonl", [0.5] * 40)))
    assert headline(short, "Paper's fit") is None and short.row["ACR_100"] == "—"

    # By step number, as `verl-avspo table` counts it: logged every 4 steps, steps 1..97 are 25 rows.
    sparse = diagnose("sparse", read_run(write_log(tmp_path / "sparse.jsonl", [0.2] * 25 + [0.8] * 75, every=4)))
    assert sparse.row["ACR_100"] == "0.218"  # steps 1–97 at 0.2; 98–100 belong to the row at 101 (0.8)
    assert sparse.steps == 397 and "397 steps, 100 rows logged every 4" in sparse.heading


@pytest.mark.parametrize(
    "share,expected",
    [
        (0.1, "all-wrong groups dominate"),
        (0.9, "all-correct groups dominate"),
        (0.5, "both kinds matter"),
    ],
)
def test_which_kind_of_group_dominates(tmp_path, share, expected):
    frame = read_run(write_log(tmp_path / "run.jsonl", [0.4] * 20, correct_share=share))
    assert expected in headline(diagnose("run", frame), "Collapse: 40% of groups")


def test_grpo_log_without_our_metrics_reads_collapse_from_the_scores(tmp_path):
    path = tmp_path / "plain.jsonl"
    with path.open("w") as stream:
        for step in range(1, 11):
            low = 0.0 if step <= 6 else 1.0 if step <= 8 else 0.0
            write_record(
                stream,
                step,
                {"critic/score/mean": low, "critic/score/max": 1.0 if step > 8 else low, "critic/score/min": low},
            )
    summary = diagnose("plain", read_run(path))
    collapse = headline(summary, "Every group collapsed")
    assert collapse.startswith(
        "[ALERT] Every group collapsed on 8 of 10 logged rows (critic/score/max == critic/score/min)"
    )
    assert summary.values["all_wrong"] == pytest.approx(0.6) and summary.values["all_correct"] == pytest.approx(0.2)

    with path.open("w") as stream:
        write_record(stream, 1, {"loss": 1.0})
    assert headline(diagnose("other", read_run(path)), "No collapse measure in this log") is not None


def test_avspo_run_reports_effective_collapse_and_an_idle_trigger(tmp_path):
    frame = read_run(write_log(tmp_path / "avspo.jsonl", [0.4] * 20, avspo=True))
    assert "0.400 raw → 0.200 effective" in headline(diagnose("avspo", frame), "AVSPO augmented")
    frame["avspo/triggered"] = 0.0
    assert headline(diagnose("avspo", frame), "AVSPO never augmented a group") is not None


def test_report_side_by_side_writes_pngs_and_markdown(tmp_path, capsys):
    grpo = write_log(tmp_path / "logs" / "grpo.jsonl", [0.45] * 60)
    avspo = write_log(tmp_path / "logs" / "avspo.jsonl", [0.3] * 60, avspo=True)
    out = tmp_path / "report"
    # The default rule, acr_no_gain: these logs' mean score rises every step, so nothing stalls.
    assert cli.main(["report", str(grpo), str(avspo), "--out", str(out)]) == 0
    assert "STALLED" not in capsys.readouterr().out
    assert cli.main(["report", str(grpo), str(avspo), "--out", str(out), "--rule", "acr"]) == 0
    printed = capsys.readouterr().out
    assert "== grpo (60 steps; verl log)" in printed and "== avspo (60 steps; verl log)" in printed
    assert "[ALERT] Stalled at steps" in printed
    for name in ("acr", "acr_split", "threshold", "reward", "accuracy"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    summary = (out / "summary.md").read_text()
    # final score: the mean of the last fifth of the rows (0.348..0.359), not the last row; no ACR_100 under 100 steps.
    assert "| grpo | 60 | 0.353 (last 0.359) | HuggingFaceH4/MATH-500/acc/mean@1 0.450 | 0.450 | — | 0.360 |" in summary
    assert "| avspo | 60 |" in summary and "![threshold](threshold.png)" in summary


def test_a_directory_of_plain_logs_skips_the_figures_it_cannot_draw(tmp_path):
    path = tmp_path / "logs" / "plain.jsonl"
    path.parent.mkdir()
    with path.open("w") as stream:
        for step in range(1, 5):
            write_record(stream, step, {"critic/score/mean": 0.5})
    _, files = write_report(collect_runs([path.parent]), tmp_path / "out")
    assert [f.name for f in files] == ["reward.png", "summary.md"]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "Not drawn: acr.png (no run logs acr/rate, acr/effective, frac_reward_zero_std)" in summary


def test_run_names_from_files_and_recipe_folders(tmp_path):
    for run in ("math_grpo", "math_avspo"):  # the recipes' runs/<run>/metrics.jsonl, with a final eval.jsonl
        write_log(tmp_path / "runs" / run / "metrics.jsonl", [0.3] * 5)
        write_record((tmp_path / "runs" / run / "eval.jsonl").open("w"), 0, {VAL: 0.5})
    assert sorted(collect_runs([tmp_path / "runs"])) == ["math_avspo", "math_grpo"]
    for seed in ("seed0", "seed1"):
        write_log(tmp_path / "exp" / seed / "exp.jsonl", [0.3] * 5)
    assert sorted(collect_runs([tmp_path / "exp"])) == ["seed0/exp", "seed1/exp"]
    assert list(collect_runs([tmp_path / "exp"], names=["a", "b"])) == ["a", "b"]
    with pytest.raises(ValueError, match="--name was given 1 time"):
        collect_runs([tmp_path / "exp"], names=["a"])


def test_tensorboard_event_files_read_like_the_jsonl(tmp_path):
    summary_writer = pytest.importorskip("torch.utils.tensorboard", reason="needs the tensorboard package")
    writer = summary_writer.SummaryWriter(log_dir=str(tmp_path / "tensorboard_log" / "proj" / "exp"))
    for step in range(1, 6):  # verl's tensorboard logger: one add_scalar per metric and step
        writer.add_scalar("acr/rate", 0.1 * step, step)
        writer.add_scalar("critic/score/mean", 0.5, step)
    writer.close()
    runs = collect_runs([tmp_path / "tensorboard_log"])
    assert list(runs) == ["exp"]
    pd.testing.assert_series_equal(
        runs["exp"]["acr/rate"],
        pd.Series([0.1, 0.2, 0.3, 0.4, 0.5], index=pd.Index(range(1, 6), name="step"), name="acr/rate"),
        atol=1e-6,
    )


def test_wandb_history_csv(tmp_path):
    path = tmp_path / "wandb.csv"
    pd.DataFrame({"_step": [1, 2, 3], "acr/rate": [0.5, 0.4, 0.3], "_runtime": [1, 2, 3], "note": "x"}).to_csv(path)
    frame = read_run(path)
    assert frame.index.tolist() == [1, 2, 3] and frame["acr/rate"].tolist() == [0.5, 0.4, 0.3]
    assert "note" not in frame
    pd.DataFrame({"time": [1]}).to_csv(path, index=False)
    with pytest.raises(ValueError, match="has no step column"):
        read_run(path)


def test_openrlhf_wandb_history_is_read_by_its_global_step(tmp_path):
    # OpenRLHF's WandbLogger: train/<key> with train/global_step, evaluations as eval/<key> in their own
    # log calls, so wandb's _step runs ahead of the training step.
    path = tmp_path / "openrlhf.csv"
    pd.DataFrame(
        {
            "_step": [0, 1, 2, 3],
            "train/global_step": [1, 2, None, 3],
            "train/reward": [0.25, 0.5, None, 0.75],
            "train/acr/rate": [0.5, 0.4, None, 0.3],
            "eval/eval_math500_pass1": [None, None, 0.5, None],
            "eval/global_step": [None, None, 2, None],
        }
    ).to_csv(path, index=False)
    frame = read_run(path)
    assert frame["acr/rate"].to_dict() == {1: 0.5, 2: 0.4, 3: 0.3}
    assert diagnose("openrlhf", frame).row["final score"] == "0.750 (last 0.750)"
    assert frame["eval/eval_math500_pass1"].dropna().to_dict() == {2: 0.5}


def test_cli_errors_name_the_problem(tmp_path, capsys):
    with pytest.raises(SystemExit, match="no logs .* found in"):
        cli.main(["report", str(tmp_path)])
    with pytest.raises(SystemExit, match="no such log file or directory"):
        cli.main(["report", str(tmp_path / "missing.jsonl")])
    log = write_log(tmp_path / "run.jsonl", [0.4] * 5)
    with pytest.raises(SystemExit, match=r"--smooth must be >= 1 \(1 plots the raw values\); got 0"):
        cli.main(["report", str(log), "--smooth", "0", "--out", str(tmp_path / "out")])
    # The stall rule's flags get the live alert's checks and words, every bad one at once.
    with pytest.raises(SystemExit) as refused:
        cli.main(["report", str(log), "--window", "0", "--threshold", "nan", "--out", str(tmp_path / "out")])
    message = str(refused.value)
    assert "--rule, --window and --threshold set the stall rule" in message
    # Named by the flags the user gave, not by the live alert's verl keys.
    assert "--window=0 is invalid: expected an integer >= 1." in message
    assert "--threshold=nan is invalid: expected a finite number." in message and "algorithm." not in message
    assert not (tmp_path / "out").exists()


def test_a_corrupt_file_in_a_folder_does_not_hide_the_other_runs(tmp_path):
    write_log(tmp_path / "runs" / "good" / "metrics.jsonl", [0.4] * 5)
    cut = write_log(tmp_path / "runs" / "killed" / "metrics.jsonl", [0.3] * 4)
    cut.write_text(cut.read_text()[:-20])  # the run was killed while writing its last line
    (tmp_path / "runs" / "broken.jsonl").write_text("\x00\x01 not json\n")
    with pytest.warns(UserWarning) as caught:
        runs = collect_runs([tmp_path / "runs"])
    assert sorted(runs) == ["good", "killed"] and runs["killed"].shape[0] == 3
    messages = [str(w.message) for w in caught]
    assert any("killed/metrics.jsonl:4" in m for m in messages)
    assert any("skipped a log that cannot be read" in m and "broken.jsonl" in m for m in messages)


def test_an_unreadable_file_in_a_folder_is_named_in_the_text_and_counted(tmp_path, capsys):
    write_log(tmp_path / "runs" / "good" / "metrics.jsonl", [0.4] * 5)
    (tmp_path / "runs" / "broken.jsonl").write_text("\x00\x01 not json\n")
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # named in the text, not raised as a Python warning
        assert cli.main(["report", str(tmp_path / "runs"), "--out", str(out), "--fail-on", "unreadable"]) == 3
    printed = capsys.readouterr()
    assert "!! not read:" in printed.out and "broken.jsonl" in printed.out
    assert "--fail-on unreadable holds for" in printed.err
    assert "## Logs that could not be read" in (out / "summary.md").read_text()


def test_writes_go_through_atomic_write_and_an_unwritable_json_is_named(tmp_path):
    log = write_log(tmp_path / "run.jsonl", [0.4] * 5)
    target = tmp_path / "no" / "such" / "report.json"
    with pytest.raises(SystemExit, match=f"cannot write {target}: its folder does not exist"):
        cli.main(["report", str(log), "--out", str(tmp_path / "out"), "--json", str(target)])
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


def test_openrlhf_train_prefixed_metrics_are_read_as_acr(tmp_path):
    path = tmp_path / "openrlhf.jsonl"
    with path.open("w") as stream:
        for step in range(1, 4):
            write_record(
                stream, step, {"train/acr/rate": 0.5, "train/acr/all_wrong": 0.5, "train/avspo/triggered": 0.1}
            )
    frame = read_run(path)
    assert {"acr/rate", "acr/all_wrong", "avspo/triggered"} <= set(frame)
    assert diagnose("openrlhf", frame).values["acr_source"] == "acr/rate"


def test_wandb_chart_panel_csv_gives_one_run_per_series(tmp_path):
    path = tmp_path / "panel.csv"
    pd.DataFrame(
        {
            "Step": [1, 2, 3],
            "grpo-1 - acr/rate": [0.5, 0.4, 0.3],
            "grpo-1 - acr/rate__MIN": [0.4, 0.3, 0.2],
            "grpo-1 - acr/rate__MAX": [0.6, 0.5, 0.4],
            "avspo-1 - train/acr/rate": [0.2, None, 0.1],
        }
    ).to_csv(path, index=False)
    runs = collect_runs([path])
    assert sorted(runs) == ["avspo-1", "grpo-1"]
    assert runs["grpo-1"]["acr/rate"].tolist() == [0.5, 0.4, 0.3] and list(runs["grpo-1"]) == ["acr/rate"]
    assert runs["avspo-1"]["acr/rate"].dropna().tolist() == [0.2, 0.1]
    with pytest.raises(ValueError, match="panel export of 2 runs"):
        read_run(path)


def test_cli_clear_messages_for_an_empty_log_and_a_file_as_out(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(SystemExit, match=r"empty.jsonl is empty"):
        cli.main(["report", str(empty), "--out", str(tmp_path / "out")])
    log = write_log(tmp_path / "run.jsonl", [0.4] * 5)
    with pytest.raises(SystemExit, match=r"--out .*run.jsonl is an existing file"):
        cli.main(["report", str(log), "--out", str(log)])
    assert json.loads(log.read_text().splitlines()[0])["step"] == 1  # the log is untouched
    empty_csv = tmp_path / "empty.csv"
    empty_csv.write_text("")
    with pytest.raises(SystemExit, match=r"empty.csv is not a readable CSV"):
        cli.main(["report", str(empty_csv), "--out", str(tmp_path / "out")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean log reads without a warning
        collect_runs([log])


def test_json_holds_every_finding_and_figure(tmp_path, capsys):
    grpo = write_log(tmp_path / "logs" / "grpo.jsonl", [0.2] * 10 + [0.5] * 60)
    out, document = tmp_path / "report", tmp_path / "report.json"
    assert cli.main(["report", str(grpo), "--out", str(out), "--rule", "acr", "--json", str(document)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(document.read_text())
    assert report["rule"] == {
        "rule": "acr",
        "window": 50,
        "threshold": 0.35,
        "description": "ACR above 0.35 for 50 consecutive steps",
    }
    (run,) = report["runs"]
    diagnosis = diagnose("grpo", read_run(grpo), AlertConfig(rule="acr"))
    assert run["findings"] == [asdict(finding) for finding in diagnosis.findings]
    assert all(finding.headline in printed for finding in diagnosis.findings)
    assert run["row"] == diagnosis.row and run["steps"] == 70
    assert run["stalled"] is True and run["stalls"] == [{"first_step": 11, "last_step": 70, "steps": 60}]
    assert run["mean_acr"] == pytest.approx((0.2 * 10 + 0.5 * 60) / 70) and run["final_score"] == pytest.approx(0.3625)
    assert run["last_score"] == pytest.approx(0.369) and run["trend"]["direction"] == "rose"
    assert run["coverage"]["first"] == 1 and run["coverage"]["gaps"] == [] and run["unusable_columns"] == {}
    assert sorted(Path(f).name for f in report["files"]) == sorted(
        ["acr.png", "acr_split.png", "reward.png", "accuracy.png", "summary.md"]
    )
    assert report["failed"] == {}


def test_json_to_stdout_moves_the_text_to_stderr(tmp_path, capsys):
    log = write_log(tmp_path / "run.jsonl", [0.4] * 5)
    assert cli.main(["report", str(log), "--out", str(tmp_path / "out"), "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["runs"][0]["name"] == "run"
    assert "== run (5 steps; verl log)" in captured.err


def test_fail_on_sets_the_exit_status(tmp_path, capsys):
    stalled = write_log(tmp_path / "logs" / "stalled.jsonl", [0.5] * 60)
    healthy = write_log(tmp_path / "logs" / "healthy.jsonl", [0.1] * 60)
    out = ["--out", str(tmp_path / "out"), "--rule", "acr"]
    logs = [str(stalled), str(healthy)]
    assert cli.main(["report", *logs, *out, "--fail-on", "stalled"]) == 3
    assert "verl-avspo report: --fail-on stalled holds for stalled" in capsys.readouterr().err
    assert cli.main(["report", str(healthy), *out, "--fail-on", "stalled", "--fail-on", "acr_100>0.2"]) == 0
    assert cli.main(["report", *logs, *out, "--fail-on", "acr_100>0.2", "--fail-on", "incomplete"]) == 3
    assert "--fail-on acr_100>0.2 holds for stalled\n" in capsys.readouterr().err
    assert cli.main(["report", str(healthy), *out, "--fail-on", "final_score<0.5"]) == 3
    with pytest.raises(SystemExit) as refused:
        cli.main(["report", str(healthy), *out, "--fail-on", "collapse"])
    assert refused.value.code == 2
    assert "'collapse' is not a condition: use one of stalled, incomplete, no-acr, unusable" in capsys.readouterr().err


def test_fail_on_incomplete_and_no_acr(tmp_path):
    resumed = tmp_path / "resumed.jsonl"
    with resumed.open("w") as stream:
        for step in (4, 5):
            write_record(stream, step, {"critic/score/mean": 0.5})
    out = ["--out", str(tmp_path / "out")]
    assert cli.main(["report", str(resumed), *out, "--fail-on", "incomplete"]) == 3
    assert cli.main(["report", str(resumed), *out, "--fail-on", "no-acr"]) == 3
    assert cli.main(["report", str(resumed), *out, "--fail-on", "unusable"]) == 0
    assert cli.main(["report", str(resumed), *out, "--json", str(tmp_path / "r.json")]) == 0
    (run,) = json.loads((tmp_path / "r.json").read_text())["runs"]
    assert run["stalled"] is None and run["mean_acr"] is None and run["stalls"] == []
    assert run["coverage"]["starts_late"] is True and run["coverage"]["missing"] == "steps 1–3 missing"


def test_json_refuses_to_overwrite_a_log(tmp_path):
    log = write_log(tmp_path / "run.jsonl", [0.4] * 5)
    with pytest.raises(SystemExit, match=r"--json .*run.jsonl names a folder or a log"):
        cli.main(["report", str(log), "--out", str(tmp_path / "out"), "--json", str(log)])
    assert json.loads(log.read_text().splitlines()[0])["step"] == 1


def test_a_full_disk_is_named_with_the_path(tmp_path, monkeypatch):
    import errno
    import os

    log = write_log(tmp_path / "run.jsonl", [0.4] * 5)
    real_replace = os.replace

    def full(source, target):
        if str(target).endswith("summary.md"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(source, target)

    monkeypatch.setattr(os, "replace", full)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=f"cannot write {out / 'summary.md'}: no space left on the device"):
        cli.main(["report", str(log), "--out", str(out)])
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_fail_on_stalled_on_a_log_too_short_for_the_rule_says_why(tmp_path, capsys):
    log = write_log(tmp_path / "short.jsonl", [0.9] * 80)
    # Not checked is not a pass: exit status 4, told apart from 0 (passed) and 3 (held).
    assert cli.main(["report", str(log), "--out", str(tmp_path / "out"), "--fail-on", "stalled"]) == 4
    printed = capsys.readouterr()
    assert "Stall rule not checked: it needs 100 steps of history and the log has 80" in printed.out
    assert (
        "--fail-on stalled could not be checked for short (the rule needs 100 steps of history and the log has 80): "
        "exit status 4 (not a pass)"
    ) in printed.err
    out = tmp_path / "out2"
    assert cli.main(["report", str(log), "--out", str(out), "--fail-on", "stalled", "--rule", "acr"]) == 3
    long = write_log(tmp_path / "long.jsonl", [0.1] * 120)
    assert cli.main(["report", str(long), "--out", str(tmp_path / "o3"), "--fail-on", "stalled"]) == 0
    assert cli.main(["report", str(long), str(log), "--out", str(tmp_path / "o4"), "--fail-on", "stalled"]) == 4
    document = tmp_path / "r.json"
    cli.main(["report", str(log), "--out", str(tmp_path / "o5"), "--fail-on", "stalled", "--json", str(document)])
    assert json.loads(document.read_text())["unchecked"] == {
        "stalled": ["short (the rule needs 100 steps of history and the log has 80)"]
    }
