"""The local data files, read as far as the dry run can afford: each parquet's schema (its
footer: metadata only) must have the columns verl's dataset and reward loop read, and each
``data_source`` value must be one the reward function scores (that one column is read). verl
itself finds a missing column when the dataset loads, and an unknown source at the first reward
(NotImplementedError), after the models have loaded.

Pure: problems are returned, and what could not be checked is added to ``not_checked``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import DictConfig, OmegaConf

__all__ = ["DATA_KEYS", "DATA_WRITERS", "OUR_REWARD", "local_data_files", "data_problems"]

DATA_KEYS = ("data.train_files", "data.val_files")
OUR_REWARD = "pkg://verl_avspo.verl_plugin.rewards"
# verl's RLHFDataset reads these suffixes (and raises "Unsupported file format" for any other).
_FORMATS = (".parquet", ".json", ".jsonl")
# The recipe script that writes each key's files.
DATA_WRITERS = {
    "data.train_files": "recipes/data/prepare_math.py",
    "data.val_files": "recipes/data/prepare_eval.py",
}
_MAX_LISTED = 5


def local_data_files(config: DictConfig, key: str) -> list[str]:
    """The files ``key`` lists (one path or a list), as given."""
    value = OmegaConf.select(config, key, default=None)
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(item) for item in value]


def _reward_scorer(config: DictConfig, not_checked: list[str]):
    """The function that tells whether the run's reward scores a ``data_source`` (None: unknown here)."""
    reward = config.reward
    if OmegaConf.select(reward, "reward_model.enable", default=False) is True:
        not_checked.append("the data_source values (a reward model scores them)")
        return None
    if OmegaConf.select(reward, "reward_manager.module.path", default=None):
        not_checked.append("the data_source values against reward.reward_manager.module (your reward manager)")
        return None
    custom = OmegaConf.select(reward, "custom_reward_function", default=None) or {}
    path = custom.get("path")
    from verl_avspo.verl_plugin import rewards

    if not path:
        return rewards.verl_scores_source
    if str(path) == OUR_REWARD and custom.get("name") == "compute_score":
        return rewards.scores_source
    not_checked.append(f"the data_source values against reward.custom_reward_function.path={path} (your function)")
    return None


def _first_record_keys(path: Path) -> list[str] | None:
    """The keys of a JSON-lines file's first row (a .json file is read the same way, as verl's json
    loader takes both); None for a JSON array, whose columns are not read here.

    Raises:
        ValueError: the file does not start with a JSON object or array.
    """
    with path.open(encoding="utf-8", errors="replace") as file:
        first = next((line for line in file if line.strip()), "")
    if first.lstrip().startswith("["):
        return None
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        record = None
    if not isinstance(record, dict):
        raise ValueError(first[:80])
    return list(record)


def _missing_columns(key: str, path: Path, missing: list[str], names: list[str], writer: str) -> str:
    return (
        f"{key}: {path} has no column {', '.join(missing)} (it has: {', '.join(names) or 'none'}). verl reads the "
        f"prompt, the data source and reward_model.ground_truth from each row: write the file with {writer}, or set "
        "data.prompt_key / data.reward_fn_key to the columns that hold them."
    )


def _file_problems(key: str, path: Path, columns: list[str], scores, source_key: str) -> Iterator[str]:
    writer = DATA_WRITERS[key]
    if path.suffix not in _FORMATS or not path.is_file():
        yield (
            f"{key}: {path} is not a .parquet, .json or .jsonl file, the formats verl's dataset reads. Give such a "
            f"file (write one with {writer})."
        )
        return
    if path.suffix != ".parquet":
        try:
            names = _first_record_keys(path)
        except ValueError as err:
            yield (
                f"{key}: {path} does not start with a JSON object (one row per line), but with {str(err)!r}. Write "
                f"it again (with {writer}), or give the right file."
            )
            return
        missing = [column for column in columns if names is not None and column not in names]
        if missing:
            yield _missing_columns(key, path, missing, names, writer)
        return
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as err:
        yield (
            f"{key}: {path} is not a readable parquet file ({str(err).splitlines()[0]}). Write it again (with "
            f"{writer}), or give the right file."
        )
        return
    missing = [column for column in columns if column not in schema.names]
    if missing:
        yield _missing_columns(key, path, missing, schema.names, writer)
        return
    reward_type = schema.field("reward_model").type
    if pa.types.is_struct(reward_type) and reward_type.get_field_index("ground_truth") < 0:
        yield (
            f"{key}: {path}'s reward_model column has no ground_truth field (it has: "
            f"{', '.join(field.name for field in reward_type)}). verl's reward reads reward_model.ground_truth: "
            f"write the file with {writer}."
        )
    if scores is None:
        return
    sources = pq.read_table(path, columns=[source_key]).column(0).unique().to_pylist()
    unknown = sorted(str(source) for source in sources if source is None or not scores(str(source)))
    if unknown:
        listed = ", ".join(repr(source) for source in unknown[:_MAX_LISTED])
        more = f" and {len(unknown) - _MAX_LISTED} more" if len(unknown) > _MAX_LISTED else ""
        yield (
            f"{key}: {path} has {source_key} values that the reward function does not score: {listed}{more}; verl "
            "would stop at the first reward with NotImplementedError. Score them with your own function "
            "(reward.custom_reward_function.path=<file> reward.custom_reward_function.name=<function>), or use "
            "sources it knows (math500, gsm8k, aime2024, mmlu_pro, ...: see verl_avspo/verl_plugin/rewards.py)."
        )


def data_problems(config: DictConfig, not_checked: list[str]) -> list[str]:
    """Each local data file's format, columns and data sources (files that do not exist, and remote
    ones, are left to the path checks)."""
    if OmegaConf.select(config, "data.custom_cls.path", default=None):
        not_checked.append("the data files' columns (data.custom_cls reads them its own way)")
        return []
    files = [
        (key, Path(name).expanduser())
        for key in DATA_KEYS
        for name in local_data_files(config, key)
        if "://" not in name and Path(name).expanduser().exists()
    ]
    if not files:
        return []
    prompt_key = str(OmegaConf.select(config, "data.prompt_key", default="prompt"))
    source_key = str(OmegaConf.select(config, "data.reward_fn_key", default="data_source"))
    scores = _reward_scorer(config, not_checked)
    problems = []
    for key, path in files:
        problems += _file_problems(key, path, [prompt_key, source_key, "reward_model"], scores, source_key)
        if scores is not None and path.suffix != ".parquet":
            not_checked.append(f"the {source_key} values of {path} (of a JSON file only the first row's keys are read)")
    return problems
