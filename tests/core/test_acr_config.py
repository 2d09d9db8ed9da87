"""ACR's own settings (core.acr_config, algorithm.acr) and how verl's config.algorithm is read
(core.config.resolve_run_settings): the old algorithm.avspo spellings warn with the new key, a
conflict between both places is an error, AVSPO keys with another estimator are refused, a tau that
is not small beside the reward range is refused (every group collapsed) or warned of, and the seed is
bounded as torch takes it."""

import warnings

import pytest
import torch

from verl_avspo.core.acr_config import ACRConfig, AlertConfig, resolve_acr
from verl_avspo.core.config import MAX_SEED, SettingsError, resolve_avspo, resolve_run_settings


def test_acr_has_its_own_section():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling warns about nothing
        settings = resolve_run_settings({"adv_estimator": "grpo", "acr": {"tau": 1e-3, "alert": {"window": 7}}})
    assert settings.acr == ACRConfig(tau=1e-3, alert=AlertConfig(window=7)) and settings.avspo is None


def test_the_old_spelling_still_works_and_names_the_new_key():
    with pytest.warns(FutureWarning, match=r"algorithm\.avspo\.tau is deprecated.*algorithm\.acr\.tau"):
        settings = resolve_run_settings({"adv_estimator": "avspo", "avspo": {"tau": 0.01, "gap": 0.2}})
    assert settings.acr.tau == 0.01 and settings.avspo.gap == 0.2


def test_an_all_null_old_alert_section_is_not_a_setting():
    """The launcher's YAML declares algorithm.avspo.alert.* as null: no warning for what nobody set."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_run_settings({"adv_estimator": "avspo", "avspo": {"alert": {"window": None}}})


def test_both_places_disagreeing_is_an_error():
    with pytest.raises(SettingsError, match=r"algorithm\.avspo\.tau=0\.1 and algorithm\.acr\.tau=0\.2 disagree"):
        resolve_run_settings({"adv_estimator": "avspo", "acr": {"tau": 0.2}, "avspo": {"tau": 0.1}})


def test_avspo_keys_with_another_estimator_are_refused_with_the_fix():
    with pytest.raises(SettingsError) as error:
        resolve_run_settings({"adv_estimator": "grpo", "avspo": {"strategy": "random", "k": 4}})
    message = str(error.value)
    assert "algorithm.avspo.k=4" in message and "algorithm.avspo.strategy='random'" in message
    assert "algorithm.adv_estimator=avspo" in message


def test_bad_acr_values_name_the_new_keys_all_at_once():
    with pytest.raises(SettingsError) as error:
        resolve_acr({"tau": 0, "reward_range": [1, 0], "alert": {"window": 0}})
    assert len(error.value.problems) == 3
    assert all(p.startswith(("algorithm.acr.tau", "algorithm.acr.reward_range", "algorithm.acr.alert.window"))
               for p in error.value.problems)  # fmt: skip


@pytest.mark.parametrize(
    ("tau", "reward_range", "limit"),
    [(5.0, [0, 1], 0.5), (0.5, [0, 1], 0.5), (1.0, [-1, 1], 1.0), (20.0, [0, 10], 5.0)],
)
def test_a_tau_that_makes_every_group_collapsed_is_refused(tau, reward_range, limit):
    with pytest.raises(SettingsError) as error:
        resolve_acr({"tau": tau, "reward_range": reward_range})
    (message,) = error.value.problems
    assert message.startswith(f"algorithm.acr.tau={tau} is invalid: a group's scores within reward_range")
    assert f"have a population std of at most {limit}, so every group would count as collapsed" in message


def test_a_tau_not_small_beside_the_reward_range_is_warned_of_and_a_small_one_is_not():
    with pytest.warns(UserWarning, match=r"^algorithm\.acr\.tau=0\.2 is 20% of reward_range \[0\.0, 1\.0\]: groups"):
        assert resolve_acr({"tau": 0.2}).tau == 0.2
    with pytest.warns(UserWarning, match=r"^algorithm\.acr\.tau=1\.5 is 15% of reward_range \[0\.0, 10\.0\]"):
        resolve_acr({"tau": 1.5, "reward_range": [0, 10]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_acr({"tau": 0.1})  # a tenth of the range: still below the std of a 0/1 group of 64 with one success
        resolve_acr({"tau": 1e-3, "reward_range": [0, 10]})


def test_the_seed_is_bounded_as_torch_takes_it():
    torch.Generator().manual_seed(MAX_SEED)  # the largest torch takes
    assert resolve_avspo({"seed": MAX_SEED}).seed == MAX_SEED
    with pytest.raises(SettingsError, match=r"algorithm\.avspo\.seed=18446744073709551616 is invalid"):
        resolve_avspo({"seed": MAX_SEED + 1})
