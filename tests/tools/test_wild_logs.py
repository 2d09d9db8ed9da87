"""``report`` and ``table`` on the shapes of public logs (synthetic reproductions in
``fixtures/wild_logs.py``): console logs (verl's ``step:N`` lines through Ray with ANSI colours, the
Trainer's printed dicts of older and recent transformers between ``\\r`` progress bars, OpenRLHF's
``Global step N``), a cut-off console log, every file of a folder accounted for, Tinker's group fractions,
group counts, DAPO's regeneration, custom reward and step names, a custom loop's exact-zero loss as
collapse where a zero is exceptional in its log (and not where it is the norm, only the first step's, or a
small loss's), "gain stopped" on the shapes of logs 5, 7 and N9 told at INFO (not on a rise that goes on), a
gain given back over the last third at WARN, the coverage
section, a headline that agrees with its numbers, the paper's fit only for math runs, no raw Python
warnings, reading logs without torch or verl imported, and `--no-figures` without matplotlib."""

import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from verl_avspo import cli
from verl_avspo.tools.diagnosis import diagnose
from verl_avspo.tools.logs import collect_runs, read_run
from verl_avspo.tools.signals import Trend
from verl_avspo.tools.table import table_rows

_SPEC = importlib.util.spec_from_file_location("wild_logs", Path(__file__).parent / "fixtures" / "wild_logs.py")
wild_logs = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(wild_logs)


def headlines(diagnosis):
    return [f"[{f.severity}] {f.headline}" for f in diagnosis.findings]


def test_verl_console_log_reads_through_ray_prefixes_colours_and_progress_bars(tmp_path):
    frame = read_run(wild_logs.verl_console(tmp_path / "train.log", steps=30, collapse_from=13))
    assert frame.index.tolist() == list(range(31))  # step 0: the validation before training
    assert "max_num_seqs" not in frame  # a key=value line among verl's is other output
    assert frame.loc[0, "val-core/gsm8k/acc/mean@1"] == 0.25  # np.float64(0.25)
    assert frame.loc[5, "critic/score/mean"] == pytest.approx(0.25) and "planned_steps" not in frame.attrs
    diagnosis = diagnose("train", frame)
    assert diagnosis.values["framework"] == "verl" and diagnosis.steps == 30
    assert "[ALERT] Every group collapsed on 18 of 30 logged rows (critic/score/max == critic/score/min)" in (
        headlines(diagnosis)
    )
    # Truncation 0.9 on the collapsed rows vs 0.05 elsewhere: tied to the collapse.
    assert any(h.startswith("[ALERT] Likely cause of collapse: 56% of completions cut") for h in headlines(diagnosis))


def test_a_cut_off_console_log_is_read_as_far_as_it_goes_with_a_warning(tmp_path):
    path = wild_logs.verl_console(tmp_path / "killed.log", steps=10, planned=30, cut=True)
    with pytest.warns(UserWarning, match=r"killed.log:\d+ \(the last line is cut off"):
        frame = read_run(path)
    assert frame.index.max() == 10
    said = diagnose("killed", frame).findings[0]
    assert said.severity == "WARN" and "it ends at step 10 of the 30 its progress bar planned" in said.headline
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["report", str(path), "--out", str(tmp_path / "out"), "--fail-on", "incomplete"]) == 3


@pytest.mark.parametrize("as_strings", [True, False])
def test_trainer_printed_dicts_take_the_progress_bar_step(tmp_path, as_strings):
    frame = read_run(wild_logs.trl_console(tmp_path / "out.txt", steps=20, logging_steps=2, as_strings=as_strings))
    assert frame.index.tolist() == list(range(2, 21, 2)) and "train_runtime" not in frame
    assert frame.loc[10, "eval_reward"] == 0.3 and frame.loc[20, "reward"] == pytest.approx(0.5)
    diagnosis = diagnose("out", frame)
    assert diagnosis.values["framework"] == "trl" and diagnosis.values["acr_source"] == "frac_reward_zero_std"
    assert diagnosis.values["coverage"]["stride"] == 2 and not diagnosis.values["coverage"]["gaps"]


