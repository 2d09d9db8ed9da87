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
from verl_avspo.core.prompt_refill import skip_and_refill
from verl_avspo.core.run_tracker import STATE_VERSION, RunTracker
from verl_avspo.core.state_file import checkpoint_step

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


@pytest.mark.parametrize(
    ("host", "expected"),
    [({}, "(now step 2, acr.alert.rule=acr); most groups give no gradient. Try to raise the sampling temperature "
          "(the generator's temperature), use a larger group (the group size)"),
     ({"acr_section": "--acr", "advice": "use a bigger --group"},
      "(now step 2, --acr.alert.rule=acr); most groups give no gradient. Try to use a bigger --group.")],
)  # fmt: skip
def test_the_stall_rule_sets_acr_stalled_and_warns_once_in_the_hosts_spelling(caplog, host, expected):
    """The core names no host: the warning spells the rule's setting and the advice as the host passes them."""
    tracker = RunTracker(ACRConfig(alert=AlertConfig(window=2, threshold=0.5, rule="acr")), **host)
    flags = []
    for step in range(1, 5):
        tracker.measure(SCORES, INDEX)
        report = tracker.end_step(step)
        flags.append((report["acr/stalled"], report.newly_stalled))
    assert flags == [(0.0, False), (1.0, True), (1.0, False), (1.0, False)]
    (warning,) = [record.getMessage() for record in caplog.records if "advantage collapse" in record.getMessage()]
    assert expected in warning and "algorithm." not in warning


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
        "rollouts_cumulative",
        "prompt_allocation",
    }
    resumed = avspo_tracker(**settings)
    resumed.load_state_dict(state)
    assert run(resumed, steps[2:]) == straight[2:]


@pytest.mark.parametrize(("version", "fix"), [(None, "resume from a checkpoint"), (3, "resume from a checkpoint"),
                                              (STATE_VERSION + 1, "upgrade verl-avspo")])  # fmt: skip
def test_a_state_of_another_version_is_refused_naming_it(version, fix):
    """Versions 1-3 were layouts of unreleased builds: refused, never converted."""
    tracker = avspo_tracker()
    tracker.measure(SCORES, INDEX)
    tracker.avspo_advantages(*outcome(SCORES), INDEX)
    tracker.end_step(1)
    state = {key: value for key, value in tracker.state_dict().items() if key != "version"}
    if version is not None:
        state["version"] = version
    with pytest.raises(ValueError, match=rf"^the run state has version {version}, .* reads version 4 only: {fix}"):
        avspo_tracker().load_state_dict(state)


def test_dropped_groups_of_a_filter():
    scores = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    assert DroppedGroups.of(scores) == DroppedGroups({1.0: 1, 0.0: 2}, 1)


# ---- prompts: the per-prompt history, prompts/* and the skip rule ------------------------------------


def prompt_tracker(**skip):
    from verl_avspo.core.prompt_skip import PromptSkipConfig

    return RunTracker(ACRConfig(), prompt_skip=PromptSkipConfig(**skip) if skip else None)


def keyed_step(tracker, step, scores, keys):
    tracker.measure(scores, INDEX)
    tracker.set_prompt_keys(dict(zip(["a", "b", "c"], keys, strict=True)))
    return tracker.end_step(step)


def test_without_prompt_keys_there_is_no_history_and_no_prompt_metric():
    tracker = prompt_tracker()
    tracker.measure(SCORES, INDEX)
    report = tracker.end_step(1)
    assert not [name for name in report if name.startswith("prompts/")] and len(tracker.prompt_history) == 0
    assert tracker.select_prompts([1, 2], 8).tolist() == [True, True]  # skipping off: roll out everything


def test_prompt_metrics_count_seen_classes_and_collapsed_before():
    tracker = prompt_tracker()
    # Step 1: prompt 10 all correct, 11 all wrong, 12 mixed. Step 2: 10 and 11 again (now mixed and
    # all wrong), 13 new (None: a padding group, left out).
    first = keyed_step(tracker, 1, SCORES, [10, 11, 12])
    assert first["prompts/seen"] == 3 and first["prompts/collapsed_before"] == 0.0
    assert first["prompts/always_solved"] == pytest.approx(1 / 3) and first["prompts/never_solved"] == pytest.approx(
        1 / 3
    )
    second = keyed_step(tracker, 2, torch.tensor([1.0, 0, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1]), [10, 11, None])
    assert second["prompts/collapsed_before"] == 1.0  # both keyed groups had collapsed on their one earlier visit
    assert second["prompts/seen"] == 3 and second["prompts/never_solved"] == pytest.approx(1 / 3)
    assert second["prompts/always_solved"] == 0.0
    records = tracker.prompt_history.lookup([10, 11, 12])
    assert records.visits.tolist() == [2, 2, 1] and records.collapse_streak.tolist() == [0, 2, 0]
    assert records.last_step.tolist() == [2, 2, 1]
    third = keyed_step(tracker, 3, SCORES, [10, 11, 12])
    assert third["prompts/collapsed_before"] == pytest.approx(1 / 3)  # 11 only; 10 and 12 had a mixed visit


