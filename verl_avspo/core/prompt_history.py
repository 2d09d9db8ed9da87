"""Per-prompt collapse history across a run (docs/prompts.md). Framework-free: numpy and torch.

A *prompt key* is a prompt's stable identity across steps: an integer (verl's ``extra_info.index``,
the sandbox's problem number) or a string (:func:`prompt_key`, a hash of the prompt for hosts
without a dataset index). :class:`PromptHistory` keeps, per key, how often the prompt was visited,
on how many visits its group was all-correct or all-wrong, its last pass rate, its collapse streak
(consecutive collapsed visits ending at the latest) and the last step it was seen.

Memory is bounded: one sorted key array and six dense columns, about 36 bytes per integer-keyed
prompt (68 per hashed one), no Python object per prompt (benchmarks/bench_prompt_history.py
measures 1M prompts). Look-ups and updates are ``np.searchsorted`` over the sorted keys, vectorised
over the batch's groups.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["PROMPT_CLASSES", "COLUMNS", "PromptRecords", "PromptClasses", "PromptHistory", "prompt_key"]

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
    prompt gives the same key in every process and release; it equals the key DCPO's
    ``prompt_key=raw_prompt`` has always stored, so a saved DCPO history keeps matching."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        value = value.tolist()
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


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


class PromptHistory:
    """Per-prompt visit counts, collapse counts, last pass rate and collapse streak.

    Keys are integers or strings, one kind per history (the first :meth:`record` fixes it).
    """

    def __init__(self) -> None:
        self._keys: np.ndarray | None = None  # sorted; int64, or bytes (utf-8) for string keys
        self._columns = {name: np.zeros(0, dtype=dtype) for name, dtype in COLUMNS.items()}

    def __len__(self) -> int:
        """Number of distinct prompts seen."""
        return 0 if self._keys is None else len(self._keys)

    @property
    def key_kind(self) -> str | None:
        """``int``, ``str``, or None before the first record."""
        if self._keys is None:
            return None
        return "int" if self._keys.dtype.kind == "i" else "str"

    @property
    def nbytes(self) -> int:
        """Bytes held by the key array and the columns."""
        keys = 0 if self._keys is None else self._keys.nbytes
        return keys + sum(column.nbytes for column in self._columns.values())

    # ---- keys -----------------------------------------------------------------------------------

    def _encode(self, keys: Any) -> np.ndarray:
        """(n,) keys as this history's key array dtype (int64, or utf-8 bytes)."""
        if isinstance(keys, torch.Tensor):
            keys = keys.detach().cpu().numpy()
        array = np.asarray(keys)
        if array.ndim != 1:
            array = array.reshape(-1)
        if array.size == 0:
            return np.zeros(0, dtype=self._keys.dtype if self._keys is not None else np.int64)
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

    def _positions(self, encoded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(n,) position of each key in the sorted keys (where it is or would go) and (n,) found."""
        if self._keys is None or not len(self._keys):
            return np.zeros(len(encoded), dtype=np.int64), np.zeros(len(encoded), dtype=bool)
        position = np.searchsorted(self._keys, encoded)
        found = self._keys[np.minimum(position, len(self._keys) - 1)] == encoded
        return position, found & (position < len(self._keys))

    def _insert(self, encoded: np.ndarray) -> np.ndarray:
        """Slots of ``encoded``, inserting the new keys (zeroed rows) in sorted order."""
        position, found = self._positions(encoded)
        if found.all():
            return position
        new = np.unique(encoded[~found])
        if self._keys is None:
            self._keys = new
        else:
            if new.dtype.itemsize > self._keys.dtype.itemsize:  # a longer string key: widen, never truncate
                self._keys = self._keys.astype(new.dtype)
            at = np.searchsorted(self._keys, new)
            self._keys = np.insert(self._keys, at, new)
            self._columns = {name: np.insert(column, at, 0) for name, column in self._columns.items()}
        if len(self._columns["visits"]) < len(self._keys):  # the first insert
            self._columns = {name: np.zeros(len(self._keys), dtype=dtype) for name, dtype in COLUMNS.items()}
        return np.searchsorted(self._keys, encoded)

    # ---- update and read ------------------------------------------------------------------------

    def record(self, keys: Any, pass_rate: Any, all_correct: Any, all_wrong: Any, step: int) -> None:
        """Add one visit per entry: group g of this step had prompt ``keys[g]``, the share
        ``pass_rate[g]`` in [0, 1] of its reward range, and was all-correct / all-wrong (bool). A key
        repeated in one call counts as that many visits, in the order given."""
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
        slots = self._insert(encoded)
        unique, inverse, counts = np.unique(slots, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
        columns = self._columns
        columns["visits"][unique] += counts.astype(np.int32)
        columns["all_correct"][unique] += np.bincount(inverse, weights=correct, minlength=len(unique)).astype(np.int32)
        columns["all_wrong"][unique] += np.bincount(inverse, weights=wrong, minlength=len(unique)).astype(np.int32)
        # Each prompt's last visit of the call, and the rank of every entry among its prompt's visits.
        order = np.argsort(inverse, kind="stable")
        ends = np.cumsum(counts)
        columns["last_pass_rate"][unique] = rate[order[ends - 1]]
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order)) - np.repeat(ends - counts, counts)
        # The streak restarts after the prompt's last non-collapsed visit of the call, else grows.
        last_mixed = np.full(len(unique), -1, dtype=np.int64)
        mixed = ~(correct | wrong)
        np.maximum.at(last_mixed, inverse[mixed], rank[mixed])
        streak = columns["collapse_streak"][unique]
        columns["collapse_streak"][unique] = np.where(last_mixed < 0, streak + counts, counts - 1 - last_mixed)
        columns["last_step"][unique] = int(step)

    def lookup(self, keys: Any) -> PromptRecords:
        """The history of each of (n,) ``keys`` (unseen keys included, see :class:`PromptRecords`)."""
        encoded = self._encode(keys)
        position, found = self._positions(encoded)
        slot = np.where(found, position, 0)
        values = {}
        for name, column in self._columns.items():
            fill = np.nan if name == "last_pass_rate" else (-1 if name == "last_step" else 0)
            picked = column[slot] if len(column) else np.zeros(len(encoded), dtype=column.dtype)
            values[name] = np.where(found, picked, fill).astype(column.dtype)
        return PromptRecords(seen=found, **values)

    def class_codes(self) -> np.ndarray:
        """(num_prompts,) int8 index into :data:`PROMPT_CLASSES` of each seen prompt, in key order."""
        visits = self._columns["visits"]
        codes = np.full(len(visits), 2, dtype=np.int8)
        codes[self._columns["all_wrong"] == visits] = 1
        codes[self._columns["all_correct"] == visits] = 0
        return codes

    def classes(self) -> PromptClasses:
        """Counts of the seen prompts by class."""
        counts = np.bincount(self.class_codes(), minlength=3)
        return PromptClasses(len(self), *(int(c) for c in counts))

    def table(self) -> dict[str, np.ndarray]:
        """Every seen prompt, in key order: ``key`` (int64, or str), the columns of :data:`COLUMNS`
        and ``class`` (str, :data:`PROMPT_CLASSES`). Ready for ``pandas.DataFrame(history.table())``."""
        keys = np.zeros(0, dtype=np.int64) if self._keys is None else self._keys
        if keys.dtype.kind == "S":
            keys = np.char.decode(keys, "utf-8")
        return {
            "key": keys,
            **{name: column.copy() for name, column in self._columns.items()},
            "class": np.asarray(PROMPT_CLASSES)[self.class_codes()],
        }

    # ---- the state a restart keeps ----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Tensors only (``torch.load(weights_only=True)`` reads it): the keys (int64, or a (n, width)
        uint8 tensor of utf-8 bytes) and one tensor per column."""
        if self._keys is None:
            keys, kind = torch.zeros(0, dtype=torch.int64), None
        elif self.key_kind == "int":
            keys, kind = torch.from_numpy(self._keys.copy()), "int"
        else:
            width = self._keys.dtype.itemsize
            keys = torch.from_numpy(self._keys.view(np.uint8).reshape(len(self._keys), width).copy())
            kind = "str"
        return {
            "key_kind": kind,
            "keys": keys,
            **{name: torch.from_numpy(column.copy()) for name, column in self._columns.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        kind = state["key_kind"]
        keys = state["keys"].numpy()
        if kind is None:
            self._keys = None
        elif kind == "int":
            self._keys = keys.astype(np.int64)
        else:
            width = keys.shape[1]
            self._keys = np.ascontiguousarray(keys, dtype=np.uint8).view(f"S{width}").reshape(-1)
        self._columns = {name: state[name].numpy().astype(dtype).copy() for name, dtype in COLUMNS.items()}


def _numpy(values: Any) -> Any:
    return values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else values
