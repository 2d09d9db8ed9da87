"""ACR's own settings (core.acr_config, algorithm.acr) and how verl's config.algorithm is read
(core.config.resolve_run_settings): ACR's keys under algorithm.avspo are refused naming their
algorithm.acr key (in the host's spelling where it passes its own), AVSPO keys with another estimator
are refused, a tau that is not small beside the reward range is refused (every group collapsed) or
warned of, and the seed is bounded as torch takes it."""

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


@pytest.mark.parametrize("estimator", ["avspo", "grpo"])
def test_acr_keys_under_avspo_are_refused_naming_their_acr_key(estimator):
    with pytest.raises(SettingsError) as error:
        resolve_run_settings({"adv_estimator": estimator, "avspo": {"tau": 0.01, "alert": {"window": 3}}})
    assert error.value.problems == [
        f"algorithm.avspo.{key} is not an AVSPO setting: ACR's settings apply to every estimator and have a "
        f"section of their own; set algorithm.acr.{key} instead."
        for key in ("tau", "alert")
    ]


def test_a_host_names_the_sections_in_its_own_spelling():
    with pytest.raises(SettingsError) as error:
        resolve_avspo({"reward_range": [0, 1], "gap": 2}, section="--avspo", acr_section="--acr")
    first, second = error.value.problems
    assert first.startswith("--avspo.reward_range is not an AVSPO setting") and "set --acr.reward_range" in first
    assert second.startswith("--avspo.gap=2 is invalid")
    with pytest.raises(SettingsError, match=r"^--acr\.tau=0 is invalid"):
        resolve_acr({"tau": 0}, section="--acr")


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