def test_dropped_groups_join_the_history():
    tracker = prompt_tracker()
    tracker.record_groups([5, 6], torch.tensor([[1.0, 1, 1], [0.0, 1, 0]]))
    report = keyed_step(tracker, 1, SCORES, [10, 11, 12])
    assert report["prompts/seen"] == 5
    assert tracker.prompt_history.lookup([5, 6]).all_correct.tolist() == [1, 0]


def test_skipping_counts_rollouts_and_a_resumed_run_skips_the_same():
    def run(tracker, steps):
        decisions, reports = [], []
        for step in steps:
            decisions.append(tracker.select_prompts([10, 11, 12, 13], 4).tolist())
            reports.append(dict(keyed_step(tracker, step, SCORES, [10, 11, 12])))
        return decisions, reports

    settings = {"enable": True, "explore": 0.5, "seed": 4}
    straight = run(prompt_tracker(**settings), range(1, 9))
    first = prompt_tracker(**settings)
    run(first, range(1, 5))
    resumed = prompt_tracker(**settings)
    resumed.load_state_dict(first.state_dict())
    assert run(resumed, range(5, 9)) == (straight[0][4:], straight[1][4:])
    decisions, reports = straight
    skipped = [4 * row.count(False) for row in decisions]
    assert [r["prompts/rollouts_skipped"] for r in reports] == skipped
    assert [r["prompts/rollouts_skipped_cumulative"] for r in reports] == np.cumsum(skipped).tolist()
    assert all(row[2] and row[3] for row in decisions)  # mixed and never seen: always rolled out
    assert sum(skipped) > 0
    # Each step 1/3 of the groups is all-correct and 1/3 all-wrong, above both targets (0.125): explore less.
    assert reports[-1]["prompts/explore_all_correct"] == pytest.approx(0.5 - 8 * 0.01)


def collapsing_steps(tracker, steps: range, fill=None, batch: int = 4, group_size: int = 4) -> list[dict]:
    """Steps whose every group is all correct; each step's batch is filled by the core's skip-and-refill loop
    from a stream of 6 prompts (``fill``: the places it must fill, as ``skip_and_refill``'s), the 4th refill
    forced (the hosts' guard). Each step counts the rollouts it generated."""
    dataset = iter(range(10**6))

    def draw(_missing):
        return [next(dataset) % 6 for _ in range(batch)]

    reports = []
    for step in steps:
        picked = skip_and_refill(
            draw(batch),
            lambda chunk: chunk,
            lambda keys, at_least, refill: tracker.select_prompts(keys, group_size, at_least, refill),
            draw,
            batch,
            fill=fill,
            forced=lambda number, _chunk: number >= 4,
        )
        chosen = [chunk[i] for chunk, positions in picked.chunks for i in positions]
        tracker.count_rollouts(len(chosen) * group_size, len(picked.chunks))
        scores = torch.ones(len(chosen) * group_size)  # every group all correct
        index = np.repeat(np.array([f"u{i}" for i in range(len(chosen))], dtype=object), group_size)
        tracker.measure(scores, index)
        tracker.set_prompt_keys({f"u{i}": key for i, key in enumerate(chosen)})
        reports.append(tracker.end_step(step))
    return reports


