"""The per-prompt rollout allocator (core.prompt_allocation): its settings' validation (every bad key at
once, and the settings that cannot fit a group size), the four outcomes (skip, pilot, full group, more
than the group near a pass rate of 1/2), the budget (never exceeded by the first pass plus the pilots'
reserve; the least informative prompts dropped first), the pilots' extension and its adaptive rate, and
a generator state that a resumed allocator continues from exactly."""

import numpy as np
import pytest
import torch

from verl_avspo.core.prompt_allocation import (
    PromptAllocationConfig,
    PromptAllocator,
    allocation_problems,
    pilots_spread,
    resolve_prompt_allocation,
)
from verl_avspo.core.prompt_history import PromptHistory
from verl_avspo.core.validation import SettingsError

G = 8


def history_of(rates, visits=1):
    """A history where prompt i had pass rate ``rates[i]`` (NaN: never seen) on each of ``visits`` visits."""
    history = PromptHistory()
    for step in range(visits):
        keys = [i for i, rate in enumerate(rates) if not np.isnan(rate)]
        rate = np.array([rates[i] for i in keys])
        history.record(keys, rate, rate == 1.0, rate == 0.0, step)
    return history


def test_defaults_and_every_bad_key_at_once():
    assert resolve_prompt_allocation(None) == PromptAllocationConfig()
    assert resolve_prompt_allocation({"enable": True, "seed": None}).enable
    with pytest.raises(SettingsError) as caught:
        resolve_prompt_allocation(
            {"enable": 1, "pilot_size": 1, "extra_band": 0.6, "budget_share": 0, "extend_rate": 2, "pilot_size2": 3},
            "algorithm.prompt_allocation",
        )
    problems = caught.value.problems
    assert len(problems) == 6
    assert "prompt_allocation.pilot_size2 is not a setting. Did you mean algorithm.prompt_allocation" in problems[0]
    for text in ("enable=1", "pilot_size=1", "extra_band=0.6", "budget_share=0", "extend_rate=2"):
        assert any(f"algorithm.prompt_allocation.{text}" in problem for problem in problems), text


def test_the_budget_share_range_says_what_is_accepted():
    # inf is refused (a budget must be a number of rollouts), so the range must not read "(0.0, inf]".
    for share in (0, -1.0, float("inf"), "inf"):
        with pytest.raises(SettingsError) as caught:
            resolve_prompt_allocation({"budget_share": share}, "a")
        (problem,) = caught.value.problems
        assert problem.endswith("expected a finite number > 0.0.") or problem.endswith("expected a finite number.")
        assert "inf]" not in problem
    assert resolve_prompt_allocation({"budget_share": 1e6}).budget_share == 1e6


def test_a_pilot_as_large_as_the_largest_group_is_refused_with_the_fix():
    with pytest.raises(SettingsError, match=r"pilot_size=16 is invalid.*Lower prompt_allocation.pilot_size"):
        resolve_prompt_allocation({"pilot_size": 16})


def test_settings_that_do_not_fit_the_group_size_name_both_keys():
    config = PromptAllocationConfig(pilot_size=4, max_group_size=6)
    problems = allocation_problems(config, 4, "algorithm.prompt_allocation", "actor_rollout_ref.rollout.n")
    assert len(problems) == 1 and "pilot_size=4 with actor_rollout_ref.rollout.n=4" in problems[0]
    problems = allocation_problems(config, 8, "algorithm.prompt_allocation", "actor_rollout_ref.rollout.n")
    assert len(problems) == 1 and "max_group_size=6 with actor_rollout_ref.rollout.n=8" in problems[0]
    with pytest.raises(ValueError, match="max_group_size=6 with group_size=8"):
        PromptAllocator(config).allocate([0], PromptHistory(), 8)
    # A group of 1 or 2 holds no pilot at all: the fix is the group size, not a pilot below 2.
    (problem,) = allocation_problems(PromptAllocationConfig(), 1, "prompts.allocation", "actor_rollout_ref.rollout.n")
    assert "prompts.allocation.enable=True with actor_rollout_ref.rollout.n=1" in problem
    assert "Set actor_rollout_ref.rollout.n to 3 or more (8 is the paper's)" in problem and "below 1" not in problem


