"""Every bad ``algorithm.avspo`` setting raises a ValueError from the core that names the problem and
the fix (bad batches through verl's entry point: tests/verl_plugin/test_estimator_errors.py)."""

import pytest

from verl_avspo.core.config import PRESETS, SettingsError, resolve_settings


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"strategies": "stratified"},
            r"algorithm.avspo.strategies is not a setting. Did you mean algorithm.avspo.strategy\? Allowed keys of "
            r"algorithm.avspo: preset, strategy",
        ),
        ({"strategy": "stratifed"}, r"strategy='stratifed' is invalid: allowed values are stratified, opposite, www"),
        ({"preset": "papers"}, r"preset='papers' is invalid: allowed values are paper, paper_code, grpo"),
        ({"apply_to": "correct"}, r"apply_to='correct' is invalid: allowed values are both, all_correct, all_wrong"),
        ({"acr_signal": "mean"}, r"acr_signal='mean' is invalid: allowed values are batch, ema"),
        ({"tau": 0}, r"tau=0 is invalid: expected a finite number > 0.0"),
        ({"tau": float("nan")}, r"tau=nan is invalid: expected a finite number"),
        ({"gap": 1.5}, r"gap=1.5 is invalid: expected a number in \(0.0, 1.0\]"),
        ({"gap": "0.1"}, r"gap='0.1' is invalid: expected a finite number"),
        ({"k": 0}, r"k=0 is invalid: expected a positive integer or 'adaptive'"),
        ({"k": "auto"}, r"k='auto' is invalid: expected a positive integer or 'adaptive'"),
        ({"k": True}, r"k=True is invalid"),
        ({"k": 2.5}, r"k=2.5 is invalid"),
        ({"alpha": -1}, r"alpha=-1 is invalid"),
        ({"ema_beta": 1.0}, r"ema_beta=1.0 is invalid: expected a number in \[0.0, 1.0\)"),
        ({"adaptive_threshold": "yes"}, r"adaptive_threshold='yes' is invalid: expected true or false"),
        ({"threshold_init": 1.2}, r"threshold_init=1.2 is invalid: expected a number in \[0.0, 1.0\]"),
        ({"threshold_init": 0.05}, r"threshold_init=0.05 is invalid: with adaptive_threshold=true it must lie within"),
        ({"eta": -0.1}, r"eta=-0.1 is invalid"),
        ({"threshold_bounds": [0.9, 0.1]}, r"threshold_bounds=\[0.9, 0.1\] is invalid: expected low < high"),
        ({"threshold_bounds": [0.0, 2.0]}, r"threshold_bounds=\[0.0, 2.0\] is invalid: expected 0 <= low < high <= 1"),
        ({"threshold_bounds": 0.5}, r"threshold_bounds=0.5 is invalid: expected a pair \[low, high\]"),
        ({"reward_range": [1, 0]}, r"algorithm.acr.reward_range=\[1, 0\] is invalid: expected low < high"),
        ({"reward_range": [0, 1, 2]}, r"reward_range=\[0, 1, 2\] is invalid: expected a pair"),
        ({"seed": -1}, r"seed=-1 is invalid: expected an integer >= 0"),
        ({"epsilon": 0}, r"epsilon=0 is invalid"),
        ({"alert": {"window": 0}}, r"alert.window=0 is invalid: expected an integer >= 1"),
        ({"alert": {"action": "halt"}}, r"alert.action='halt' is invalid: allowed values are warn, stop"),
        (
            {"alert": {"windows": 5}},
            r"algorithm.acr.alert.windows is not a setting. Did you mean algorithm.acr.alert.window\?",
        ),
        ({"preset": "PAPER"}, r"preset='PAPER' is invalid: .*\(did you mean 'paper'\?\)"),
        ({"alert": 5}, r"algorithm.acr.alert=5 is invalid: it is a group of settings; set its keys"),
        (
            {"trigger_scope": "batches"},
            r"trigger_scope='batches' is invalid: allowed values are group, batch \(did you mean 'batch'\?\)",
        ),
        (
            {"strategy": "beta", "trigger_scope": "batch"},
            r"trigger_scope='batch' is invalid: strategy=beta .* reads no virtual-sample",
        ),
    ],
)
def test_bad_settings_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        resolve_settings(settings)


def test_not_a_mapping():
    with pytest.raises(ValueError, match=r"algorithm.avspo=.* is invalid: it is a group of settings"):
        resolve_settings("paper")


def test_presets_and_overrides():
    assert resolve_settings(None) == resolve_settings({}) == resolve_settings({"preset": "paper"})
    code, _ = resolve_settings({"preset": "paper_code"})
    assert (code.strategy, code.k, code.adaptive_threshold, code.threshold_init) == ("opposite", 1, False, 0.0)
    # Keys beside the preset override it; None means "not given" (a Hydra null).
    mixed, _ = resolve_settings({"preset": "paper_code", "threshold_init": 0.2, "strategy": None})
    assert mixed.threshold_init == 0.2 and mixed.strategy == "opposite"
    assert resolve_settings({"preset": "grpo"})[0].apply_to == "none"
    assert resolve_settings({"k": "4"})[0].k == 4
    assert set(PRESETS) == {"paper", "paper_code", "grpo", "beta_loo", "beta_fitted"}


def test_a_misspelt_key_is_reported_with_the_other_problems():
    with pytest.raises(SettingsError) as err:
        resolve_settings({"treshold_init": 0.3, "strategy": "stratifed", "alert": {"windw": 3, "action": "halt"}})
    problems = err.value.problems
    assert any(
        "algorithm.avspo.treshold_init is not a setting. Did you mean algorithm.avspo.threshold_init?" in p
        for p in problems
    )
    assert any("strategy='stratifed'" in p for p in problems)
    assert any("Did you mean algorithm.acr.alert.window?" in p for p in problems)
    assert any("alert.action='halt'" in p for p in problems)


def test_a_whole_section_given_a_value_names_its_keys():
    with pytest.raises(
        ValueError, match=r"algorithm.avspo='paper_code' is invalid: .* algorithm.avspo.preset=paper_code"
    ):
        resolve_settings("paper_code")


def test_the_baselines_sections_are_read_as_algorithm_avspo_is():
    # One reader for every settings section: an unknown key gets a did-you-mean and is reported
    # with the section's other problems; a section that is not a mapping says how to set a key.
    from verl_avspo.core.baseline_settings import resolve_dcpo, resolve_intrinsic

    with pytest.raises(ValueError) as error:
        resolve_dcpo({"epsilon": -1, "epsilom": 0})
    assert str(error.value).splitlines() == [
        "algorithm.dcpo.epsilom is not a setting. Did you mean algorithm.dcpo.epsilon? Allowed keys of "
        "algorithm.dcpo: epsilon.",
        "algorithm.dcpo.epsilon=-1 is invalid: expected a finite number >= 0 added to the stds before dividing. "
        "Set algorithm.dcpo.epsilon=1e-6 (verl's GRPO value).",
    ]
    with pytest.raises(ValueError, match=r"algorithm.intrinsic='x' is invalid: it is a group of settings"):
        resolve_intrinsic("x")