def test_printed_dicts_without_a_progress_bar_are_numbered_in_order_with_a_warning(tmp_path):
    path = tmp_path / "nobar.log"
    path.write_text("".join(str({"loss": 0.1, "reward": 0.1 * i, "epoch": i}) + "\n" for i in range(1, 4)))
    with pytest.warns(UserWarning, match="the 3 dicts are numbered 1, 2, ... in order"):
        assert read_run(path).index.tolist() == [1, 2, 3]


def test_printed_dicts_with_nan_broken_lines_and_a_sparse_progress_bar(tmp_path):
    path = tmp_path / "unsloth.log"
    first = "{'loss': 0.0, 'grad_norm': nan, 'reward': -3.5, 'epoch': 0.0}"
    broken = (
        "{'loss': 0.0, 'grad_norm': 0.2, 'completions/max_terminated_len\ngth': 578.0, 'reward': -2.0, 'epoch': 0.1}"
    )
    path.write_text(
        f"  0%|   | 0/20 [00:00<?, ?it/s]\n{first}\n{broken}\n{first}\n 10%|#  | 10/20 [00:10<00:10]\n{first}\n"
    )
    with pytest.warns(UserWarning, match="the 4 dicts are numbered 1, 2, ... in order, each a logging step"):
        frame = read_run(path)
    assert (
        frame.index.tolist() == [1, 2, 3, 4] and frame.loc[2, "reward"] == -2.0 and "planned_steps" not in frame.attrs
    )
    assert frame["grad_norm"].isna().sum() == 3 and frame.loc[2, "completions/max_terminated_length"] == 578.0


def test_a_custom_loops_key_value_progress_lines(tmp_path):
    frame = read_run(wild_logs.custom_progress(tmp_path / "run.log"))
    assert frame.index.tolist() == list(range(1, 21)) and frame.loc[3, "acc"] == 0.0 and frame.loc[4, "acc"] == 0.25
    diagnosis = diagnose("run", frame)
    source = "reward at 0 or 1, or loss == 0"  # its loss is 0 exactly where its reward is
    assert diagnosis.values["score_metric"] == "reward" and diagnosis.values["acr_source"] == source
    assert f"[WARN] Every group collapsed on 6 of 20 logged rows ({source})" in headlines(diagnosis)
    assert diagnosis.values["all_wrong"] == pytest.approx(0.3) and diagnosis.values["all_correct"] == 0.0


def _zero_loss_steps(rng: np.random.Generator, steps: int = 100) -> tuple[list[float], list[float]]:
    """N10's shape: loss exactly 0 on 55 of 100 steps, at a mean reward of 0.1, 0.3 or 0.5 (every group
    collapsed, some all correct); elsewhere a loss between 0.07 and 7 in size and a reward in 80ths."""
    zero = np.zeros(steps, dtype=bool)
    zero[rng.choice(np.arange(2, steps), 55, replace=False)] = True
    losses = np.where(zero, 0.0, rng.choice([-1, 1], steps) * rng.uniform(0.07, 7.0, steps))
    rewards = np.where(zero, rng.choice([0.1, 0.3, 0.5], steps), rng.integers(7, 36, steps) / 80)
    return losses.tolist(), rewards.tolist()


def test_an_exact_zero_loss_is_collapse_where_it_is_exceptional_in_the_log(tmp_path):
    losses, rewards = _zero_loss_steps(np.random.default_rng(0))
    diagnosis = diagnose("grpo_100_math", read_run(wild_logs.custom_losses(tmp_path / "math.log", losses, rewards)))
    source = "reward at 0 or 1, or loss == 0"
    assert diagnosis.values["acr_source"] == source and diagnosis.values["mean_acr"] == pytest.approx(0.55)
    assert f"[ALERT] Every group collapsed on 55 of 100 logged rows ({source})" in headlines(diagnosis)
    # a reward of 0.3 on a collapsed step is groups of both kinds: the split is not claimed
    assert diagnosis.values["all_correct"] is None and diagnosis.values["all_wrong"] is None
    assert {"loss", "reward"} <= diagnosis.used
    assert any(h.startswith("[WARN] No gain") and h.endswith("while collapse is high") for h in headlines(diagnosis))


