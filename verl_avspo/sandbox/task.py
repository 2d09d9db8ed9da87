"""The sandbox task: synthetic arithmetic with difficulty levels and an exact-match verifier.

A *level* is written ``"<digits><op><digits>"``: ``"1+1"`` adds two 1-digit numbers, ``"2*1"``
multiplies a 2-digit number by a 1-digit one. Each level's problem space is enumerated, shuffled
with a fixed seed and split once into three disjoint parts: a held-out evaluation set, a warm-up
pool (the supervised warm-up's problems) and the RL training pool, so no evaluation problem is ever
trained on and the RL prompts are new to the warmed-up policy, as a pretrained LLM's RL prompts are.
A prompt is ``"12+34="`` and the expected response is ``"46"`` followed by end-of-sequence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

__all__ = [
    "Level",
    "Problems",
    "ArithmeticTask",
    "parse_levels",
    "training_pool_size",
    "check_warm_up_share",
    "level_shares",
    "check_training_set",
    "exact_match",
]

_LEVEL = re.compile(r"^([1-9])([+*])([1-9])$")
_SPLIT_SEED = 1234  # fixed: the train/eval split must not depend on the run's seed
# Every problem of a level is enumerated (for the split), so its count bounds memory: 4+3 has
# 8.1 million, 4+4 already 81 million.
MAX_PROBLEMS_PER_LEVEL = 10**7


@dataclass(frozen=True)
class Level:
    """One difficulty level: ``op`` applied to a ``left``-digit and a ``right``-digit number."""

    left: int
    op: str
    right: int

    @property
    def name(self) -> str:
        return f"{self.left}{self.op}{self.right}"

    @property
    def num_problems(self) -> int:
        return _numbers_with_digits(self.left).numel() * _numbers_with_digits(self.right).numel()

    def operands(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every (a, b) pair of this level, as two (num_problems,) int64 tensors."""
        a = _numbers_with_digits(self.left)
        b = _numbers_with_digits(self.right)
        return a.repeat_interleave(b.numel()), b.repeat(a.numel())

    def answer(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b if self.op == "+" else a * b


def _numbers_with_digits(digits: int) -> torch.Tensor:
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return torch.arange(low, 10**digits)


def held_out_size(level: Level, eval_size: int) -> int:
    """How many of ``level``'s problems are held out for evaluation: ``eval_size``, at most a fifth of the level."""
    return min(eval_size, level.num_problems // 5)


def warm_up_pool_size(level: Level, eval_size: int, warm_up_share: float) -> int:
    """How many of ``level``'s problems the supervised warm-up draws from: ``warm_up_share`` of those not
    held out, rounded down."""
    return int(warm_up_share * (level.num_problems - held_out_size(level, eval_size)))


def training_pool_size(level: Level, eval_size: int, warm_up_share: float) -> int:
    """How many of ``level``'s problems are left for RL training once ``eval_size`` are held out (at
    most a fifth of the level) and ``warm_up_share`` of the rest is kept for the warm-up (:class:`ArithmeticTask`)."""
    return level.num_problems - held_out_size(level, eval_size) - warm_up_pool_size(level, eval_size, warm_up_share)


def check_warm_up_share(warm_up_share: float) -> None:
    """Raise ValueError unless 0 < ``warm_up_share`` < 1: both the warm-up and RL need problems of their own."""
    if not 0 < warm_up_share < 1:
        raise ValueError(
            f"warm_up_share={warm_up_share} is invalid: the share of each level's non-held-out problems kept for the "
            "supervised warm-up must lie strictly between 0 and 1 (the rest is the RL training pool), e.g. 0.5"
        )


def level_shares(size: int, pools: list[int]) -> list[int]:
    """``size`` prompts split over levels whose training pools hold ``pools`` problems: as evenly as
    integers allow (the first levels take the remainder), except that a level gives at most its whole
    pool and the others share what it cannot give. How a fixed training set is drawn over levels: a
    small level (``1+1`` keeps 40 problems for RL) does not cap the set at 40 per level.

    Raises ValueError when ``size`` exceeds the pools' total (:func:`check_training_set` names the fix).
    """
    if size > sum(pools):
        raise ValueError(f"{size} prompts exceed the training pools' {sum(pools)} problems")
    shares = list(pools)  # levels whose pool is at most an even share give it whole
    left, rest = size, list(range(len(pools)))
    while full := [index for index in rest if pools[index] <= left // len(rest)]:
        left -= sum(pools[index] for index in full)
        rest = [index for index in rest if index not in full]
    for rank, index in enumerate(rest):  # the others hold more than an even share of what is left
        shares[index] = left // len(rest) + (rank < left % len(rest))
    return shares


def check_training_set(levels: tuple[Level, ...], size: int, eval_size: int, warm_up_share: float) -> None:
    """Raise ValueError when the levels' training pools together hold fewer than ``size`` problems (a
    fixed training set draws :func:`level_shares` of them)."""
    pools = [training_pool_size(level, eval_size, warm_up_share) for level in levels]
    if size > sum(pools):
        names = ",".join(level.name for level in levels)
        held = ", ".join(f"{level.name} {pool}" for level, pool in zip(levels, pools, strict=True))
        raise ValueError(
            f"train_set={size} is too large for levels={names}: their training pools hold {sum(pools)} problems "
            f"({held}); use at most {sum(pools)}, a smaller warm_up_share, or larger levels"
        )


def parse_levels(spec: str) -> tuple[Level, ...]:
    """``"1+1,2+2,2*1"`` -> levels. Raises ValueError naming the bad entry."""
    levels = []
    for item in (part.strip() for part in spec.split(",")):
        match = _LEVEL.match(item)
        if not match:
            raise ValueError(
                f"level {item!r} is invalid: write <digits><op><digits> with op + or * and 1-9 digits, "
                "for example --levels 1+1,2+2,2*1"
            )
        level = Level(int(match[1]), match[2], int(match[3]))
        if level.num_problems > MAX_PROBLEMS_PER_LEVEL:
            raise ValueError(
                f"level {item!r} has {level.num_problems:,} problems, more than the sandbox enumerates "
                f"({MAX_PROBLEMS_PER_LEVEL:,}): use fewer digits, for example 3+3 or 4*3"
            )
        levels.append(level)
    if len({level.name for level in levels}) != len(levels):
        raise ValueError(f"--levels {spec!r} names a level twice; list each level once")
    return tuple(levels)


@dataclass(frozen=True)
class Problems:
    """A batch of problems: ``prompts`` and ``answers`` are strings, ``level`` (n,) int64 holds the
    index of each problem's level. A problem's prompt text is its stable identity across steps (its
    prompt key: the levels' problems are distinct strings)."""

    prompts: list[str]
    answers: list[str]
    level: torch.Tensor

    def select(self, rows: torch.Tensor) -> Problems:
        """The problems at (k,) ``rows`` (bool mask or indices), in order."""
        rows = rows.nonzero().squeeze(1) if rows.dtype == torch.bool else rows
        picked = rows.tolist()
        return Problems([self.prompts[r] for r in picked], [self.answers[r] for r in picked], self.level[rows])

    @staticmethod
    def concat(parts: list[Problems]) -> Problems:
        return Problems(
            [p for part in parts for p in part.prompts],
            [a for part in parts for a in part.answers],
            torch.cat([part.level for part in parts]),
        )


def _render(level: Level, a: torch.Tensor, b: torch.Tensor) -> tuple[list[str], list[str]]:
    answers = level.answer(a, b).tolist()
    prompts = [f"{x}{level.op}{y}=" for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    return prompts, [str(v) for v in answers]


class ArithmeticTask:
    """Held-out evaluation sets, warm-up pools and RL training pools for a tuple of levels, disjoint.

    Args:
        levels: the difficulty levels; training prompts are drawn uniformly over levels.
        eval_size: held-out problems per level (at most a fifth of a level's problem space, so
            the training pools keep most of a small level).
        warm_up_share: the share of each level's other problems kept for the supervised warm-up
            (:meth:`sample_warm_up`); RL trains on the rest (:meth:`sample`, :meth:`training_set`).
    """

    def __init__(self, levels: tuple[Level, ...], eval_size: int, warm_up_share: float = 0.5):
        if eval_size < 1:
            raise ValueError(f"eval_size={eval_size} is invalid: need at least 1 held-out problem per level")
        check_warm_up_share(warm_up_share)
        self.levels = levels
        self.eval_size = eval_size
        self.warm_up_share = warm_up_share
        split = torch.Generator().manual_seed(_SPLIT_SEED)
        self._train: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._warm_up: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._eval: list[Problems] = []
        for index, level in enumerate(levels):
            a, b = level.operands()
            order = torch.randperm(a.numel(), generator=split)
            held_out = held_out_size(level, eval_size)
            warm_up = held_out + warm_up_pool_size(level, eval_size, warm_up_share)
            test, warm, train = order[:held_out], order[held_out:warm_up], order[warm_up:]
            self._train.append((a[train], b[train]))
            self._warm_up.append((a[warm], b[warm]))
            prompts, answers = _render(level, a[test], b[test])
            self._eval.append(Problems(prompts, answers, torch.full((held_out,), index)))

    @property
    def max_answer_chars(self) -> int:
        """Characters in the longest answer of any level."""
        return max(len(str(int(level.answer(*level.operands()).max()))) for level in self.levels)

    def eval_set(self, level_index: int) -> Problems:
        return self._eval[level_index]

    def sample(self, num_prompts: int, generator: torch.Generator) -> Problems:
        """``num_prompts`` RL training problems, each from a uniformly drawn level."""
        return self._draw(self._train, num_prompts, generator)

    def sample_warm_up(self, num_prompts: int, generator: torch.Generator) -> Problems:
        """``num_prompts`` problems of the warm-up pools, each from a uniformly drawn level."""
        return self._draw(self._warm_up, num_prompts, generator)

    def _draw(self, pools: list[tuple[torch.Tensor, torch.Tensor]], num_prompts: int, generator) -> Problems:
        level = torch.randint(len(self.levels), (num_prompts,), generator=generator)
        prompts, answers = [""] * num_prompts, [""] * num_prompts
        for index, (a, b) in enumerate(pools):
            rows = (level == index).nonzero().squeeze(1)
            pick = torch.randint(a.numel(), (rows.numel(),), generator=generator)
            level_prompts, level_answers = _render(self.levels[index], a[pick], b[pick])
            for row, prompt, answer in zip(rows.tolist(), level_prompts, level_answers, strict=True):
                prompts[row], answers[row] = prompt, answer
        return Problems(prompts, answers, level)

    def training_set(self, size: int, generator: torch.Generator) -> Problems:
        """A fixed training set of ``size`` distinct problems, drawn without replacement from the
        training pools, :func:`level_shares` of it from each level, in level order
        (:func:`check_training_set`)."""
        check_training_set(self.levels, size, self.eval_size, self.warm_up_share)
        shares = level_shares(size, [a.numel() for a, _ in self._train])
        parts = []
        for index, ((a, b), share) in enumerate(zip(self._train, shares, strict=True)):
            pick = torch.randperm(a.numel(), generator=generator)[:share]
            prompts, answers = _render(self.levels[index], a[pick], b[pick])
            parts.append(Problems(prompts, answers, torch.full((share,), index)))
        return Problems.concat(parts)


def exact_match(responses: list[str], answers: list[str]) -> torch.Tensor:
    """The verifier: reward 1.0 iff the decoded response equals the answer exactly, else 0.0.
    Returns (n,) float32."""
    return torch.tensor([float(r == a) for r, a in zip(responses, answers, strict=True)])
