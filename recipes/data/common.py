"""What every data script shares: the system prompt, dataset loading, the verl row format.

verl reads parquet with the columns ``data_source``, ``prompt`` (chat messages), ``ability``,
``reward_model`` ({style: rule, ground_truth}) and ``extra_info``. The prompt carries the paper's
system prompt (docs/method.md §7), so training, validation and the pass-rate sampling all see the same text.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import datasets

SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."

_LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}

logger = logging.getLogger(__name__)


# One request decides whether the hub answers; datasets' own download retries for about half a minute.
HUB_TIMEOUT_S = 10.0


def check_hub(hub_name: str) -> None:
    """Raise ValueError at once, saying why and what to do, when ``hub_name`` cannot be downloaded:
    the hub does not answer, or has no such dataset. Offline mode (HF_DATASETS_OFFLINE=1,
    HF_HUB_OFFLINE=1) is left to datasets, which then reads its cache without network."""
    import httpx
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    if datasets.config.HF_HUB_OFFLINE:
        return
    offline_route = (
        "download the split where there is network and pass it as --local-path (json, jsonl or parquet: the "
        "offline route), or, if it is in your datasets cache already, set HF_DATASETS_OFFLINE=1"
    )
    try:
        HfApi().dataset_info(hub_name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return  # datasets says what access it needs
    except RepositoryNotFoundError:
        raise ValueError(
            f"{hub_name} is not a dataset on {constants.ENDPOINT} (or it is private: log in with `hf auth login`); "
            "fix the name, or give the data with --local-path"
        ) from None
    except (httpx.HTTPError, HfHubHTTPError, OSError) as err:
        raise ValueError(
            f"{hub_name} is downloaded from {constants.ENDPOINT}, which does not answer ({type(err).__name__}: "
            f"{err}); {offline_route}"
        ) from None


def check_writable(path: str | Path, what: str) -> None:
    """Raise ValueError before any work when ``path`` (a file to write, or a folder to write into) cannot
    be written: its nearest existing ancestor is not a writable folder, or it is a folder where a file
    is expected. ``what`` names the option in the message."""
    path = Path(path).expanduser()
    if what != "--out-dir" and path.is_dir():
        raise ValueError(f"{what} {path} is a folder; give the parquet file to write, for example {path}/train.parquet")
    ancestor = path if what == "--out-dir" else path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{what} {path}: {ancestor} is a file, not a folder; choose another {what}")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path}: {ancestor} is not writable by this user; choose another {what}")
    if path.is_file() and not os.access(path, os.W_OK):
        raise ValueError(f"{what} {path} exists and is read-only; choose another {what} or remove it")


def load_source(hub_name: str, config: str | None, split: str, local_path: str | None = None) -> datasets.Dataset:
    """The split from the Hugging Face hub (checked first: :func:`check_hub`), or from ``local_path``
    (json, jsonl or parquet, with the hub dataset's columns) when given: the offline route."""
    if local_path is None:
        check_hub(hub_name)
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