@pytest.mark.parametrize(
    "case",
    [
        "zero on every step",  # a group-mean loss on-policy with no KL term: 0 by construction
        "rounding",  # about 0 by construction, logged with 4 decimals
        "first step only",  # ratio 1 and KL 0 on the first step of any loop
        "a growing KL",  # 0 until the KL term grows, passing near 0
        "too few others",  # 4 values to judge the loss's spread by
    ],
)
def test_an_exact_zero_loss_is_not_collapse_where_zero_is_the_norm(tmp_path, case):
    steps = 40
    rewards = [0.25 + 0.005 * (step % 7) for step in range(steps)]
    losses = {
        "zero on every step": [0.0] * steps,
        "rounding": [[0.0, 0.0001, -0.0001, 0.0002][step % 4] for step in range(steps)],
        "first step only": [0.0] + [(-1) ** step * 1.5 for step in range(1, steps)],
        "a growing KL": [round(1e-5 * step**2, 4) for step in range(steps)],
        "too few others": [0.0] * (steps - 4) + [1.5] * 4,
    }[case]
    diagnosis = diagnose("run", read_run(wild_logs.custom_losses(tmp_path / "run.log", losses, rewards)))
    assert diagnosis.values["acr_source"] == "reward at 0 or 1" and diagnosis.values["mean_acr"] == 0.0
    assert "loss" not in diagnosis.used


def test_a_frameworks_log_keeps_its_own_collapse_measure_beside_a_zero_loss(tmp_path):
    path = tmp_path / "trl.jsonl"  # TRL's loss is 0 by construction: its reward_std says where groups collapsed
    rows = [
        {"step": step, "loss": 0.0 if step % 2 else 1.5, "reward": 0.5, "reward_std": 0.0 if step == 3 else 0.3}
        for step in range(1, 21)
    ]
    path.write_text("".join(json.dumps(row | {"completions/mean_length": 100.0}) + "\n" for row in rows))
    assert diagnose("trl", read_run(path)).values["acr_source"] == "reward_std == 0"


