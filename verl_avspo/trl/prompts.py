"""Prompt identity and pre-rollout skipping in TRL's ``GRPOTrainer`` (docs/trl.md, "Prompts").

The trainer's ``prompts=`` argument: ``key``, the dataset column that identifies a prompt across
steps (TRL's ``prompt`` by default, hashed with the core's ``prompt_key``; an integer column such as
``index`` is used as it is), and ``skip``, the core's skip rule (``core.prompt_skip``, off by default).
A key that does not identify prompts (a boolean, a missing value, one value shared by two prompts)
would merge their histories, so it is refused: at ``__init__`` for a map-style training dataset (every
row read), else at the step whose generation batch shows it.

TRL draws a generation batch as whole groups: its ``RepeatSampler`` repeats each prompt
``num_generations`` times in a row and every process takes a contiguous slice of the same index
stream. Skipping keeps that shape: a skipped group's rows are replaced, in place and on every process
alike, by the rows of another prompt of the training dataset, so each process keeps its number of
rows and every group stays whole. The replacements are drawn from a permutation of the dataset seeded
by the skip rule's seed and the step, so a resumed run draws what the uninterrupted one drew without
saving a position; the rule itself (its generator, its exploration probabilities) and the history
are in the run tracker's state. Imports neither TRL nor transformers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from verl_avspo.core.prompt_allocation import resolve_prompt_allocation
from verl_avspo.core.prompt_history import history_key, prompt_key
from verl_avspo.core.prompt_refill import skip_and_refill
from verl_avspo.core.prompt_skip import PromptSkipConfig, resolve_prompt_skip
from verl_avspo.core.validation import Problems, given_settings

__all__ = [
    "PROMPTS_SECTION",
    "DEFAULT_KEY",
    "TRLPrompts",
    "resolve_trl_prompts",
    "row_key",
    "short_repr",
    "check_keys_identify_prompts",
    "row_entry",
    "batch_keys",
    "group_keys",
    "select_groups",
]

logger = logging.getLogger(__name__)

PROMPTS_SECTION = "prompts"
# TRL's prompt column: its text or chat messages, hashed.
DEFAULT_KEY = "prompt"
# The columns TRL keeps with GRPOConfig.remove_unused_columns=True (GRPOTrainer._set_signature_columns_if_needed).
TRL_KEPT_COLUMNS = ("prompt", "image", "images")


@dataclass(frozen=True)
class TRLPrompts:
    """The run's prompt settings (``prompts=``)."""

    key: str | None
    """The column whose value identifies a prompt; None: no history (a dataset without a ``prompt`` column)."""
    skip: PromptSkipConfig
    """The pre-rollout skip rule (``prompts.skip``; off unless ``enable``)."""


def _column_names(dataset: Any) -> list[str] | None:
    names = getattr(dataset, "column_names", None)
    return list(names) if isinstance(names, (list, tuple)) else None


def _indexable(dataset: Any) -> bool:
    return callable(getattr(dataset, "__getitem__", None)) and callable(getattr(dataset, "__len__", None))


