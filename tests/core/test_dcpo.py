"""DCPO's smooth advantage standardization on scripted visits, its state, and its clip bounds."""

import io
import math

import numpy as np
import pytest
import torch
from helpers import group_uids, outcome_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_avspo.core.dcpo import PromptRewardHistory, dynamic_clip_bounds, dynamic_clip_token_losses, smooth_advantages


def _step(history, groups):
    """groups: [(prompt key, [rewards])] -> advantages per group, one uid per group."""
    scores = torch.tensor([r for _, rewards in groups for r in rewards], dtype=torch.float32)
    keys = [key for key, rewards in groups for _ in rewards]
    advantages = history.advantages(scores, keys, group_uids([len(rewards) for _, rewards in groups], "g"))
    return advantages.split([len(rewards) for _, rewards in groups])


def _unbiased_std(ones, zeros):
    n, mean = ones + zeros, ones / (ones + zeros)
    return math.sqrt((ones * (1 - mean) ** 2 + zeros * mean**2) / (n - 1))


def test_scripted_visits_of_one_prompt():
    """Visit 1 collapsed -> 0; visit 2 mixes both standardizations equally; visit 3 collapsed ->
    the cumulative advantage over 3 (SA_new), all against hand-computed statistics."""
    history = PromptRewardHistory(epsilon=0.0)
    (first,) = _step(history, [("a", [1, 1, 1, 1])])
    assert first.tolist() == [0.0, 0.0, 0.0, 0.0]

    (second,) = _step(history, [("a", [1, 0, 0, 0])])
    new_one, new_zero = 0.75 / 0.5, -0.25 / 0.5  # group mean 1/4, unbiased std 1/2
    total_std = _unbiased_std(5, 3)  # 5 ones and 3 zeros so far: sqrt(15/56)
    total_one, total_zero = (3 / 8) / total_std, -(5 / 8) / total_std
    expected = [(new_one + total_one) / 2] + [(new_zero + total_zero) / 2] * 3
    assert second.tolist() == pytest.approx(expected, rel=1e-6)
    assert second[0] == pytest.approx(1.112287, rel=1e-5)

    (third,) = _step(history, [("a", [0, 0, 0, 0])])
    total_zero = -(5 / 12) / _unbiased_std(5, 7)  # sqrt(35/132)
    # SA_new = 2/3 * 0 + 1/3 * total beats SA_total = 2/3 * total in magnitude.
    assert third.tolist() == pytest.approx([total_zero / 3] * 4, rel=1e-6)
    assert third[0] == pytest.approx(-0.269722, rel=1e-5)
    assert history.stats("a") == pytest.approx({"visits": 3, "count": 12, "mean": 5 / 12, "std": _unbiased_std(5, 7)})


def test_interleaved_prompts_keep_separate_histories():
    history = PromptRewardHistory(epsilon=0.0)
    # Step 1: a collapsed all-wrong, b mixed; both first visits.
    adv_a, adv_b = _step(history, [("a", [0, 0]), ("b", [1, 0])])
    assert adv_a.tolist() == [0.0, 0.0]
    grpo_b = 0.5 / math.sqrt(0.5)
    assert adv_b.tolist() == pytest.approx([grpo_b, -grpo_b])
    # Step 2: only b, collapsed all-correct; a is untouched.
    (adv_b,) = _step(history, [("b", [1, 1])])
    total = (1 - 3 / 4) / _unbiased_std(3, 1)  # b: 3 ones, 1 zero
    assert adv_b.tolist() == pytest.approx([total / 2, total / 2])  # i = 2: both blends are total/2
    assert history.stats("a")["visits"] == 1
    # Step 3: a mixed, after b, in reversed order in the batch: a's second visit.
    adv_b, adv_a = _step(history, [("b", [0, 1]), ("a", [1, 0])])
    total_a = (1 - 1 / 4) / _unbiased_std(1, 3), -(1 / 4) / _unbiased_std(1, 3)
    new_a = 0.5 / math.sqrt(0.5)
    assert adv_a.tolist() == pytest.approx([(new_a + total_a[0]) / 2, (-new_a + total_a[1]) / 2])
    # b's third visit: 4 ones and 2 zeros so far; pick the smaller-magnitude blend.
    new_b = torch.tensor([-grpo_b, grpo_b], dtype=torch.float64)
    total_b = torch.tensor([-4 / 6, 2 / 6], dtype=torch.float64) / _unbiased_std(4, 2)
    sa_new, sa_total = 2 / 3 * new_b + 1 / 3 * total_b, 1 / 3 * new_b + 2 / 3 * total_b
    expected = torch.where(sa_new.abs() < sa_total.abs(), sa_new, sa_total)
    assert adv_b.tolist() == pytest.approx(expected.tolist())
    assert len(history) == 2