def _gain_shapes(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
    """The reward of logs 5 (a slow rise over two thirds of 200 rows every 5 steps, then flat), 7 (flat, a
    jump at two thirds of 300 rows every 2 steps, flat after) and N9 (8 completions a step: a rise over the
    first third of 100 steps, then flat): each shape's mean, its rows drawn around it, its logging interval."""
    five = np.r_[np.linspace(0.34, 0.40, 134), np.full(66, 0.40)]
    seven = np.r_[np.full(200, 4.3), np.full(100, 4.8)]
    nine = np.r_[np.linspace(0.15, 0.35, 35), np.full(65, 0.35)]
    return {
        "5": (five, five + rng.normal(0, 0.03, 200), 5),
        "7": (seven, seven + rng.normal(0, 0.5, 300), 2),
        "N9": (nine, rng.binomial(8, nine) / 8, 1),
    }


def _reward_log(path: Path, rewards: np.ndarray, every: int) -> Path:
    path.write_text("".join(json.dumps({"step": every * i, "reward_mean": r}) + "\n" for i, r in enumerate(rewards, 1)))
    return path


@pytest.mark.parametrize("shape", ["5", "7", "N9"])
def test_gain_stopped_on_a_rise_whose_last_third_has_no_trend(tmp_path, shape):
    """A rise with no trend over its last third is told ("Gain stopped", with the best step) at INFO, the
    same on the three shapes: no trend is no fall, and no statistic tells these stops apart."""
    mean, rewards, every = _gain_shapes(np.random.default_rng(0))[shape]
    diagnosis = diagnose("run", read_run(_reward_log(tmp_path / "run.jsonl", rewards, every)))
    trend = next(f for f in diagnosis.findings if f.headline.startswith(("Gain", "No gain", "Reward")))
    assert trend.severity == "INFO" and trend.headline.startswith("Gain stopped")
    assert any(line.startswith("no trend is not a fall") for line in trend.evidence)
    assert diagnosis.values["trend"]["direction"] == "rose" and diagnosis.values["trend"]["recent_p_value"] >= 0.05
    # the same noise around a rise that goes on through the last third
    rising = rewards - mean + np.linspace(mean[0], mean[0] + 10 * (rewards - mean).std(), len(mean))
    trend = next(
        f
        for f in diagnose("run", read_run(_reward_log(tmp_path / "on.jsonl", rising, every))).findings
        if f.headline.startswith(("Gain", "No gain", "Reward"))
    )
    assert trend.severity == "INFO" and trend.headline.startswith("Reward rose")


def test_a_reward_at_its_ceiling_is_not_a_gain_problem(tmp_path):
    path = tmp_path / "solved.jsonl"
    rewards = [0.9 + 0.01 * i for i in range(8)] + [0.998] * 20
    path.write_text("".join(json.dumps({"step": i, "reward_mean": r}) + "\n" for i, r in enumerate(rewards, 1)))
    trend = next(f for f in diagnose("solved", read_run(path)).findings if "Reward" in f.headline)
    assert trend.severity == "INFO" and trend.headline == "Reward at its ceiling: 0.998 of 1 over the last fifth"
    path.write_text("".join(json.dumps({"step": i, "reward_mean": r / 2}) + "\n" for i, r in enumerate(rewards, 1)))
    trend = next(f for f in diagnose("half", read_run(path)).findings if "Gain" in f.headline)
    assert trend.severity == "INFO" and trend.headline.startswith("Gain stopped")


def test_a_gain_given_back_over_the_last_third_is_a_warning(tmp_path):
    """A reward that rose over the run (p < 0.05) and fell over its last third (p < 0.05) is "Gain lost"
    (WARN), naming where the last third starts and the best step to keep; under 12 rows the last third
    is not judged."""
    rewards = np.r_[np.linspace(0.1, 0.6, 40), np.linspace(0.6, 0.45, 20)] + np.tile([-0.01, 0.01], 30)
    diagnosis = diagnose("lost", read_run(_reward_log(tmp_path / "lost.jsonl", rewards, 1)))
    trend = next(f for f in diagnosis.findings if "Gain" in f.headline)
    assert trend.severity == "WARN" and trend.headline.startswith("Gain lost") and "since step 41" in trend.headline
    assert diagnosis.values["trend"]["recent_tau"] < 0 and diagnosis.values["trend"]["recent_p_value"] < 0.05
    assert any(line.startswith("best at step 40") for line in trend.evidence)
    short = diagnose(
        "short",
        read_run(_reward_log(tmp_path / "short.jsonl", [0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.85, 0.8, 0.75], 1)),
    )
    assert not any(f.headline.startswith("Gain lost") for f in short.findings)
    assert short.values["trend"]["recent_tau"] == 0.0


def test_printed_config_dicts_are_not_metrics(tmp_path):
    path = tmp_path / "crashed.log"  # verl prints its config as dicts, then crashed before step 1
    path.write_text("(TaskRunner pid=1) {'actor': {'clip_ratio': 0.2, 'entropy_coeff': 0.001}}\nNotImplementedError\n")
    with pytest.raises(ValueError, match="holds no metrics record"):
        read_run(path)


def test_openrlhf_console_lines(tmp_path):
    frame = read_run(wild_logs.openrlhf_console(tmp_path / "orl.out"))
    assert frame.index.tolist() == list(range(1, 13)) and frame.loc[3, "reward"] == pytest.approx(0.33)
    assert diagnose("orl", frame).values["framework"] == "openrlhf"


def test_tinker_group_fractions_are_collapse_split_into_good_and_bad(tmp_path):
    frame = read_run(wild_logs.tinker_metrics(tmp_path / "metrics.jsonl"))
    diagnosis = diagnose("minesweeper", frame)
    values = diagnosis.values
    assert values["acr_source"] == "env/all/by_group/frac_all_good + frac_all_bad"
    assert values["mean_acr"] == pytest.approx(0.6) and values["all_correct"] == pytest.approx(0.3)
    assert values["score_metric"] == "env/all/reward/total"
    assert "[INFO] Reward rose: 0.186 → 0.884" in headlines(diagnosis) and diagnosis.steps == 20
    assert not any("Paper's fit" in h for h in headlines(diagnosis))  # not a math run


@pytest.mark.parametrize(
    ("lengths", "cut"), [([900, 1500, 2600, 4096, 4096, 4096, 4096, 4096], True), ([5] * 7 + [4.9], False)]
)
def test_lengths_that_run_up_to_one_maximum_and_stay_are_the_cap(tmp_path, lengths, cut):
    # Tinker logs no cut ratio: completions that all reach the cap show as a mean length stuck at its maximum;
    # answers that are always short do not.
    path = tmp_path / "metrics.jsonl"
    records = [{"step": i, "env/all/reward/total": 0.2, "env/all/ac_tokens_per_turn": n} for i, n in enumerate(lengths)]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    said = [f.headline for f in diagnose("run", read_run(path)).findings if "length cap" in f.headline]
    assert said == (["62% of completions cut at the length cap on average (100% over the last fifth)"] if cut else [])


def test_dapo_regeneration_is_collapse_evidence_not_an_acr_of_zero(tmp_path):
    path = wild_logs.dapo_file_log(tmp_path / "dapo.jsonl")
    diagnosis = diagnose("dapo", read_run(path))
    assert (
        "[WARN] Collapsed groups filtered out before logging (DAPO's dynamic sampling): generated again on 20 of "
        "20 steps"
    ) in headlines(diagnosis)
    assert diagnosis.values["mean_acr"] is None and diagnosis.values["stalled"] is None
    (row,) = table_rows([path])
    assert row.acr_final is None and "generated again on 20 of 20 steps" in row.notes[-1]
    path = wild_logs.dapo_file_log(tmp_path / "dapo1.jsonl", gen_batches=1)
    assert diagnose("dapo", read_run(path)).findings[0].severity == "INFO"


def test_iteration_step_column_reward_mean_and_group_counts(tmp_path):
    frame = read_run(wild_logs.iteration_csv(tmp_path / "custom.csv"))
    diagnosis = diagnose("custom", frame)
    assert diagnosis.values["score_metric"] == "reward_mean"
    assert diagnosis.values["acr_source"] == "skipped_groups / n_groups"
    assert diagnosis.values["mean_acr"] == pytest.approx((4 * 0.5 + 11 * 0.125) / 15)
    path = tmp_path / "custom.jsonl"
    path.write_text("".join(json.dumps({"iteration": i, "mean_reward": 0.1 * i}) + "\n" for i in range(1, 6)))
    assert diagnose("custom", read_run(path)).values["score_metric"] == "mean_reward"
    columnar = tmp_path / "history.json"
    columnar.write_text(json.dumps({"step": [1, 2, 3], "reward_mean": [0.1, 0.2, 0.3], "name": "run"}))
    assert read_run(columnar)["reward_mean"].tolist() == [0.1, 0.2, 0.3]


def test_a_folder_accounts_for_every_file_and_reads_what_reads_alone(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    wild_logs.verl_console(runs / "verl_console.txt")
    wild_logs.trl_console(runs / "trl.log")
    wild_logs.tinker_metrics(runs / "tinker.jsonl")
    (runs / "training_logs.json").write_text(json.dumps([{"step": s, "reward": 0.1 * s} for s in range(1, 6)]))
    (runs / "config.json").write_text(json.dumps({"lr": 1e-6}))
    (runs / "samples.jsonl").write_text(json.dumps({"prompt": "1+1", "completion": "2"}) + "\n")
    (runs / "notes.md").write_text("a run\n")
    (runs / "model.safetensors").write_bytes(b"\0" * 16)
    (runs / "broken.csv").write_text("")
    alone = {path.name for path in runs.iterdir() if _reads_alone(path)}
    unreadable, skipped = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = collect_runs([runs], unreadable=unreadable, skipped=skipped)
    assert sorted(found) == ["tinker", "training_logs", "trl", "verl_console"]
    assert {name + suffix for name, suffix in zip(found, (".jsonl", ".json", ".log", ".txt"), strict=True)} == alone
    named = unreadable + skipped
    for path in runs.iterdir():  # every file: a run, or named with its reason
        assert path.stem in found or any(str(path) in entry for entry in named), path
    assert any("config.json (JSON without a step or a log_history: a config?)" in entry for entry in skipped)
    assert any("samples.jsonl (JSON lines without a step" in entry for entry in skipped)
    assert any("broken.csv" in problem for problem in unreadable)


def _reads_alone(path: Path) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            read_run(path)
    except ValueError:
        return False
    return True


def test_report_cli_prints_warnings_as_lines_and_names_files_not_read(tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    wild_logs.verl_console(runs / "killed.log", steps=10, planned=30, cut=True)
    (runs / "config.json").write_text("{}")
    out = tmp_path / "report"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a raw Python warning would fail here
        assert cli.main(["report", str(runs), "--out", str(out), "--json", str(tmp_path / "r.json")]) == 0
    printed = capsys.readouterr().out
    assert "-- warning: skipped 1 line(s)" in printed and "UserWarning" not in printed
    assert "-- not a log, not read: 1 file(s), JSON without a step or a log_history: a config?" in printed
    assert "## Reading the logs" in (out / "summary.md").read_text()
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["not_logs"] == [f"{runs / 'config.json'} (JSON without a step or a log_history: a config?)"]
    keys = document["runs"][0]["keys"]
    assert "critic/score/mean" in keys["used"] and "timing_s/step" in keys["not_used"]


def test_table_names_every_file_of_a_folder_it_does_not_read(tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    wild_logs.tinker_metrics(runs / "tinker.jsonl")
    wild_logs.dapo_file_log(runs / "dapo.jsonl")
    (runs / "config.json").write_text("{}")
    assert cli.main(["table", str(runs)]) == 0  # a file that is no log is named, not an error
    printed = capsys.readouterr()
    assert "| tinker |" in printed.out and "| dapo |" in printed.out
    assert "not a log, not read: 1 file(s), JSON without a step or a log_history: a config?" in printed.err
    assert "- dapo: no ACR: steps where DAPO's dynamic sampling had to generate again" in printed.out


def test_the_coverage_finding_lists_keys_read_and_not_read(tmp_path):
    diagnosis = diagnose("train", read_run(wild_logs.verl_console(tmp_path / "t.log")))
    keys = diagnosis.findings[-1]
    assert keys.headline == "Log keys: 6 of 9 numeric keys read by the findings"
    assert keys.evidence[1] == "not read: actor/pg_loss, actor/grad_norm, timing_s/step (--json lists them all)"


def test_a_fall_that_is_not_significant_is_said_so_not_flat():
    fell = Trend(0.398, 0.125, 0.12, 3, -0.3, 0.09, 0.45, 4, 10, 0.0, 0.5)
    assert fell.direction == "flat" and fell.said == "fell, not significant (p 0.09)"
    flat = Trend(0.4, 0.401, 0.4, 3, 0.0, 0.9, 0.45, 4, 10, 0.0, 0.5)
    assert flat.said == "flat"


def test_paper_fit_only_for_math_runs_or_on_request(tmp_path):
    path = tmp_path / "minesweeper.jsonl"
    with path.open("w") as stream:
        for step in range(1, 121):
            stream.write(json.dumps({"step": step, "data": {"acr/rate": 0.4, "critic/score/mean": 0.3}}) + "\n")
    frame = read_run(path)
    assert not any("Paper's fit" in h for h in headlines(diagnose("minesweeper", frame)))
    assert any("Paper's fit" in h for h in headlines(diagnose("minesweeper", frame, paper_fit=True)))
    assert any("Paper's fit" in h for h in headlines(diagnose("qwen-math-grpo", frame)))


def _fresh_python(code: str) -> list[str]:
    """The lines ``code`` prints in a new interpreter (warnings off): the modules it holds are its own."""
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def test_reading_and_diagnosing_logs_imports_neither_torch_nor_verl(tmp_path):
    log = wild_logs.verl_console(tmp_path / "t.log")
    printed = _fresh_python(
        "import sys; from verl_avspo.tools.report import write_report; from verl_avspo.tools.logs import collect_runs; "
        f"write_report(collect_runs([{str(log)!r}]), {str(tmp_path / 'out')!r}); "
        "print(sorted(m for m in ('torch', 'verl', 'ray', 'transformers') if m in sys.modules))"
    )
    assert printed == ["[]"]


def test_no_figures_writes_the_findings_without_importing_matplotlib(tmp_path):
    """``report --no-figures`` writes summary.md (saying no figure was drawn) and prints the findings, with
    no PNG and matplotlib never imported; a report with figures draws them."""
    log = wild_logs.verl_console(tmp_path / "t.log")
    printed = _fresh_python(
        "import sys; from verl_avspo import cli; "
        f"status = cli.main(['report', {str(log)!r}, '--out', {str(tmp_path / 'out')!r}, '--no-figures']); "
        "print(status, 'matplotlib' in sys.modules)"
    )
    assert printed[-1] == "0 False" and "== t (30 steps; verl log)" in printed
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["summary.md"]
    assert "Not drawn: every figure (--no-figures)." in (tmp_path / "out" / "summary.md").read_text()
    assert cli.main(["report", str(log), "--out", str(tmp_path / "drawn")]) == 0
    assert (tmp_path / "drawn" / "reward.png").exists()
