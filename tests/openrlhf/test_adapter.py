"""The launcher's argument handling (``flags``): ``--avspo.*``, ``--acr.*`` and ``--prompts.skip.*``,
ACR's keys given as ``--avspo.*`` refused naming the ``--acr.`` flag, AVSPO flags with an estimator AVSPO
does not replace refused, and a run without AVSPO building no AVSPOConfig. None of this imports OpenRLHF
(tests/openrlhf/test_trainer.py runs the real one)."""

import json
import re
import warnings

import pytest

from verl_avspo.core import config as core_config
from verl_avspo.core.acr_config import ACR_KEYS, ALERT_KEYS, ACRConfig, AlertConfig
from verl_avspo.core.config import AVSPO_KEYS, PRESETS, resolve_settings
from verl_avspo.openrlhf import advantage_step, flags, launcher


def test_avspo_arguments_are_split_from_openrlhfs():
    argv = ["--rollout.n_samples_per_prompt", "8", "--avspo.preset", "paper", "--avspo.reward_range", "-1", "1"]
    argv += ["--avspo.k=adaptive", "--avspo.adaptive_threshold", "false", "--train.seed", "1"]
    rest, settings = flags.split_settings_arguments(argv)[:2]
    assert rest == ["--rollout.n_samples_per_prompt", "8", "--train.seed", "1"]
    assert settings == {"preset": "paper", "reward_range": [-1, 1], "k": "adaptive", "adaptive_threshold": False}


def test_numbers_in_scientific_notation_and_single_dash_options():
    # YAML 1.1 would read 1e-3 as text; a single-dash option ends a key's values.
    rest, avspo, acr = flags.split_settings_arguments(["--acr.tau", "1e-3", "--avspo.epsilon=1e-6", "-h"])
    assert avspo == {"epsilon": 1e-6} and acr == {"tau": 1e-3} and rest == ["-h"]
    rest, _, acr = flags.split_settings_arguments(["--acr.reward_range", "-1", "1", "-x", "2"])
    assert acr == {"reward_range": [-1, 1]} and rest == ["-x", "2"]


def test_alert_settings_nest_as_in_verls_config():
    argv = ["--acr.alert.rule", "all_wrong", "--acr.alert.window=3", "--avspo.k", "2", "--acr.alert.action", "stop"]
    rest, avspo, acr = flags.split_settings_arguments(argv)
    assert rest == [] and avspo == {"k": 2} and acr == {"alert": {"rule": "all_wrong", "window": 3, "action": "stop"}}


@pytest.mark.parametrize(
    ("argv", "settings", "openrlhf_argv", "avspo"),
    [
        (["--algo.advantage.estimator", "avspo"], {}, ["--algo.advantage.estimator", "group_norm"], {}),
        (["--algo.advantage.estimator", "dr_grpo"], {"k": 2}, ["--algo.advantage.estimator", "dr_grpo"], {"k": 2}),
        # Not OpenRLHF's flag: left to its argparse, which refuses it.
        (["--advantage_estimator", "avspo"], {}, ["--advantage_estimator", "avspo"], None),
        (["--algo.advantage.estimator", "group_norm"], {}, ["--algo.advantage.estimator", "group_norm"], None),
        (["--algo.advantage.estimator", "rloo"], {}, ["--algo.advantage.estimator", "rloo"], None),
        # argparse's abbreviations (OpenRLHF's parser allows them).
        (["--algo.advantage.estim", "avspo"], {}, ["--algo.advantage.estimator", "group_norm"], {}),
        (["--algo.advantage.est=avspo"], {}, ["--algo.advantage.estimator=group_norm"], {}),
    ],
)
def test_estimator_choice(argv, settings, openrlhf_argv, avspo):
    assert launcher.choose_estimator(argv, settings) == (openrlhf_argv, avspo)


@pytest.mark.parametrize(
    ("argv", "acr"),
    [
        (["--acr.reward_range", "-1", "1"], {"reward_range": [-1, 1]}),
        (["--acr.tau", "0.1", "--acr.alert.action", "stop"], {"tau": 0.1, "alert": {"action": "stop"}}),
    ],
)
@pytest.mark.parametrize("estimator", ["rloo", "group_norm", "reinforce_baseline"])
def test_acr_flags_keep_openrlhfs_estimator_and_build_no_avspo_config(argv, acr, estimator, monkeypatch):
    """ACR's settings apply to every estimator; without AVSPO no AVSPOConfig is built at all."""

    def no_avspo(*args, **kwargs):
        raise AssertionError("a run without AVSPO must not resolve AVSPO's settings")

    monkeypatch.setattr(core_config, "_resolve_avspo", no_avspo)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling warns of nothing
        rest, settings, acr_settings = launcher.resolve_arguments(["--algo.advantage.estimator", estimator, *argv])
    assert rest == ["--algo.advantage.estimator", estimator] and settings is None and acr_settings == acr
    monkeypatch.setenv("VERL_AVSPO_OPENRLHF_ACR", json.dumps(acr_settings))
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_SETTINGS", raising=False)
    step = advantage_step.AdvantageStep(
        estimator, advantage_step.settings_from_env(), advantage_step.acr_settings_from_env()
    )
    assert step.tracker.avspo is None and step.tracker.controller is None and not step.avspo_on
    expected = ACRConfig(
        tau=acr.get("tau", 1e-6),
        reward_range=tuple(acr.get("reward_range", (0.0, 1.0))),
        alert=AlertConfig(**acr.get("alert", {})),
    )
    assert step.tracker.acr == expected