def test_skipped_prompts_a_host_replaces_are_reselections_not_savings():
    """Every prompt collapses on every visit, and the host refills each batch to its size (as verl's V1
    trainer, OpenRLHF's prompt draw, TRL's and the sandbox's do): the rule turns many candidates down, but
    the step still rolls out its whole batch, so nothing is saved; each skipped candidate is a re-selection.
    (Counting every skipped candidate's rollouts as saved once exceeded the rollouts generated.)"""
    batch, group_size, steps = 4, 4, 12
    tracker = prompt_tracker(enable=True, explore=0.05, adaptive=False, seed=3)
    reports = collapsing_steps(tracker, range(1, steps + 1))
    skipped = sum(report["prompts/skipped"] for report in reports)
    generated = [report["train/rollouts_generated"] for report in reports]
    assert generated == [batch * group_size] * steps  # the whole batch, every step
    assert reports[-1]["train/rollouts_cumulative"] == sum(generated)
    assert skipped * group_size > sum(generated)  # what the former count would have called saved
    for report in reports:
        assert report["prompts/rollouts_skipped"] == 0 and report["prompts/reselected"] == report["prompts/skipped"]
    assert reports[-1]["prompts/rollouts_skipped_cumulative"] == 0
    assert reports[-1]["prompts/reselected_cumulative"] == skipped == tracker.skipper.reselected
    # A host that does not replace them (one draw a step): every skipped prompt's rollouts are saved, at most
    # the batch's.
    for step in range(steps + 1, steps + 4):
        keep = tracker.select_prompts([step % 6, (step + 1) % 6, (step + 2) % 6, (step + 3) % 6], group_size)
        report: dict = {}
        tracker.observe_step(step, report)
        assert report["prompts/rollouts_skipped"] == group_size * int((~keep).sum()) <= batch * group_size
        assert report["prompts/reselected"] == 0


def test_where_later_batches_top_up_skipping_saves_what_it_leaves_open():
    """DAPO's dynamic sampling tops a step up with later generation batches, so the loop fills one place and
    leaves the others open: on the same seeds, every step generates fewer rollouts than the refilling host,
    and what it did not generate is exactly the rollouts saved (no re-selection where nothing was redrawn)."""
    settings = {"enable": True, "explore": 0.05, "adaptive": False, "seed": 3}
    refilled = collapsing_steps(prompt_tracker(**settings), range(1, 9))
    topped_up = collapsing_steps(prompt_tracker(**settings), range(1, 9), fill=1)
    full = [report["train/rollouts_generated"] for report in refilled]
    lean = [report["train/rollouts_generated"] for report in topped_up]
    assert all(a <= b for a, b in zip(lean, full, strict=True)) and sum(lean) < sum(full)
    for report, generated in zip(topped_up, lean, strict=True):
        assert report["prompts/rollouts_skipped"] == 16 - generated
    assert topped_up[-1]["prompts/rollouts_skipped_cumulative"] == sum(full) - sum(lean) > 0
    assert topped_up[-1]["train/rollouts_cumulative"] == sum(lean)


def test_the_rollout_counts_survive_a_resume():
    settings = {"enable": True, "explore": 0.05, "adaptive": False, "seed": 3}
    straight = collapsing_steps(prompt_tracker(**settings), range(1, 7), fill=1)
    first = prompt_tracker(**settings)
    collapsing_steps(first, range(1, 4), fill=1)
    resumed = prompt_tracker(**settings)
    resumed.load_state_dict(first.state_dict())
    # (Its prompt stream restarts: the data position is the host's to restore; the counts carry on.)
    after = collapsing_steps(resumed, range(4, 5), fill=1)[0]
    assert (
        after["train/rollouts_cumulative"]
        == straight[2]["train/rollouts_cumulative"] + after["train/rollouts_generated"]
    )
    assert after["prompts/rollouts_skipped_cumulative"] == (
        straight[2]["prompts/rollouts_skipped_cumulative"] + after["prompts/rollouts_skipped"]
    )
    assert prompt_tracker().state_dict()["rollouts_cumulative"] is None  # a host that counts nothing logs nothing


def test_the_loop_fills_its_places_in_draw_order_and_forces_the_guarded_draw():
    calls = []

    def select(keys, at_least, refill):
        calls.append((list(keys), at_least, refill))
        keep = np.array([key % 2 == 0 for key in keys])
        keep[np.flatnonzero(~keep)[: max(0, at_least - int(keep.sum()))]] = True
        return keep

    chunks = iter([[4, 5, 7], [9, 11, 13], [15, 17, 19]])
    picked = skip_and_refill([1, 2, 3], list, select, lambda missing: next(chunks), 3, forced=lambda n, _c: n >= 3)
    assert [(chunk, chosen.tolist()) for chunk, chosen in picked.chunks] == [
        ([1, 2, 3], [1]),
        ([4, 5, 7], [0]),
        ([9, 11, 13], []),
        ([15, 17, 19], [0]),  # the guarded draw keeps what is missing whatever the rule says
    ]
    assert picked.open_places == 0 and picked.count == 3
    assert [refill for _, _, refill in calls] == [False, True, True, True]
    assert [at_least for _, at_least, _ in calls] == [0, 0, 0, 1]
    # A host whose data runs out leaves its places open; a top-up's first chunk is a refill.
    ran_out = skip_and_refill([1, 3], list, select, lambda missing: None, 2, refill=True)
    assert ran_out.open_places == 2 and calls[-1] == ([1, 3], 0, True)


