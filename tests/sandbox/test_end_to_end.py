"""The CPU sandbox end to end: a few real RL steps through verl's compute_advantage and policy
loss, its outputs, the consistency of its metrics, and determinism. Tiny settings throughout
(20 warm-up steps, 8 held-out problems per level, 4 RL steps) to stay within seconds. DAPO's dynamic
sampling (dapo_resample), the rollout counts every run logs, the epochs mode (--train-set) and the
rate's linear warm-up are checked on their own runs. The summary's no-training row, its rollouts
columns, title and gated verdicts; --out protected by --force; an epochs run too short refused before
training; --fingerprint's verdict against the documented machines."""

import functools
import json
import math
import re
import warnings
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from verl_avspo.cli import main
from verl_avspo.tools.logs import read_metrics
from verl_avspo.tools.stats import FINAL_EVALUATIONS, window_mean

pytestmark = pytest.mark.verl

ESTIMATORS = "grpo,avspo:paper_code,dapo,dcpo,intuitor,rent"
LABELS = ("grpo", "avspo-paper_code", "dapo", "dcpo", "intuitor", "rent")
TINY = ["--steps", "4", "--seeds", "1", "--sft-steps", "20", "--eval-size", "8", "--eval-every", "2"]
TINY += ["--group-size", "8"]  # the rollout counts below are of 16 prompts x 8 answers


@pytest.fixture(scope="module")
def torch_settings():
    """The sandbox fixes torch's thread count and deterministic mode; restore them afterwards."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


@pytest.fixture(scope="module")
def comparison(tmp_path_factory, torch_settings):
    out = tmp_path_factory.mktemp("sandbox")
    cache = out / "cache"
    assert main(["sandbox", "--estimators", ESTIMATORS, "--out", str(out), "--cache-dir", str(cache), *TINY]) == 0
    return out


def _runs(out):
    return {label: read_metrics(out / "runs" / label / "seed0.jsonl") for label in LABELS}


def _sandbox_again(comparison, out, estimators, *flags) -> int:
    """``verl-avspo sandbox`` again from the comparison's warmed-up policy (its cache), into ``out``."""
    cache = comparison / "cache"
    return main(["sandbox", "--estimators", estimators, "--out", str(out), "--cache-dir", str(cache), *TINY, *flags])


