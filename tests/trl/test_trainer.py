"""The TRL trainer (``verl_avspo.trl.trainer``) on what is known only once it trains: a key column of
an iterable dataset (not read at ``__init__``) that two prompts of a batch share, or that is None, stops
the step naming the column; on ``train(resume_from_checkpoint=...)``, an ``avspo_state.pt`` that is
torn, empty, text or a folder is refused with the core's ``RunStateError`` (the file and the fix), and a
checkpoint saved with another ``acr.tau``, ``avspo.gap`` or ``prompts.key`` is refused before the first
step, in the trainer's arguments; the core's warnings (scores outside the reward range) name the
trainer's arguments, not verl's keys.

Each test trains the harness's tiny random Qwen2 (``tests/e2e/trl_cpu``, built once: conftest.py); a
step costs about a second. The rewards' checks are tests/trl/test_rewards.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="TRL is not installed (pip install 'verl-avspo[trl]')")

from datasets import Dataset  # noqa: E402
from trl_cpu.harness import TinyAssets, contains_sum, grpo_config, make_trainer  # noqa: E402

from verl_avspo.core.run_tracker import RunStateError  # noqa: E402
from verl_avspo.trl import STATE_FILE, AVSPOGRPOTrainer  # noqa: E402

ONE_STEP = {"max_steps": 1}


@pytest.fixture(scope="module")
def checkpoint(tiny, tmp_path_factory):
    """A checkpoint of a one-step run keyed by the default key, with its ``avspo_state.pt``."""
    trainer = make_trainer(
        tiny, tmp_path_factory.mktemp("trl_saved"), config={**ONE_STEP, "save_strategy": "steps", "save_steps": 1}
    )
    trainer.train()
    folder = Path(trainer.args.output_dir) / "checkpoint-1"
    assert (folder / STATE_FILE).is_file()
    return folder


def trainer_on(tiny: TinyAssets, output_dir: Path, dataset, config: dict, **settings) -> AVSPOGRPOTrainer:
    """The adapter's trainer of ``tiny`` on ``dataset`` (the harness's recorders are not needed here)."""
    return AVSPOGRPOTrainer(
        model=str(tiny.model),
        reward_funcs=contains_sum,
        args=grpo_config(output_dir, **config),
        train_dataset=dataset,
        processing_class=tiny.tokenizer(),
        **settings,
    )


def with_column(tiny: TinyAssets, **columns) -> Dataset:
    return Dataset.from_dict({**tiny.dataset().to_dict(), **columns})


def test_an_iterable_datasets_key_that_two_prompts_share_stops_the_step(tiny, tmp_path):
    """The issue's case: prompts sharing a value would merge their histories (prompts/seen 1)."""
    dataset = with_column(tiny, shared=["same"] * tiny.prompts).to_iterable_dataset()
    trainer = trainer_on(tiny, tmp_path, dataset, ONE_STEP, prompts={"key": "shared"})
    with pytest.raises(ValueError) as refused:
        trainer.train()
    message = str(refused.value)
    assert message.startswith("prompts.key='shared' does not identify prompts: generation batch rows 0 and 4 have")
    assert "Name a column with one value per prompt in prompts.key" in message


def test_an_iterable_datasets_key_that_is_none_stops_the_step_naming_the_column_and_the_row(tiny, tmp_path):
    dataset = with_column(tiny, id=[None] * tiny.prompts).to_iterable_dataset()
    trainer = trainer_on(tiny, tmp_path, dataset, ONE_STEP, prompts={"key": "id"})
    with pytest.raises(ValueError, match=r"^prompts.key='id' is invalid: the training row \{'prompt': .*'id': None\}"):
        trainer.train()


@pytest.mark.parametrize("damage", ["torn", "empty", "text", "folder"])
def test_an_unreadable_state_file_on_resume_names_the_file_and_the_fix(tiny, checkpoint, tmp_path, damage):
    copy = shutil.copytree(checkpoint, tmp_path / "checkpoint-1")
    state = copy / STATE_FILE
    if damage == "torn":
        state.write_bytes(state.read_bytes()[:100])
    elif damage == "empty":
        state.write_bytes(b"")
    elif damage == "text":
        state.write_text("not a run state\n")
    else:
        state.unlink()
        state.mkdir()
    trainer = make_trainer(tiny, tmp_path / "out", config={"max_steps": 2})
    with pytest.raises(RunStateError) as refused:
        trainer.train(resume_from_checkpoint=str(copy))
    assert str(state) in str(refused.value) and "resume from the previous checkpoint" in str(refused.value)
    assert trainer.state.global_step == 1  # refused before any step of the resumed run


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"acr": {"tau": 1e-3}}, "acr.tau=1e-06 in the checkpoint, 0.001 here"),
        ({"avspo": {"gap": 0.2}}, "avspo.gap=0.1 in the checkpoint, 0.2 here"),
        ({"prompts": {"key": "answer_id"}}, "prompts.key='prompt' keyed the checkpoint's per-prompt history, "),
    ],
)
def test_resuming_with_other_settings_is_refused_before_the_first_step(tiny, checkpoint, tmp_path, settings, expected):
    dataset = with_column(tiny, answer_id=list(range(tiny.prompts)))
    trainer = trainer_on(tiny, tmp_path, dataset, {"max_steps": 2}, **settings)
    with pytest.raises(ValueError) as refused:
        trainer.train(resume_from_checkpoint=checkpoint)
    message = str(refused.value)
    assert message.startswith(f"the checkpoint's {STATE_FILE} was saved with other settings: {expected}")
    assert message.endswith("or start a fresh run (train() without resume_from_checkpoint).")
    assert trainer.state.global_step == 1


def test_the_cores_warnings_name_the_trainers_arguments(tiny, tmp_path):
    def out_of_range(completions, **kwargs):
        return [2.0, 0.0] * (len(completions) // 2)

    trainer = make_trainer(tiny, tmp_path, reward_funcs=out_of_range, config=ONE_STEP)
    with pytest.warns(UserWarning) as warned:
        trainer.train()
    messages = [str(warning.message) for warning in warned]
    assert any(message.startswith("response scores fall outside acr.reward_range=[0.0, 1.0]") for message in messages)
    assert not [message for message in messages if "algorithm.acr" in message or "algorithm.avspo" in message]
