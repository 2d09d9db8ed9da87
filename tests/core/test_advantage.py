"""The AVSPO advantage (docs/method.md §3-§5): closed forms, signs, isolation, K, threshold, state, presets,
and exact equivalence with verl's own ``compute_grpo_outcome_advantage``; groups of unequal size (§9: sizes
1, 2, 4, 8 and 12 in one batch, an extended pilot, a dropped pilot) against a plain per-group reference,
for GRPO and for AVSPO's virtual rewards."""

import dataclasses
import io
import math
import re
import statistics

import pytest
import torch
from helpers import group_uids, outcome_batch, released_code_rule
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_avspo.core.advantage import compute_avspo_outcome_advantage
from verl_avspo.core.collapse import measure_collapse
from verl_avspo.core.config import resolve_settings
from verl_avspo.core.controller import AdaptiveController
from verl_avspo.core.run_tracker import RunTracker
from verl_avspo.core.virtual import closed_form_advantage, virtual_counts, virtual_rewards


def avspo(scores, index, norm=True, controller=None, **settings):
    """One AVSPO step through the run's step owner, as every host runs it; ``metrics`` holds the
    tracker's whole step report (acr/* and avspo/*). ``controller`` carries θ across calls."""
    cfg, acr = resolve_settings(settings)
    tracker = RunTracker(acr, cfg)
    if controller is not None:
        tracker.controller = controller
    rewards, mask = outcome_batch(scores)
    output = tracker.avspo_advantages(rewards, mask, index, norm)
    return dataclasses.replace(output, metrics=tracker.end_step(1, output.scalar_advantages))


def first_token(output):
    return output.advantages[:, 0]


# --- equivalence with verl's grpo --------------------------------------------------------------


@pytest.mark.verl
@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=10),
    binary=st.booleans(),
    norm=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_preset_grpo_equals_verl_grpo(sizes, binary, norm, seed):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    scores = (torch.rand(n, generator=gen) < 0.5).float() if binary else torch.randn(n, generator=gen).double()
    lengths = torch.randint(1, 6, (n,), generator=gen)
    rewards, mask = outcome_batch(scores, length=5, lengths=lengths)
    order = torch.randperm(n, generator=gen)  # groups interleaved, as after verl's balancing
    index = group_uids(sizes)[order.numpy()]
    rewards, mask = rewards[order], mask[order]
    cfg, acr = resolve_settings({"preset": "grpo", "reward_range": [-10, 10]})
    ours = compute_avspo_outcome_advantage(rewards, mask, index, cfg, acr, AdaptiveController(cfg, acr), norm)
    theirs, returns = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    torch.testing.assert_close(ours.advantages, theirs, atol=1e-6, rtol=1e-6)
    measured = measure_collapse(rewards.sum(dim=-1), index, ours.advantages, reward_range=(-10, 10))
    assert measured["acr/effective"] == measured["acr/rate"]


@pytest.mark.verl
@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=10), seed=st.integers(0, 2**16))
def test_batch_without_collapse_equals_verl_grpo_under_paper_preset(sizes, seed):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(sum(sizes), generator=gen).double()  # continuous: no group of n >= 2 collapses
    rewards, mask = outcome_batch(scores)
    cfg, acr = resolve_settings({"preset": "paper", "threshold_init": 0.1, "reward_range": [-10, 10]})
    ours = compute_avspo_outcome_advantage(rewards, mask, group_uids(sizes), cfg, acr, AdaptiveController(cfg, acr))
    theirs, _ = compute_grpo_outcome_advantage(rewards, mask, group_uids(sizes))
    torch.testing.assert_close(ours.advantages, theirs, atol=1e-6, rtol=1e-6)
    assert ours.collapse.rate == 0.0