def short_repr(value: Any, width: int = 80) -> str:
    """``repr(value)``, cut to ``width`` characters for a message."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


# How to key prompts when a column does not identify them.
KEY_FIX = (
    f"Name a column with one value per prompt in {PROMPTS_SECTION}.key (a row index: "
    "dataset.map(lambda row, i: {'index': i}, with_indices=True)), or leave the key out for the hash of "
    f"'{DEFAULT_KEY}'."
)


def _value_problem(column: str, value: Any, where: str) -> str | None:
    """Why ``value`` of the key column cannot identify a prompt (None if it can)."""
    if value is None:
        return (
            f"{PROMPTS_SECTION}.key={column!r} is invalid: {where} has no value in it (None), so its prompt has no "
            f"identity. Fill the column for every row, or: {KEY_FIX}"
        )
    if isinstance(value, (bool, np.bool_)):
        return (
            f"{PROMPTS_SECTION}.key={column!r} is invalid: {where} holds the boolean {bool(value)}, and a boolean "
            f"tells at most two prompts apart, so their histories would merge. {KEY_FIX}"
        )
    return None


def _same_prompt(first: Any, second: Any) -> bool:
    """Whether two prompts (texts, chat messages or hashes) are one: by value, as their hash sees them."""
    try:
        return bool(first == second)
    except (TypeError, ValueError):  # arrays: compared as the hash sees them
        return prompt_key(first) == prompt_key(second)


def check_keys_identify_prompts(
    column: str, keys: Sequence[Any], prompts: Sequence[Any], where: str, shown: Sequence[Any] | None = None
) -> None:
    """Refuse a key (:func:`row_key`) that two different prompts share (``prompts``: the rows' prompts,
    text or chat messages, or their hashes; None where unknown): the per-prompt history would merge
    them, and skipping would act on the wrong one. ``shown``: the column's values as the message shows
    them (default: the keys).

    Raises:
        ValueError: naming the column, the value, both rows and their prompts, and the fix.
    """
    if len(set(keys)) == len(keys):  # no key repeats (a row index): nothing to compare
        return
    first: dict[Any, int] = {}
    for row, (key, prompt) in enumerate(zip(keys, prompts, strict=True)):
        if prompt is None:
            continue
        seen_row = first.setdefault(key, row)
        seen_prompt = prompts[seen_row]
        if seen_row != row and not _same_prompt(seen_prompt, prompt):
            value = (keys if shown is None else shown)[row]
            raise ValueError(
                f"{PROMPTS_SECTION}.key={column!r} does not identify prompts: {where} rows {seen_row} and {row} "
                f"have the same {column} {short_repr(value)} but different prompts ({short_repr(seen_prompt)} and "
                f"{short_repr(prompt)}), so their histories would merge and skipping would act on the wrong prompt. "
                f"{KEY_FIX}"
            )


def _read_column(dataset: Any, name: str) -> list:
    """A whole column of a map-style dataset (a ``datasets.Dataset`` in one Arrow read: its column
    object, read row by row, takes seconds per 100k rows)."""
    if callable(getattr(dataset, "select_columns", None)):
        return dataset.select_columns([name]).with_format(None)[:][name]
    return [dataset[row][name] for row in range(len(dataset))]


def _check_key_column(dataset: Any, column: str, problems: Problems) -> None:
    """Every row of a map-style training dataset: the key column holds no None and no boolean, and no
    value of it is shared by two different prompts (read once, at ``__init__``; the prompts only when
    some value repeats)."""
    values = _read_column(dataset, column)
    for row, value in enumerate(values):
        problem = _value_problem(column, value, f"training row {row}")
        if problem:
            problems.messages.append(problem)
            return
    if column == DEFAULT_KEY or DEFAULT_KEY not in (_column_names(dataset) or ()):
        return
    try:
        repeats = len(set(values)) < len(values)
    except TypeError:  # unhashable values (lists): compared by their keys
        repeats = True
    if repeats:
        keys = [history_key(value, hashed=column == DEFAULT_KEY) for value in values]
        prompts = _read_column(dataset, DEFAULT_KEY)
        problems.check(check_keys_identify_prompts, column, keys, prompts, "training", values)


def resolve_trl_prompts(prompts: Any, args: Any, dataset: Any, problems: Problems) -> TRLPrompts | None:
    """Validate the trainer's ``prompts=`` against its ``GRPOConfig`` and training dataset; problems
    are added to ``problems`` (the trainer reports every bad setting at once)."""
    given = problems.check(
        given_settings,
        prompts,
        PROMPTS_SECTION,
        ("key", "skip", "allocation"),
        problems,
        example="prompts={'key': 'index'}",
    )
    if given is None:
        return None
    skip = problems.check(resolve_prompt_skip, given.get("skip"), section=f"{PROMPTS_SECTION}.skip")
    allocation = problems.check(
        resolve_prompt_allocation, given.get("allocation"), section=f"{PROMPTS_SECTION}.allocation"
    )
    if allocation is not None and allocation.enable:
        problems.messages.append(
            f"{PROMPTS_SECTION}.allocation.enable=True is not available with TRL's GRPOTrainer: TRL 1.16 draws every "
            "prompt num_generations times (its RepeatSampler) and groups rewards by position (arange(N) // "
            "num_generations), so every group holds exactly num_generations completions and none can be a pilot or "
            "a larger group. Remove prompts['allocation']. (prompts['skip'] spends the same rollouts on other "
            "prompts: each skipped prompt is replaced by another, so it saves none; docs/trl.md.) docs/prompts.md "
            "says what TRL would need."
        )
    key = given.get("key")
    columns = _column_names(dataset)
    if key is not None and not isinstance(key, str):
        problems.messages.append(
            f"{PROMPTS_SECTION}.key={key!r} is invalid: it is the name of the training dataset's column that "
            f"identifies a prompt, e.g. prompts={{'key': 'index'}}, or leave it out for the hash of '{DEFAULT_KEY}'."
        )
        return None
    if key is not None and columns is not None and key not in columns:
        problems.messages.append(
            f"{PROMPTS_SECTION}.key={key!r} is invalid: the training dataset has no such column (it has "
            f"{', '.join(columns)}). Name one of them, or leave the key out for the hash of '{DEFAULT_KEY}'."
        )
    elif key is not None and columns is not None and _indexable(dataset):
        _check_key_column(dataset, key, problems)
    if key is None:
        key = DEFAULT_KEY if columns is None or DEFAULT_KEY in columns else None
    remove_unused = bool(getattr(args, "remove_unused_columns", False))
    if key is not None and remove_unused and key not in TRL_KEPT_COLUMNS:
        problems.messages.append(
            f"{PROMPTS_SECTION}.key={key!r} is invalid with GRPOConfig.remove_unused_columns=True: TRL removes "
            f"every column but {', '.join(TRL_KEPT_COLUMNS)} before the trainer sees a row. Set "
            "remove_unused_columns=False (TRL's default), or leave the key out for the hash of the prompt."
        )
    if skip is not None and skip.enable:
        if key is None:
            problems.messages.append(
                f"{PROMPTS_SECTION}.skip.enable=True is invalid: the training dataset has no '{DEFAULT_KEY}' "
                f"column to know a prompt by. Name the column that identifies a prompt in {PROMPTS_SECTION}.key."
            )
        if dataset is not None and not _indexable(dataset):
            problems.messages.append(
                f"{PROMPTS_SECTION}.skip.enable=True is invalid with a {type(dataset).__name__} training dataset: a "
                "skipped prompt is replaced by another row of the dataset, read by its index, and an iterable "
                "dataset has none. Pass a map-style datasets.Dataset, or set prompts={'skip': {'enable': False}}."
            )
    return None if skip is None else TRLPrompts(key, skip)


def row_key(row: Mapping[str, Any], column: str) -> int | str:
    """A dataset row's prompt key: an integer column's value as it is, anything else (the prompt's text
    or chat messages) hashed: the core's :func:`~verl_avspo.core.prompt_history.history_key`.

    Raises:
        KeyError: the row has no such column.
        ValueError: its value is None or a boolean (no prompt identity), naming the column and the row.
    """
    try:
        value = row[column]
    except KeyError:
        raise KeyError(
            f"a training row has no column {column!r} ({PROMPTS_SECTION}.key): its columns are {sorted(row)}. "
            f"Name the column that identifies a prompt in {PROMPTS_SECTION}.key."
        ) from None
    problem = _value_problem(column, value, f"the training row {short_repr(dict(row), 200)}")
    if problem:
        raise ValueError(problem)
    return history_key(value, hashed=column == DEFAULT_KEY)


def row_entry(row: Mapping[str, Any], column: str) -> tuple[Any, str | None, str | None]:
    """What a process contributes of one row to the gathered generation batch: the row's key, the hash of
    its ``prompt`` (with a key column other than ``prompt``: :func:`batch_keys` compares them), and the
    problem with its key, if any. The problem travels with the gather, so that every process refuses the
    batch alike, where one raising alone would leave the others waiting in the gather."""
    try:
        key = row_key(row, column)
    except (KeyError, ValueError) as error:
        return None, None, error.args[0]
    identity = prompt_key(row[DEFAULT_KEY]) if column != DEFAULT_KEY and DEFAULT_KEY in row else None
    return key, identity, None


def batch_keys(entries: Sequence[tuple[Any, str | None, str | None]], column: str) -> list:
    """The gathered :func:`row_entry` of every row: their keys.

    Raises:
        ValueError: a row's key problem (the first), or a key two prompts of the batch share.
    """
    problems = [problem for _, _, problem in entries if problem is not None]
    if problems:
        raise ValueError(problems[0])
    keys = [key for key, _, _ in entries]
    check_keys_identify_prompts(column, keys, [identity for _, identity, _ in entries], "generation batch")
    return keys


def group_keys(row_keys: Sequence[Any], group_size: int) -> list[Any]:
    """The key of each group of ``group_size`` consecutive rows (TRL's layout of a generation batch).

    Raises:
        RuntimeError: a group whose rows are different prompts (a TRL that no longer draws whole groups).
    """
    keys = np.empty(len(row_keys), dtype=object)
    keys[:] = list(row_keys)
    groups = keys.reshape(-1, group_size)
    mixed = [g for g, rows in enumerate(groups) if any(key != rows[0] for key in rows)]
    if mixed:
        raise RuntimeError(
            f"verl_avspo.trl: group {mixed[0]} of the generation batch holds rows of different prompts: this TRL no "
            "longer repeats each prompt num_generations times in a row (RepeatSampler), which the per-prompt history "
            "and skipping rely on. Install a tested TRL (pip install 'verl-avspo[trl]')."
        )
    return groups[:, 0].tolist()


def refill_candidates(dataset_size: int, seed: int, step: int) -> Iterator[tuple[int, bool]]:
    """Dataset indices to replace skipped prompts with at ``step``: permutations of the dataset seeded by
    (``seed``, ``step``, pass), each index with whether its pass is the first. Stateless, so every
    process and a resumed run draw the same."""
    for pass_number in range(1 << 30):
        for index in np.random.default_rng([seed, step, pass_number]).permutation(dataset_size):
            yield int(index), pass_number == 0


def select_groups(
    keys: Sequence[Any],
    select: Callable[[list[Any], int, bool], np.ndarray],
    candidates: Iterator[tuple[int, bool]],
    candidate_key: Callable[[int], Any],
) -> dict[int, tuple[int, Any]]:
    """Which groups of a generation batch to replace, and by what: ``{group: (dataset index, key)}``.

    The core's skip-and-refill loop (``core.prompt_refill``) with TRL's policies: ``select(keys, at_least,
    refill)`` is the run tracker's rule (``RunTracker.select_prompts``). The batch's own groups are asked
    first; each skipped one's place is then offered to further ``candidates`` (dataset indices, in order),
    asked in chunks of the places still open, leaving out during the first pass over the dataset the batch's
    own prompts and those already offered. Once a whole pass is through and places are still open, the next
    chunk fills them whatever the rule says (with a warning).
    """
    offered = set(keys)  # a prompt is offered once in the first pass (the batch's own included)
    warned = False

    def draw(missing: int) -> _Chunk:
        nonlocal warned
        chunk, first_pass = _Chunk(), True
        while len(chunk) < missing:
            index, first_pass = next(candidates)
            key = candidate_key(index)
            if first_pass and key in offered:
                continue
            offered.add(key)
            chunk.append((index, key))
        chunk.first_pass = first_pass
        if not first_pass and not warned:
            warned = True
            logger.warning(
                "the skip rule (%s.skip) passed over every prompt of the training dataset without filling the "
                "generation batch: its open places are filled whatever the rule says",
                PROMPTS_SECTION,
            )
        return chunk

    picked = skip_and_refill(
        _Chunk((None, key) for key in keys),
        lambda chunk: [key for _, key in chunk],
        lambda chunk_keys, at_least, refill: select(list(chunk_keys), at_least, refill),
        draw,
        len(keys),
        forced=lambda _number, chunk: not chunk.first_pass,
    )
    (_, kept), *refills = picked.chunks
    open_places = sorted(set(range(len(keys))) - set(kept.tolist()))
    taken = [chunk[i] for chunk, chosen in refills for i in chosen]
    return dict(zip(open_places, taken, strict=False))


class _Chunk(list):
    """Candidates ``(dataset index, key)`` of one draw, and whether all came from the first pass."""

    first_pass: bool = True
