"""Per-prompt collapse history across a run (docs/prompts.md). Framework-free: numpy and torch.

A *prompt key* is a prompt's stable identity across steps: an integer (verl's ``extra_info.index``,
the sandbox's problem number) or a string (:func:`prompt_key`, a hash of the prompt for hosts
without a dataset index). :class:`PromptHistory` keeps, per key, how often the prompt was visited,
on how many visits its group was all-correct or all-wrong, its last pass rate, its collapse streak
(consecutive collapsed visits ending at the latest) and the last step it was seen.

Memory is bounded: a key array and six dense columns in slot order (the order prompts were first
seen) and a sorted index of the keys, no Python object per prompt (benchmarks/bench_prompt_history.py
measures 1M prompts). Look-ups and updates are ``np.searchsorted`` over the sorted index, vectorised
over the batch's groups; new prompts are appended, so a step costs about the same at 1k and 1M
prompts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["PROMPT_CLASSES", "COLUMNS", "PromptRecords", "PromptClasses", "PromptHistory", "prompt_key", "history_key"]

# The class of a seen prompt: all-correct on every visit, all-wrong on every visit, or neither.
PROMPT_CLASSES = ("always_solved", "never_solved", "mixed")
# The per-prompt columns, with their dtypes.
COLUMNS = {
    "visits": np.int32,
    "all_correct": np.int32,
    "all_wrong": np.int32,
    "last_pass_rate": np.float32,
    "collapse_streak": np.int32,
    "last_step": np.int64,
}


def prompt_key(value: Any) -> str:
    """A stable identity for a prompt that has no dataset index: 32 hex characters of the SHA-256 of
    its JSON form (text, token ids, or chat messages; an array or tensor counts as its list). The same
    prompt gives the same key in every process and release, so a saved history keeps matching."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        value = value.tolist()
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def history_key(value: Any, hashed: bool = False) -> int | str:
    """A prompt's key in the history, the one rule of every host: an integer identity (a dataset
    index as int, numpy integer or one-element integer tensor) as ``int``; anything else (a string id,
    the prompt's text, token ids or chat messages) as :func:`prompt_key`'s hash.

    Args:
        value: the prompt's identity, or the prompt itself.
        hashed: the value is the prompt itself (verl's ``raw_prompt``, TRL's ``prompt`` column), hashed
            even where it is a number.
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    if not hashed and isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return prompt_key(value)


@dataclass(frozen=True)
class PromptRecords:
    """The history of some prompts, one entry per key asked for (:meth:`PromptHistory.lookup`).
    An unseen key has ``seen`` False, zero counts, ``last_pass_rate`` NaN and ``last_step`` -1."""

    seen: np.ndarray
    visits: np.ndarray
    all_correct: np.ndarray
    all_wrong: np.ndarray
    last_pass_rate: np.ndarray
    collapse_streak: np.ndarray
    last_step: np.ndarray

    @property
    def collapsed_every_visit(self) -> np.ndarray:
        """(n,) bool: seen, and collapsed (all-correct or all-wrong) on every visit."""
        return self.seen & (self.all_correct + self.all_wrong == self.visits)


@dataclass(frozen=True)
class PromptClasses:
    """Counts of the seen prompts by class (:data:`PROMPT_CLASSES`)."""

    seen: int
    always_solved: int
    never_solved: int
    mixed: int

    def share(self, name: str) -> float:
        """A class's share of the seen prompts (0 when none was seen)."""
        return getattr(self, name) / self.seen if self.seen else 0.0


