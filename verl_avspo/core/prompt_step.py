"""One step's prompts, between the host's batches and the per-prompt history (``core.run_tracker``).
Framework-free.

:class:`StepPrompts` collects the keyed groups of a step's batches (and the groups a filter dropped)
and the skip rule's counts; at the end of the step :meth:`StepPrompts.close` records them in the
:class:`~verl_avspo.core.prompt_history.PromptHistory`, adapts the skip rule and returns ``prompts/*``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from verl_avspo.core.acr_config import ACRConfig
from verl_avspo.core.collapse import Collapse, GroupStats, Measurement
from verl_avspo.core.prompt_allocation import Allocation
from verl_avspo.core.prompt_history import PromptHistory
from verl_avspo.core.prompt_skip import PromptSkipper

__all__ = ["StepPrompts", "group_keys"]

logger = logging.getLogger(__name__)


class StepPrompts:
    """One step's keyed groups (per batch, in order), skip counts and generated rollouts, until the step closes.

    Of the candidates the skip rule turned down (``prompts/skipped``), those whose place the host filled with
    a further draw are re-selections (``prompts/reselected``): the step still rolls out as many prompts. Only
    the places left empty save rollouts (``prompts/rollouts_skipped``), so the saving never exceeds what the
    step's batches could have rolled out."""

    def __init__(self) -> None:
        self.keys: list[np.ndarray] = []
        self.pass_rate: list[np.ndarray] = []
        self.all_correct: list[np.ndarray] = []
        self.all_wrong: list[np.ndarray] = []
        self.skipped = 0
        # The places of a batch's skipped candidates that no later draw has filled yet, and the rollouts
        # each would have had: those still open when the step closes are the rollouts skipping saved.
        self.open_places = 0
        self.rollouts_per_place = 0
        # What the host generated this step, in how many generation batches (RunTracker.count_rollouts).
        self.rollouts = 0
        self.gen_batches = 0
        # The rollout allocator's plan (RunTracker.allocate_prompts / extend_pilots).
        self.allocated = 0
        self.pilots = 0
        self.extended = 0
        self.extra_rollouts = 0
        self.unallocated = 0

    def count_selection(self, keep: np.ndarray, rollouts_per_prompt: int, refill: bool) -> None:
        """Count one draw of candidate prompts (``keep``: the rule's decision for each). A ``refill`` draw fills
        places earlier draws left open with its kept candidates (the skipped prompts of those places were
        re-selected, not saved), and its skipped candidates open none; any other draw is a batch of its own,
        whose skipped candidates leave their places open (``core.prompt_refill``)."""
        kept, skipped = int(keep.sum()), int((~keep).sum())
        self.skipped += skipped
        if refill:
            self.open_places -= min(kept, self.open_places)
        else:
            self.open_places += skipped
            self.rollouts_per_place = int(rollouts_per_prompt)

    def count_rollouts(self, rollouts: int, gen_batches: int) -> None:
        """Count rollouts the host generated this step, in ``gen_batches`` generation batches."""
        self.rollouts += int(rollouts)
        self.gen_batches += int(gen_batches)

    def count_allocation(self, allocation: Allocation) -> None:
        """Count one plan of the rollout allocator: its first pass, pilots, rollouts beyond G and the
        candidates it gave none."""
        self.allocated += allocation.total
        self.pilots += int(allocation.pilot.sum())
        self.extra_rollouts += int((allocation.rollouts - allocation.group_size).clamp(min=0).sum())
        self.unallocated += int((allocation.rollouts == 0).sum())

    def count_extension(self, added: torch.Tensor) -> None:
        """Count the pilots extended to the full group."""
        self.extended += int((added > 0).sum())

    def allocation_metrics(self) -> dict[str, float]:
        """The step's ``prompts/*`` of the rollout allocator."""
        return {
            "prompts/rollouts_allocated": float(self.allocated),
            "prompts/pilots": float(self.pilots),
            "prompts/pilots_extended": float(self.extended),
            "prompts/extra_rollouts": float(self.extra_rollouts),
            "prompts/unallocated": float(self.unallocated),
        }

    def add(self, keys: list, stats: GroupStats, collapse: Collapse, acr: ACRConfig) -> None:
        """The groups with a key (not None) and at least two responses (a singleton has no collapse)."""
        has_key = np.array([key is not None for key in keys], dtype=bool)
        rows = has_key & collapse.eligible.cpu().numpy()
        if not rows.any():
            return
        low, high = acr.reward_range
        rate = ((stats.mean.cpu().numpy() - low) / (high - low)).clip(0.0, 1.0)
        picked = np.empty(int(rows.sum()), dtype=object)
        picked[:] = [key for key, row in zip(keys, rows, strict=True) if row]
        self.keys.append(picked)
        self.pass_rate.append(rate[rows])
        self.all_correct.append(collapse.all_correct.cpu().numpy()[rows])
        self.all_wrong.append(collapse.all_wrong.cpu().numpy()[rows])

    def close(self, history: PromptHistory, skipper: PromptSkipper | None, step: int) -> dict[str, float]:
        """Record the step's keyed groups in ``history``, adapt ``skipper`` and return the step's
        ``prompts/*`` (none when no group had a key and skipping is off)."""
        metrics: dict[str, float] = {}
        if self.keys:
            keys = np.concatenate(self.keys)
            correct, wrong = np.concatenate(self.all_correct), np.concatenate(self.all_wrong)
            before = history.lookup(keys).collapsed_every_visit  # before this step's visits count
            history.record(keys, np.concatenate(self.pass_rate), correct, wrong, step)
            classes = history.classes()
            metrics = {
                "prompts/seen": float(classes.seen),
                "prompts/always_solved": classes.share("always_solved"),
                "prompts/never_solved": classes.share("never_solved"),
                "prompts/collapsed_before": float(before.mean()),
            }
            if skipper is not None:
                skipper.update(float(correct.mean()), float(wrong.mean()))
        if skipper is not None:
            rollouts_saved, reselected = self.open_places * self.rollouts_per_place, self.skipped - self.open_places
            skipper.rollouts_skipped += rollouts_saved
            skipper.reselected += reselected
            metrics.update(
                {
                    "prompts/skipped": float(self.skipped),
                    "prompts/reselected": float(reselected),
                    "prompts/reselected_cumulative": float(skipper.reselected),
                    "prompts/rollouts_skipped": float(rollouts_saved),
                    "prompts/rollouts_skipped_cumulative": float(skipper.rollouts_skipped),
                    **skipper.metrics(),
                }
            )
        return metrics


def group_keys(measured: Measurement, keys_by_uid: dict[str, Any]) -> list:
    """The prompt key of each group of the measured batch, in group-id order (None: no key)."""
    stats = measured.stats
    positions = torch.arange(stats.ids.numel(), device=stats.ids.device)
    first = torch.full((stats.num_groups,), stats.ids.numel(), device=stats.ids.device)
    first = first.scatter_reduce(0, stats.ids, positions, reduce="amin").cpu().numpy()
    labels = np.asarray(measured.index, dtype=object)[first]
    missing = sum(str(label) not in keys_by_uid for label in labels)
    if missing:
        logger.warning(
            "%d of the batch's %d groups have no prompt key (their uid is not in set_prompt_keys): they are left "
            "out of the prompt history",
            missing,
            len(labels),
        )
    return [keys_by_uid.get(str(label)) for label in labels]
