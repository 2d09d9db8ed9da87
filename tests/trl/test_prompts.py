"""The TRL adapter's prompt settings and skipping (``verl_avspo.trl.prompts``): what the trainer refuses at
``__init__`` about ``prompts=`` (with the other settings, before TRL loads the model; a key column that
does not identify prompts: a boolean, a None, a value two prompts share), a row's prompt key (refused
when None or a boolean), the check of a batch's keys against its prompts (a bad key travels with the
gather, so that every process refuses the batch),
the check that a generation batch holds whole groups, the seeded refill stream, and how skipped groups are
replaced (in place, from further candidates, the batch's own prompts not offered again, filled after a
whole pass), the same on two trackers in the same state, as two processes are. No model is built here
(the runs are tests/e2e/test_trl_cpu_e2e.py).
"""

import logging

import numpy as np
import pytest
import torch

pytest.importorskip("trl", reason="TRL is not installed (pip install 'verl-avspo[trl]')")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from verl_avspo.core.acr_config import ACRConfig  # noqa: E402
from verl_avspo.core.prompt_history import prompt_key  # noqa: E402
from verl_avspo.core.prompt_skip import PromptSkipConfig  # noqa: E402
from verl_avspo.core.run_tracker import RunTracker  # noqa: E402
from verl_avspo.core.validation import SettingsError  # noqa: E402
from verl_avspo.trl import AVSPOGRPOTrainer, resolve_trl_settings  # noqa: E402
from verl_avspo.trl.prompts import (  # noqa: E402
    batch_keys,
    check_keys_identify_prompts,
    group_keys,
    refill_candidates,
    row_entry,
    row_key,
    select_groups,
)


def config(tmp_path, **options):
    return GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, **options)


def rows(count: int = 4) -> Dataset:
    return Dataset.from_dict({"prompt": [f"{i}+1=" for i in range(count)], "index": list(range(count))})


def test_every_prompt_problem_is_refused_at_once_before_the_model_loads(tmp_path):
    args = config(tmp_path, remove_unused_columns=True)
    with pytest.raises(SettingsError) as refused:
        AVSPOGRPOTrainer(  # the model path does not exist: the settings are read first
            model=str(tmp_path / "no-model"),
            reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
            args=args,
            train_dataset=rows().to_iterable_dataset(),
            prompts={"key": "index", "skip": {"enable": True, "explore": 2.0}, "keys": "index"},
        )
    problems = refused.value.problems
    expected = [
        "prompts.keys is not a setting",
        "prompts.skip.explore=2.0 is invalid",
        "prompts.key='index' is invalid with GRPOConfig.remove_unused_columns=True",
    ]
    for start in expected:
        assert any(problem.startswith(start) for problem in problems), (start, problems)
    # explore out of range leaves no skip settings to check against the iterable dataset
    assert len(problems) == 3, problems


def test_the_key_names_a_column_and_skipping_needs_a_map_style_dataset():
    with pytest.raises(SettingsError) as refused:
        resolve_trl_settings("grpo", prompts={"key": "idx", "skip": {"enable": True}}, train_dataset=rows())
    assert refused.value.problems == [
        "prompts.key='idx' is invalid: the training dataset has no such column (it has prompt, index). Name one of "
        "them, or leave the key out for the hash of 'prompt'."
    ]
    with pytest.raises(SettingsError, match=r"prompts.key=3 is invalid: it is the name of the training dataset"):
        resolve_trl_settings("grpo", prompts={"key": 3})
    with pytest.raises(SettingsError) as refused:
        resolve_trl_settings("grpo", prompts={"skip": {"enable": True}}, train_dataset=rows().to_iterable_dataset())
    assert refused.value.problems[0].startswith(
        "prompts.skip.enable=True is invalid with a IterableDataset training dataset: a skipped prompt is replaced"
    )
    with pytest.raises(SettingsError, match=r"prompts=\['index'\] is invalid: it is a group of settings"):
        resolve_trl_settings("grpo", prompts=["index"])


def test_the_rollout_allocator_is_refused_with_the_reason_and_its_values_checked():
    # TRL sizes every group by num_generations: the allocator cannot run here, and says why.
    with pytest.raises(SettingsError) as refused:
        resolve_trl_settings("grpo", prompts={"allocation": {"enable": True}}, train_dataset=rows())
    (problem,) = refused.value.problems
    assert problem.startswith("prompts.allocation.enable=True is not available with TRL's GRPOTrainer: TRL 1.16 draws")
    assert "Remove prompts['allocation']. (prompts['skip'] spends the same rollouts on other prompts" in problem
    assert "saves rollouts" not in problem  # TRL's skipping refills every skipped place (docs/trl.md)
    with pytest.raises(SettingsError, match=r"prompts.allocation.pilot_size=1 is invalid"):
        resolve_trl_settings("grpo", prompts={"allocation": {"pilot_size": 1}}, train_dataset=rows())
    # Off, it is no setting at all.
    assert resolve_trl_settings("grpo", prompts={"allocation": {"enable": False}}, train_dataset=rows()).prompts


