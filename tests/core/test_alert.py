"""The stall rules of ``algorithm.acr.alert`` on scripted metric sequences (``core.alert``)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_avspo.core.alert import ALERT_SIGNALS, REWARD_KEY, StagnationMonitor, stalled_steps, stalled_windows
from verl_avspo.core.config import ALERT_RULES, AlertConfig, resolve_alert


def steps(rate, all_wrong=None, reward=0.5):
    """One step's metrics; ``all_wrong`` defaults to the whole of ``rate``."""
    return {"acr/rate": rate, "acr/all_wrong": rate if all_wrong is None else all_wrong, REWARD_KEY: reward}


def flags(rule, rows, window=3, threshold=0.35):
    return stalled_steps(rows, AlertConfig(window=window, threshold=threshold, rule=rule))


def test_every_rule_has_a_signal():
    assert set(ALERT_SIGNALS) == set(ALERT_RULES)


def test_the_papers_rule_fires_on_the_window_th_step_strictly_above_and_resets():
    rows = [steps(0.5)] * 2 + [steps(0.35)] + [steps(0.5)] * 4 + [steps(0.1)] + [steps(0.9)] * 3
    assert flags("acr", rows) == [False] * 5 + [True, True, False, False, False, True]
    monitor = StagnationMonitor(AlertConfig(window=3, rule="acr"))
    newly = [monitor.update(row) for row in rows]
    assert [i for i, n in enumerate(newly) if n] == [5, 10]  # once per stall


def test_all_correct_collapse_is_not_a_stall_under_the_all_wrong_rule():
    solved = [steps(0.9, all_wrong=0.05)] * 10  # a run whose prompts are solved
    stuck = [steps(0.9, all_wrong=0.8)] * 10  # a run whose prompts are too hard
    assert any(flags("acr", solved)) and not any(flags("all_wrong", solved))
    assert flags("all_wrong", stuck) == flags("acr", stuck) == [False, False] + [True] * 8


def test_acr_no_gain_needs_high_acr_and_a_reward_that_does_not_rise():
    rising = [steps(0.8, reward=0.05 * i) for i in range(12)]
    flat = [steps(0.8, reward=0.3)] * 12
    falling = [steps(0.8, reward=0.8 - 0.05 * i) for i in range(12)]
    low_acr = [steps(0.2, reward=0.3)] * 12
    assert not any(flags("acr_no_gain", rising, window=4))
    # Two windows of rewards are needed before "no gain" can be told.
    assert flags("acr_no_gain", flat, window=4) == [False] * 7 + [True] * 5
    assert flags("acr_no_gain", falling, window=4) == [False] * 7 + [True] * 5
    assert not any(flags("acr_no_gain", low_acr, window=4))
    # The last window against the one before it: a late rise ends the stall.
    recovering = flat[:9] + [steps(0.8, reward=0.9)] * 3
    assert flags("acr_no_gain", recovering, window=4) == [False] * 7 + [True, True] + [False] * 3
    # Rewards count from before the streak: a rise into a high-ACR plateau is progress.
    climb = [steps(0.2, reward=0.1)] * 4 + [steps(0.8, reward=0.6)] * 4
    assert not any(flags("acr_no_gain", climb, window=4))


@settings(max_examples=60, deadline=None)
@given(
    rule=st.sampled_from(ALERT_RULES),
    window=st.integers(1, 6),
    rows=st.lists(
        st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)).map(lambda t: steps(t[0], t[0] * t[1], t[2])),
        min_size=1,
        max_size=30,
    ),
    cut=st.integers(0, 30),
)
def test_a_resumed_monitor_continues_exactly(rule, window, rows, cut):
    config = AlertConfig(window=window, rule=rule)
    whole = stalled_steps(rows, config)
    before = StagnationMonitor(config)
    for row in rows[:cut]:
        before.update(row)
    resumed = StagnationMonitor(config)
    resumed.load_state_dict(before.state_dict())
    after = []
    for row in rows[cut:]:
        resumed.update(row)
        after.append(resumed.stalled)
    assert whole[cut:] == after


def test_stalled_windows_are_the_runs_of_true():
    assert stalled_windows([False, True, True, False, True]) == [(1, 2), (4, 4)]
    assert stalled_windows([]) == []


def test_the_rule_is_a_validated_setting():
    assert resolve_alert({"rule": "acr"}).rule == "acr"
    with pytest.raises(ValueError, match=r"alert.rule='all-wrong' is invalid: .*\(did you mean 'all_wrong'\?\)"):
        resolve_alert({"rule": "all-wrong"})