# --- closed forms and signs -----------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 8, 16])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_identical_virtual_values_give_the_closed_form(n, k):
    # `fixed` puts all K virtual values at the same point (lo + hi) / 2, away from c.
    out = avspo([1.0] * n + [0.0] * n, group_uids([n, n]), strategy="fixed", k=k, threshold_init=0.1)
    expected = math.sqrt(k * (n + k - 1) / (n * (n + k)))
    assert expected == pytest.approx(closed_form_advantage(n, k))
    torch.testing.assert_close(first_token(out)[:n], torch.full((n,), expected), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first_token(out)[n:], torch.full((n,), -expected), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gap", [0.01, 0.1, 0.5, 1.0])
def test_push_size_does_not_depend_on_distance_under_std_normalisation(gap):
    n = 6
    # A tiny epsilon shows the pure algebra; with verl's 1e-6 the size is the same once |c - v| >> 1e-6.
    out = avspo([1.0] * n, group_uids([n]), strategy="stratified", k=1, gap=gap, threshold_init=0.1, epsilon=1e-12)
    torch.testing.assert_close(first_token(out), torch.full((n,), 1 / math.sqrt(n + 1)), atol=1e-5, rtol=1e-5)


def test_gap_sets_the_push_without_std_normalisation():
    n, gap = 4, 0.2
    out = avspo([1.0] * n, group_uids([n]), norm=False, strategy="stratified", k=1, gap=gap, threshold_init=0.1)
    # mu' = (n * 1 + (1 - gap)) / (n + 1), so A = 1 - mu' = gap / (n + 1)
    torch.testing.assert_close(first_token(out), torch.full((n,), gap / (n + 1)))


@pytest.mark.parametrize("strategy", ["stratified", "opposite", "random", "fixed", "exp_decay", "www"])
def test_all_correct_pushes_up_and_all_wrong_pushes_down(strategy):
    out = avspo(
        [1.0] * 4 + [0.0] * 4 + [1.0, 0.0, 1.0], group_uids([4, 4, 3]), strategy=strategy, k=3, threshold_init=0.1
    )
    adv = first_token(out)
    assert torch.all(adv[:4] > 0.1)
    if strategy == "www":
        # The earlier manuscript's c * (1 - (k-1)/K) is 0 for c = 0: all-wrong groups stay collapsed.
        assert torch.all(adv[4:8] == 0)
        assert out.metrics["acr/effective"] == pytest.approx(1 / 3)
    else:
        assert torch.all(adv[4:8] < -0.1)
        assert out.metrics["acr/effective"] == 0.0
    # The mixed group is untouched: plain GRPO.
    mixed = torch.tensor([1.0, 0.0, 1.0])
    torch.testing.assert_close(adv[8:], (mixed - mixed.mean()) / (mixed.std() + 1e-6))


@pytest.mark.parametrize(
    ("apply_to", "correct_moves", "wrong_moves"),
    [("both", True, True), ("all_correct", True, False), ("all_wrong", False, True), ("none", False, False)],
)
def test_apply_to_isolates_the_two_halves(apply_to, correct_moves, wrong_moves):
    out = avspo([1.0] * 4 + [0.0] * 4, group_uids([4, 4]), apply_to=apply_to, threshold_init=0.1)
    adv = first_token(out)
    assert bool(torch.all(adv[:4] > 0)) is correct_moves and bool(torch.all(adv[:4] == 0)) is not correct_moves
    assert bool(torch.all(adv[4:] < 0)) is wrong_moves and bool(torch.all(adv[4:] == 0)) is not wrong_moves
    assert out.metrics["avspo/triggered"] == (correct_moves + wrong_moves) / 2


def test_paper_code_is_one_opposite_label_sample_with_unbiased_std_always_on():
    n = 5
    # ACR = 1/10: far below the paper threshold, but paper_code triggers always (θ = 0).
    scores = [1.0] * n + [1.0, 0.0] * 9 * 1
    sizes = [n] + [2] * 9
    out = avspo(scores, group_uids(sizes), preset="paper_code")
    augmented = torch.tensor([1.0] * n + [0.0])
    expected = (1.0 - augmented.mean()) / (augmented.std() + 1e-4)  # the released code's epsilon
    torch.testing.assert_close(first_token(out)[:n], expected.expand(n))
    assert out.metrics["avspo/virtual_k"] == 1.0 and out.metrics["avspo/threshold"] == 0.0


@pytest.mark.parametrize("group_size", [2, 4, 8, 16])
def test_paper_code_reproduces_the_released_rule_with_one_prompt_per_step(group_size):
    """The authors' layout: one prompt per step, so batch and group are the same; every outcome of
    a binary verifier, all-0 and all-1 included, over a run's worth of steps."""
    generator = torch.Generator().manual_seed(group_size)
    controller = None
    steps = [[0.0] * group_size, [1.0] * group_size]
    steps += [torch.randint(0, 2, (group_size,), generator=generator).float().tolist() for _ in range(20)]
    for scores in steps:
        cfg, acr = resolve_settings({"preset": "paper_code"})
        controller = controller or AdaptiveController(cfg, acr)
        rewards, mask = outcome_batch(scores)
        out = compute_avspo_outcome_advantage(rewards, mask, group_uids([group_size]), cfg, acr, controller)
        torch.testing.assert_close(out.scalar_advantages, released_code_rule(scores, group_size))


@pytest.mark.parametrize("prompts", [2, 8])
def test_paper_code_with_batch_scope_reproduces_the_released_rule_on_multi_prompt_batches(prompts):
    """8 prompts x 8 answers (the recipes' batch): the released rule fires only on an all-0 or
    all-1 batch, which trigger_scope=batch follows; the default group scope augments every
    collapsed group, so it differs from the released code on exactly those groups, by 1/sqrt(G+1)."""
    group_size = 8
    generator = torch.Generator().manual_seed(prompts)
    steps = [[0.0] * prompts * group_size, [1.0] * prompts * group_size]
    # Collapsed groups (all 0 or all 1) beside groups with signal (random, first 0 and last 1).
    for _ in range(10):
        batch = []
        for kind in torch.randint(0, 3, (prompts,), generator=generator).tolist():
            group = [float(kind)] * group_size
            if kind == 2:
                group = torch.randint(0, 2, (group_size,), generator=generator).float().tolist()
                group[0], group[-1] = 0.0, 1.0
            batch += group
        steps.append(batch)
    batch_cfg, acr = resolve_settings({"preset": "paper_code", "trigger_scope": "batch"})
    group_cfg, acr = resolve_settings({"preset": "paper_code"})
    batch_controller, group_controller = AdaptiveController(batch_cfg, acr), AdaptiveController(group_cfg, acr)
    index = group_uids([group_size] * prompts)
    fired_differently = 0
    for scores in steps:
        rewards, mask = outcome_batch(scores)
        reference = released_code_rule(scores, group_size)
        batch = compute_avspo_outcome_advantage(rewards, mask, index, batch_cfg, acr, batch_controller)
        torch.testing.assert_close(batch.scalar_advantages, reference)
        group = compute_avspo_outcome_advantage(rewards, mask, index, group_cfg, acr, group_controller)
        differs = (group.scalar_advantages - reference).abs() > 1e-5
        grouped = torch.tensor(scores).view(prompts, group_size)
        collapsed = (grouped == grouped[:, :1]).all(dim=1).repeat_interleave(group_size)
        at_one_end = len(set(scores)) == 1
        assert torch.equal(differs, collapsed & (not at_one_end))
        gap = (group.scalar_advantages - reference)[differs].abs()
        torch.testing.assert_close(gap, torch.full_like(gap, 1 / math.sqrt(group_size + 1)), atol=1e-3, rtol=0)
        fired_differently += int(differs.any())
    assert fired_differently > 0  # the steps hold collapsed groups in mixed batches


def test_batch_scope_uses_the_reward_range_and_leaves_other_batches_to_grpo():
    """With reward_range [-1, 1] the batch is "all wrong" at -1; a batch all at the midpoint, or a
    collapsed group beside a mixed one, is not augmented."""
    settings = {"preset": "paper_code", "trigger_scope": "batch", "reward_range": [-1.0, 1.0]}
    all_wrong = avspo([-1.0] * 4, group_uids([2, 2]), **settings)
    augmented = torch.tensor([-1.0, -1.0, 1.0])  # one virtual sample at the other end
    expected = (-1.0 - augmented.mean()) / (augmented.std() + 1e-4)
    torch.testing.assert_close(first_token(all_wrong), expected.expand(4))
    for scores in ([0.0] * 4, [-1.0, -1.0, -1.0, 1.0]):
        out = avspo(scores, group_uids([2, 2]), **settings)
        assert out.metrics["avspo/triggered"] == 0.0 and bool(out.virtual_k.eq(0).all())


@pytest.mark.parametrize(
    ("acr_section", "named"), [("algorithm.acr", "algorithm.acr"), ("--acr", "--acr"), (None, "acr")]
)
def test_scores_outside_the_reward_range_warn_naming_the_hosts_setting(acr_section, named):
    cfg, acr = resolve_settings({})
    tracker = RunTracker(acr, cfg, **({} if acr_section is None else {"acr_section": acr_section}))
    rewards, mask = outcome_batch([2.0, 2.0])
    with pytest.warns(
        UserWarning, match=rf"^response scores fall outside {re.escape(named)}\.reward_range=\[0.0, 1.0\]"
    ):
        tracker.avspo_advantages(rewards, mask, group_uids([2]))


def test_singletons_get_verl_mean_zero_std_one():
    out = avspo([0.7, 1.0, 1.0], group_uids([1, 2]), threshold_init=0.1)
    assert first_token(out)[0].item() == pytest.approx(0.7 / (1 + 1e-6))
    assert out.metrics["acr/singletons"] == 1.0


# --- the virtual values and K ----------------------------------------------------------------------


def test_each_strategy_virtual_values():
    c = torch.tensor([1.0, 0.0], dtype=torch.float64)
    correct = torch.tensor([True, False])
    k = torch.tensor([4, 4])

    def values(strategy, generator=None):
        v, valid = virtual_rewards(strategy, c, correct, k, (0.0, 1.0), 0.1, generator)
        assert valid.all()
        return v

    torch.testing.assert_close(
        values("stratified"), torch.tensor([[0.975, 0.95, 0.925, 0.9], [0.025, 0.05, 0.075, 0.1]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        values("exp_decay"), torch.tensor([[0.9, 0.95, 0.975, 0.9875], [0.1, 0.05, 0.025, 0.0125]], dtype=torch.float64)
    )
    torch.testing.assert_close(values("opposite"), torch.tensor([[0.0] * 4, [1.0] * 4], dtype=torch.float64))
    torch.testing.assert_close(values("www"), torch.tensor([[1.0, 0.75, 0.5, 0.25], [0.0] * 4], dtype=torch.float64))
    torch.testing.assert_close(values("fixed"), torch.full((2, 4), 0.5, dtype=torch.float64))
    first = values("random", torch.Generator().manual_seed(3))
    assert torch.equal(first, values("random", torch.Generator().manual_seed(3)))
    assert not torch.equal(first, values("random", torch.Generator().manual_seed(4)))
    assert torch.all((first >= 0) & (first <= 1))


def test_ragged_k_masks_the_tail():
    v, valid = virtual_rewards(
        "stratified",
        torch.tensor([1.0, 1.0], dtype=torch.float64),
        torch.tensor([True, True]),
        torch.tensor([1, 3]),
        (0.0, 1.0),
        0.3,
    )
    assert valid.tolist() == [[True, False, False], [True, True, True]]
    torch.testing.assert_close(v, torch.tensor([[0.7, 0.0, 0.0], [0.9, 0.8, 0.7]], dtype=torch.float64))


@pytest.mark.parametrize(
    ("n", "signal", "expected"),
    [(8, 0.75, 7), (8, 1.0, 8), (8, 0.0, 1), (8, 0.01, 1), (3, 0.5, 3), (16, 0.25, 8), (1, 0.9, 1)],
)
def test_adaptive_k_rule(n, signal, expected):
    # K = max(1, min(n, ceil(n * s ** 0.5)))
    assert expected == max(1, min(n, math.ceil(n * signal**0.5)))
    assert virtual_counts(torch.tensor([n]), "adaptive", signal, 0.5, "stratified").item() == expected


def test_fixed_k_and_opposite_forces_one():
    sizes = torch.tensor([2, 8])
    assert virtual_counts(sizes, 3, 0.9, 0.5, "stratified").tolist() == [3, 3]
    assert virtual_counts(sizes, 3, 0.9, 0.5, "opposite").tolist() == [1, 1]


def test_adaptive_k_is_used_per_group():
    # 3 of 4 groups collapsed: s = 0.75. n = 8 -> K = 7, n = 4 -> K = ceil(4 * 0.866) = 4
    scores = [1.0] * 8 + [0.0] * 4 + [1.0] * 4 + [1.0, 0.0]
    out = avspo(scores, group_uids([8, 4, 4, 2]))
    assert out.virtual_k.tolist() == [7, 4, 4, 0]
    assert out.metrics["avspo/virtual_k"] == pytest.approx(5.0)


# --- groups of unequal size (docs/method.md §9) ----------------------------------------------------

RAGGED_SIZES = [1, 2, 4, 8, 12]


def reference_advantages(groups, norm=True, signal=None, gap=0.1, alpha=0.5, epsilon=1e-6):
    """docs/method.md §1, §3 and §9 by hand, one group at a time: each group's own mean and unbiased std over
    its n rewards (a singleton: mean 0, std 1); with ``signal`` (AVSPO triggered, stratified, adaptive K), a
    collapsed group of n >= 2 also counts K = max(1, min(n, ceil(n signal^alpha))) virtual values
    c -/+ gap k/K (reward range [0, 1]) in its mean and std."""
    out = []
    for rewards in groups:
        values = list(rewards)
        n = len(rewards)
        collapsed = n >= 2 and max(rewards) == min(rewards)
        if signal is not None and collapsed:
            k = max(1, min(n, math.ceil(n * signal**alpha)))
            direction = -1.0 if rewards[0] >= 0.5 else 1.0
            values += [rewards[0] + direction * gap * j / k for j in range(1, k + 1)]
        mean, std = (0.0, 1.0) if n == 1 else (statistics.fmean(values), statistics.stdev(values))
        out.append([(r - mean) / (std + epsilon) if norm else r - mean for r in rewards])
    return out


def interleaved(groups, seed=0):
    """The groups' scores and uids in one random order (as after verl's balancing), and that order."""
    scores = torch.tensor([r for rewards in groups for r in rewards], dtype=torch.float64)
    index = group_uids([len(rewards) for rewards in groups])
    order = torch.randperm(len(scores), generator=torch.Generator().manual_seed(seed))
    return scores[order], index[order.numpy()], order


def ragged_groups(seed):
    """Binary rewards for groups of RAGGED_SIZES: the group of 2 all-wrong and the group of 12 all-correct
    (collapsed), the others mixed."""
    gen = torch.Generator().manual_seed(seed)
    groups = [[float(torch.rand(1, generator=gen) < 0.5)], [0.0, 0.0]]
    for size in (4, 8):
        mixed = (torch.rand(size, generator=gen) < 0.5).double()
        mixed[0], mixed[1] = 0.0, 1.0
        groups.append(mixed.tolist())
    return groups + [[1.0] * 12]


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ragged_grpo_matches_the_per_group_reference(norm, seed):
    groups = ragged_groups(seed)
    scores, index, order = interleaved(groups, seed)
    out = avspo(scores.tolist(), index, norm, preset="grpo")
    expected = torch.tensor([a for group in reference_advantages(groups, norm) for a in group], dtype=torch.float64)
    torch.testing.assert_close(first_token(out).double(), expected[order], atol=1e-6, rtol=1e-6)
    assert out.metrics["acr/rate"] == pytest.approx(2 / 4)  # the singleton is not eligible


@pytest.mark.parametrize("norm", [True, False])
def test_ragged_avspo_matches_the_per_group_reference(norm):
    groups = ragged_groups(3)
    scores, index, order = interleaved(groups, 3)
    out = avspo(scores.tolist(), index, norm, threshold_init=0.1)  # ACR 1/2 > 0.1: triggered
    assert out.augmented.tolist() == [False, True, False, False, True]
    assert out.virtual_k.tolist() == [0, 2, 0, 0, 9]  # ceil(2 sqrt(1/2)) = 2, ceil(12 sqrt(1/2)) = 9
    reference = reference_advantages(groups, norm, signal=0.5)
    expected = torch.tensor([a for group in reference for a in group], dtype=torch.float64)
    torch.testing.assert_close(first_token(out).double(), expected[order], atol=1e-6, rtol=1e-6)
    # The singleton keeps verl's mean 0 and std 1: its advantage is its raw score, not 0.
    singleton = groups[0][0]
    assert reference[0][0] == pytest.approx(singleton / (1 + 1e-6) if norm else singleton)


@pytest.mark.parametrize("preset", ["grpo", "paper"])
def test_an_extended_pilot_is_one_group_of_pilot_and_rest(preset):
    """The pilot's 2 responses first, its 6 further ones at the end of the batch (a second generation pass),
    under one uid: the same advantages as a group of 8 generated at once."""
    pilot, rest, other = [0.0, 1.0], [1.0, 1.0, 0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]
    together = avspo(pilot + rest + other, group_uids([8, 4]), preset=preset, threshold_init=0.1)
    two_passes = avspo(
        pilot + other + rest,
        ["p", "p", "q", "q", "q", "q", "p", "p", "p", "p", "p", "p"],
        preset=preset,
        threshold_init=0.1,
    )
    at = [0, 1, 6, 7, 8, 9, 10, 11, 2, 3, 4, 5]  # two_passes' rows in together's order
    torch.testing.assert_close(first_token(two_passes)[at], first_token(together))


def test_a_dropped_pilot_changes_no_other_group_under_grpo_but_the_collapse_signal_under_avspo():
    groups = [[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    with_pilot = avspo([0.0, 0.0] + groups[0] + groups[1], group_uids([2, 4, 4]), preset="grpo")
    dropped = avspo(groups[0] + groups[1], group_uids([4, 4]), preset="grpo")
    torch.testing.assert_close(first_token(with_pilot)[2:], first_token(dropped))
    assert first_token(with_pilot)[:2].tolist() == [0.0, 0.0]  # a collapsed pilot kept has no gradient anyway
    # AVSPO's signal is the batch's ACR: 2/3 with the collapsed pilot, 1/2 without it (docs/method.md §9).
    kept = avspo([0.0, 0.0] + groups[0] + groups[1], group_uids([2, 4, 4]), threshold_init=0.1)
    without = avspo(groups[0] + groups[1], group_uids([4, 4]), threshold_init=0.1)
    assert (kept.decision.signal, without.decision.signal) == (pytest.approx(2 / 3), pytest.approx(1 / 2))
    assert kept.virtual_k[2] == 4 and without.virtual_k[1] == 3  # ceil(4 sqrt(2/3)) vs ceil(4 sqrt(1/2))


@pytest.mark.verl
@pytest.mark.parametrize("norm", [True, False])
def test_ragged_grpo_equals_verl_grpo(norm):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    scores, index, _ = interleaved(ragged_groups(4), 4)
    rewards, mask = outcome_batch(scores.float())
    theirs, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    torch.testing.assert_close(avspo(scores.float().tolist(), index, norm, preset="grpo").advantages, theirs)


# --- the threshold, the trigger and state -------------------------------------------------------------

HIGH = ([1.0] * 4 + [0.0] * 4 + [1.0] * 4 + [1.0, 0.0, 0.0, 0.0], [4, 4, 4, 4])  # ACR 0.75, J = 0.5625
LOW = ([1.0] * 4 + [1.0, 0.0, 1.0, 0.0] * 3, [4, 4, 4, 4])  # ACR 0.25, J = 0.625
MID = ([0.0] * 4 + [0.0] * 4 + [1.0, 0.0, 0.0, 0.0] * 2, [4, 4, 4, 4])  # ACR 0.5, J = 0.125


def test_scripted_threshold_trajectory():
    cfg, acr = resolve_settings({"eta": 0.5, "threshold_init": 0.5, "threshold_bounds": [0.3, 0.9]})
    controller = AdaptiveController(cfg, acr)
    thresholds, triggered = [], []
    for scores, sizes in (HIGH, LOW, MID, HIGH, HIGH):
        out = avspo(scores, group_uids(sizes), controller=controller, **cfg.to_dict())
        thresholds.append(out.metrics["avspo/threshold"])
        triggered.append(out.metrics["avspo/triggered"] > 0)
        assert (out.metrics["acr/effective"] == 0.0) == triggered[-1]
    # θ1 = 0.5 (ΔJ = 0 on the first step); J rises: θ2 = θ1 + 0.5 (0.25 - θ1) = 0.375;
    # J falls: θ3 = θ2 - 0.5 (0.5 - 0.375) = 0.3125; J rises: θ4 = 0.3125 + 0.5 (0.75 - 0.3125) = 0.53125;
    # ΔJ = 0: θ5 = θ4.
    assert thresholds == pytest.approx([0.5, 0.5, 0.375, 0.3125, 0.53125])
    assert triggered == [True, False, True, True, True]
    assert controller.threshold == pytest.approx(0.53125)


def test_threshold_is_clipped_to_its_bounds():
    cfg, acr = resolve_settings({"eta": 1.0, "threshold_init": 0.5, "threshold_bounds": [0.4, 0.6]})
    controller = AdaptiveController(cfg, acr)
    for scores, sizes in (HIGH, LOW):  # LOW raises J: θ moves to s = 0.25, clipped at 0.4
        avspo(scores, group_uids(sizes), controller=controller, **cfg.to_dict())
    assert controller.threshold == 0.4


def test_fixed_threshold_never_moves():
    cfg, acr = resolve_settings({"adaptive_threshold": False, "threshold_init": 0.6, "eta": 1.0})
    controller = AdaptiveController(cfg, acr)
    for scores, sizes in (HIGH, LOW, MID):
        out = avspo(scores, group_uids(sizes), controller=controller, **cfg.to_dict())
        assert out.metrics["avspo/threshold"] == 0.6
    assert controller.threshold == 0.6


def test_ema_signal():
    cfg, acr = resolve_settings(
        {"acr_signal": "ema", "ema_beta": 0.5, "threshold_init": 0.55, "adaptive_threshold": False}
    )
    controller = AdaptiveController(cfg, acr)
    signals = [avspo(s, group_uids(z), controller=controller, **cfg.to_dict()).metrics for s, z in (HIGH, LOW, LOW)]
    assert [m["avspo/signal"] for m in signals] == pytest.approx([0.75, 0.5, 0.375])
    # The batch ACR is 0.25 on step 2, but the EMA (0.5) decides: still below θ = 0.55, no trigger.
    assert [m["avspo/triggered"] > 0 for m in signals] == [True, False, False]


def test_state_round_trip_continues_bit_identically():
    settings = {"strategy": "random", "acr_signal": "ema", "eta": 0.3, "threshold_init": 0.3}
    cfg, acr = resolve_settings(settings)
    steps = [HIGH, LOW, MID, HIGH, MID, HIGH]
    reference = AdaptiveController(cfg, acr)
    expected = [avspo(s, group_uids(z), controller=reference, **settings) for s, z in steps]

    first = AdaptiveController(cfg, acr)
    for s, z in steps[:3]:
        avspo(s, group_uids(z), controller=first, **settings)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = AdaptiveController(cfg, acr)
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    for (s, z), want in zip(steps[3:], expected[3:], strict=True):
        got = avspo(s, group_uids(z), controller=resumed, **settings)
        assert torch.equal(got.advantages, want.advantages)
        assert got.metrics == want.metrics


def test_resuming_with_other_settings_is_refused():
    state = AdaptiveController(*resolve_settings({})).state_dict()
    other = AdaptiveController(*resolve_settings({"gap": 0.2}))
    with pytest.raises(ValueError, match="different settings.*gap"):
        other.load_state_dict(state)


@pytest.mark.parametrize(
    ("changed", "key"), [({"tau": 1e-3}, "tau"), ({"reward_range": [-1, 1]}, "reward_range"), ({"gap": 0.2}, "gap")]
)
def test_resuming_with_other_acr_settings_is_refused_but_another_alert_is_not(changed, key):
    """The ACR settings are their own config, yet a resume still refuses a changed tau or
    reward_range (the collapse test behind the saved θ and EMA); the alert may change."""
    cfg, acr = resolve_settings({"gap": 0.1})
    first = AdaptiveController(cfg, acr)
    for s, z in (HIGH, LOW):
        avspo(s, group_uids(z), controller=first)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    assert set(saved["config"]) == set(cfg.to_dict()) | {"tau", "reward_range"}  # the format of earlier releases

    with pytest.raises(ValueError, match=f"different settings \\({key}\\)"):
        AdaptiveController(*resolve_settings({"gap": 0.1, **changed})).load_state_dict(saved)
    resumed = AdaptiveController(*resolve_settings({"gap": 0.1, "alert": {"window": 3, "action": "stop"}}))
    resumed.load_state_dict(saved)
    assert (resumed.step, resumed.threshold, resumed.ema) == (first.step, first.threshold, first.ema)
    assert torch.equal(resumed.generator.get_state(), first.generator.get_state())


@pytest.mark.verl
def test_with_rollout_n_1_each_advantage_is_the_raw_score_in_verl_grpo_and_avspo():
    """What docs/troubleshooting.md says about rollout.n=1: every group is a singleton, verl gives it
    mean 0 and std 1, so the advantage is the raw score / (1 + epsilon), not 0."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    scores = torch.tensor([1.0, 0.0, 1.0, 0.5])
    rewards, mask = outcome_batch(scores)
    index = group_uids([1, 1, 1, 1])
    verl, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    ours = avspo(scores.tolist(), index).advantages
    torch.testing.assert_close(verl[:, 0], scores / (1 + 1e-6))
    torch.testing.assert_close(ours, verl)
