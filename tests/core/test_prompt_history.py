"""The per-prompt collapse history (core.prompt_history): the counts, pass rate and collapse streak of a
known visit sequence, a step's repeated visits as simultaneous (their order changes nothing), batching
invariance against a step-at-a-time reference (hypothesis), integer
and string keys, the classes and table, a state round trip through torch.save(weights_only), the
stable prompt hash, and the memory per prompt."""

import hashlib
import io
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_avspo.core.prompt_history import PromptHistory, history_key, prompt_key

# (pass rate, all_correct, all_wrong) of a visit
CORRECT, WRONG, MIXED = (1.0, True, False), (0.0, False, True), (0.5, False, False)


def visit(history, keys, outcomes, step):
    rate, correct, wrong = zip(*outcomes, strict=True) if outcomes else ((), (), ())
    history.record(keys, list(rate), list(correct), list(wrong), step)


def test_a_known_visit_sequence():
    history = PromptHistory()
    for step, outcome in enumerate([CORRECT, CORRECT, MIXED, WRONG, WRONG], 1):
        visit(history, [7], [outcome], step)
        if step == 2:
            records = history.lookup([7])
            assert records.collapsed_every_visit.tolist() == [True] and records.collapse_streak.tolist() == [2]
    records = history.lookup([7, 8])
    assert records.seen.tolist() == [True, False]
    assert records.visits.tolist() == [5, 0]
    assert records.all_correct.tolist() == [2, 0] and records.all_wrong.tolist() == [2, 0]
    assert records.collapse_streak.tolist() == [2, 0]  # the two all-wrong visits after the mixed one
    assert records.last_pass_rate[0] == 0.0 and np.isnan(records.last_pass_rate[1])
    assert records.last_step.tolist() == [5, -1]
    assert records.collapsed_every_visit.tolist() == [False, False]


def test_a_key_repeated_in_one_call_is_several_simultaneous_visits():
    history = PromptHistory()
    visit(history, [1, 3], [WRONG, WRONG], 2)
    visit(history, [1, 2, 1, 1, 3, 3], [WRONG, MIXED, MIXED, CORRECT, WRONG, CORRECT], 3)
    records = history.lookup([1, 2, 3])
    assert records.visits.tolist() == [4, 1, 3]
    assert records.collapse_streak.tolist() == [0, 0, 3]  # 1 had a mixed visit at step 3; 3 none
    assert records.last_pass_rate.tolist() == [0.5, 0.5, 0.5]  # the mean of the step's visits
    # The order of a step's groups (verl's follows random uids) changes nothing.
    shuffled = PromptHistory()
    visit(shuffled, [3, 1], [WRONG, WRONG], 2)
    visit(shuffled, [3, 1, 1, 3, 2, 1], [CORRECT, CORRECT, WRONG, WRONG, MIXED, MIXED], 3)
    for name, column in history.table().items():
        assert shuffled.table()[name].tolist() == column.tolist(), name


def reference(visits):
    """One step at a time, in Python: {key: [visits, correct, wrong, last rate, streak, last step]}; a
    step's visits of one prompt are simultaneous (their mean rate; the streak restarts if any was mixed)."""
    table, by_step = {}, {}
    for key, outcome, step in visits:
        by_step.setdefault((step, key), []).append(outcome)
    for (step, key), outcomes in sorted(by_step.items()):
        row = table.setdefault(key, [0, 0, 0, np.nan, 0, -1])
        row[0] += len(outcomes)
        row[1] += sum(correct for _, correct, _ in outcomes)
        row[2] += sum(wrong for _, _, wrong in outcomes)
        row[3] = float(np.float32(np.mean([rate for rate, _, _ in outcomes])))
        row[4] = row[4] + len(outcomes) if all(c or w for _, c, w in outcomes) else 0
        row[5] = step
    return table


