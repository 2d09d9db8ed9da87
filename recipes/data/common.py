"""What every data script shares: the system prompt, dataset loading, the verl row format.

verl reads parquet with the columns ``data_source``, ``prompt`` (chat messages), ``ability``,
``reward_model`` ({style: rule, ground_truth}) and ``extra_info``. The prompt carries the paper's
system prompt (docs/method.md §7), so training, validation and the pass-rate sampling all see the same text.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import datasets

SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."

_LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}

logger = logging.getLogger(__name__)


def load_source(hub_name: str, config: str | None, split: str, local_path: str | None = None) -> datasets.Dataset:
    """The split from the Hugging Face hub, or from ``local_path`` (json, jsonl or parquet, with the
    hub dataset's columns) when given: the offline route."""
    if local_path is None:
        return datasets.load_dataset(hub_name, config, split=split)
    path = Path(local_path)
    builder = _LOCAL_FORMATS.get(path.suffix)
    if builder is None:
        raise ValueError(
            f"--local-path {path}: expected a .json, .jsonl or .parquet file with the columns of {hub_name}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"--local-path {path}: no such file")
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except datasets.exceptions.DatasetGenerationError as err:
        cause = err.__cause__ or err
        raise ValueError(
            f"--local-path {path} cannot be read as {builder} ({type(cause).__name__}: "
            f"{str(cause).splitlines()[0][:200]}); expected {builder} rows with the columns of {hub_name}"
        ) from None


def verl_row(data_source: str, question: str, answer: str, ability: str, index: int, **extra: Any) -> dict:
    """One verl example; ``extra_info`` keeps ``index`` (verl's per-prompt id) and the extras."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"index": int(index), "question": question, **extra},
    }


def write_parquet(rows: Iterable[dict], path: str | Path) -> int:
    """Write verl rows to ``path`` (parents created); returns the row count."""
    rows = list(rows)
    if not rows:
        raise ValueError(f"refusing to write {path}: no rows (check the source and the filters)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    logger.info("wrote %d rows to %s", len(rows), path)
    return len(rows)


def read_parquet(path: str | Path) -> list[dict]:
    """verl rows back as dicts (the inverse of :func:`write_parquet`)."""
    return datasets.load_dataset("parquet", data_files=str(path), split="train").to_list()