def test_the_default_key_is_the_prompt_and_a_dataset_without_one_keeps_no_history():
    assert resolve_trl_settings("grpo").prompts.key == "prompt"  # dataset not known: TRL's column
    settings = resolve_trl_settings("grpo", train_dataset=rows())
    assert settings.prompts.key == "prompt" and settings.prompts.skip == PromptSkipConfig()
    environment_rows = Dataset.from_dict({"environment": ["a", "b"]})
    assert resolve_trl_settings("grpo", train_dataset=environment_rows).prompts.key is None
    with pytest.raises(SettingsError, match=r"prompts.skip.enable=True is invalid: the training dataset has no"):
        resolve_trl_settings("grpo", prompts={"skip": {"enable": True}}, train_dataset=environment_rows)
    skip = resolve_trl_settings("avspo", prompts={"key": "index", "skip": {"enable": True, "seed": 3}}).prompts
    assert skip.key == "index" and skip.skip == PromptSkipConfig(enable=True, seed=3)


def test_a_rows_key_is_an_integer_column_as_it_is_else_the_cores_hash():
    messages = [{"role": "user", "content": "1+1="}]
    assert row_key({"prompt": "1+1=", "index": np.int64(7)}, "index") == 7
    assert row_key({"prompt": "1+1="}, "prompt") == prompt_key("1+1=")
    assert row_key({"prompt": messages}, "prompt") == prompt_key(messages)
    assert row_key({"id": "gsm8k-12"}, "id") == prompt_key("gsm8k-12")
    with pytest.raises(KeyError, match=r"a training row has no column 'index' \(prompts.key\)"):
        row_key({"prompt": "1+1="}, "index")


@pytest.mark.parametrize(
    ("value", "problem"),
    [(None, "has no value in it (None)"), (True, "holds the boolean True"), (np.bool_(False), "the boolean False")],
)
def test_a_row_whose_key_is_none_or_a_boolean_is_refused_naming_the_column_and_the_row(value, problem):
    with pytest.raises(ValueError) as refused:
        row_key({"prompt": "1+1=", "id": value}, "id")
    message = str(refused.value)
    assert message.startswith(f"prompts.key='id' is invalid: the training row {{'prompt': '1+1=', 'id': {value!r}}}")
    assert problem in message and "leave the key out for the hash of 'prompt'" in message


@pytest.mark.parametrize(
    ("columns", "key", "expected"),
    [
        # the case: prompts sharing an answer
        (
            {"answer": ["2", "3", "2", "4"]},
            "answer",
            "training rows 0 and 2 have the same answer '2' but different prompts ('0+1=' and '2+1=')",
        ),
        ({"constant": [7, 7, 7, 7]}, "constant", "training rows 0 and 1 have the same constant 7"),
        ({"flag": [True, False, True, False]}, "flag", "training row 0 holds the boolean True"),
        ({"id": [0, 1, None, 3]}, "id", "training row 2 has no value in it (None)"),
    ],
)
def test_a_key_column_that_does_not_identify_prompts_is_refused_at_init(columns, key, expected):
    dataset = Dataset.from_dict({"prompt": [f"{i}+1=" for i in range(4)], **columns})
    with pytest.raises(SettingsError) as refused:
        resolve_trl_settings("grpo", prompts={"key": key}, train_dataset=dataset)
    (message,) = refused.value.problems
    assert message.startswith(f"prompts.key={key!r}") and expected in message, message
    assert "Name a column with one value per prompt in prompts.key" in message


def test_a_key_shared_by_rows_of_one_prompt_is_fine_and_only_prompts_that_differ_are_refused():
    dataset = Dataset.from_dict({"prompt": ["1+1=", "1+1=", "2+1="], "id": ["a", "a", "b"]})
    assert resolve_trl_settings("grpo", prompts={"key": "id"}, train_dataset=dataset).prompts.key == "id"
    messages = [[{"role": "user", "content": "1+1="}], [{"role": "user", "content": "2+1="}]]
    check_keys_identify_prompts("id", [5, 6, 5], [*messages, messages[0]], "generation batch")  # chat prompts
    check_keys_identify_prompts("id", [5, 5], [prompt_key("1+1="), None], "generation batch")  # None: unknown
    with pytest.raises(ValueError, match=r"generation batch rows 0 and 2 have the same id 5 but different prompts"):
        check_keys_identify_prompts("id", [5, 6, 5], [prompt_key("1+1="), "x", prompt_key("2+1=")], "generation batch")


def test_a_batch_of_whole_groups_gives_one_key_per_group_and_a_mixed_group_is_refused():
    assert group_keys([5, 5, 6, 6], 2) == [5, 6]
    with pytest.raises(RuntimeError, match=r"group 1 of the generation batch holds rows of different prompts"):
        group_keys([5, 5, 6, 7], 2)