class _KeyIndex:
    """Key -> slot, slots in insertion order. Vectorised look-ups: a sorted main index and a small sorted
    index of the latest keys, merged into the main one when it outgrows a sixteenth of it, so adding k
    new keys costs O(k log k) plus an amortised share of the merges instead of rewriting every array."""

    def __init__(self) -> None:
        self.keys: np.ndarray | None = None  # (capacity,) in slot order; int64, or utf-8 bytes
        self.size = 0
        self._main: tuple[np.ndarray, np.ndarray] | None = None  # (sorted keys, their slots)
        self._recent: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else len(self.keys)

    @property
    def nbytes(self) -> int:
        parts = [self.keys, *(self._main or ()), *(self._recent or ())]
        return sum(part.nbytes for part in parts if part is not None)

    def find(self, encoded: np.ndarray) -> np.ndarray:
        """(n,) slot of each key, -1 where it is not in the index."""
        slots = np.full(len(encoded), -1, dtype=np.int64)
        for level in (self._main, self._recent):
            if level is None or not len(level[0]):
                continue
            keys, level_slots = level
            position = np.minimum(np.searchsorted(keys, encoded), len(keys) - 1)
            hit = (keys[position] == encoded) & (slots < 0)
            slots[hit] = level_slots[position[hit]]
        return slots

    def add(self, encoded: np.ndarray) -> np.ndarray:
        """(n,) slot of each key, new keys appended (their slots follow the existing ones)."""
        slots = self.find(encoded)
        missing = slots < 0
        if not missing.any():
            return slots
        new, inverse = np.unique(encoded[missing], return_inverse=True)
        new_slots = np.arange(self.size, self.size + len(new), dtype=np.int64)
        self._widen(new.dtype)
        if self.size + len(new) > self.capacity:
            grown = np.zeros(max(self.size + len(new), self.capacity * 3 // 2, 1024), dtype=new.dtype)
            if self.keys is not None:
                grown[: self.size] = self.keys[: self.size]
            self.keys = grown
        self.keys[self.size : self.size + len(new)] = new
        self.size += len(new)
        self._recent = _merge(self._recent, (new, new_slots))
        if len(self._recent[0]) > max(1024, self.size // 16):
            self._main, self._recent = _merge(self._main, self._recent), None
        slots[missing] = new_slots[inverse.reshape(-1)]
        return slots

    def _widen(self, dtype: np.dtype) -> None:
        """A longer string key: widen every key array (never truncate)."""
        if self.keys is None or dtype.itemsize <= self.keys.dtype.itemsize:
            return
        self.keys = self.keys.astype(dtype)
        self._main = None if self._main is None else (self._main[0].astype(dtype), self._main[1])
        self._recent = None if self._recent is None else (self._recent[0].astype(dtype), self._recent[1])

    def restore(self, keys: np.ndarray) -> None:
        """The index of ``keys`` (slot order), as saved."""
        self.keys, self.size, self._recent = keys.copy(), len(keys), None
        order = np.argsort(keys, kind="stable")
        self._main = (keys[order], order.astype(np.int64))


def _merge(
    into: tuple[np.ndarray, np.ndarray] | None, new: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (keys, slots) with the sorted, disjoint ``new`` ones inserted in order."""
    if into is None or not len(into[0]):
        return new
    at = np.searchsorted(into[0], new[0])
    return np.insert(into[0], at, new[0]), np.insert(into[1], at, new[1])


class PromptHistory:
    """Per-prompt visit counts, collapse counts, last pass rate and collapse streak.

    Keys are integers or strings, one kind per history (the first :meth:`record` fixes it). Each prompt
    has a slot (in the order prompts were first seen) in the columns; :class:`_KeyIndex` maps keys to
    slots.
    """

    def __init__(self) -> None:
        self._index = _KeyIndex()
        self._columns = {name: np.zeros(0, dtype=dtype) for name, dtype in COLUMNS.items()}

    def __len__(self) -> int:
        """Number of distinct prompts seen."""
        return self._index.size

    @property
    def key_kind(self) -> str | None:
        """``int``, ``str``, or None before the first record."""
        keys = self._index.keys
        if keys is None:
            return None
        return "int" if keys.dtype.kind == "i" else "str"

    @property
    def nbytes(self) -> int:
        """Bytes held by the keys, their index and the columns (allocated capacity included)."""
        return self._index.nbytes + sum(column.nbytes for column in self._columns.values())

    def _column(self, name: str) -> np.ndarray:
        """The seen prompts' values of one column, in slot order (a view)."""
        return self._columns[name][: self._index.size]

    # ---- keys -----------------------------------------------------------------------------------

    def _encode(self, keys: Any) -> np.ndarray:
        """(n,) keys as this history's key array dtype (int64, or utf-8 bytes)."""
        if isinstance(keys, torch.Tensor):
            keys = keys.detach().cpu().numpy()
        array = np.asarray(keys)
        if array.ndim != 1:
            array = array.reshape(-1)
        if array.size == 0:
            return np.zeros(0, dtype=self._index.keys.dtype if self._index.keys is not None else np.int64)
        if array.dtype.kind == "O":  # a list of Python objects: all ints or all strs
            if all(isinstance(key, (int, np.integer)) and not isinstance(key, bool) for key in array):
                array = array.astype(np.int64)
            elif all(isinstance(key, str) for key in array):
                array = array.astype(str)
        if array.dtype.kind in "iu":
            kind, encoded = "int", array.astype(np.int64)
        elif array.dtype.kind == "U":
            kind, encoded = "str", np.char.encode(array, "utf-8")
        elif array.dtype.kind == "S":
            kind, encoded = "str", array
        else:
            raise ValueError(
                f"prompt keys must be integers (a dataset index) or strings (verl_avspo.core.prompt_history."
                f"prompt_key of the prompt), got {array.dtype} values such as {array[0]!r}"
            )
        if self.key_kind is not None and kind != self.key_kind:
            raise ValueError(
                f"prompt keys are {kind}s but this run's prompt history is keyed by {self.key_kind}s: "
                "give every prompt the same kind of key throughout a run (a dataset index, or a hash of the prompt)"
            )
        return encoded

    # ---- update and read ------------------------------------------------------------------------

    def record(self, keys: Any, pass_rate: Any, all_correct: Any, all_wrong: Any, step: int) -> None:
        """Add one visit per entry: group g of this step had prompt ``keys[g]``, the share
        ``pass_rate[g]`` in [0, 1] of its reward range, and was all-correct / all-wrong (bool). A key
        repeated in one call counts as that many simultaneous visits: their order does not matter (a
        host's group order can be arbitrary, verl's follows its random uids), so the streak restarts if
        any of them was not collapsed, else grows by their number, and the last pass rate is their mean."""
        encoded = self._encode(keys)
        rate = np.asarray(_numpy(pass_rate), dtype=np.float32).reshape(-1)
        correct = np.asarray(_numpy(all_correct), dtype=bool).reshape(-1)
        wrong = np.asarray(_numpy(all_wrong), dtype=bool).reshape(-1)
        if not len(encoded) == len(rate) == len(correct) == len(wrong):
            raise ValueError(
                f"PromptHistory.record: {len(encoded)} keys, {len(rate)} pass rates, {len(correct)} all_correct and "
                f"{len(wrong)} all_wrong flags: give one of each per group"
            )
        if not len(encoded):
            return
        slots = self._index.add(encoded)
        if self._index.capacity > len(self._columns["visits"]):  # grown: new slots start at zero
            self._columns = {name: _grown(column, self._index.capacity) for name, column in self._columns.items()}
        unique, inverse, counts = np.unique(slots, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
        columns = self._columns
        columns["visits"][unique] += counts.astype(np.int32)
        columns["all_correct"][unique] += np.bincount(inverse, weights=correct, minlength=len(unique)).astype(np.int32)
        columns["all_wrong"][unique] += np.bincount(inverse, weights=wrong, minlength=len(unique)).astype(np.int32)
        columns["last_pass_rate"][unique] = np.bincount(inverse, weights=rate, minlength=len(unique)) / counts
        any_mixed = np.bincount(inverse, weights=~(correct | wrong), minlength=len(unique)) > 0
        streak = columns["collapse_streak"][unique]
        columns["collapse_streak"][unique] = np.where(any_mixed, 0, streak + counts)
        columns["last_step"][unique] = int(step)

    def lookup(self, keys: Any) -> PromptRecords:
        """The history of each of (n,) ``keys`` (unseen keys included, see :class:`PromptRecords`)."""
        slots = self._index.find(self._encode(keys))
        found = slots >= 0
        slot = np.where(found, slots, 0)
        values = {}
        for name, column in self._columns.items():
            fill = np.nan if name == "last_pass_rate" else (-1 if name == "last_step" else 0)
            picked = column[slot] if len(column) else np.zeros(len(slots), dtype=column.dtype)
            values[name] = np.where(found, picked, fill).astype(column.dtype)
        return PromptRecords(seen=found, **values)

    def class_codes(self) -> np.ndarray:
        """(num_prompts,) int8 index into :data:`PROMPT_CLASSES` of each seen prompt, in slot order."""
        visits = self._column("visits")
        codes = np.full(len(visits), 2, dtype=np.int8)
        codes[self._column("all_wrong") == visits] = 1
        codes[self._column("all_correct") == visits] = 0
        return codes

    def classes(self) -> PromptClasses:
        """Counts of the seen prompts by class."""
        counts = np.bincount(self.class_codes(), minlength=3)
        return PromptClasses(len(self), *(int(c) for c in counts))

    def table(self) -> dict[str, np.ndarray]:
        """Every seen prompt, in key order: ``key`` (int64, or str), the columns of :data:`COLUMNS`
        and ``class`` (str, :data:`PROMPT_CLASSES`). Ready for ``pandas.DataFrame(history.table())``."""
        keys = np.zeros(0, dtype=np.int64) if self._index.keys is None else self._index.keys[: len(self)]
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        if keys.dtype.kind == "S":
            keys = np.char.decode(keys, "utf-8")
        return {
            "key": keys,
            **{name: self._column(name)[order] for name in COLUMNS},
            "class": np.asarray(PROMPT_CLASSES)[self.class_codes()[order]],
        }

    # ---- the state a restart keeps ----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Tensors only (``torch.load(weights_only=True)`` reads it): the keys in slot order (int64, or a
        (n, width) uint8 tensor of utf-8 bytes) and one tensor per column."""
        kind = self.key_kind
        seen = None if kind is None else np.ascontiguousarray(self._index.keys[: len(self)])
        if kind is None:
            keys = torch.zeros(0, dtype=torch.int64)
        elif kind == "int":
            keys = torch.from_numpy(seen)
        else:
            keys = torch.from_numpy(seen.view(np.uint8).reshape(len(seen), seen.dtype.itemsize).copy())
        return {
            "key_kind": kind,
            "keys": keys,
            **{name: torch.from_numpy(self._column(name).copy()) for name in COLUMNS},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        kind = state["key_kind"]
        keys = state["keys"].numpy()
        self._index = _KeyIndex()
        if kind == "int":
            self._index.restore(keys.astype(np.int64))
        elif kind == "str":
            self._index.restore(np.ascontiguousarray(keys, dtype=np.uint8).view(f"S{keys.shape[1]}").reshape(-1))
        self._columns = {name: state[name].numpy().astype(dtype).copy() for name, dtype in COLUMNS.items()}


def _grown(column: np.ndarray, capacity: int) -> np.ndarray:
    grown = np.zeros(capacity, dtype=column.dtype)
    grown[: len(column)] = column
    return grown


def _numpy(values: Any) -> Any:
    return values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else values