@pytest.mark.verl
def test_first_visit_is_verls_grpo():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 3, (48,), generator=generator).float() / 2  # many collapsed groups of 4
    uids = group_uids([4] * 12, "u")
    keys = torch.arange(48) // 4 + 100
    ours = PromptRewardHistory().advantages(scores, keys, uids)
    grpo, _ = compute_grpo_outcome_advantage(*outcome_batch(scores), uids)
    torch.testing.assert_close(ours, grpo[:, 0], rtol=1e-5, atol=1e-6)
    assert (ours == 0).any()


def test_groups_of_one_prompt_in_one_step_count_as_visits():
    history = PromptRewardHistory(epsilon=0.0)
    first, second = _step(history, [("a", [1, 1]), ("a", [0, 0])])
    # Both groups collapsed: Â_new = 0; the totals (2 ones, 2 zeros) give ±(1/2)/std; i = 2 -> half.
    total = 0.5 / _unbiased_std(2, 2)
    assert first.tolist() == pytest.approx([total / 2] * 2)
    assert second.tolist() == pytest.approx([-total / 2] * 2)
    assert history.stats("a")["visits"] == 2


def test_single_response_groups_and_mean_only():
    history = PromptRewardHistory(epsilon=0.0)
    (alone,) = _step(history, [("a", [1.0])])
    assert alone.tolist() == [0.0]  # no group baseline, no history yet
    (alone,) = _step(history, [("a", [0.0])])
    # Â_new = 0; totals {1, 0}: -(1/2)/sqrt(1/2); i = 2.
    assert alone.tolist() == pytest.approx([-0.5 / math.sqrt(0.5) / 2])
    history = PromptRewardHistory(norm_adv_by_std=False)
    _step(history, [("a", [1, 1])])
    (adv,) = _step(history, [("a", [0, 1])])
    # Mean only: Â_new = ±1/2, Â_total = (0 - 3/4, 1 - 3/4); both blends are the average.
    assert adv.tolist() == pytest.approx([(-0.5 - 0.75) / 2, (0.5 + 0.25) / 2])


def test_state_round_trip_is_bit_exact():
    generator = torch.Generator().manual_seed(1)

    def batch():
        keys = torch.randint(0, 6, (5,), generator=generator).repeat_interleave(4)
        scores = torch.rand(20, generator=generator).round(decimals=1)
        return scores, keys, np.arange(20) // 4

    original = PromptRewardHistory()
    for _ in range(4):
        original.advantages(*batch())
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    resumed = PromptRewardHistory()
    resumed.load_state_dict(torch.load(buffer))
    for _ in range(3):
        step = batch()
        assert torch.equal(original.advantages(*step), resumed.advantages(*step))
    assert original.state_dict()["keys"] == resumed.state_dict()["keys"]
    assert all(isinstance(key, int) for key in resumed.state_dict()["keys"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=6), st.randoms())