@pytest.mark.parametrize(
    ("argv", "key"),
    [(["--avspo.tau", "0.01"], "tau"), (["--avspo.reward_range", "-1", "1"], "reward_range"),
     (["--avspo.alert.window", "3"], "alert")],
)  # fmt: skip
def test_acr_keys_given_as_avspo_flags_are_refused_naming_the_acr_flag(argv, key, capsys):
    assert launcher.main(["--algo.advantage.estimator", "avspo", *argv]) == 2
    assert capsys.readouterr().err.strip().removeprefix("verl_avspo.openrlhf: error: ") == (
        f"--avspo.{key} is not an AVSPO setting: ACR's settings apply to every estimator and have a section of "
        f"their own; set --acr.{key} instead."
    )
    with pytest.raises(ValueError, match=rf"^--avspo\.{key} is not an AVSPO setting.*set --acr\.{key} instead"):
        advantage_step.AdvantageStep("group_norm", {"preset": "paper", key: 1}, None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--algo.advantage.estimator", "rloo", "--avspo.preset", "paper", "--avspo.k", "2"],
            r"^--avspo\.k, --avspo\.preset given with --algo\.advantage\.estimator=rloo: AVSPO's settings apply only "
            r"when AVSPO replaces a group estimator and would do nothing\. Use --algo\.advantage\.estimator avspo .*"
            r"or remove them \(ACR's own settings are --acr\.\*\)\.$",
        ),
        (["--avspo.preset", "paper"], r"no --algo\.advantage\.estimator \(OpenRLHF's default: gae\)"),
        (
            ["--algo.advantage.estimator", "reinforce_baseline", "--acr.tau", "0.1", "--avspo.strategy", "opposite"],
            r"^--avspo\.strategy given with --algo\.advantage\.estimator=reinforce_baseline",
        ),
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
            ["--algo.advantage.estimator", "avspo", "--acr.reward_range"],
            r"for example --acr\.reward_range 0.0 1.0$",
        ),
        (["--acr.alert.window"], r"--acr\.alert\.window needs a value, for example --acr\.alert\.window 50$"),
        (
            ["--algo.advantage.estimator", "avspo", "--avspo.kk"],
            r"--avspo\.kk needs a value, and 'kk' is not an AVSPO setting",
        ),
        (["--acr.k"], r"--acr\.k needs a value, and 'k' is not an ACR setting"),
        (["--acr.k", "2"], r"--acr\.k is not a setting\. Allowed keys of --acr: tau, reward_range, alert"),
        (
            ["--algo.advantage.estimator", "avspo", "--avspo.trigger_scope", "batches"],
            r"--avspo\.trigger_scope='batches' is invalid",
        ),
        (["--algo.advantage.estimator", "avspo", "--acr.alert.action", "halt"], r"--acr\.alert\.action='halt'"),
        (["--algo.advantage.estimator", "rloo", "--acr.alert.window", "0"], r"--acr\.alert\.window=0"),
        (["--acr.alert.rule", "acr", "--acr.alert.rule", "all_wrong"], r"--acr\.alert\.rule is given twice"),
        (
            ["--train.async_enable", "--acr.alert.action", "stop"],
            r"--acr\.alert\.action stop needs OpenRLHF's synchronous trainer.*use --acr\.alert\.action warn",
        ),
        (["--algo.advantage.estimator", "avspo", "--avspo.k", "2", "--avspo.k", "3"], r"--avspo\.k is given twice"),
        (["--algo.advantage.estimator", "rloo", "--acr.reward_range", "1", "0"], r"reward_range=\[1, 0\] is invalid"),
        # What torch.Generator.manual_seed refuses, refused here rather than at the first advantage step.
        (
            ["--algo.advantage.estimator", "avspo", "--avspo.seed", str(2**64)],
            r"--avspo\.seed=18446744073709551616 is invalid: expected an integer >= 0 and <= 18446744073709551615",
        ),
        # A value that is no value is not "the preset's default".
        (
            ["--algo.advantage.estimator", "avspo", "--avspo.k="],
            r"--avspo\.k got '', which is no value\. To keep the default, leave --avspo\.k out; .*--avspo\.k "
            r"adaptive$",
        ),
        (["--algo.advantage.estimator", "avspo", "--avspo.k", "null"], r"--avspo\.k got 'null', which is no value"),
        (["--acr.tau="], r"--acr\.tau got '', which is no value"),
        (
            ["--acr.alert.window", "5", "--acr.alert", "3"],
            r"--acr\.alert is a group of settings, not one: give its keys, for example --acr\.alert\.window 50",
        ),
        (["--avspo.alert.window", "5", "--avspo.alert", "3"], r"--avspo\.alert is a group of settings, not one"),
        # argparse's abbreviations reach OpenRLHF as the full flag.
        (["--train.async_e", "--acr.alert.action", "stop"], r"--acr\.alert\.action stop needs OpenRLHF's sync"),
        # The group size OpenRLHF asserts (a bare AssertionError after its imports), named with the fix.
        (
            ["--algo.advantage.estimator", "avspo"],
            r"^AVSPO compares the responses sampled for one prompt, so it needs at least "
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
        # Skipping where it could never act (the rule verl's launcher applies), before OpenRLHF is imported.
        (
            ["--prompts.skip.enable", "true", "--rollout.n_samples_per_prompt", "4"],
            r"^--prompts\.skip\.enable true with --algo\.advantage\.estimator gae: the skip rule predicts .* Use a "
            r"group estimator \(avspo, rloo, reinforce_baseline, group_norm, dr_grpo\) or set --prompts\.skip\.enable "
            r"false\.$",
        ),
        # Other --prompts flags: one line with the fix, not OpenRLHF's whole usage.
        (
            ["--prompts.skip", "true"],
            r"^--prompts\.skip true: --prompts\.skip is a group of settings, not one: give its keys, for example "
            r"--prompts\.skip\.enable true \(keys: enable, explore, ",
        ),
        (
            ["--prompts.key", "index"],
            r"^--prompts\.key index: there is no --prompts\.key in OpenRLHF, whose prompts carry no dataset index: "
            r"the adapter keys every prompt by a hash of its text\. Remove --prompts\.key",
        ),
        (["--prompts.skp.enable=true"], r"^--prompts\.skp\.enable true: --prompts\.skp\.enable is not a setting; "),
        # The rollout allocator: OpenRLHF sizes every group by n_samples_per_prompt; refused with the reason.
        (
            ["--prompts.allocation.enable", "true"],
            r"^--prompts\.allocation\.enable true: the rollout allocator is not available with OpenRLHF: "
            r"OpenRLHF 0\.11 gives every prompt --rollout\.n_samples_per_prompt samples .* Remove the flag",
        ),
    ],
)
def test_bad_arguments_stop_before_openrlhf_with_the_fix(argv, message, capsys, monkeypatch):
    def not_reached():
        raise AssertionError("OpenRLHF must not be checked after a usage error")

    monkeypatch.setattr(launcher, "check_openrlhf", not_reached)
    monkeypatch.setattr(launcher, "install", not_reached)
    assert launcher.main(argv) == 2
    assert re.search(message, capsys.readouterr().err.strip().removeprefix("verl_avspo.openrlhf: error: "))


