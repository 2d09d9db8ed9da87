"""Sampling a step's groups in the sandbox: ``prompts_per_step`` prompts x G answers, scored
(:func:`sample_groups`), from the pools or a fixed set in epochs (:class:`TrainingEpochs`), the
prompts the pre-rollout skip rule keeps (:func:`draw_kept`), DAPO's
dynamic sampling with verl's semantics (:func:`dynamic_sampling`), and groups of unequal size from the
rollout allocator (:func:`allocated_groups`). The loop that trains on them is
:mod:`verl_avspo.sandbox.loop`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from verl_avspo.core.collapse import detect_collapse, group_stats
from verl_avspo.core.prompt_allocation import pilots_spread
from verl_avspo.core.prompt_refill import skip_and_refill
from verl_avspo.core.run_tracker import RunTracker
from verl_avspo.sandbox.config import SandboxConfig
from verl_avspo.sandbox.policy import CharTokenizer, Rollout, pad_cat, response_logits, sample
from verl_avspo.sandbox.task import ArithmeticTask, Problems, exact_match

__all__ = [
    "SampledGroups",
    "TrainingEpochs",
    "sample_groups",
    "allocated_groups",
    "draw_kept",
    "dynamic_sampling",
    "collapsed_groups",
    "group_sizes",
]

Batch = TypeVar("Batch")


def collapsed_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """(n,) scores of consecutive groups of ``group_size`` -> (n // group_size,) bool: all equal."""
    ids = torch.arange(len(scores)) // group_size
    return detect_collapse(group_stats(scores, ids, len(scores) // group_size)).collapsed


def group_sizes(uids: np.ndarray) -> torch.Tensor:
    """(P,) the number of rows of each group of a batch whose groups are runs of equal ``uids``, in order."""
    starts = np.flatnonzero(np.r_[True, uids[1:] != uids[:-1]]) if len(uids) else np.zeros(0, dtype=np.int64)
    return torch.from_numpy(np.diff(np.r_[starts, len(uids)]))


def dynamic_sampling(
    draw: Callable[[int], Batch], group_size: int, wanted: int, max_gen_batches: int
) -> tuple[list[Batch], list[torch.Tensor]]:
    """DAPO's dynamic sampling with verl's semantics (``algorithm.filter_groups``,
    ``max_num_gen_batches``): draw batches (``draw(b)`` for b = 0, 1, ...; each has ``scores``
    (n,) in consecutive groups of ``group_size``) and keep their non-collapsed groups, until
    ``wanted`` groups are kept or ``max_gen_batches`` batches were drawn.

    Returns every batch drawn and, per batch, the indices (k_b,) of the groups to train on: the
    first ``wanted`` non-collapsed groups in generation order (verl's ``batch[:traj_bsz]``; the rest
    of the last batch is generated and discarded). At the cap, fewer than ``wanted`` (verl's DAPO
    trainer raises there; the sandbox trains on what it has).
    """
    if wanted < 1 or max_gen_batches < 1:
        raise ValueError(
            f"dynamic_sampling: wanted={wanted}, max_gen_batches={max_gen_batches}: both must be at least 1"
        )
    batches, picks, kept = [], [], 0
    while kept < wanted and len(batches) < max_gen_batches:
        batch = draw(len(batches))
        informative = (~collapsed_groups(batch.scores, group_size)).nonzero().squeeze(1)
        picks.append(informative[: wanted - kept])
        batches.append(batch)
        kept += picks[-1].numel()
    return batches, picks


@dataclass(frozen=True)
class SampledGroups:
    """Groups of answers, each group's rows together: ``prompts`` (P,) one per group; ``rollout``,
    ``scores`` (n,) exact-match rewards, ``uids`` (n,) and ``logits`` (n, R, V), the sampling policy's
    temperature-scaled logits, without gradients. n = P*G, or the sum of the group sizes with the
    rollout allocator."""

    prompts: list[str]
    rollout: Rollout
    scores: torch.Tensor
    uids: np.ndarray
    logits: torch.Tensor

    def select_groups(self, groups: torch.Tensor) -> SampledGroups:
        """The groups of indices ``groups``, of a batch of groups of equal size."""
        size = len(self.scores) // len(self.prompts)
        rows = (groups.unsqueeze(1) * size + torch.arange(size)).reshape(-1)
        return self.select_rows(rows, [self.prompts[g] for g in groups.tolist()])

    def select_rows(self, rows: torch.Tensor, prompts: list[str]) -> SampledGroups:
        """The rows ``rows`` (whole groups, each group's rows together), whose groups are ``prompts``."""
        return SampledGroups(
            prompts, self.rollout.select(rows), self.scores[rows], self.uids[rows.numpy()], self.logits[rows]
        )

    @staticmethod
    def concat(parts: list[SampledGroups], pad_id: int) -> SampledGroups:
        return SampledGroups(
            [prompt for part in parts for prompt in part.prompts],
            Rollout.concat([part.rollout for part in parts], pad_id),
            torch.cat([part.scores for part in parts]),
            np.concatenate([part.uids for part in parts]),
            pad_cat([part.logits for part in parts], 0.0),
        )


def draw_kept(
    draw: Callable[[], Problems],
    keep: Callable[[list[str], int, bool], np.ndarray],
    wanted: int,
    max_draws: int,
    fill: int | None = None,
):
    """The pre-rollout skip rule's prompts, by the core's skip-and-refill loop (``core.prompt_refill``):
    draw candidate batches (``draw()``) and keep those ``keep(prompts, at_least, refill)`` selects, until
    ``fill`` (default ``wanted``) are kept; the last of ``max_draws`` draws keeps at least what is still
    missing, so a step rolls out ``fill`` prompts (when each draw has that many). DAPO's dynamic sampling
    tops a step up with further generation batches, so it fills one place and leaves the others open (a
    saving). Returns the kept problems, at most ``wanted``, in draw order."""
    picked = skip_and_refill(
        draw(),
        lambda candidates: candidates.prompts,
        keep,
        lambda _missing: draw(),
        wanted,
        fill=fill,
        forced=lambda number, _candidates: number >= max_draws - 1,
    )
    return Problems.concat([candidates.select(torch.from_numpy(chosen)) for candidates, chosen in picked.chunks])


class TrainingEpochs:
    """The epochs mode's prompts (``SandboxConfig.train_set``): a fixed training set drawn once from
    ``task`` (:meth:`ArithmeticTask.training_set`), then handed out in epochs, each a fresh
    permutation of the set without replacement. Every draw (a step's, a refill's, DAPO's next batch)
    takes the prompts next in line, as verl's dataloader hands out its batches; a draw that runs past
    the end of an epoch goes on into the next (verl drops an epoch's incomplete last batch instead: the
    two agree when the set is a multiple of the draws' size). It stands in for the task where
    :func:`sample_groups` draws."""

    def __init__(self, task: ArithmeticTask, size: int, generator: torch.Generator):
        self.problems = task.training_set(size, generator)
        self.max_answer_chars = task.max_answer_chars
        self.epoch = 0  # epochs begun so far
        self._order = torch.empty(0, dtype=torch.long)

    def sample(self, num_prompts: int, generator: torch.Generator) -> Problems:
        """The next ``num_prompts`` prompts of the current epoch, beginning new ones as needed."""
        while len(self._order) < num_prompts:
            permutation = torch.randperm(len(self.problems.prompts), generator=generator)
            self._order = torch.cat([self._order, permutation])
            self.epoch += 1
        rows, self._order = self._order[:num_prompts], self._order[num_prompts:]
        return self.problems.select(rows)


def sample_groups(
    model,
    tokenizer: CharTokenizer,
    task: ArithmeticTask | TrainingEpochs,
    config: SandboxConfig,
    rngs: tuple[torch.Generator, torch.Generator],
    tag: str,
    keep: Callable[[list[str], int, bool], np.ndarray] | None = None,
    fill: int | None = None,
) -> SampledGroups:
    """``prompts_per_step`` prompts x G answers at the sampling temperature, scored; the answers of
    one prompt share the uid ``<tag>-<prompt index>``. ``rngs``: the prompts' generator and the
    tokens'. The prompts come from ``task``'s pools, or its epochs (:class:`TrainingEpochs`). With
    ``keep`` (the skip rule), the prompts are the candidates it keeps, at least ``fill`` of them
    (:func:`draw_kept`)."""
    prompt_rng, token_rng = rngs
    if keep is None:
        problems = task.sample(config.prompts_per_step, prompt_rng)
    else:
        problems = draw_kept(
            lambda: task.sample(config.prompts_per_step, prompt_rng),
            keep,
            config.prompts_per_step,
            config.max_gen_batches,
            fill,
        )
    counts = torch.full((len(problems.prompts),), config.group_size)
    return _answers(model, tokenizer, problems, counts, tag, token_rng, config, task.max_answer_chars)


def _answers(
    model,
    tokenizer: CharTokenizer,
    problems: Problems,
    counts: torch.Tensor,
    tag: str,
    token_rng: torch.Generator,
    config: SandboxConfig,
    max_answer_chars: int,
) -> SampledGroups:
    """``counts[i]`` answers to problem i at the sampling temperature, scored, with the uid ``<tag>-<i>``;
    the problems with no answer are left out."""
    repeats = counts.tolist()
    prompts = [p for p, r in zip(problems.prompts, repeats, strict=True) for _ in range(r)]
    answers = [a for a, r in zip(problems.answers, repeats, strict=True) for _ in range(r)]
    uids = np.array([f"{tag}-{i}" for i, r in enumerate(repeats) for _ in range(r)], dtype=object)
    model.eval()
    rollout = sample(model, tokenizer, prompts, max_answer_chars + 1, token_rng, config.temperature)
    scores = exact_match(tokenizer.decode_responses(rollout.response_ids, rollout.response_mask), answers)
    with torch.no_grad():
        logits = response_logits(model, rollout, config.temperature)
    groups = [p for p, r in zip(problems.prompts, repeats, strict=True) if r]
    return SampledGroups(groups, rollout, scores, uids, logits)


def allocated_groups(
    model,
    tokenizer: CharTokenizer,
    task: ArithmeticTask | TrainingEpochs,
    config: SandboxConfig,
    rngs: tuple[torch.Generator, torch.Generator],
    tag: str,
    tracker: RunTracker,
) -> tuple[list[SampledGroups], SampledGroups, list[str], torch.Tensor]:
    """A step of the rollout allocator (``core.prompt_allocation``, through ``tracker``): ``prompts_per_step``
    candidates, each given the rollouts the allocator plans (0, a pilot, G or more), then the rest of the
    group for each pilot whose answers differ. Returns the generation passes (one or two), the groups to
    train on (each group's rows together, in candidate order: an extended pilot's first answers, then the
    rest), and the dropped pilots, collapsed, as their prompts and (k, pilot size) scores."""
    prompt_rng, token_rng = rngs
    problems = task.sample(config.prompts_per_step, prompt_rng)
    plan = tracker.allocate_prompts(problems.prompts, config.group_size)
    first = _answers(model, tokenizer, problems, plan.rollouts, tag, token_rng, config, task.max_answer_chars)
    # Each first-pass row's candidate; a pilot spreads unless it collapsed, by the test ACR counts with.
    candidate = torch.repeat_interleave(torch.arange(len(problems.prompts)), plan.rollouts)
    spread = pilots_spread(first.scores, candidate, len(problems.prompts), tracker.acr.tau, tracker.acr.reward_range)
    added = tracker.extend_pilots(plan, spread)
    passes = [first]
    if added.any():
        passes.append(_answers(model, tokenizer, problems, added, tag, token_rng, config, task.max_answer_chars))
        candidate = torch.cat([candidate, torch.repeat_interleave(torch.arange(len(problems.prompts)), added)])
    every = SampledGroups.concat(passes, tokenizer.pad_id)
    dropped = plan.pilot & ~spread
    trained = ~dropped & (plan.rollouts > 0)
    rows = torch.nonzero(trained[candidate]).squeeze(1)
    rows = rows[torch.argsort(candidate[rows], stable=True)]  # each group's rows together, first pass first
    batch = every.select_rows(rows, [p for p, t in zip(problems.prompts, trained.tolist(), strict=True) if t])
    pilot_rows = torch.nonzero(dropped[candidate[: len(first.scores)]]).squeeze(1)
    dropped_scores = first.scores[pilot_rows].view(-1, tracker.allocator.config.pilot_size)
    return passes, batch, [p for p, d in zip(problems.prompts, dropped.tolist(), strict=True) if d], dropped_scores