def test_only_the_places_a_host_leaves_empty_save_rollouts():
    from verl_avspo.core.prompt_history import PromptHistory
    from verl_avspo.core.prompt_skip import PromptSkipConfig, PromptSkipper
    from verl_avspo.core.prompt_step import StepPrompts

    skipper, draws = PromptSkipper(PromptSkipConfig(enable=True)), StepPrompts()
    draws.count_selection(np.array([True, False, False, False]), 4, False)  # a batch: 3 places open
    draws.count_selection(np.array([False, True, False]), 4, True)  # a refill fills one; its 2 skipped open none
    metrics = draws.close(PromptHistory(), skipper, 1)  # the host stopped (its data ran out): 2 places empty
    assert (metrics["prompts/skipped"], metrics["prompts/reselected"], metrics["prompts/rollouts_skipped"]) == (5, 3, 8)
    draws = StepPrompts()
    draws.count_selection(np.array([False, False]), 4, False)
    draws.count_selection(np.array([True, True, True]), 4, True)  # fills both (one kept beyond them, unused)
    draws.count_selection(np.array([False, True]), 4, False)  # the next batch: one place open
    metrics = draws.close(PromptHistory(), skipper, 2)
    assert (metrics["prompts/skipped"], metrics["prompts/reselected"], metrics["prompts/rollouts_skipped"]) == (3, 2, 4)
    assert (metrics["prompts/reselected_cumulative"], metrics["prompts/rollouts_skipped_cumulative"]) == (5, 12)
    restored = PromptSkipper(PromptSkipConfig(enable=True))
    restored.load_state_dict(skipper.state_dict())
    assert (restored.reselected, restored.rollouts_skipped) == (5, 12)


def test_a_step_with_nothing_measured_moves_no_streak_and_logs_its_own_skips():
    from verl_avspo.core.prompt_skip import PromptSkipConfig

    alert = AlertConfig(window=2, threshold=0.5, rule="acr")
    tracker = RunTracker(ACRConfig(alert=alert), prompt_skip=PromptSkipConfig(enable=True, explore=0.01, seed=1))

    def step(number, rows, keys):
        tracker.measure(SCORES[rows], INDEX[rows])
        tracker.set_prompt_keys(dict(zip(sorted(set(INDEX[rows])), keys, strict=True)))
        return tracker.end_step(number)

    step(1, slice(0, 8), [10, 11])  # both groups collapsed: ACR 1 > 0.5, streak 1
    assert tracker.select_prompts([10, 11], 4).tolist() == [False, False]  # each kept with probability 0.01
    report: dict = {}
    assert tracker.observe_step(2, report) is False  # every response unscorable: nothing measured
    assert tracker.alert.streak == 1 and report["acr/stalled"] == 0.0
    assert (report["prompts/skipped"], report["prompts/rollouts_skipped"]) == (2, 8)
    after = step(3, slice(8, 12), [12])
    assert after["prompts/rollouts_skipped"] == 0 and after["prompts/rollouts_skipped_cumulative"] == 8


def test_a_state_saved_with_skipping_off_loads_with_the_skip_rule_afresh(caplog):
    tracker = prompt_tracker(enable=True)
    keyed_step(tracker, 1, SCORES, [10, 11, 12])
    restored = prompt_tracker(enable=True)
    restored.load_state_dict({**tracker.state_dict(), "prompt_skip": None})
    assert len(restored.prompt_history) == len(tracker.prompt_history)
    assert "no prompt skip rule" in caplog.text


# ---- the rollout allocator (core.prompt_allocation) through the tracker ---------------------------------


def allocating_tracker(**settings):
    from verl_avspo.core.prompt_allocation import PromptAllocationConfig

    tracker = RunTracker(ACRConfig())
    tracker.set_prompt_allocation(PromptAllocationConfig(enable=True, **settings))
    return tracker