def test_every_example_in_a_needs_a_value_message_is_valid_and_usage_lists_every_preset():
    """The example value each "needs a value" message gives is accepted, for every setting."""
    names = [f"--avspo.{key}" for key in AVSPO_KEYS if key not in ACR_KEYS]
    names += [f"--acr.{key}" for key in ACR_KEYS if key != "alert"] + [f"--acr.alert.{key}" for key in ALERT_KEYS]
    for flag in names:
        with pytest.raises(flags.UsageError, match="needs a value") as err:
            flags.split_settings_arguments([flag])
        example = str(err.value).rpartition(f"{flag} ")[2].split()
        _, avspo, acr = flags.split_settings_arguments([flag, *example])
        advantage_step.resolve_flags(avspo, acr)
    assert all(preset in launcher.USAGE for preset in PRESETS)


def test_paper_code_keeps_its_epsilon_and_other_presets_get_openrlhfs():
    def settings(*avspo):
        return launcher.resolve_arguments(["--algo.advantage.estimator", "avspo", *avspo])[1]

    assert "epsilon" not in settings("--avspo.preset", "paper_code")
    assert resolve_settings(settings("--avspo.preset", "paper_code"))[0].epsilon == 1e-4
    assert settings("--avspo.preset", "paper")["epsilon"] == launcher.OPENRLHF_EPSILON
    assert settings()["epsilon"] == launcher.OPENRLHF_EPSILON
    assert settings("--avspo.preset", "paper_code", "--avspo.epsilon", "1e-6")["epsilon"] == 1e-6


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