def test_skip_pilot_full_and_extra():
    # 0: never seen; 1: all-wrong; 2: all-correct; 3: pass rate 1/2; 4: 1/8 (outside the band); 5: skipped.
    rates = [np.nan, 0.0, 1.0, 0.5, 0.125, 0.5]
    keep = [True, True, True, True, True, False]
    allocation = PromptAllocator(PromptAllocationConfig(extend_rate=0.0)).allocate(
        range(6), history_of(rates), G, keep=keep
    )
    # Budget 6 x 8 = 48; first pass 8 + 2 + 2 + 8 + 8 + 0 = 28; the 20 left go to prompt 3, capped at 16.
    assert allocation.rollouts.tolist() == [8, 2, 2, 16, 8, 0]
    assert allocation.pilot.tolist() == [False, True, True, False, False, False]
    assert allocation.budget == 48 and allocation.reserved == 0.0
    assert allocation.rollouts.dtype == torch.int64


def test_extras_follow_the_variance():
    rates = [0.5, 0.25, 0.0, 0.0, 0.0, 0.0]  # p(1-p): 1/4 and 3/16
    allocation = PromptAllocator(PromptAllocationConfig(extend_rate=0.0, max_group_size=64)).allocate(
        range(6), history_of(rates), G
    )
    left = 48 - (8 + 8 + 4 * 2)
    assert allocation.rollouts[:2].tolist() == [8 + left * 4 // 7, 8 + left * 3 // 7]
    assert allocation.total <= allocation.budget


def test_pilot_streak_sets_which_prompts_get_a_pilot():
    history = history_of([0.0, 1.0], visits=2)
    history.record([1], [0.5], [False], [False], 2)  # prompt 1's streak restarts
    allocation = PromptAllocator(PromptAllocationConfig(pilot_streak=2)).allocate([0, 1], history, G)
    assert allocation.pilot.tolist() == [True, False]


@pytest.mark.parametrize("share", [0.3, 0.5, 0.8, 1.0, 1.5])
def test_the_first_pass_and_the_reserve_stay_within_the_budget(share):
    gen = np.random.default_rng(0)
    rates = gen.choice([np.nan, 0.0, 1.0, 0.25, 0.5, 0.75], size=64)
    config = PromptAllocationConfig(budget_share=share, extend_rate=0.5)
    allocation = PromptAllocator(config).allocate(range(64), history_of(rates), G)
    assert allocation.total + allocation.reserved <= allocation.budget
    assert int(allocation.rollouts.max()) <= config.max_group_size
    assert (allocation.rollouts[allocation.pilot] == config.pilot_size).all()


def test_a_short_budget_drops_pilots_first_then_the_lowest_variance():
    # Pilots (streak 1) and full groups at p = 1/2 (variance 1/4), 1/8 (7/64) and unseen (1/6); no extras.
    history = history_of([0.0, 1.0, 0.5, 0.125, np.nan])
    allocator = PromptAllocator(PromptAllocationConfig(extend_rate=0.0, max_group_size=G))
    assert allocator.allocate(range(5), history, G, budget=24).rollouts.tolist() == [0, 0, 8, 8, 8]
    assert allocator.allocate(range(5), history, G, budget=17).rollouts.tolist() == [0, 0, 8, 0, 8]
    one_pilot = allocator.allocate(range(5), history, G, budget=26)
    assert one_pilot.rollouts[2:].tolist() == [8, 8, 8] and sorted(one_pilot.rollouts[:2].tolist()) == [0, 2]
    assert one_pilot.pilot.tolist() == (one_pilot.rollouts == 2).tolist()


def test_no_budget_rolls_out_nothing_and_a_keep_of_the_wrong_length_is_refused():
    allocator = PromptAllocator(PromptAllocationConfig())
    assert allocator.allocate(range(3), history_of([0.0, 0.5, np.nan]), G, budget=0).rollouts.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match=r"3 keys, keep of shape \(2,\).*one keep flag per key"):
        allocator.allocate(range(3), PromptHistory(), G, keep=[True, False])