def test_the_refill_stream_is_a_seeded_permutation_per_step_and_pass():
    def first(seed, step, count):
        stream = refill_candidates(5, seed, step)
        return [next(stream) for _ in range(count)]

    drawn = first(0, 3, 10)
    assert drawn == first(0, 3, 10)  # stateless: every process, and a resumed run, draw the same
    assert sorted(index for index, _ in drawn[:5]) == list(range(5))
    assert [is_first for _, is_first in drawn] == [True] * 5 + [False] * 5
    assert drawn != first(0, 4, 10) and drawn != first(1, 3, 10)


def fixed_rule(dead: set):
    """A stand-in for the tracker's rule: keeps every key not in ``dead``; ``at_least`` as the core's."""
    calls = []

    def select(keys, at_least, refill):
        calls.append((list(keys), at_least, refill))
        keep = np.array([key not in dead for key in keys])
        shortfall = at_least - int(keep.sum())
        if shortfall > 0:
            keep[np.flatnonzero(~keep)[:shortfall]] = True
        return keep

    return select, calls


def test_skipped_groups_are_replaced_in_place_by_the_first_kept_candidates():
    select, calls = fixed_rule(dead={"b", "x"})
    stream = iter([(0, True), (1, True), (2, True), (3, True)])
    names = {0: "b", 1: "x", 2: "y", 3: "z"}
    replacements = select_groups(["a", "b", "c"], select, stream, names.get)
    assert replacements == {1: (2, "y")}
    # The batch's own "b" is not offered again; "x" is asked and skipped, "y" fills the place.
    assert calls == [(["a", "b", "c"], 0, False), (["x"], 0, True), (["y"], 0, True)]  # refills of its place
    select, calls = fixed_rule(dead=set())
    assert select_groups(["a", "b"], select, iter([]), names.get) == {}


def test_after_a_whole_pass_the_open_places_are_filled_whatever_the_rule_says(caplog):
    select, calls = fixed_rule(dead={"a", "b"})
    stream = refill_candidates(2, seed=0, step=1)
    names = {0: "a", 1: "b"}
    with caplog.at_level(logging.WARNING):
        replacements = select_groups(["a", "b"], select, stream, names.get)
    assert sorted(replacements) == [0, 1] and calls[-1][1] == 2
    assert "passed over every prompt of the training dataset" in caplog.text


def test_two_processes_with_the_same_tracker_state_replace_the_same_groups():
    """Each process runs the rule on the gathered batch with its own tracker; equal states (the same
    gathered rewards, the rule's seeded generator) give equal choices and equal states after."""
    skip = PromptSkipConfig(enable=True, explore=0.3, adaptive=False, seed=5)
    trackers = [RunTracker(ACRConfig(), prompt_skip=skip) for _ in range(2)]
    dataset = rows(12)
    for tracker in trackers:  # every prompt all wrong on a first visit
        tracker.set_prompt_keys({group: prompt_key(f"{group}+1=") for group in range(12)})
        tracker.measure(torch.zeros(24), np.arange(24) // 2)
        tracker.end_step(1)
    choices = []
    for tracker in trackers:
        choices.append(
            select_groups(
                [prompt_key(f"{group}+1=") for group in (0, 1, 2, 3)],
                lambda keys, at_least, refill, tracker=tracker: tracker.select_prompts(keys, 2, at_least, refill),
                refill_candidates(len(dataset), skip.seed, 2),
                lambda index: row_key(dataset[index], "prompt"),
            )
        )
    assert choices[0] == choices[1] and choices[0]  # something was skipped and replaced
    first, second = (tracker.skipper.state_dict() for tracker in trackers)
    assert torch.equal(first["generator"], second["generator"])


def test_a_bad_key_travels_with_the_gather_so_that_every_process_refuses_the_batch():
    """Two processes' rows, gathered in order: each process computes its entries, every process reads all."""
    first = [row_entry({"prompt": "1+1=", "id": 5}, "id") for _ in range(2)]
    second = [row_entry({"prompt": "2+1=", "id": None}, "id"), row_entry({"prompt": "2+1="}, "id")]
    assert first[0] == (5, prompt_key("1+1="), None)
    with pytest.raises(ValueError, match=r"^prompts.key='id' is invalid: the training row .* has no value in it"):
        batch_keys(first + second, "id")  # the first problem, on every process alike
    shared = [row_entry({"prompt": "2+1=", "id": 5}, "id") for _ in range(2)]
    with pytest.raises(ValueError, match=r"generation batch rows 0 and 2 have the same id 5 but different prompts"):
        batch_keys(first + shared, "id")
    assert batch_keys(first + [row_entry({"prompt": "2+1=", "id": 6}, "id")] * 2, "id") == [5, 5, 6, 6]
    # The default key is the prompt's own hash: nothing else travels.
    assert row_entry({"prompt": "1+1="}, "prompt") == (prompt_key("1+1="), None, None)
