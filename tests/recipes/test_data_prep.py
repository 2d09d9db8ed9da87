"""recipes/data on fixture files shaped like the hub datasets (tests/recipes/fixtures/datasets, written
by us): the parquet they produce loads in verl's real ``RLHFDataset``, carries the system prompt
and one data_source per benchmark, and its gold answers satisfy our own scorer.

The scripts run in-process through their ``main(argv)`` (a subprocess per script would re-import
verl each time). The tokenizer and the sampling model are tiny, random and built here: no download.
"""

import importlib
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf
from verl.utils.dataset.rl_dataset import RLHFDataset

from verl_avspo.verl_plugin.rewards import compute_score

pytestmark = pytest.mark.verl

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "datasets"
SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
EVAL_FIXTURES = {
    "math500": "math500.jsonl",
    "gsm8k": "gsm8k.jsonl",
    "minerva_math": "minervamath.jsonl",
    "olympiadbench": "olympiadbench.jsonl",
    "amc23": "amc23.jsonl",
    "aime2024": "aime_2024.jsonl",
    "mmlu_pro": "mmlu_pro.jsonl",
}


@pytest.fixture(scope="module")
def scripts():
    """The recipes/data modules (they import their sibling ``common`` as scripts do)."""
    sys.path.insert(0, str(REPO / "recipes" / "data"))
    try:
        names = ("common", "prepare_math", "prepare_eval", "select_difficulty", "sample_pass_rates")
        yield {name: importlib.import_module(name) for name in names}
    finally:
        sys.path.remove(str(REPO / "recipes" / "data"))


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A word-level tokenizer with a chat template and a 1-layer random Qwen2, saved locally."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    words = ["[UNK]", "[PAD]", "[EOS]", "<|system|>", "<|user|>", "<|assistant|>", "the", "answer", "is", "4", "x"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]", chat_template=template
    )
    config = Qwen2Config(
        vocab_size=len(words),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        pad_token_id=1,
        eos_token_id=2,
    )
    path = tmp_path_factory.mktemp("tiny_model")
    tokenizer.save_pretrained(path)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def _rlhf_dataset(files, tokenizer, tmp_path):
    config = OmegaConf.create(
        {"max_prompt_length": 512, "filter_overlong_prompts": True, "cache_dir": str(tmp_path / "cache")}
    )
    return RLHFDataset([str(f) for f in files], tokenizer, config)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_math_train_parquet_loads_in_rlhf_dataset(scripts, tokenizer, tmp_path, caplog):
    out = tmp_path / "train.parquet"
    assert scripts["prepare_math"].main(["--local-path", str(FIXTURES / "math_train.jsonl"), "--out", str(out)]) == 0
    # The fixture's 5th solution has no \boxed{}: it is skipped with a warning, not given a wrong answer.
    assert "example 4: its solution has no \\boxed{}" in caplog.text

    dataset = _rlhf_dataset([out], tokenizer, tmp_path)
    assert len(dataset) == 5
    item = dataset[0]
    assert item["data_source"] == "math"
    assert item["raw_prompt"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert item["raw_prompt"][1] == {"role": "user", "content": r"What is $\frac{1}{2} + \frac{1}{4}$?"}
    assert item["reward_model"] == {"style": "rule", "ground_truth": r"\frac{3}{4}"}
    assert item["extra_info"]["level"] == "Level 1"
    assert [dataset[i]["index"] for i in range(5)] == [0, 1, 2, 3, 5]  # verl's per-prompt id

    level3 = tmp_path / "level3.parquet"
    scripts["prepare_math"].main(
        ["--local-path", str(FIXTURES / "math_train.jsonl"), "--levels", "3", "--out", str(level3)]
    )
    assert [row["extra_info"]["level"] for row in scripts["common"].read_parquet(level3)] == ["Level 3"] * 3


def test_eval_sets_one_data_source_each(scripts, tokenizer, tmp_path):
    # The parquet route of --local-path: one fixture converted, the others read as jsonl.
    gsm8k_parquet = tmp_path / "gsm8k_test.parquet"
    pd.read_json(FIXTURES / "gsm8k.jsonl", lines=True).to_parquet(gsm8k_parquet)
    local = {name: FIXTURES / file for name, file in EVAL_FIXTURES.items()} | {"gsm8k": gsm8k_parquet}
    argv = ["--out-dir", str(tmp_path / "eval")]
    for name, path in local.items():
        argv += ["--local-path", f"{name}={path}"]
    assert scripts["prepare_eval"].main(argv) == 0

    files = [tmp_path / "eval" / f"{name}.parquet" for name in EVAL_FIXTURES]
    dataset = _rlhf_dataset(files, tokenizer, tmp_path)
    rows = [dataset[i] for i in range(len(dataset))]
    assert {row["data_source"] for row in rows} == set(EVAL_FIXTURES)
    gold = {(row["data_source"], row["reward_model"]["ground_truth"]) for row in rows}
    # GSM8K's "#### 2,000", AMC23's float 27.0, OlympiadBench's ["$1$", "$2$"], MMLU-Pro's letters.
    assert {("gsm8k", "72"), ("gsm8k", "2000"), ("amc23", "27"), ("olympiadbench", "1, 2"), ("mmlu_pro", "I")} <= gold
    assert all(row["raw_prompt"][0]["content"] == SYSTEM_PROMPT for row in rows)
    mmlu = next(r for r in rows if r["data_source"] == "mmlu_pro" and r["reward_model"]["ground_truth"] == "C")
    assert "A. Berlin\nB. Madrid\nC. Paris\nD. Rome" in mmlu["raw_prompt"][1]["content"]
    # A response that boxes the gold answer must score 1 under the scorer the recipes select.
    for row in rows:
        answer = row["reward_model"]["ground_truth"]
        assert compute_score(row["data_source"], f"\\boxed{{{answer}}}", answer) == 1.0, row["data_source"]


def test_eval_arguments_are_checked(scripts, tmp_path):
    with pytest.raises(SystemExit, match="unknown benchmark 'math50'; known: math500, gsm8k"):
        scripts["prepare_eval"].main(["--out-dir", str(tmp_path), "--local-path", "math50=x.jsonl"])
    with pytest.raises(SystemExit, match="expected NAME=VALUE"):
        scripts["prepare_eval"].main(["--out-dir", str(tmp_path), "--max-samples", "mmlu_pro"])


@pytest.mark.parametrize(
    ("script", "argv", "message"),
    [
        ("prepare_eval", ["--max-samples", "mmlu_pro=all"], "--max-samples mmlu_pro=all: expected a positive integer"),
        ("prepare_eval", ["--benchmarks", "amc23", "--local-path", "amc23=a.csv"], "expected a .json, .jsonl or"),
        ("prepare_eval", ["--benchmarks", "amc23", "--local-path", "amc23=missing.jsonl"], "missing.jsonl: no such"),
        # A file of another benchmark: the missing column is named, not a KeyError traceback.
        (
            "prepare_eval",
            ["--benchmarks", "math500", "--local-path", f"math500={FIXTURES / 'gsm8k.jsonl'}"],
            "math500: the data has no column 'problem'; expected the columns of HuggingFaceH4/MATH-500",
        ),
        ("prepare_math", ["--local-path", str(FIXTURES / "gsm8k.jsonl")], "the data has no column 'solution'"),
        ("prepare_math", ["--local-path", "missing.jsonl"], "missing.jsonl: no such file"),
        ("select_difficulty", ["--data", "missing.parquet", "--pass-rates", "missing.parquet"], "missing.parquet"),
    ],
)
def test_bad_inputs_end_in_a_usage_error_naming_the_problem(scripts, tmp_path, capsys, script, argv, message):
    out = ["--out-dir", str(tmp_path)] if script == "prepare_eval" else ["--out", str(tmp_path / "out.parquet")]
    with pytest.raises(SystemExit) as exit_info:
        scripts[script].main(argv + out)
    assert exit_info.value.code == 2  # argparse's usage error, after the message on stderr
    assert message in capsys.readouterr().err


def test_eval_max_samples_is_a_seeded_subset(scripts):
    import datasets

    dataset = datasets.Dataset.from_list([{"question": f"q{i}", "answer": str(i)} for i in range(20)])
    first = list(scripts["prepare_eval"].benchmark_rows("minerva_math", dataset, max_samples=5, seed=3))
    again = list(scripts["prepare_eval"].benchmark_rows("minerva_math", dataset, max_samples=5, seed=3))
    assert first == again and len(first) == 5
    indices = [row["extra_info"]["index"] for row in first]
    assert indices == sorted(indices) and all(
        row["reward_model"]["ground_truth"] == str(i) for row, i in zip(first, indices, strict=True)
    )


def _train_rows(scripts, tmp_path):
    out = tmp_path / "train.parquet"
    scripts["prepare_math"].main(["--local-path", str(FIXTURES / "math_train.jsonl"), "--out", str(out)])
    return out, scripts["common"].read_parquet(out)


def test_select_difficulty_band_is_inclusive(scripts, tmp_path, caplog):
    train, rows = _train_rows(scripts, tmp_path)  # indices 0, 1, 2, 3, 5
    rates = pd.DataFrame({"index": [0, 1, 2, 3], "pass_rate": [0.25, 0.3, 0.5, 0.5625]})  # index 5 unsampled
    kept = scripts["select_difficulty"].select(rows, rates, 0.3, 0.5, max_problems=None)
    assert [row["extra_info"]["index"] for row in kept] == [1, 2]
    assert [row["extra_info"]["pass_rate"] for row in kept] == [0.3, 0.5]
    assert "1 of 5 problems have no pass rate" in caplog.text

    rates.to_parquet(tmp_path / "rates.parquet")
    out = tmp_path / "level3.parquet"
    argv = ["--data", str(train), "--pass-rates", str(tmp_path / "rates.parquet"), "--out", str(out)]
    assert scripts["select_difficulty"].main(argv + ["--max-problems", "1", "--seed", "0"]) == 0
    (only,) = scripts["common"].read_parquet(out)
    assert only["extra_info"]["index"] in (1, 2)

    with pytest.raises(ValueError, match=r"pass-rate band \[0.6, 0.4\] is invalid"):
        scripts["select_difficulty"].select(rows, rates, 0.6, 0.4, None)


def test_pass_rates_score_with_the_training_reward(scripts, tmp_path):
    _, rows = _train_rows(scripts, tmp_path)
    completions = [[r"\boxed{0.75}", r"\boxed{1}", "no box"], [r"so $x=\boxed{4}$"] * 2]
    rates = scripts["sample_pass_rates"].pass_rates(rows[:2], completions)
    assert rates.to_dict("list") == {
        "index": [0, 1],
        "data_source": ["math", "math"],
        "samples": [3, 2],
        "correct": [1, 2],
        "pass_rate": [1 / 3, 1.0],
    }


def test_sample_pass_rates_transformers_backend(scripts, tiny_model_dir, tmp_path):
    """End to end with a random 1-layer model: the sampling, decoding and scoring path runs and
    writes one row per problem with the requested number of samples."""
    train, _ = _train_rows(scripts, tmp_path)
    out = tmp_path / "rates.parquet"
    argv = ["--data", str(train), "--model", str(tiny_model_dir), "--out", str(out), "--backend", "transformers"]
    assert scripts["sample_pass_rates"].main(argv + ["--samples", "3", "--max-tokens", "4", "--limit", "2"]) == 0
    rates = pd.read_parquet(out)
    assert rates["index"].tolist() == [0, 1] and rates["samples"].tolist() == [3, 3]
    # The tiny vocabulary has no "\boxed", so no sampled answer can be correct.
    assert rates["pass_rate"].tolist() == [0.0, 0.0]


def test_fixtures_are_shaped_like_the_hub_datasets():
    """Guard against fixtures drifting from the columns the loaders read."""
    columns = {
        "math_train.jsonl": {"problem", "level", "type", "solution"},
        "math500.jsonl": {"problem", "solution", "answer", "subject", "level", "unique_id"},
        "gsm8k.jsonl": {"question", "answer"},
        "minervamath.jsonl": {"question", "answer"},
        "olympiadbench.jsonl": {"question", "final_answer", "modality"},
        "amc23.jsonl": {"question", "answer"},
        "aime_2024.jsonl": {"problem", "answer", "year"},
        "mmlu_pro.jsonl": {"question", "options", "answer", "answer_index", "category"},
    }
    for file, wanted in columns.items():
        for line in (FIXTURES / file).read_text().splitlines():
            assert wanted <= set(json.loads(line)), file


def test_a_corrupt_local_file_is_named_not_a_traceback(scripts, tmp_path, capsys):
    corrupt = tmp_path / "math_train.jsonl"
    corrupt.write_text("not json\n")
    with pytest.raises(SystemExit) as exit_info:
        scripts["prepare_math"].main(["--local-path", str(corrupt), "--out", str(tmp_path / "out.parquet")])
    assert exit_info.value.code == 2
    assert f"--local-path {corrupt} cannot be read as json" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("script", "argv"),
    [
        ("prepare_math", ["--local-path", str(FIXTURES / "math_train.jsonl")]),
        ("prepare_eval", ["--benchmarks", "gsm8k", "--local-path", f"gsm8k={FIXTURES / 'gsm8k.jsonl'}"]),
        ("select_difficulty", ["--data", "missing.parquet", "--pass-rates", "missing.parquet"]),
        ("sample_pass_rates", ["--data", "missing.parquet", "--model", "none"]),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_work(
    script, argv, scripts, tmp_path, capsys, monkeypatch
):
    """The traceback used to come after the download (or the sampling) was done."""
    for reader in ("load_source", "read_parquet"):  # what each script starts its work with
        if hasattr(scripts[script], reader):
            monkeypatch.setattr(scripts[script], reader, lambda *a, **k: pytest.fail("the work must not start"))
    (tmp_path / "a_file").write_text("")
    option = "--out-dir" if script == "prepare_eval" else "--out"
    target = tmp_path / "a_file" / ("eval" if script == "prepare_eval" else "out.parquet")
    with pytest.raises(SystemExit) as exit_info:
        scripts[script].main([*argv, option, str(target)])
    assert exit_info.value.code == 2
    assert f"{option} {target}: {tmp_path / 'a_file'} is a file, not a folder; choose another {option}" in (
        capsys.readouterr().err
    )
    if script != "prepare_eval":  # a folder where the parquet file should go
        with pytest.raises(SystemExit):
            scripts[script].main([*argv, option, str(tmp_path)])
        assert f"{option} {tmp_path} is a folder; give the parquet file to write" in capsys.readouterr().err


def test_an_unreachable_hub_is_said_at_once_with_the_offline_route(scripts, tmp_path, capsys, monkeypatch):
    """Offline, datasets retried for about 30 s and ended in a ConnectionError traceback."""
    import time

    import datasets
    import huggingface_hub

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # tests/conftest.py sets it
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("no download without the hub"))
    start = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        scripts["prepare_math"].main(["--out", str(tmp_path / "out.parquet")])
    assert exit_info.value.code == 2 and time.monotonic() - start < 15
    err = capsys.readouterr().err
    assert "DigitalLearningGmbH/MATH-lighteval is downloaded from http://127.0.0.1:9, which does not answer" in err
    assert "pass it as --local-path" in err and "HF_DATASETS_OFFLINE=1" in err