def allocated_step(tracker, step, group_size=4):
    """One host step over prompts 0-5: prompts 0-1 are always right, 2-3 always wrong, 4-5 half right; a
    pilot is extended where its answers differ, a collapsed pilot is dropped (recorded, as the hosts do)."""
    keys = list(range(6))
    plan = tracker.allocate_prompts(keys, group_size)
    answer = {0: 1.0, 1: 1.0, 2: 0.0, 3: 0.0}

    def scores(key, n):
        return torch.tensor([answer.get(key, float(j % 2)) for j in range(n)])

    first = [scores(key, n) for key, n in zip(keys, plan.rollouts.tolist(), strict=True)]
    spread = torch.tensor([len(s) > 1 and bool(s.max() > s.min()) for s in first])
    added = tracker.extend_pilots(plan, spread)
    trained = [k for k in keys if plan.rollouts[k] > 0 and not (plan.pilot[k] and not spread[k])]
    dropped = [k for k in keys if plan.pilot[k] and not spread[k]]
    if dropped:
        tracker.record_groups(dropped, torch.stack([first[k] for k in dropped]))
    sizes = [int(plan.rollouts[k] + added[k]) for k in trained]
    tracker.count_rollouts(int(plan.rollouts.sum() + added.sum()), 1 + int(added.any()))
    tracker.measure(
        torch.cat([scores(k, n) for k, n in zip(trained, sizes, strict=True)]),
        np.repeat(np.array([f"u{k}" for k in trained], dtype=object), sizes),
    )
    tracker.set_prompt_keys({f"u{k}": k for k in trained})
    return plan, dict(tracker.end_step(step))


def test_the_allocator_pilots_predicted_collapses_and_a_resumed_run_allocates_the_same():
    straight = allocating_tracker(seed=3)
    plans = [allocated_step(straight, step) for step in range(1, 7)]
    first, report = plans[0]
    assert first.rollouts.tolist() == [4] * 6 and report["prompts/pilots"] == 0  # nothing known yet
    second, report = plans[1]
    # The collapsed prompts get a pilot of 2, dropped again; the half-right ones their group, plus extras.
    assert second.pilot.tolist() == [True] * 4 + [False] * 2
    assert second.rollouts.tolist()[:4] == [2] * 4 and all(n >= 4 for n in second.rollouts.tolist()[4:])
    assert report["prompts/pilots"] == 4 and report["prompts/pilots_extended"] == 0
    assert report["train/rollouts_generated"] == second.total < 24  # the pilots' savings
    assert report["prompts/extra_rollouts"] == second.total - 8 - 8
    assert report["prompts/pilot_extend_rate"] == pytest.approx(0.9 * 0.25)  # no pilot spread
    # Stopped after step 3 and resumed from its state: the same plans, the same extension rate.
    stopped = allocating_tracker(seed=3)
    for step in range(1, 4):
        allocated_step(stopped, step)
    resumed = allocating_tracker(seed=3)
    resumed.load_state_dict(stopped.state_dict())
    for step, (plan, report) in zip(range(4, 7), plans[3:], strict=True):
        again, again_report = allocated_step(resumed, step)
        assert torch.equal(again.rollouts, plan.rollouts) and again_report == report


def test_a_state_saved_without_the_allocator_loads_with_it_afresh(caplog):
    tracker = allocating_tracker()
    allocated_step(tracker, 1)
    restored = allocating_tracker()
    restored.load_state_dict({**tracker.state_dict(), "prompt_allocation": None})
    assert len(restored.prompt_history) == len(tracker.prompt_history)
    assert "no rollout allocator" in caplog.text
    with pytest.raises(ValueError, match="no rollout allocator: call set_prompt_allocation first"):
        RunTracker(ACRConfig()).allocate_prompts([1, 2], 4)


def test_a_host_that_extends_pilots_itself_reports_them_to_the_tracker():
    tracker = allocating_tracker(extend_rate_decay=0.5)
    tracker.observe_pilots(torch.tensor([True, False, True, True]))
    tracker.count_rollouts(3 * 2, gen_batches=0)  # the host counts the rollouts it added (G - pilot each)
    metrics: dict = {}
    tracker.observe_step(1, metrics)
    assert metrics["prompts/pilots_extended"] == 3 and metrics["train/rollouts_generated"] == 6
    assert metrics["prompts/pilot_extend_rate"] == pytest.approx(0.5 * 0.25 + 0.5 * 3 / 4)
    assert tracker.state_dict()["prompt_allocation"]["extend_rate"] == metrics["prompts/pilot_extend_rate"]


@pytest.mark.parametrize(
    ("folder", "step"),
    [
        ("ckpts/global_step_12", 12),  # verl
        ("ckpts/global_step_12/", 12),
        ("_actor/global_step7", 7),  # OpenRLHF's DeepSpeed tag
        ("out/checkpoint-300", 300),  # TRL
        ("ckpts/global_step_12_old", None),  # a copy set aside is no checkpoint of the run
        ("ckpts/latest", None),
    ],
)
def test_a_checkpoint_folders_step_is_read_from_its_name_in_each_frameworks_naming(folder, step):
    assert checkpoint_step(folder) == step
