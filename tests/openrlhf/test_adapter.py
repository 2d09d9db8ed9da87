"""GroupNormAVSPO reproduces OpenRLHF's group_norm where AVSPO does not trigger and AVSPO's closed
form where it does, and the launcher's argument handling. None of this imports OpenRLHF: its
group_norm is two lines, written out here as the reference (tests/openrlhf/test_trainer.py runs the
real one)."""

import math
import re

import pytest
import torch

from verl_avspo.core.config import AVSPO_KEYS, PRESETS, resolve_settings
from verl_avspo.openrlhf import GroupNormAVSPO, launcher


def openrlhf_group_norm(rewards):
    return (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)


def test_preset_grpo_equals_openrlhf_group_norm():
    rewards = torch.randn(6, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    adapter = GroupNormAVSPO({"preset": "grpo", "epsilon": 1e-9, "reward_range": [-10, 10]})
    torch.testing.assert_close(adapter(rewards), openrlhf_group_norm(rewards))
    assert adapter.metrics["acr/rate"] == 0.0


def test_collapsed_rows_get_the_push_and_metrics():
    rewards = torch.tensor([[1.0] * 4, [0.0] * 4, [1.0, 0.0, 0.0, 1.0]])
    adapter = GroupNormAVSPO({"preset": "paper_code", "epsilon": 1e-9})
    advantages = adapter(rewards)
    torch.testing.assert_close(advantages[0], torch.full((4,), 1 / math.sqrt(5)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(advantages[1], torch.full((4,), -1 / math.sqrt(5)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(advantages[2], openrlhf_group_norm(rewards[2:])[0], atol=1e-5, rtol=1e-5)
    assert adapter.metrics["acr/rate"] == pytest.approx(2 / 3) and adapter.metrics["acr/effective"] == 0.0


def test_state_round_trip():
    first, second = GroupNormAVSPO({"eta": 0.5}), GroupNormAVSPO({"eta": 0.5})
    for rewards in (torch.ones(2, 4), torch.tensor([[1.0, 0, 1, 0], [1, 1, 1, 1]])):
        first(rewards)
    second.load_state_dict(first.state_dict())
    assert second.controller.threshold == first.controller.threshold and second.controller.step == 2


def test_flat_rewards_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"reshape with rewards.reshape\(-1, n_samples_per_prompt\)"):
        GroupNormAVSPO()(torch.ones(8))


def test_avspo_arguments_are_split_from_openrlhfs():
    argv = ["--rollout.n_samples_per_prompt", "8", "--avspo.preset", "paper", "--avspo.reward_range", "-1", "1"]
    argv += ["--avspo.k=adaptive", "--avspo.adaptive_threshold", "false", "--train.seed", "1"]
    rest, settings = launcher.split_avspo_arguments(argv)
    assert rest == ["--rollout.n_samples_per_prompt", "8", "--train.seed", "1"]
    assert settings == {"preset": "paper", "reward_range": [-1, 1], "k": "adaptive", "adaptive_threshold": False}


def test_numbers_in_scientific_notation_and_single_dash_options():
    # YAML 1.1 would read 1e-3 as text; a single-dash option ends a key's values.
    rest, settings = launcher.split_avspo_arguments(["--avspo.tau", "1e-3", "--avspo.epsilon=1e-6", "-h"])
    assert settings == {"tau": 1e-3, "epsilon": 1e-6} and rest == ["-h"]
    rest, settings = launcher.split_avspo_arguments(["--avspo.reward_range", "-1", "1", "-x", "2"])
    assert settings == {"reward_range": [-1, 1]} and rest == ["-x", "2"]


def test_alert_settings_nest_as_in_verls_config():
    argv = [
        "--avspo.alert.rule",
        "all_wrong",
        "--avspo.alert.window=3",
        "--avspo.k",
        "2",
        "--avspo.alert.action",
        "stop",
    ]
    rest, settings = launcher.split_avspo_arguments(argv)
    assert rest == [] and settings == {"alert": {"rule": "all_wrong", "window": 3, "action": "stop"}, "k": 2}


@pytest.mark.parametrize(
    ("argv", "settings", "openrlhf_argv", "avspo"),
    [
        (["--algo.advantage.estimator", "avspo"], {}, ["--algo.advantage.estimator", "group_norm"], {}),
        (["--advantage_estimator=avspo"], {}, ["--algo.advantage.estimator=group_norm"], {}),
        (["--advantage_estimator", "dr_grpo"], {"k": 2}, ["--algo.advantage.estimator", "dr_grpo"], {"k": 2}),
        (["--algo.advantage.estimator", "group_norm"], {}, ["--algo.advantage.estimator", "group_norm"], None),
        (["--algo.advantage.estimator", "rloo"], {}, ["--algo.advantage.estimator", "rloo"], None),
        # argparse's abbreviations (OpenRLHF's parser allows them).
        (["--algo.advantage.estim", "avspo"], {}, ["--algo.advantage.estimator", "group_norm"], {}),
        (["--algo.advantage.est=avspo"], {}, ["--algo.advantage.estimator=group_norm"], {}),
        # The metrics' own settings alone keep OpenRLHF's estimator (group_norm included).
        (
            ["--algo.advantage.estimator", "rloo"],
            {"reward_range": [-1, 1]},
            ["--algo.advantage.estimator", "rloo"],
            None,
        ),
        (
            ["--algo.advantage.estimator", "group_norm"],
            {"tau": 0.1},
            ["--algo.advantage.estimator", "group_norm"],
            None,
        ),
        # So does the stall alert: it watches OpenRLHF's own estimator too.
        (
            ["--algo.advantage.estimator", "group_norm"],
            {"alert": {"action": "stop"}, "tau": 0.1},
            ["--algo.advantage.estimator", "group_norm"],
            None,
        ),
    ],
)
def test_estimator_choice(argv, settings, openrlhf_argv, avspo):
    assert launcher.choose_estimator(argv, settings) == (openrlhf_argv, avspo)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--algo.advantage.estimator", "rloo", "--avspo.preset", "paper"], r"algo\.advantage\.estimator=rloo.*avspo"),
        (["--avspo.preset", "paper"], r"no --algo\.advantage\.estimator \(OpenRLHF's default: gae\)"),
        (["--algo.advantage.estimator", "avspo", "--avspo.strategy", "best"], r"--avspo\.strategy='best' is invalid"),
        (
            ["--algo.advantage.estimator", "avspo", "--avspo.preset"],
            r"--avspo\.preset needs a value, for example --avspo\.preset paper$",
        ),
        (
            ["--algo.advantage.estimator", "avspo", "--avspo.k"],
            r"--avspo\.k needs a value, for example --avspo\.k adaptive$",
        ),
        (
            ["--algo.advantage.estimator", "avspo", "--avspo.reward_range"],
            r"for example --avspo\.reward_range 0.0 1.0$",
        ),
        (
            ["--algo.advantage.estimator", "avspo", "--avspo.kk"],
            r"--avspo\.kk needs a value, and 'kk' is not an AVSPO setting",
        ),
        (
            ["--algo.advantage.estimator", "avspo", "--avspo.trigger_scope", "batches"],
            r"--avspo\.trigger_scope='batches' is invalid",
        ),
        (["--algo.advantage.estimator", "avspo", "--avspo.alert.action", "halt"], r"--avspo\.alert\.action='halt'"),
        (["--algo.advantage.estimator", "rloo", "--avspo.alert.window", "0"], r"--avspo\.alert\.window=0"),
        (["--avspo.alert.rule", "acr", "--avspo.alert.rule", "all_wrong"], r"--avspo\.alert\.rule is given twice"),
        (
            ["--train.async_enable", "--avspo.alert.action", "stop"],
            r"--avspo\.alert\.action stop needs OpenRLHF's synchronous trainer.*use --avspo\.alert\.action warn",
        ),
        (["--algo.advantage.estimator", "avspo", "--avspo.k", "2", "--avspo.k", "3"], r"--avspo\.k is given twice"),
        (["--algo.advantage.estimator", "rloo", "--avspo.reward_range", "1", "0"], r"reward_range=\[1, 0\] is invalid"),
        # What torch.Generator.manual_seed refuses, refused here rather than at the first advantage step.
        (
            ["--algo.advantage.estimator", "avspo", "--avspo.seed", str(2**64)],
            r"--avspo\.seed=18446744073709551616 is invalid: expected an integer in \[0, 18446744073709551615\]",
        ),
        # A value that is no value is not "the preset's default".
        (
            ["--algo.advantage.estimator", "avspo", "--avspo.k="],
            r"--avspo\.k got '', which is no value\. To keep the preset's default, leave --avspo\.k out; .*--avspo\.k "
            r"adaptive$",
        ),
        (["--algo.advantage.estimator", "avspo", "--avspo.k", "null"], r"--avspo\.k got 'null', which is no value"),
        (
            ["--avspo.alert.window", "5", "--avspo.alert", "3"],
            r"--avspo\.alert is a group of settings, not one: give its keys, for example --avspo\.alert\.window 50",
        ),
        # argparse's abbreviations reach OpenRLHF as the full flag.
        (["--train.async_e", "--avspo.alert.action", "stop"], r"--avspo\.alert\.action stop needs OpenRLHF's sync"),
        # The group size OpenRLHF asserts (a bare AssertionError after its imports), named with the fix.
        (
            ["--algo.advantage.estimator", "avspo"],
            r"^verl_avspo\.openrlhf: error: AVSPO compares the responses sampled for one prompt, so it needs at least "
            r"2 per prompt, and this command has no --rollout\.n_samples_per_prompt \(OpenRLHF's default: 1\)\. Set "
            r"--rollout\.n_samples_per_prompt 8",
        ),
        (
            ["--algo.advantage.estimator", "dr_grpo", "--avspo.k", "2", "--rollout.n_samples=1"],
            r"AVSPO compares .* this command has --rollout\.n_samples_per_prompt 1\.",
        ),
        (
            ["--algo.advantage.est", "rloo", "--rollout.n_samples_per_prompt", "1"],
            r"--algo\.advantage\.estimator rloo compares the responses",
        ),
    ],
)
def test_bad_arguments_stop_before_openrlhf_with_the_fix(argv, message, capsys, monkeypatch):
    def not_reached():
        raise AssertionError("OpenRLHF must not be checked after a usage error")

    monkeypatch.setattr(launcher, "check_openrlhf", not_reached)
    assert launcher.main(argv) == 2
    assert re.search(message, capsys.readouterr().err.strip())


def test_every_example_in_a_needs_a_value_message_is_valid_and_usage_lists_every_preset():
    """The example value each "needs a value" message gives is accepted, for every setting."""
    for key in AVSPO_KEYS:
        if key == "alert":
            continue
        with pytest.raises(launcher.UsageError, match="needs a value") as err:
            launcher.split_avspo_arguments([f"--avspo.{key}"])
        example = str(err.value).rpartition(f"--avspo.{key} ")[2].split()
        _, settings = launcher.split_avspo_arguments([f"--avspo.{key}", *example])
        resolve_settings(settings)
    assert all(preset in launcher.USAGE for preset in PRESETS)


def test_paper_code_keeps_its_epsilon_and_other_presets_get_openrlhfs():
    assert "epsilon" not in launcher._validated({"preset": "paper_code"})
    assert resolve_settings(launcher._validated({"preset": "paper_code"}))[0].epsilon == 1e-4
    assert launcher._validated({"preset": "paper"})["epsilon"] == launcher.OPENRLHF_EPSILON
    assert launcher._validated({"preset": "paper_code", "epsilon": 1e-6})["epsilon"] == 1e-6


def test_missing_openrlhf_is_reported_with_the_supported_versions(capsys, monkeypatch):
    import importlib.metadata

    version = importlib.metadata.version

    def without_openrlhf(name):
        if name == "openrlhf":
            raise importlib.metadata.PackageNotFoundError(name)
        return version(name)

    monkeypatch.setattr(importlib.metadata, "version", without_openrlhf)
    assert launcher.main(["--algo.advantage.estimator", "avspo", "--rollout.n_samples_per_prompt", "8"]) == 2
    err = capsys.readouterr().err
    assert "verl_avspo.openrlhf: error: OpenRLHF is not installed; supported: openrlhf>=0.10.4,<0.12" in err
    assert "pip install 'openrlhf>=0.10.4,<0.12'" in err


def test_ray_init_gets_the_setup_hook_and_settings():
    seen = {}

    def init(**kwargs):
        seen.update(kwargs)

    wrapped = launcher.runtime_env_hook(init, {"preset": "paper_code"})
    wrapped(runtime_env={"env_vars": {"NCCL_DEBUG": "WARN"}}, num_cpus=2)
    assert seen["num_cpus"] == 2
    assert seen["runtime_env"]["worker_process_setup_hook"] == "verl_avspo.openrlhf.worker_setup"
    assert seen["runtime_env"]["env_vars"] == {
        "NCCL_DEBUG": "WARN",
        "VERL_AVSPO_OPENRLHF_SETTINGS": '{"preset": "paper_code"}',
        "VERL_AVSPO_OPENRLHF_ACR": "",
    }
    launcher.runtime_env_hook(init, None, {"reward_range": [-1, 1]})()  # a run without AVSPO
    assert seen["runtime_env"]["env_vars"] == {
        "VERL_AVSPO_OPENRLHF_SETTINGS": "",
        "VERL_AVSPO_OPENRLHF_ACR": '{"reward_range": [-1, 1]}',
    }
    with pytest.raises(ValueError, match=r"already has worker_process_setup_hook='mine'"):
        wrapped(runtime_env={"worker_process_setup_hook": "mine"})


def test_a_group_size_of_two_or_more_passes_however_it_is_spelt():
    for argv in (
        ["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "8"],
        ["--algo.advantage.estimator=rloo", "--rollout.n_samples_per=2"],
        ["--algo.advantage.estimator", "gae"],  # no groups, no group size
        [],
    ):
        launcher._check_group_size(argv, avspo=False)


def test_help_shows_our_options_when_openrlhf_cannot_be_imported(capsys, monkeypatch):
    """Without flash_attn (OpenRLHF's trainer does not import), --help still shows ours, exit 0."""

    def unimportable():
        raise launcher.OpenRLHFIncompatibleError("OpenRLHF 0.11.2 is installed but its trainer does not import")

    monkeypatch.setattr(launcher, "check_openrlhf", unimportable)
    assert launcher.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m verl_avspo.openrlhf") and "--avspo.alert.rule" in out
    assert "OpenRLHF's own options cannot be listed here: OpenRLHF 0.11.2 is installed but its trainer" in out