def test_totals_equal_the_statistics_of_all_rewards(visits, rng):
    """After any sequence of visits, in any order within a step, the running totals are the
    mean and unbiased std of every reward seen."""
    history = PromptRewardHistory()
    for rewards in visits:
        order = list(range(len(rewards)))
        rng.shuffle(order)
        scores = torch.tensor(rewards, dtype=torch.float32)
        advantages = history.advantages(scores[order], ["p"] * len(rewards), np.zeros(len(rewards)))
        assert advantages.shape == (len(rewards),) and advantages.isfinite().all()
    everything = torch.tensor([r for rewards in visits for r in rewards], dtype=torch.float64)
    stats = history.stats("p")
    assert stats["mean"] == pytest.approx(everything.mean().item(), abs=1e-12)
    if everything.numel() > 1:
        assert stats["std"] == pytest.approx(everything.std().item(), abs=1e-12)
    assert stats["visits"] == len(visits)


def test_permuting_the_batch_permutes_the_advantages():
    scores = torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 0.5])
    keys, uids = [7, 7, 8, 8, 9, 9, 10, 10], np.array(list("aabbccdd"), dtype=object)
    warm = [(torch.tensor([0.0, 1, 1, 1, 0, 0, 1, 0]), keys, uids)]
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(3))
    straight, shuffled = PromptRewardHistory(), PromptRewardHistory()
    for history in (straight, shuffled):
        history.advantages(*warm[0])
    expected = straight.advantages(scores, keys, uids)
    got = shuffled.advantages(scores[perm], [keys[i] for i in perm], uids[perm.numpy()])
    torch.testing.assert_close(got, expected[perm], rtol=0, atol=1e-12)


def test_smooth_advantages_blend():
    adv_new, adv_total = torch.tensor([1.0, 2.0, 0.0, 3.0]), torch.tensor([-1.0, 0.0, -6.0, 1.0])
    picked = smooth_advantages(adv_new, adv_total, torch.tensor([3, 1, 4, 2]))
    # i = 3: SA_new = 2/3 - 1/3 = 1/3, SA_total = 1/3 - 2/3 = -1/3, a tie in magnitude -> SA_total.
    # i = 1: SA_new = Â_total = 0, SA_total = Â_new = 2 -> 0.
    # i = 4: SA_new = -6/4, SA_total = -18/4 -> -1.5.   i = 2: both are the average, 2.
    assert picked.tolist() == pytest.approx([-1 / 3, 0.0, -1.5, 2.0])


def test_bad_inputs_are_named():
    history = PromptRewardHistory()
    with pytest.raises(ValueError, match="prompt_keys has 3 entries but scores has 4"):
        history.advantages(torch.zeros(4), [1, 1, 2], np.zeros(4))
    with pytest.raises(ValueError, match="all responses of one group .* must share one prompt key"):
        history.advantages(torch.zeros(4), [1, 1, 1, 2], np.zeros(4))
    with pytest.raises(ValueError, match="epsilon=-1"):
        PromptRewardHistory(epsilon=-1)
    with pytest.raises(ValueError, match=r"missing \['mean', 'sq_dev'\]"):
        history.load_state_dict({"keys": [], "visits": [], "count": []})
    with pytest.raises(KeyError, match="has not been seen"):
        history.stats("nope")


def test_dynamic_clip_bounds_closed_form():
    q = torch.tensor([[1.0, 0.5, 0.8, 1e-4], [0.25, 0.9, 0.0, 1.0]])
    low, high = dynamic_clip_bounds(q.log(), eps_low=0.2, eps_high=0.28)
    expected_low = 0.5 + 0.5 * torch.sqrt((1 - 0.8 / q).clamp(min=0))
    expected_high = (0.5 + 0.5 * torch.sqrt(1 + 1.12 / q)).clamp(max=10)
    torch.testing.assert_close(low, expected_low)
    torch.testing.assert_close(high, expected_high)
    assert low[0, 0].item() == pytest.approx((1 + math.sqrt(0.2)) / 2)
    assert high[0, 0].item() == pytest.approx((1 + math.sqrt(2.12)) / 2)
    # Rare tokens: the lower bound falls to 1/2, the upper one to the cap (q = 0 included).
    assert low[0, 3].item() == 0.5 and high[0, 3].item() == 10.0
    assert low[1, 2].item() == 0.5 and high[1, 2].item() == 10.0
    # At an unclamped bound the probability moves by exactly eps: |r - 1| * r * q = eps.
    ok = (1 - 0.8 / q > 0) & (high < 10)
    torch.testing.assert_close(((1 - low) * low * q)[ok], torch.full_like(q[ok], 0.2))
    torch.testing.assert_close(((high - 1) * high * q)[high < 10], torch.full_like(q[high < 10], 0.28))
    # The range narrows as the token gets likelier.
    grid_low, grid_high = dynamic_clip_bounds(torch.linspace(0.01, 1, 50).log(), 0.2, 0.28)
    assert (grid_low.diff() >= 0).all() and (grid_high.diff() <= 0).all() and grid_low[-1] > 0.5
    with pytest.raises(ValueError, match="eps_high=-0.1"):
        dynamic_clip_bounds(q.log(), 0.2, -0.1)
    with pytest.raises(ValueError, match="max_ratio=0.5"):
        dynamic_clip_bounds(q.log(), 0.2, 0.2, max_ratio=0.5)