def test_outputs_exist(comparison):
    for name in ("summary.md", "acr.png", "accuracy.png"):
        assert (comparison / name).stat().st_size > 0, name
    assert (comparison / "acr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for frame in _runs(comparison).values():
        assert list(frame.index) == [0, 1, 2, 3, 4]  # step 0: evaluation of the warm-up model
        assert frame.loc[1:, "acr/rate"].notna().all()
        assert frame.loc[[0, 2, 4], "eval/acc_mean"].notna().all()  # every eval_every steps and at the end


def test_acr_metrics_are_consistent(comparison):
    runs = _runs(comparison)
    for frame in runs.values():
        steps = frame.loc[1:]
        assert steps["acr/rate"].between(0, 1).all()
        assert (steps["acr/all_correct"] + steps["acr/all_wrong"] - steps["acr/rate"]).abs().max() < 1e-12
        assert (steps["acr/groups"] == 16).all()  # prompts_per_step groups of G=8, no singletons
    grpo, avspo, dapo = runs["grpo"].loc[1:], runs["avspo-paper_code"].loc[1:], runs["dapo"].loc[1:]
    pd.testing.assert_series_equal(grpo["acr/effective"], grpo["acr/rate"], check_names=False)
    assert (avspo["acr/effective"] <= avspo["acr/rate"]).all()
    # paper_code augments every collapsed group, so none is left at zero advantage.
    assert (avspo["acr/effective"] == 0).all() and (avspo["acr/rate"] > 0).any()
    assert (avspo["avspo/triggered"] == avspo["acr/rate"]).all()
    # dapo keeps exactly the groups that did not collapse.
    pd.testing.assert_series_equal(dapo["train/kept_groups"], 1 - dapo["acr/rate"], check_names=False)


def test_first_step_is_shared_by_estimators_with_the_same_seed(comparison):
    # Same seed: same warm-up model, same prompts, same samples at step 1, so the same verifier
    # rewards and entropy (the intrinsic-reward runs measure ACR on their own reward).
    runs = _runs(comparison)
    first = [frame.loc[1, ["train/reward_mean", "actor/entropy"]] for frame in runs.values()]
    for other in first[1:]:
        pd.testing.assert_series_equal(first[0], other)
    verifier = [runs[label].loc[1, "acr/rate"] for label in ("grpo", "avspo-paper_code", "dapo", "dcpo")]
    assert len(set(verifier)) == 1


def test_summary_reports_the_measured_numbers(comparison):
    summary = (comparison / "summary.md").read_text()
    grpo = _runs(comparison)["grpo"]
    raw = grpo.loc[1:, "acr/rate"].mean()
    assert f"| `grpo` | {raw:.3f} | {raw:.3f} |" in summary
    acc = 100 * window_mean(grpo["eval/acc_mean"], FINAL_EVALUATIONS)  # the last five evaluations' mean
    assert "final mean greedy accuracy" in summary and f"vs {acc:.1f}%" in summary
    assert summary.count("vs `grpo`**") == 5  # one verdict per other estimator
    assert "| `intuitor` † |" in summary and "| `rent` † |" in summary and "| `dcpo` |" in summary
    assert "raw ACR is not comparable" in summary
    assert "from a single seed" in summary  # one seed: the verdict refuses to call a winner
    assert "'ACR, step 1' is the early-training ACR" in summary and "| ACR, step 1 |" in summary  # 4 steps // 5 = 0


def test_paper_baselines_in_the_loop(comparison):
    runs = _runs(comparison)
    for frame in runs.values():
        # Token-mean entropy of the sampling policy, in nats: within [0, log V] for V = 16 tokens.
        assert frame.loc[1:, "actor/entropy"].between(0, math.log(16)).all()
    grpo, dcpo = runs["grpo"].loc[1:], runs["dcpo"].loc[1:]
    # Step 1 is every problem's first visit: DCPO's advantages are GRPO's there.
    assert dcpo.loc[1, "acr/effective"] == grpo.loc[1, "acr/effective"]
    assert (dcpo["acr/effective"] <= dcpo["acr/rate"]).all()
    for label in ("intuitor", "rent"):
        steps = runs[label].loc[1:]
        # Continuous intrinsic rewards tie only when a group repeats one answer; the verifier's often do.
        assert (steps["acr/rate"] < grpo["acr/rate"]).all()
        assert (steps["acr/effective"] == steps["acr/rate"]).all()  # GRPO on that reward
        # Their reward is not the verifier's, so their loss differs from GRPO's at the same step-1 samples.
        assert steps.loc[1, "actor/pg_loss"] != grpo.loc[1, "actor/pg_loss"]
    # Self-certainty is a KL divergence (> 0 for a trained policy); RENT's reward is minus an entropy.
    assert (runs["intuitor"].loc[1:, "train/intrinsic_reward_mean"] > 0).all()
    assert (runs["rent"].loc[1:, "train/intrinsic_reward_mean"] < 0).all()


def test_dcpo_runs_verls_registered_estimator_and_loss_keyed_by_problem_text(comparison, monkeypatch, tmp_path):
    from verl.trainer.ppo import core_algos

    from verl_avspo.core.run_tracker import RunTracker

    keys, losses = [], []
    set_prompt_keys, get_policy_loss_fn = RunTracker.set_prompt_keys, core_algos.get_policy_loss_fn

    def record_keys(tracker, keys_by_uid):
        keys.append(dict(keys_by_uid))
        set_prompt_keys(tracker, keys_by_uid)

    def record_loss(name):
        loss = get_policy_loss_fn(name)

        @functools.wraps(loss)  # still our loss to verl_avspo's registration, which asks this getter what dcpo holds
        def call(*args, **kwargs):
            losses.append((name, kwargs["config"].clip_ratio_c))
            return loss(*args, **kwargs)

        return call

    monkeypatch.setattr(RunTracker, "set_prompt_keys", record_keys)
    monkeypatch.setattr(core_algos, "get_policy_loss_fn", record_loss)
    assert _sandbox_again(comparison, tmp_path, "dcpo") == 0
    assert len(keys) == 4 and all(len(step) == 16 for step in keys)  # one key per group, every step
    for step, keys_by_uid in enumerate(keys, start=1):
        assert all(uid.startswith(f"{step}-") for uid in keys_by_uid)
        assert all(re.fullmatch(r"\d+[+*]\d+=", prompt) for prompt in keys_by_uid.values())  # the problem
    assert losses and set(losses) == {("dcpo", 10.0)}


def test_same_seed_same_metrics(comparison, tmp_path):
    from verl_avspo.sandbox.config import PolicyConfig, SandboxConfig
    from verl_avspo.sandbox.estimators import parse_estimators
    from verl_avspo.sandbox.loop import train

    config = SandboxConfig(group_size=8, steps=3, eval_every=3, eval_size=8, policy=PolicyConfig(sft_steps=20))
    (avspo,) = parse_estimators("avspo")
    logs = [tmp_path / f"{name}.jsonl" for name in ("a", "b", "other_seed")]
    for path, seed in zip(logs, (0, 0, 1), strict=True):
        train(config, avspo, seed, path, comparison / "cache")
    assert logs[0].read_text() == logs[1].read_text()
    assert logs[0].read_text() != logs[2].read_text()
    paper = read_metrics(logs[0]).loc[1:]
    assert (paper["acr/effective"] <= paper["acr/rate"]).all()
    assert paper["avspo/threshold"].between(0.1, 0.9).all()


def test_the_rate_ramps_up_as_verls_constant_schedule_with_warm_up(comparison, tmp_path):
    """A ramp over half of 4 steps: the rate of steps 1..4 is 0, lr/2, lr, lr (verl's
    get_constant_schedule_with_warmup over int(0.5 * 4) steps), logged as actor/lr; at rate 0 the first update
    leaves the warmed-up policy as it was. Without a ramp every step trains at lr."""
    from verl_avspo.sandbox.config import PolicyConfig, SandboxConfig
    from verl_avspo.sandbox.estimators import parse_estimators
    from verl_avspo.sandbox.loop import train

    config = SandboxConfig(
        group_size=8, steps=4, eval_every=4, eval_size=8, lr_warmup_steps_ratio=0.5, policy=PolicyConfig(sft_steps=20)
    )
    (grpo,) = parse_estimators("grpo")
    weights = {}

    def keep_weights(step, model, batch):
        weights[step] = torch.cat([p.detach().flatten().clone() for p in model.parameters()])

    train(config, grpo, 0, tmp_path / "ramp.jsonl", comparison / "cache", on_rollout=keep_weights)
    rates = read_metrics(tmp_path / "ramp.jsonl").loc[1:, "actor/lr"].tolist()
    assert rates == pytest.approx([0.0, config.lr / 2, config.lr, config.lr])
    assert torch.equal(weights[1], weights[2])  # step 1 trained at rate 0
    assert not torch.equal(weights[2], weights[3])
    train(replace(config, lr_warmup_steps_ratio=0), grpo, 0, tmp_path / "constant.jsonl", comparison / "cache")
    assert read_metrics(tmp_path / "constant.jsonl").loc[1:, "actor/lr"].tolist() == [config.lr] * 4
    # The summary names the ramp: the comparison's 4 steps at the default share (150/360) ramp over int(1.67) = 1.
    assert "AdamW lr 0.0002 at 0 for the first step; seeds" in (comparison / "summary.md").read_text()


def test_seed_start_runs_the_seeds_it_names(comparison, tmp_path):
    """--seed-start 0 reproduces the default seeds; --seed-start 1 runs seed 1, a different run."""
    for start in (0, 1):
        assert _sandbox_again(comparison, tmp_path / str(start), "grpo", "--seed-start", str(start)) == 0
    seed0 = (tmp_path / "0" / "runs" / "grpo" / "seed0.jsonl").read_text()
    assert seed0 == (comparison / "runs" / "grpo" / "seed0.jsonl").read_text()
    assert sorted(p.name for p in (tmp_path / "1" / "runs" / "grpo").iterdir()) == ["seed1.jsonl"]
    assert (tmp_path / "1" / "runs" / "grpo" / "seed1.jsonl").read_text() != seed0
    assert "seeds 1..1" in (tmp_path / "1" / "summary.md").read_text()


def test_dapo_resample_trains_on_full_batches_and_counts_every_rollout(torch_settings, tmp_path):
    from verl_avspo.sandbox.config import PolicyConfig, SandboxConfig
    from verl_avspo.sandbox.estimators import parse_estimators
    from verl_avspo.sandbox.loop import train

    # 200 warm-up steps: about half the groups collapse, so re-sampling has work to do.
    config = SandboxConfig(
        group_size=8,
        levels="1+1,2+1,1*1",
        steps=4,
        eval_every=2,
        eval_size=8,
        max_gen_batches=4,
        policy=PolicyConfig(sft_steps=200),
    )
    frames = {}
    for spec in parse_estimators("grpo,dapo_resample"):
        train(config, spec, 0, tmp_path / f"{spec.label}.jsonl", tmp_path / "cache")
        frames[spec.label] = read_metrics(tmp_path / f"{spec.label}.jsonl")
    grpo, resample = frames["grpo"], frames["dapo_resample"]
    assert (grpo.loc[1:, "train/rollouts_generated"] == 128).all()  # 16 prompts x G=8, every step
    assert grpo["train/rollouts_cumulative"].tolist() == [0, 128, 256, 384, 512]  # step 0 (the warm-up's eval) too
    steps = resample.loc[1:]
    assert steps["train/gen_batches"].between(1, 4).all() and (steps["train/gen_batches"] > 1).any()
    # It pays for every response of every batch it drew, and its raw ACR is over all of those groups.
    assert (steps["train/rollouts_generated"] == 128 * steps["train/gen_batches"]).all()
    assert (steps["train/rollouts_cumulative"] == steps["train/rollouts_generated"].cumsum()).all()
    assert (steps["acr/groups"] == 16 * steps["train/gen_batches"]).all()
    # Below the cap it trains on exactly prompts_per_step groups, none of them collapsed.
    full = steps["train/resample_capped"] == 0
    assert full.any() and (steps.loc[full, "train/kept_groups"] == 1).all()
    assert (steps.loc[~full, "train/gen_batches"] == 4).all() and (steps.loc[~full, "train/kept_groups"] < 1).all()
    assert (steps["acr/effective"] == 0).all()
    assert resample.loc[[0, 2, 4], ["eval/acc_mean", "train/rollouts_cumulative"]].notna().all().all()


def test_dapo_resample_at_its_cap_with_nothing_kept_makes_no_update(torch_settings, tmp_path):
    from verl_avspo.sandbox.config import PolicyConfig, SandboxConfig
    from verl_avspo.sandbox.estimators import parse_estimators
    from verl_avspo.sandbox.loop import train

    # No warm-up and 3-digit sums: every answer is wrong, every group collapses, one batch allowed.
    config = SandboxConfig(
        group_size=8,
        levels="3+2",
        steps=2,
        eval_every=2,
        eval_size=8,
        max_gen_batches=1,
        policy=PolicyConfig(sft_steps=0),
    )
    (spec,) = parse_estimators("dapo_resample")
    train(config, spec, 0, tmp_path / "capped.jsonl")
    steps = read_metrics(tmp_path / "capped.jsonl").loc[1:]
    assert (steps["acr/rate"] == 1).all() and (steps["train/kept_groups"] == 0).all()
    assert (steps["train/resample_capped"] == 1).all() and (steps["train/rollouts_generated"] == 128).all()
    assert (steps["acr/effective"] == 0).all() and (steps["actor/pg_loss"] == 0).all()  # no mini-batch ran


def test_skip_rolls_out_a_full_batch_and_counts_what_it_skipped(torch_settings, tmp_path):
    from verl_avspo.sandbox.config import PolicyConfig, SandboxConfig
    from verl_avspo.sandbox.estimators import parse_estimators
    from verl_avspo.sandbox.loop import train

    # 46 RL training problems and a barely warmed-up policy: most groups are all-wrong, and prompts come back.
    config = SandboxConfig(
        group_size=8, levels="1+1", steps=4, eval_every=4, eval_size=8, policy=PolicyConfig(sft_steps=20)
    )
    (spec,) = parse_estimators("grpo+skip")
    train(config, spec, 0, tmp_path / "skip.jsonl", tmp_path / "cache")
    steps = read_metrics(tmp_path / "skip.jsonl").loc[1:]
    assert (steps["train/rollouts_generated"] == 128).all() and (steps["acr/groups"] == 16).all()
    # Every skipped prompt's place was filled by a further draw: re-selected, no rollout saved.
    assert (steps["prompts/reselected"] == steps["prompts/skipped"]).all()
    assert (steps["prompts/reselected_cumulative"] == steps["prompts/reselected"].cumsum()).all()
    assert (steps["prompts/rollouts_skipped"] == 0).all() and (steps["prompts/rollouts_skipped_cumulative"] == 0).all()
    assert steps["prompts/skipped"].sum() > 0 and steps.loc[1, "prompts/skipped"] == 0  # nothing known at step 1
    assert steps["prompts/seen"].is_monotonic_increasing and steps["prompts/seen"].iloc[-1] <= 80
    assert steps["prompts/explore_all_wrong"].between(0.05, 1).all()


def test_dapo_resample_with_skip_leaves_skipped_places_open_and_saves_their_rollouts(torch_settings, tmp_path):
    from verl_avspo.sandbox.config import PolicyConfig, SandboxConfig
    from verl_avspo.sandbox.estimators import parse_estimators
    from verl_avspo.sandbox.loop import train

    # As above: most groups all-wrong, prompts come back; DAPO draws up to 4 batches a step.
    config = SandboxConfig(
        group_size=8,
        levels="1+1",
        steps=4,
        eval_every=4,
        eval_size=8,
        max_gen_batches=4,
        policy=PolicyConfig(sft_steps=20),
    )
    (spec,) = parse_estimators("dapo_resample+skip")
    train(config, spec, 0, tmp_path / "dapo_skip.jsonl", tmp_path / "cache")
    steps = read_metrics(tmp_path / "dapo_skip.jsonl").loc[1:]
    # Every group drawn is paid for (G=8) and measured; a batch's skipped places stay open (DAPO's next batch
    # tops up), so each skipped prompt is a saving unless a batch whose every candidate was skipped drew one more.
    assert (steps["train/rollouts_generated"] == 8 * steps["acr/groups"]).all()
    assert (steps["train/rollouts_cumulative"] == steps["train/rollouts_generated"].cumsum()).all()
    assert (steps["prompts/reselected"] + steps["prompts/rollouts_skipped"] / 8 == steps["prompts/skipped"]).all()
    assert steps["prompts/rollouts_skipped"].sum() > 0
    assert steps["prompts/rollouts_skipped_cumulative"].iloc[-1] == steps["prompts/rollouts_skipped"].sum()


def test_alloc_pilots_extends_and_counts_every_rollout_it_generated(torch_settings, tmp_path):
    from verl_avspo.sandbox.config import PolicyConfig, SandboxConfig
    from verl_avspo.sandbox.estimators import parse_estimators
    from verl_avspo.sandbox.loop import train
    from verl_avspo.sandbox.sampling import group_sizes

    # 16 prompts seen every step, a barely warmed-up policy: most groups all-wrong, so pilots from step 2 on.
    config = SandboxConfig(
        group_size=8, levels="1+1", steps=6, eval_every=6, eval_size=8, train_set=16, policy=PolicyConfig(sft_steps=20)
    )
    (spec,) = parse_estimators("grpo+alloc")
    batches = {}
    train(
        config,
        spec,
        0,
        tmp_path / "alloc.jsonl",
        tmp_path / "cache",
        on_rollout=lambda step, _model, batch: batches.update({step: batch}),
    )
    steps = read_metrics(tmp_path / "alloc.jsonl").loc[1:]
    extended, pilots = steps["prompts/pilots_extended"], steps["prompts/pilots"]
    # What it generated: the first pass and the rest of each extended pilot's group, in one or two passes.
    assert (steps["train/rollouts_generated"] == steps["prompts/rollouts_allocated"] + 6 * extended).all()
    assert (steps["train/gen_batches"] == 1 + (extended > 0)).all()
    assert (steps["train/rollouts_cumulative"] == steps["train/rollouts_generated"].cumsum()).all()
    assert steps.loc[1, "train/rollouts_generated"] == 128 and pilots.loc[1] == 0  # nothing known at step 1
    assert pilots.iloc[1:].gt(0).all() and (steps["train/rollouts_generated"] < 128).any()  # a saving
    assert (steps["prompts/rollouts_allocated"] <= 128).all()  # within the budget, 1 x 16 x G
    # Every group rolled out is measured, a dropped pilot too; the collapsed pilots are not trained on.
    assert (steps["acr/groups"] == 16 - steps["prompts/unallocated"]).all()
    dropped = pilots - extended
    assert (steps["train/kept_groups"] * 16 == 16 - steps["prompts/unallocated"] - dropped).all()
    for step, batch in batches.items():  # each group's rows together: a pilot extended to G, G, or up to 16
        sizes = group_sizes(batch.uids)
        assert len(sizes) == len(set(batch.uids)) == len(batch.prompts)
        assert sizes.ge(8).all() and sizes.le(16).all(), step
    assert steps["prompts/extra_rollouts"].sum() > 0 and extended.sum() > 0


def test_same_seed_same_prompts_for_every_estimator(comparison, tmp_path, monkeypatch):
    # The verdicts pair runs by seed; dapo keeps a varying number of groups per step, which must
    # not shift the prompt sequence. Spy on the real task.sample to record every step's prompts.
    from verl_avspo.sandbox.config import PolicyConfig, SandboxConfig
    from verl_avspo.sandbox.estimators import parse_estimators
    from verl_avspo.sandbox.loop import train
    from verl_avspo.sandbox.task import ArithmeticTask

    drawn = []
    real_sample = ArithmeticTask.sample

    def spy(self, num_prompts, generator):
        problems = real_sample(self, num_prompts, generator)
        drawn[-1].append(problems.prompts)
        return problems

    monkeypatch.setattr(ArithmeticTask, "sample", spy)
    config = SandboxConfig(group_size=8, steps=3, eval_every=3, eval_size=8, policy=PolicyConfig(sft_steps=20))
    for spec in parse_estimators("grpo,dapo"):
        drawn.append([])
        train(config, spec, 0, tmp_path / f"{spec.label}.jsonl", comparison / "cache")
    dapo = read_metrics(tmp_path / "dapo.jsonl")
    assert (dapo.loc[1:, "train/kept_groups"] < 1).any()  # dapo did drop groups
    assert len(drawn[0]) == 3 and drawn[0] == drawn[1]


def test_warm_up_is_deterministic_and_cached_by_settings(tmp_path, torch_settings):
    from verl_avspo.sandbox.config import PolicyConfig
    from verl_avspo.sandbox.policy import warm_policy
    from verl_avspo.sandbox.task import ArithmeticTask, parse_levels

    task = ArithmeticTask(parse_levels("1+1,2+1"), 8)
    config = PolicyConfig(sft_steps=5)
    fresh, _ = warm_policy(config, task, None)
    cached, _ = warm_policy(config, task, tmp_path)
    reloaded, _ = warm_policy(config, task, tmp_path)
    assert len(list(tmp_path.iterdir())) == 1
    for name, weight in fresh.state_dict().items():
        assert torch.equal(weight, cached.state_dict()[name]) and torch.equal(weight, reloaded.state_dict()[name])
    warm_policy(PolicyConfig(sft_steps=6), task, tmp_path)
    assert len(list(tmp_path.iterdir())) == 2  # changed settings never reuse a stale model
    # A larger held-out split evaluates on problems the smaller split's warm-up trained on.
    warm_policy(config, ArithmeticTask(parse_levels("1+1,2+1"), 16), tmp_path)
    assert len(list(tmp_path.iterdir())) == 3
    saved = json.loads(next(p for p in tmp_path.glob("*/sandbox_settings.json")).read_text())
    assert saved["sft_steps"] in (5, 6)


def test_the_loss_aggregation_is_a_setting(comparison, tmp_path):
    # The same step-1 samples as the comparison's grpo run, aggregated per sequence: another loss.
    assert _sandbox_again(comparison, tmp_path, "grpo", "--loss-agg-mode", "seq-mean-token-sum") == 0
    summed = read_metrics(tmp_path / "runs" / "grpo" / "seed0.jsonl")
    grpo = _runs(comparison)["grpo"]
    assert summed.loc[1, "acr/rate"] == grpo.loc[1, "acr/rate"]  # same rollouts
    assert summed.loc[1, "actor/pg_loss"] != grpo.loc[1, "actor/pg_loss"]
    assert "`seq-mean-token-sum` aggregation" in (tmp_path / "summary.md").read_text()
    with pytest.raises(SystemExit, match=r"loss_agg_mode='token-sum-norm' is invalid: expected one of token-mean"):
        _sandbox_again(comparison, tmp_path, "grpo", "--loss-agg-mode", "token-sum-norm")


def test_the_sampling_temperature_is_a_setting(comparison, tmp_path):
    # Hotter rollouts from the same warmed-up policy and seed: other samples, more token entropy,
    # and the summary says which temperature trained.
    assert _sandbox_again(comparison, tmp_path, "grpo", "--temperature", "2.0") == 0
    hot = read_metrics(tmp_path / "runs" / "grpo" / "seed0.jsonl")
    grpo = _runs(comparison)["grpo"]
    assert hot.loc[1, "actor/entropy"] > grpo.loc[1, "actor/entropy"]
    assert hot.loc[0, "eval/acc_mean"] == grpo.loc[0, "eval/acc_mean"]  # same policy before training
    assert "temperature 2, verl's" in (tmp_path / "summary.md").read_text()


def test_the_epochs_mode_visits_each_prompt_of_its_set_at_least_five_times(torch_settings, tmp_path):
    from collections import Counter

    from verl_avspo.sandbox.config import PolicyConfig, SandboxConfig
    from verl_avspo.sandbox.estimators import parse_estimators
    from verl_avspo.sandbox.loop import train

    config = SandboxConfig(
        group_size=8,
        levels="1+1,2+1",
        steps=5,
        eval_every=5,
        eval_size=8,
        train_set=16,
        policy=PolicyConfig(sft_steps=20),
    )
    visits = Counter()
    (spec,) = parse_estimators("grpo")
    train(config, spec, 0, tmp_path / "epochs.jsonl", tmp_path / "cache", lambda _s, _m, b: visits.update(b.prompts))
    assert len(visits) == 16 and set(visits.values()) == {5}  # 5 steps x 16 prompts over a set of 16
    steps = read_metrics(tmp_path / "epochs.jsonl").loc[1:]
    assert (steps["prompts/seen"] == 16).all()  # the whole set in the first epoch, no prompt outside it
    shares = steps[["prompts/always_solved", "prompts/never_solved"]].iloc[-1]
    assert shares.between(0, 1).all() and shares.sum() <= 1


def _row(summary: str, name: str) -> list[str]:
    """The cells of the first table row of ``summary`` named ``name``."""
    line = next(line for line in summary.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_summary_holds_the_no_training_row_and_what_each_estimator_generated(comparison):
    summary = (comparison / "summary.md").read_text()
    runs = _runs(comparison)
    grpo = runs["grpo"]
    start = grpo.loc[0, [f"eval/acc_level_{i}" for i in range(1, 5)] + ["eval/acc_mean", "eval/mean@8_mean"]]
    # The warmed-up policy not trained: its step-0 evaluation, at 0 rollouts; every run starts from it.
    assert all(frame.loc[0, "eval/acc_mean"] == grpo.loc[0, "eval/acc_mean"] for frame in runs.values())
    assert _row(summary, "*no training*") == ["*no training*", *(f"{100 * v:.1f}" for v in start), "0.0", "0"]
    assert _row(summary, "`grpo`")[-2:] == ["128.0", "512"]  # 4 steps of 16 x G=8
    # The title names what ran; no sentence claims one rollout budget for all.
    assert summary.startswith(
        "# CPU sandbox: `grpo`, `avspo:paper_code`, `dapo`, `dcpo`, `intuitor`, `rent` and no training, "
        "1 seed × 4 steps"
    )
    assert "rollouts per step for every estimator" not in summary and "same rollout budget" not in summary
    final = window_mean(grpo["eval/acc_mean"], FINAL_EVALUATIONS)
    gain = 100 * (final - grpo.loc[0, "eval/acc_mean"])
    assert f"**`grpo` vs no training**: final mean greedy accuracy {100 * final:.1f}%" in summary
    assert f"({gain:+.1f} points from a single seed), which gives no spread to judge by" in summary
    assert "It generated 512 rollouts (128.0 a step), 1.00× `grpo`'s 512." in summary


def test_alloc_summary_gives_its_rollouts_and_says_its_pilots_were_dropped(comparison, tmp_path):
    assert _sandbox_again(comparison, tmp_path, "grpo,grpo+alloc", "--train-set", "16", "--steps", "5") == 0
    summary = (tmp_path / "summary.md").read_text()
    alloc = read_metrics(tmp_path / "runs" / "grpo+alloc" / "seed0.jsonl")
    total, per_step = alloc["train/rollouts_cumulative"].iloc[-1], alloc.loc[1:, "train/rollouts_generated"].mean()
    assert total < 640  # pilots of 2 from step 2 on: fewer than grpo's 5 x 128
    assert _row(summary, "`grpo+alloc`")[-2:] == [f"{per_step:.1f}", f"{total:.0f}"]
    assert _row(summary, "`grpo`")[-2:] == ["128.0", "640"]
    assert f"It generated {total:.0f} rollouts ({per_step:.1f} a step), {total / 640:.2f}× `grpo`'s 640" in summary
    assert "(its collapsed pilots were dropped, not given a signal)" in summary and "| `grpo+alloc` ‡ |" in summary
    assert "rollouts per step for every estimator" not in summary
    assert "each prompt seen 5 times by an estimator that draws 16 prompts a step (80 draws" in summary


def test_a_second_run_into_the_same_out_is_refused_before_training_unless_forced(comparison, tmp_path, monkeypatch):
    flags = ["--steps", "1", "--eval-every", "1"]
    assert _sandbox_again(comparison, tmp_path, "grpo", *flags) == 0
    first = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file() and "cache" not in path.parts}
    from verl_avspo.sandbox import loop

    def no_training(*_args, **_kwargs):
        raise AssertionError("trained before refusing")

    monkeypatch.setattr(loop, "train", no_training)
    with pytest.raises(
        SystemExit,
        match=r"--out \S+ holds an earlier run \(summary.md, acr.png, accuracy.png, "
        r"runs/grpo/seed0.jsonl\): pass --force to replace it .* or choose another --out",
    ):
        _sandbox_again(comparison, tmp_path, "avspo", *flags)
    assert {path: path.read_bytes() for path in first} == first  # nothing replaced
    monkeypatch.undo()
    # --force: the earlier run's files go first, so the new run's logs are the only ones (report reads them all).
    assert _sandbox_again(comparison, tmp_path, "avspo", *flags, "--force") == 0
    assert sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "runs").rglob("*.jsonl")) == [
        "runs/avspo/seed0.jsonl"
    ]
    summary = (tmp_path / "summary.md").read_text()
    assert (
        summary.startswith("# CPU sandbox: `avspo` and no training, 1 seed × 1 step\n") and "| `grpo` |" not in summary
    )


