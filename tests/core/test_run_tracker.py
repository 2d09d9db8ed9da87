"""The run's one step owner (core.run_tracker.RunTracker): each batch's raw scores measured once, every
acr/* metric (raw, split, effective) and the estimator's avspo/* in one report, the stall rule and
acr/stalled, and one versioned state dict that a resumed run continues from exactly."""

import numpy as np
import pytest
import torch

from verl_avspo.core import collapse
from verl_avspo.core.acr_config import ACRConfig, AlertConfig
from verl_avspo.core.collapse import DroppedGroups
from verl_avspo.core.config import resolve_settings
from verl_avspo.core.run_tracker import STATE_VERSION, RunTracker

# Three groups of 4: all correct, all wrong, mixed.
SCORES = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 0])
INDEX = np.repeat(np.array(["a", "b", "c"], dtype=object), 4)


def outcome(scores):
    rewards = torch.zeros(len(scores), 3)
    rewards[:, -1] = scores
    return rewards, torch.ones_like(rewards)


def avspo_tracker(**settings):
    avspo, acr = resolve_settings({"threshold_init": 0.1, **settings})
    return RunTracker(acr, avspo)


def count_measurements(monkeypatch):
    calls = []
    real = collapse.measure

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("verl_avspo.core.run_tracker.measure", spy)
    monkeypatch.setattr("verl_avspo.core.advantage.measure", spy)
    return calls


def test_a_step_measures_its_batch_once_whoever_measures_first(monkeypatch):
    calls = count_measurements(monkeypatch)
    tracker = avspo_tracker()
    tracker.measure(SCORES, INDEX)  # the host, before the advantage stage
    output = tracker.avspo_advantages(*outcome(SCORES), INDEX)
    report = tracker.end_step(1, output.scalar_advantages)
    assert len(calls) == 1
    # The estimator alone (no host measured): it measures, and the host's later call reuses it.
    tracker.avspo_advantages(*outcome(SCORES), INDEX)
    tracker.measure(SCORES, INDEX)
    assert len(calls) == 2
    assert report["acr/rate"] == pytest.approx(2 / 3) and report["acr/all_correct"] == pytest.approx(1 / 3)
    assert report["acr/effective"] == 0.0  # θ_1 = 0.1 < ACR: both collapsed groups were augmented
    assert report["avspo/triggered"] == pytest.approx(2 / 3) and report["acr/stalled"] == 0.0


def test_without_a_host_each_estimator_call_measures_its_own_batch():
    """Bare verl (no host closes steps): a step's measurement never leaks into the next call."""
    tracker = avspo_tracker()
    tracker.avspo_advantages(*outcome(SCORES), INDEX)
    flat = torch.tensor([1.0, 0, 1, 0] * 3)  # no group collapsed
    assert tracker.avspo_advantages(*outcome(flat), INDEX).decision.signal == 0.0


def test_the_estimator_decides_on_the_hosts_measurement_of_the_step():
    """The host measured the real rows (and the groups a filter dropped); the estimator's batch has
    a padding row more. θ and s_t follow the host's ACR, not the padded batch's."""
    tracker = avspo_tracker()
    tracker.measure(SCORES, INDEX, DroppedGroups({1.0: 3}))
    padded = torch.cat([SCORES, torch.zeros(2)])
    index = np.concatenate([INDEX, np.array(["pad", "pad"], dtype=object)])
    output = tracker.avspo_advantages(*outcome(padded), index)
    assert output.decision.signal == pytest.approx(2 / 3)  # the batch's own ACR, without the dropped groups
    report = tracker.end_step(1)
    assert report["acr/rate"] == pytest.approx(5 / 6) and report["acr/groups"] == 6.0
    assert "acr/effective" not in report


def test_effective_collapse_over_other_rows_than_the_measured():
    tracker = RunTracker(ACRConfig())
    tracker.measure(SCORES, INDEX)
    trained = torch.tensor([0.0, 0.0, 1.0, -1.0])  # one flat and one informative group trained
    report = tracker.end_step(1, trained, index=np.array(["x", "x", "y", "y"], dtype=object))
    assert report["acr/rate"] == pytest.approx(2 / 3) and report["acr/effective"] == 0.5


def test_end_step_without_a_measurement_is_refused():
    with pytest.raises(RuntimeError, match="measure"):
        RunTracker(ACRConfig()).end_step(1)


def test_the_stall_rule_sets_acr_stalled_and_warns_once(caplog):
    tracker = RunTracker(ACRConfig(alert=AlertConfig(window=2, threshold=0.5, rule="acr")))
    flags = []
    for step in range(1, 5):
        tracker.measure(SCORES, INDEX)
        report = tracker.end_step(step)
        flags.append((report["acr/stalled"], report.newly_stalled))
    assert flags == [(0.0, False), (1.0, True), (1.0, False), (1.0, False)]
    assert sum("advantage collapse" in record.message for record in caplog.records) == 1
    assert "algorithm.acr.alert.rule=acr" in caplog.text


def test_state_round_trips_and_a_resumed_run_continues_exactly():
    steps = [SCORES, torch.tensor([1.0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0]), SCORES, torch.zeros(12)]

    def run(tracker, batches):
        reports = []
        for step, scores in enumerate(batches, 1):
            tracker.measure(scores, INDEX)
            output = tracker.avspo_advantages(*outcome(scores), INDEX)
            reports.append(dict(tracker.end_step(step, output.scalar_advantages)))
        return reports

    settings = {"strategy": "random", "alert": {"window": 2, "threshold": 0.2, "rule": "acr"}}
    straight = run(avspo_tracker(**settings), steps)
    first = avspo_tracker(**settings)
    run(first, steps[:2])
    state = first.state_dict()
    assert state["version"] == STATE_VERSION and set(state) == {
        "version",
        "controller",
        "stagnation",
        "dcpo",
        "prompt_history",
        "prompt_skip",
    }
    resumed = avspo_tracker(**settings)
    resumed.load_state_dict(state)
    assert run(resumed, steps[2:]) == straight[2:]


def test_a_version_1_state_loads_and_a_newer_one_is_refused():
    tracker = avspo_tracker()
    tracker.measure(SCORES, INDEX)
    tracker.avspo_advantages(*outcome(SCORES), INDEX)
    tracker.end_step(1)
    legacy = {key: value for key, value in tracker.state_dict().items() if key != "version"}  # avspo_state.pt of 0.x
    restored = avspo_tracker()
    restored.load_state_dict(legacy)
    assert restored.controller.state_dict()["threshold"] == tracker.controller.state_dict()["threshold"]
    with pytest.raises(ValueError, match="upgrade verl-avspo"):
        restored.load_state_dict({**legacy, "version": STATE_VERSION + 1})


def test_dropped_groups_of_a_filter():
    scores = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    assert DroppedGroups.of(scores) == DroppedGroups({1.0: 1, 0.0: 2}, 1)