def test_dynamic_clip_token_losses():
    old = torch.tensor([[0.0, 0.0, math.log(0.01), 0.0]])  # q = 1, 1, 0.01, 1
    new = torch.tensor([[math.log(1.5), math.log(0.5), math.log(0.05), math.log(1.1)]], requires_grad=True)
    advantages = torch.tensor([[1.0, -1.0, 1.0, -2.0]])
    losses, clipped = dynamic_clip_token_losses(old, new, advantages, 0.2, 0.28)
    high_q1, low_q1 = (1 + math.sqrt(2.12)) / 2, (1 + math.sqrt(0.2)) / 2
    # r = 1.5 > high with A > 0: clipped at high. r = 0.5 < low with A < 0: clipped at low.
    # r = 5 for a rare token (q = 0.01): inside its wide range [0.5, 5.8], not clipped. r = 1.1: inside.
    expected = [-high_q1, low_q1, -5.0, 2.2]
    assert losses.detach()[0].tolist() == pytest.approx(expected, rel=1e-5)
    assert clipped[0].tolist() == [True, True, False, False]
    losses.sum().backward()
    assert new.grad[0, 0] == 0 and new.grad[0, 1] == 0 and new.grad[0, 2] != 0


def test_a_resumed_history_keeps_its_own_settings_and_warns_when_they_differ(caplog):
    saved = PromptRewardHistory(epsilon=0.0)
    saved.advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), [3] * 4, np.zeros(4))
    resumed = PromptRewardHistory(epsilon=0.5, norm_adv_by_std=False)
    with caplog.at_level("WARNING", logger="verl_avspo.core.dcpo"):
        resumed.load_state_dict(saved.state_dict())
    assert "saved with {'epsilon': 0.0, 'norm_by_std': True} and is resumed with" in caplog.text
    assert (resumed.epsilon, resumed.norm_adv_by_std) == (0.5, False)
    assert resumed.stats(3) == saved.stats(3)


def test_epsilon_enters_both_the_group_and_the_cumulative_std():
    # A large ε, hand-computed. Visit 1 of prompt 0 with [1, 0, 0, 0]; visit 2 with [1, 1, 0, 0].
    eps = 0.5
    history = PromptRewardHistory(epsilon=eps)
    first = history.advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), [0] * 4, np.zeros(4))
    # Group (= totals on a first visit): mean 1/4, unbiased std 1/2.
    assert first.tolist() == pytest.approx([0.75 / (0.5 + eps)] + [-0.25 / (0.5 + eps)] * 3)
    second = history.advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), [0] * 4, np.zeros(4))
    group_std = math.sqrt(4 * 0.25 / 3)
    total_mean, total_std = 3 / 8, math.sqrt((3 * 0.625**2 + 5 * 0.375**2) / 7)
    # i = 2: both blends are the average of the two standardized advantages.
    a_new, a_total = 0.5 / (group_std + eps), (1 - total_mean) / (total_std + eps)
    assert float(second[0]) == pytest.approx((a_new + a_total) / 2, rel=1e-6)