def test_ties_in_the_drop_order_are_broken_at_random():
    # 16 never-seen prompts, room for 8 full groups: which 8 changes from step to step.
    allocator = PromptAllocator(PromptAllocationConfig())
    chosen = {tuple(allocator.allocate(range(16), PromptHistory(), G, budget=64).rollouts.tolist()) for _ in range(8)}
    assert len(chosen) > 1
    assert all(sum(rollouts) == 64 for rollouts in chosen)


def test_the_reserve_follows_the_extension_rate():
    allocator = PromptAllocator(PromptAllocationConfig(extend_rate=0.5))
    allocation = allocator.allocate(range(4), history_of([0.0, 0.0, 1.0, 1.0]), G)
    assert allocation.reserved == 0.5 * 4 * (G - 2)


def test_extension_adds_the_rest_of_the_group_to_pilots_that_spread_and_adapts_the_rate():
    allocator = PromptAllocator(PromptAllocationConfig(extend_rate=0.25, extend_rate_decay=0.5))
    allocation = allocator.allocate(range(4), history_of([0.0, 1.0, 0.0, np.nan]), G)
    assert allocation.pilot.tolist() == [True, True, True, False]
    # A spread on prompt 3 (not a pilot) is ignored; one of the three pilots spread.
    added = allocator.extend(allocation, [True, False, False, True])
    assert added.tolist() == [G - 2, 0, 0, 0]
    assert allocator.extend_rate == pytest.approx(0.5 * 0.25 + 0.5 / 3)
    assert allocator.metrics() == {"prompts/pilot_extend_rate": allocator.extend_rate}


def test_a_hosts_own_extensions_move_the_rate_as_extend_does():
    # verl's agent loop extends pilots itself and reports them: the same estimate as extend's.
    extending, observing = (PromptAllocator(PromptAllocationConfig(extend_rate_decay=0.5)) for _ in range(2))
    allocation = extending.allocate(range(4), history_of([0.0, 1.0, 0.0, np.nan]), G)
    extending.extend(allocation, [True, False, False, True])
    observing.observe_pilots([True, False, False])
    assert observing.extend_rate == extending.extend_rate == pytest.approx(0.5 * 0.25 + 0.5 / 3)
    observing.observe_pilots([])  # a step without pilots leaves it
    assert observing.extend_rate == extending.extend_rate


def test_a_pilot_spreads_exactly_when_the_collapse_test_would_not_count_it():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5 + 1e-9, 0.0, 0.0])
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    assert pilots_spread(scores, ids, 4, 1e-6, (0.0, 1.0)).tolist() == [False, True, False, False]
    # A tau above a pilot's std (0.5 for rewards 0 and 1) counts it collapsed, as ACR would.
    assert pilots_spread(scores, ids, 4, 0.6, (0.0, 1.0)).tolist() == [False, False, False, False]
    assert pilots_spread(scores, ids, 4, 0.4, (0.0, 1.0)).tolist() == [False, True, False, False]


def test_a_resumed_allocator_allocates_exactly_as_an_uninterrupted_one():
    gen = np.random.default_rng(1)
    steps = [
        (gen.choice([np.nan, 0.0, 1.0, 0.5, 0.25], size=32), gen.random(32) < 0.3, int(gen.integers(64, 256)))
        for _ in range(6)
    ]
    config = PromptAllocationConfig(seed=7)

    def run(allocator, batch):
        rates, spread, budget = batch
        allocation = allocator.allocate(range(32), history_of(rates), G, budget=budget)
        return allocation.rollouts.tolist(), allocator.extend(allocation, spread).tolist()

    straight = PromptAllocator(config)
    expected = [run(straight, batch) for batch in steps]
    first = PromptAllocator(config)
    got = [run(first, batch) for batch in steps[:3]]
    state = first.state_dict()
    resumed = PromptAllocator(config)
    resumed.load_state_dict(state)
    got += [run(resumed, batch) for batch in steps[3:]]
    assert got == expected
    assert resumed.extend_rate == straight.extend_rate
    assert torch.equal(resumed.generator.get_state(), straight.generator.get_state())
