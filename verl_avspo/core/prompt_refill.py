"""The skip-and-refill loop: how every host fills a batch's places with the prompts the skip rule keeps
(``core.prompt_skip``). Framework-free.

A host hands :func:`skip_and_refill` its first chunk of candidate prompts, a way to draw more, and its
policies: how many places it must fill (all of them, except where a later generation batch tops up only
if needed: DAPO), and when the rule must keep what is still missing (verl's epoch guard, the sandbox's
draw cap, TRL's pass over the dataset). Every draw goes through ``RunTracker.select_prompts`` with
whether it refills earlier places, so the step's counts are exact: a skipped prompt whose place a later
draw filled is a re-selection (``prompts/reselected``), a place left empty saves its rollouts
(``prompts/rollouts_skipped``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

__all__ = ["Picked", "skip_and_refill"]

Chunk = TypeVar("Chunk")


@dataclass
class Picked(Generic[Chunk]):
    """What :func:`skip_and_refill` chose: each chunk drawn, in order, with the positions (k,) of its
    candidates that fill places (the first ``wanted`` kept, in draw order), and the places left open."""

    chunks: list[tuple[Chunk, np.ndarray]]
    open_places: int

    @property
    def count(self) -> int:
        return sum(len(chosen) for _, chosen in self.chunks)


def skip_and_refill(
    first: Chunk,
    keys: Callable[[Chunk], Sequence[Any]],
    select: Callable[[Sequence[Any], int, bool], np.ndarray],
    draw: Callable[[int], Chunk | None],
    wanted: int,
    *,
    fill: int | None = None,
    refill: bool = False,
    forced: Callable[[int, Chunk], bool] | None = None,
) -> Picked[Chunk]:
    """Fill ``wanted`` places with the candidates the skip rule keeps.

    Args:
        first: the first chunk of candidates (a host's batch).
        keys: a chunk's prompt keys, one per candidate.
        select: ``RunTracker.select_prompts`` with the group size bound: ``(keys, at_least, refill) -> keep``.
        draw: further candidates for the places still open (their number is the argument), or None when
            the host has none (its data ran out): the places stay open.
        wanted: the places.
        fill: how many places must be filled before the loop stops (default: all). A host whose later
            generation batches top up only if needed (DAPO's dynamic sampling) fills fewer: its other
            places stay open, and skipping saves their rollouts instead of replacing them.
        refill: the places are ones an earlier call left open (a host's top-up): the first chunk fills them.
        forced: ``forced(number, chunk)`` for draw ``number`` (0: ``first``): the rule must keep what is still
            missing of ``fill`` (a host's guard against a rule that skips its every prompt).
    """
    fill = wanted if fill is None else min(fill, wanted)
    chunks: list[tuple[Chunk, np.ndarray]] = []
    count, chunk, number = 0, first, 0
    while True:
        at_least = fill - count if forced is not None and forced(number, chunk) else 0
        keep = select(list(keys(chunk)), at_least, refill or number > 0)
        chosen = np.flatnonzero(keep)[: wanted - count]
        chunks.append((chunk, chosen))
        count += len(chosen)
        if count >= fill:
            break
        chunk, number = draw(wanted - count), number + 1
        if chunk is None:
            break
    return Picked(chunks, wanted - count)