def test_an_epochs_run_too_short_is_refused_before_training_with_a_fix_it_accepts(tmp_path):
    out = tmp_path / "out"
    base = ["sandbox", "--estimators", "grpo", "--out", str(out), "--no-cache", "--levels", "2+1,2+2"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused by the command, not warned about as `<string>:19: UserWarning`
        # 10 x 16 = 160 draws over 32 prompts: 5 visits, accepted up to 32; at 64, fewer.
        with pytest.raises(
            SystemExit,
            match=r"--train-set=64 is too large for --steps=10 x --prompts-per-step=16 = "
            r"160 prompt draws: some prompts would be seen 2 time\(s\), fewer than the 5 epochs .* "
            r"Use --steps 20 or more or --train-set 32 or less$",
        ):
            main([*base, "--steps", "10", "--train-set", "64"])
        # A set no smaller than a step's 16 prompts would do: only more steps are offered.
        with pytest.raises(SystemExit, match=r"seen 2 time\(s\).* Use --steps 10 or more$"):
            main([*base, "--steps", "4", "--train-set", "32"])
    assert not out.exists()


def test_the_summary_says_how_often_each_prompt_of_the_set_was_seen():
    from verl_avspo.sandbox.config import SandboxConfig
    from verl_avspo.sandbox.setup_text import _prompts_text

    def text(**settings) -> str:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the library warns below 5 epochs; the command refuses
            return _prompts_text(SandboxConfig(levels="2+2,3+2", **settings))

    assert "each prompt seen 5 times by an estimator that draws 16 prompts a step (80 draws" in text(
        steps=5, train_set=16
    )
    assert "each prompt seen at least 3 times" in text(steps=10, train_set=48)  # 160 draws over 48
    # Fewer draws than prompts: not "at least 0 times".
    assert "only 16 of its prompts seen, once each, by an estimator" in text(steps=1, train_set=64)


def test_the_fingerprint_says_whether_it_matches_a_documented_machine(torch_settings, monkeypatch, capsys):
    from verl_avspo.sandbox import fingerprint, fingerprint_match

    documented = fingerprint_match.DOCUMENTED_FINGERPRINT
    (epyc,) = documented.weights  # one machine has printed today's defaults' fingerprint
    # The docs quote every documented value, so that the code and the page change together.
    docs = " ".join((Path(__file__).resolve().parents[2] / "docs" / "results.md").read_text().split())
    for weights in documented.weights:
        assert f"weights {weights}, samples {documented.samples} (torch {documented.torch}" in docs
    line = "sandbox fingerprint: weights {}, samples {} (torch {}, transformers {})"
    versions = (documented.torch, documented.transformers)
    assert fingerprint_match.fingerprint_verdict(line.format(epyc, documented.samples, *versions), True).startswith(
        "MATCH: "
    )
    partial = fingerprint_match.fingerprint_verdict(line.format("0123456789ab", documented.samples, *versions), True)
    assert partial.startswith("PARTIAL MATCH: the documented samples") and "may still differ" in partial
    other = fingerprint_match.fingerprint_verdict(line.format(epyc, "0123456789ab", *versions), True)
    assert other.startswith("NO MATCH: the samples differ") and "another table" in other
    assert "quotes torch" in fingerprint_match.fingerprint_verdict(
        line.format(epyc, documented.samples, "2.0.0", "4.0"), True
    )
    assert "default settings only" in fingerprint_match.fingerprint_verdict(
        line.format(epyc, documented.samples, *versions), False
    )
    # The command prints the hashes and the verdict (the hashes themselves: tests/sandbox/test_kernels.py).
    monkeypatch.setattr(fingerprint, "fingerprint", lambda _config: line.format(epyc, documented.samples, *versions))
    assert main(["sandbox", "--fingerprint"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert (
        printed[-1]
        == f"against docs/results.md: MATCH: the same weights and samples as {documented.weights[epyc]}: `make demo` "
        "should print that table"
    )
    assert main(["sandbox", "--fingerprint", "--steps", "7"]) == 0
    assert "default settings only" in capsys.readouterr().out


def test_the_verdicts_call_fewer_rollouts_a_saving_only_where_grpo_beat_not_training():
    from verl_avspo.sandbox.summary import learning_verdict, no_training_runs, verdicts

    def runs(finals, per_step, start=0.5):
        return [
            {"acc_mean": final, "start_acc_mean": start, "acr": 0.5, "acr_effective": 0.25}
            | {"rollouts_per_step": per_step, "rollouts_total": 10 * per_step}
            for final in finals
        ]

    learned = {"grpo": runs([0.60, 0.61, 0.62], 128), "grpo+alloc": runs([0.60, 0.60, 0.61], 64)}
    assert [run["acc_mean"] for run in no_training_runs(learned)] == [0.5] * 3
    gate, passed = learning_verdict(learned)
    assert passed and "against 50.0% for the warmed-up policy not trained" in gate and "learned here" in gate
    (alloc,) = verdicts(learned, dropped={"grpo+alloc": "collapsed pilots"}, learned=passed)
    assert "It generated 640 rollouts (64.0 a step), 0.50× `grpo`'s 1280." in alloc
    assert "(its collapsed pilots were dropped, not given a signal)" in alloc
    flat = {"grpo": runs([0.49, 0.51, 0.50], 128), "grpo+alloc": runs([0.50, 0.50, 0.50], 64)}
    gate, passed = learning_verdict(flat)
    assert not passed and "`grpo` did not beat not training (p ≥ 0.05)" in gate
    assert "not training matches it too, at none" in gate
    (alloc,) = verdicts(flat, learned=passed)
    assert "0.50× `grpo`'s 1280; `grpo` did not beat not training here, so this is no saving at its accuracy." in alloc
