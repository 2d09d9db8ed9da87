"""The pre-rollout skip rule (core.prompt_skip): its settings' validation (every bad key at once), the
keep probability p^z per kind of the latest collapse, the skip frequencies with a fixed seed, the
adaptive exploration probabilities, and a generator state that a resumed run continues from."""

import numpy as np
import pytest

from verl_avspo.core.prompt_history import PromptHistory
from verl_avspo.core.prompt_skip import (
    PromptSkipConfig,
    PromptSkipper,
    SkipSpelling,
    resolve_prompt_skip,
    skip_problems,
)
from verl_avspo.core.validation import SettingsError


def test_defaults_and_every_bad_key_at_once():
    assert resolve_prompt_skip(None) == PromptSkipConfig()
    assert resolve_prompt_skip({"enable": True, "explore": None}).enable
    with pytest.raises(SettingsError) as caught:
        resolve_prompt_skip(
            {"enable": "yes", "explore": 0, "target_all_wrong": 2, "explore_bounds": [0.0, 1.0], "seeds": 1},
            "algorithm.prompt_skip",
        )
    problems = caught.value.problems
    assert len(problems) == 5
    assert "algorithm.prompt_skip.seeds is not a setting. Did you mean algorithm.prompt_skip.seed?" in problems[0]
    assert any("algorithm.prompt_skip.enable='yes'" in p for p in problems)
    assert any("algorithm.prompt_skip.explore=0 " in p and "(0.0, 1.0]" in p for p in problems)
    assert any("target_all_wrong=2" in p for p in problems)
    assert any("explore_bounds=[0.0, 1.0]" in p and "low > 0" in p for p in problems)
    with pytest.raises(SettingsError, match=r"explore=0.9 is invalid: it must lie within .*explore_bounds"):
        resolve_prompt_skip({"explore": 0.9, "explore_bounds": [0.1, 0.5]})


def history_with_streaks():
    """Prompts 0..3: all-correct twice, all-wrong once, mixed last, never seen (4)."""
    history = PromptHistory()
    history.record([0, 1, 2], [1.0, 0.0, 1.0], [True, False, True], [False, True, False], 1)
    history.record([0, 2], [1.0, 0.5], [True, False], [False, False], 2)
    return history


def test_keep_probability_is_p_to_the_streak_per_kind():
    skipper = PromptSkipper(PromptSkipConfig(enable=True))
    skipper.explore = np.array([0.5, 0.2])  # p(all_correct), p(all_wrong)
    probability = skipper.keep_probability([0, 1, 2, 4], history_with_streaks())
    assert probability.tolist() == pytest.approx([0.25, 0.2, 1.0, 1.0])


def test_skip_frequencies_with_a_fixed_seed():
    history = PromptHistory()
    n = 20_000
    keys = np.arange(n)
    for step in (1, 2):  # every prompt all-correct twice: kept with 0.5**2
        history.record(keys, np.ones(n), np.ones(n, bool), np.zeros(n, bool), step)
    skipper = PromptSkipper(PromptSkipConfig(enable=True, seed=3))
    kept = skipper.keep(np.concatenate([keys, keys + n]), history)
    assert abs(kept[:n].mean() - 0.25) < 4 * np.sqrt(0.25 * 0.75 / n)
    assert kept[n:].all()  # never seen: always rolled out
    again = PromptSkipper(PromptSkipConfig(enable=True, seed=3)).keep(keys, history)
    assert np.array_equal(again, kept[:n])


def test_adaptive_exploration_moves_toward_the_targets_within_bounds():
    config = PromptSkipConfig(enable=True, explore=0.5, explore_step=0.25, explore_bounds=(0.2, 0.9))
    skipper = PromptSkipper(config)
    skipper.update(all_correct_share=0.6, all_wrong_share=0.0)  # too many all-correct: explore them less
    assert skipper.explore.tolist() == [0.25, 0.75]
    skipper.update(0.6, 0.0)
    assert skipper.explore.tolist() == [0.2, 0.9]  # clipped
    assert skipper.metrics() == {"prompts/explore_all_correct": 0.2, "prompts/explore_all_wrong": 0.9}
    fixed = PromptSkipper(PromptSkipConfig(enable=True, adaptive=False))
    fixed.update(1.0, 1.0)
    assert fixed.explore.tolist() == [0.5, 0.5]


def test_state_round_trip_continues_the_same_draws():
    history = history_with_streaks()
    skipper = PromptSkipper(PromptSkipConfig(enable=True, seed=1))
    skipper.keep(list(range(5)) * 10, history)
    skipper.update(0.5, 0.0)
    skipper.rollouts_skipped = 24
    restored = PromptSkipper(PromptSkipConfig(enable=True, seed=99))
    restored.load_state_dict(skipper.state_dict())
    keys = list(range(5)) * 20
    assert np.array_equal(restored.keep(keys, history), skipper.keep(keys, history))
    assert restored.explore.tolist() == skipper.explore.tolist() and restored.rollouts_skipped == 24


def test_skipping_where_it_could_never_act_is_named_in_the_hosts_spelling():
    """One rule for every host (verl's launcher, OpenRLHF's): groups compared by the estimator, of at least 2."""
    flags = SkipSpelling("--prompts.skip", "--estimator", "--n", "grpo", assign=" ", true="true", false="false")
    (no_groups,) = skip_problems(flags, "gae", False, 8)
    assert no_groups.startswith("--prompts.skip.enable true with --estimator gae: the skip rule predicts")
    assert no_groups.endswith("Use a group estimator (grpo) or set --prompts.skip.enable false.")
    assert skip_problems(flags, "gae", False, 1) == [no_groups]  # the estimator first: any n is moot
    (single,) = skip_problems(SkipSpelling("a.skip", "a.est", "r.n", "grpo"), "grpo", True, 1)
    assert single.startswith("a.skip.enable=True with r.n=1: ") and single.endswith(
        "Set r.n=8 (the paper's group size) or more, or set a.skip.enable=False."
    )
    assert skip_problems(flags, "grpo", True, 2) == []
    assert skip_problems(flags, "grpo", True, "${oc.env:N}") == []  # not a number: the host's own checks say so
