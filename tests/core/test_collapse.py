"""Group ids, segment statistics and ACR metrics (docs/method.md §2), against direct per-group computation,
and the warning for non-finite scores."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_avspo.core.collapse import (
    DroppedGroups,
    detect_collapse,
    effective_collapse_rate,
    group_ids,
    group_stats,
    measure_collapse,
)


def test_group_ids_from_strings_ints_and_tensors_agree():
    labels = ["b", "a", "b", "c", "a"]
    expected_partition = [[0, 2], [1, 4], [3]]
    for index in (
        np.array(labels, dtype=object),
        labels,
        np.array([2, 1, 2, 3, 1]),
        torch.tensor([20, 10, 20, 30, 10]),
        np.array(["x", 1, "x", 2.5, 1], dtype=object),  # mixed types compare by string form
    ):
        ids, num_groups = group_ids(index)
        assert num_groups == 3
        partition = sorted(sorted(torch.nonzero(ids == g).squeeze(1).tolist()) for g in range(num_groups))
        assert partition == expected_partition


def test_group_ids_errors_are_explained():
    with pytest.raises(ValueError, match="uid"):
        group_ids(None)
    with pytest.raises(ValueError, match="1-D"):
        group_ids(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="integer or string"):
        group_ids(torch.tensor([0.5, 1.5]))


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_group_stats_match_per_group_torch(sizes, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    ids = ids[torch.randperm(len(ids), generator=gen)]  # groups need not be contiguous
    scores = torch.randn(len(ids), generator=gen)
    stats = group_stats(scores, ids, len(sizes))
    for g, n in enumerate(sizes):
        x = scores[ids == g].double()
        assert stats.count[g] == n
        assert torch.isclose(stats.mean[g], x.mean())
        assert torch.isclose(stats.std_population[g], x.std(correction=0), atol=1e-12)
        assert stats.min[g] == x.min() and stats.max[g] == x.max()
        if n > 1:
            assert torch.isclose(stats.std_unbiased[g], x.std(), atol=1e-12)
        else:
            assert torch.isnan(stats.std_unbiased[g])


def test_identical_scores_have_exactly_zero_spread():
    scores = torch.full((7,), 0.1)  # 0.1 is inexact in binary: a one-pass variance would not be 0
    stats = group_stats(scores, torch.zeros(7, dtype=torch.long), 1)
    assert stats.std_population[0] == 0.0 and stats.sq_dev[0] == 0.0


def test_acr_counts_singletons_apart_and_splits_by_midpoint():
    # groups: all-correct (3), all-wrong (3), mixed (2), singleton correct, singleton wrong
    scores = torch.tensor([1.0, 1, 1, 0, 0, 0, 1, 0, 1, 0])
    index = np.array(list("aaabbbccde"), dtype=object)
    metrics = measure_collapse(scores, index)
    assert metrics["acr/rate"] == pytest.approx(2 / 3)
    assert metrics["acr/all_correct"] == pytest.approx(1 / 3)
    assert metrics["acr/all_wrong"] == pytest.approx(1 / 3)
    assert metrics["acr/groups"] == 3 and metrics["acr/singletons"] == 2
    assert "acr/effective" not in metrics


def test_reward_range_midpoint_decides_the_split():
    scores = torch.tensor([0.5, 0.5, 0.49, 0.49, -1.0, -1.0])
    ids, num_groups = group_ids(np.array(list("aabbcc")))
    stats = group_stats(scores, ids, num_groups)
    unit = detect_collapse(stats, reward_range=(0.0, 1.0))
    assert unit.all_correct.tolist() == [True, False, False] and unit.all_wrong.tolist() == [False, True, True]
    signed = detect_collapse(stats, reward_range=(-1.0, 1.0))
    assert signed.all_correct.tolist() == [True, True, False]


def test_tau_is_a_population_std_threshold():
    scores = torch.tensor([0.0, 4e-6, 0.0, 1.8e-6])
    ids, num_groups = group_ids(np.array(list("aabb")))
    collapse = detect_collapse(group_stats(scores, ids, num_groups), tau=1e-6)
    # population std of {0, 4e-6} is 2e-6, not below tau; of {0, 1.8e-6} it is 9e-7, below.
    assert collapse.collapsed.tolist() == [False, True]


def test_no_eligible_group_gives_zero_rates():
    metrics = measure_collapse(torch.tensor([1.0, 0.0]), np.array(["a", "b"]), advantages=torch.zeros(2))
    assert metrics["acr/rate"] == 0.0 and metrics["acr/effective"] == 0.0 and metrics["acr/singletons"] == 2


def test_effective_rate_uses_largest_token_advantage():
    ids, num_groups = group_ids(np.array(list("aabb")))
    stats = group_stats(torch.tensor([1.0, 1.0, 0.0, 1.0]), ids, num_groups)
    token_adv = torch.tensor([[0.0, 0.0], [0.0, 0.3], [0.0, 0.0], [0.0, 0.0]])
    assert effective_collapse_rate(token_adv, stats.ids, stats.count) == 0.5
    assert effective_collapse_rate(torch.zeros(4), stats.ids, stats.count) == 1.0


def test_groups_a_filter_dropped_count_as_if_they_were_measured():
    # Measuring the whole generation at once and measuring what the filter kept plus what it dropped
    # (collapsed groups by shared score, mixed ones as surplus) give the same rates: ACR before filtering.
    kept = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])  # a, d: mixed; b: all 1; c: all 0
    dropped_scores = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0])  # e: all 1, f: all 0, g: all 0, h: mixed
    everything = measure_collapse(
        torch.cat([kept, dropped_scores]), np.array(list("aabbccdd") + list("eeffgghh")), reward_range=(0.0, 1.0)
    )
    dropped = DroppedGroups({1.0: 1, 0.0: 2}, surplus=1)
    corrected = measure_collapse(kept, np.array(list("aabbccdd")), torch.ones(8), dropped=dropped)
    for key in ("acr/rate", "acr/all_correct", "acr/all_wrong", "acr/groups"):
        assert corrected[key] == everything[key], key
    assert corrected["acr/rate"] == 5 / 8 and corrected["acr/all_wrong"] == 3 / 8  # b, c, e, f, g; c, f, g
    # acr/effective is over the trained batch only (these advantages are all non-zero).
    assert corrected["acr/effective"] == 0.0


def test_a_dropped_group_is_split_at_the_reward_range_midpoint():
    dropped = DroppedGroups({0.5: 1, -0.2: 1, 0.9: 2})
    metrics = measure_collapse(
        torch.tensor([0.0, 1.0]), np.array(["a", "a"]), reward_range=(-1.0, 1.0), dropped=dropped
    )
    # Midpoint 0: 0.5 and 0.9 (3 groups) are all-correct, -0.2 all-wrong, plus the measured mixed group.
    assert (metrics["acr/all_correct"], metrics["acr/all_wrong"], metrics["acr/groups"]) == (3 / 5, 1 / 5, 5.0)
    assert not DroppedGroups() and not DroppedGroups({1.0: 0})


def test_non_finite_scores_are_measured_with_a_warning_that_names_the_groups_and_the_fix():
    # Group a: 1, NaN (not counted as collapsed); b: inf, inf; c: all wrong. Only c is collapsed.
    scores = torch.tensor([1.0, float("nan"), float("inf"), float("inf"), 0.0, 0.0])
    with pytest.warns(UserWarning) as caught:
        metrics = measure_collapse(scores, ["a", "a", "b", "b", "c", "c"])
    (warning,) = caught
    assert str(warning.message) == (
        "3 response score(s) are not finite (1 NaN, 2 inf) in group(s) uid=['a', 'b']: ACR counts their groups as "
        "not collapsed and acr/reward_mean is NaN. Fix the reward function so it always returns a finite number "
        "(for example 0.0 for an unparseable answer)."
    )
    assert metrics["acr/rate"] == pytest.approx(1 / 3) and np.isnan(metrics["acr/reward_mean"])