outcomes = st.sampled_from([CORRECT, WRONG, MIXED])
steps_of_visits = st.lists(st.lists(st.tuples(st.integers(0, 6), outcomes), max_size=12), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(steps_of_visits)
def test_batched_records_equal_a_step_at_a_time(steps):
    history = PromptHistory()
    flat = []
    for step, visits in enumerate(steps, 1):
        visit(history, [k for k, _ in visits], [o for _, o in visits], step)
        flat += [(key, outcome, step) for key, outcome in visits]
    expected = reference(flat)
    table = history.table()
    assert table["key"].tolist() == sorted(expected)
    for name, column in enumerate(["visits", "all_correct", "all_wrong", "last_pass_rate", "collapse_streak"]):
        assert table[column].tolist() == [expected[k][name] for k in sorted(expected)], column
    assert table["last_step"].tolist() == [expected[k][5] for k in sorted(expected)]


def test_keys_as_tensors_arrays_and_lists_are_the_same_prompts():
    history = PromptHistory()
    visit(history, torch.tensor([3, 4]), [CORRECT, WRONG], 1)
    visit(history, np.array([4], dtype=np.int32), [WRONG], 2)
    visit(history, [3], [MIXED], 3)
    assert history.lookup([3, 4]).visits.tolist() == [2, 2]
    assert history.key_kind == "int"


def test_string_keys_widen_and_a_mixed_key_kind_is_refused():
    history = PromptHistory()
    visit(history, ["ab", "z"], [CORRECT, WRONG], 1)
    long_key = "a-much-longer-key-than-the-first-ones"
    visit(history, [long_key, "ab"], [MIXED, CORRECT], 2)
    assert history.table()["key"].tolist() == [long_key, "ab", "z"]  # sorted: "a-" < "ab"
    assert history.lookup(["ab", long_key, "abc"]).visits.tolist() == [2, 1, 0]
    with pytest.raises(ValueError, match="keyed by strs"):
        visit(history, [5], [CORRECT], 3)
    with pytest.raises(ValueError, match="integers .* or strings"):
        PromptHistory().record([1.5], [1.0], [True], [False], 1)
    with pytest.raises(ValueError, match="one of each per group"):
        history.record(["ab"], [1.0, 0.0], [True], [False], 1)


def test_classes_and_table():
    history = PromptHistory()
    visit(history, [1, 2, 3, 4], [CORRECT, WRONG, MIXED, CORRECT], 1)
    visit(history, [1, 2, 4], [CORRECT, WRONG, WRONG], 2)
    classes = history.classes()
    assert (classes.seen, classes.always_solved, classes.never_solved, classes.mixed) == (4, 1, 1, 2)
    assert classes.share("never_solved") == 0.25 and PromptHistory().classes().share("mixed") == 0.0
    assert history.table()["class"].tolist() == ["always_solved", "never_solved", "mixed", "mixed"]


@pytest.mark.parametrize("keys", [[10, 2, 30], ["b", "a", prompt_key("text")]])
def test_state_round_trips_through_weights_only_load(keys):
    history = PromptHistory()
    visit(history, keys, [CORRECT, WRONG, MIXED], 4)
    buffer = io.BytesIO()
    torch.save(history.state_dict(), buffer)
    buffer.seek(0)
    restored = PromptHistory()
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    for name, column in history.table().items():
        assert restored.table()[name].tolist() == column.tolist() or name == "last_pass_rate"
    visit(history, keys[:1], [WRONG], 5)
    visit(restored, keys[:1], [WRONG], 5)
    assert restored.table()["collapse_streak"].tolist() == history.table()["collapse_streak"].tolist()
    empty = PromptHistory()
    empty.load_state_dict(PromptHistory().state_dict())
    assert len(empty) == 0 and empty.key_kind is None


def test_prompt_key_is_the_sha256_of_the_json_form_whatever_the_container():
    messages = [{"role": "user", "content": "2+2="}]
    assert prompt_key(messages) == hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:32]
    assert prompt_key(torch.tensor([1, 2, 3])) == prompt_key(np.array([1, 2, 3])) == prompt_key([1, 2, 3])
    assert prompt_key("2+2=") != prompt_key("2+3=") and len(prompt_key("x")) == 32


@pytest.mark.parametrize("index", [7, np.int64(7), torch.tensor(7), torch.tensor([7])])
def test_history_key_takes_an_integer_identity_as_it_is(index):
    key = history_key(index)
    assert key == 7 and type(key) is int


@pytest.mark.parametrize("value", ["q7", True, np.bool_(False), 7.0, torch.tensor(7.0), [1, 2], None])
def test_history_key_hashes_anything_that_is_not_an_integer(value):
    # A bool is not an index (True == 1 would merge it with prompt 1); a float index is not exact.
    assert history_key(value) == prompt_key(value.tolist() if isinstance(value, torch.Tensor) else value)


def test_history_key_of_the_prompt_itself_is_its_hash_even_where_it_is_a_number():
    assert history_key(12, hashed=True) == prompt_key(12) != history_key(12)


def test_memory_per_prompt_is_bounded():
    history = PromptHistory()
    n = 100_000
    history.record(np.arange(n) * 7, np.zeros(n), np.zeros(n, bool), np.ones(n, bool), 1)
    assert len(history) == n and history.nbytes / n <= 52  # 8 (key) + 16 (sorted index) + 28 (columns)


def test_many_small_batches_merge_the_index_and_keep_every_prompt():
    """Beyond 1024 recent keys the index merges them into its main level; revisits find either level."""
    rng = np.random.default_rng(0)
    history, expected = PromptHistory(), {}
    for step in range(40):
        keys = rng.integers(0, 5000, size=100)
        visit(history, keys, [WRONG] * len(keys), step)
        for key in keys.tolist():
            expected[key] = expected.get(key, 0) + 1
    probe = np.arange(5000)
    assert len(history) == len(expected)
    assert history.lookup(probe).visits.tolist() == [expected.get(key, 0) for key in probe.tolist()]
    assert history.table()["key"].tolist() == sorted(expected)
    strings = PromptHistory()
    for step, width in enumerate((2, 40, 3, 80)):  # widening string keys across both levels
        visit(strings, [f"{step}-{i:0{width}d}" for i in range(700)], [CORRECT] * 700, step)
    assert len(strings) == 2800
    assert strings.lookup(["0-00", f"1-{5:040d}", f"3-{699:080d}", "xyz"]).visits.tolist() == [1, 1, 1, 0]