def test_ray_init_gets_the_settings_and_leaves_the_workers_setup_hook_to_the_user():
    seen = {}

    def init(**kwargs):
        seen.update(kwargs)

    wrapped = launcher.runtime_env_hook(init, {"preset": "paper_code"}, {"tau": 0.1})
    wrapped(runtime_env={"env_vars": {"NCCL_DEBUG": "WARN"}}, num_cpus=2)
    assert seen["num_cpus"] == 2
    assert "worker_process_setup_hook" not in seen["runtime_env"]  # nothing runs in the workers
    assert seen["runtime_env"]["env_vars"] == {
        "NCCL_DEBUG": "WARN",
        "VERL_AVSPO_OPENRLHF_SETTINGS": '{"preset": "paper_code"}',
        "VERL_AVSPO_OPENRLHF_ACR": '{"tau": 0.1}',
        "VERL_AVSPO_OPENRLHF_PROMPT_SKIP": "",
    }
    launcher.runtime_env_hook(init, None, {"reward_range": [-1, 1]}, {"enable": True})()  # a run without AVSPO
    assert seen["runtime_env"]["env_vars"] == {
        "VERL_AVSPO_OPENRLHF_SETTINGS": "",
        "VERL_AVSPO_OPENRLHF_ACR": '{"reward_range": [-1, 1]}',
        "VERL_AVSPO_OPENRLHF_PROMPT_SKIP": '{"enable": true}',
    }
    wrapped(runtime_env={"worker_process_setup_hook": "mine"})
    assert seen["runtime_env"]["worker_process_setup_hook"] == "mine"


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
    assert out.startswith("usage: python -m verl_avspo.openrlhf") and "--acr.alert.rule" in out
    assert "OpenRLHF's own options cannot be listed here: OpenRLHF 0.11.2 is installed but its trainer" in out


def test_prompt_skip_flags_are_split_checked_and_refused_with_the_async_trainer():
    rest, skip = flags.split_prompt_skip_arguments(
        ["--prompts.skip.enable", "true", "--x", "--prompts.skip.explore=0.2"]
    )
    assert rest == ["--x"] and skip == {"enable": True, "explore": 0.2}
    assert flags.split_prompt_skip_arguments(["--acr.tau", "1e-3"]) == (["--acr.tau", "1e-3"], None)
    groups = ["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4"]
    assert launcher.check_prompt_skip(groups, skip) is True
    with pytest.raises(launcher.UsageError, match=r"synchronous trainer.*Drop --train.async_enable"):
        launcher.check_prompt_skip([*groups, "--train.async_enable"], skip)
    with pytest.raises(launcher.UsageError, match=r"--prompts.skip.explore=2 is invalid"):
        launcher.check_prompt_skip(groups, {"enable": True, "explore": 2})


def test_prompt_skip_is_refused_where_it_could_never_act():
    """The rule verl's launcher applies (core.prompt_skip.skip_problems), in OpenRLHF's flags: an estimator
    that compares no groups (OpenRLHF's default gae included), or one response per prompt."""
    skip = {"enable": True}
    for argv, given in (
        ([], "estimator gae"),
        (["--algo.advantage.estimator=reinforce", "--rollout.n_samples_per_prompt", "8"], "estimator reinforce"),
    ):
        with pytest.raises(launcher.UsageError) as refused:
            launcher.check_prompt_skip(argv, skip)
        message = str(refused.value)
        assert message.startswith(f"--prompts.skip.enable true with --algo.advantage.{given}: the skip rule predicts")
        assert message.endswith(
            "Use a group estimator (avspo, rloo, reinforce_baseline, group_norm, dr_grpo) or "
            "set --prompts.skip.enable false."
        )
    with pytest.raises(launcher.UsageError) as refused:
        launcher.check_prompt_skip(
            ["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt=1"], skip
        )
    assert str(refused.value).startswith("--prompts.skip.enable true with --rollout.n_samples_per_prompt 1: ")
    assert "Set --rollout.n_samples_per_prompt 8 (the paper's group size) or more" in str(refused.value)
    assert launcher.check_prompt_skip([], {"enable": False}) is False  # off: nothing to act on
    with pytest.raises(launcher.UsageError, match=r"--prompts.skip.enable needs a value, for example --prompts.skip"):
        flags.split_prompt_skip_arguments(["--prompts.skip.enable"])
