"""The per-prompt history and prompt skipping in our V1 trainer (every mode): :class:`PromptRecords` and
:class:`PromptSkipping`, two parts the trainer (:class:`~verl_avspo.verl_plugin.trainer.AVSPOTrainer`) holds.

- Every step, before verl's advantage stage, the trainer reads each response's prompt identity from
  TransferQueue with its score (the field :mod:`verl_avspo.verl_plugin.prompt_identity` resolved: ``index`` or
  ``raw_prompt``) and hands ``uid -> key`` to the run tracker (``RunTracker.set_prompt_keys``), which
  records the per-prompt history (``prompts/*``) and DCPO's reward statistics.
- Groups verl's replay buffer drops before the advantage stage (DAPO's ``filter_groups`` evictions and
  surplus, stale groups: ``ReplayBuffer._clear_groups``) reach the history too: the buffer's
  ``_clear_groups`` first hands every finished group among them that has all its responses (not a
  failed one) to ``RunTracker.record_groups`` (one TransferQueue read per eviction), so a prompt DAPO
  filters on every visit is still seen collapsed.
- With ``algorithm.prompts.skip.enable=True``, :meth:`PromptSkipping.kept`, called from the trainer's
  ``_next_train_batch`` (where every V1 mode takes its prompts from the dataloader) drops the
  prompts the tracker's skip rule rejects before they are sent to rollout, through the core's
  skip-and-refill loop (``core.prompt_refill``). It refills the batch from the dataloader to the size
  verl asked for (re-selections, ``prompts/reselected``): the sync trainer's replay buffer waits for
  exactly ``data.train_batch_size`` groups, and the async modes ask for an exact number of prompts
  (``_add_prompts_to_generate``), so a smaller batch would stall the step. Accepted prompts of the
  last chunk fetched beyond that size are left for a later epoch, as verl's DAPO over-sampling leaves
  its surplus groups; verl's dataloader state, saved with each checkpoint, and the skip rule's state,
  saved with the tracker's, make a resumed run skip exactly what the uninterrupted one would.
- With DAPO's ``algorithm.filter_groups`` in the ``sync`` mode the buffer generates more prompts until it
  has enough groups with spread, so a skipped prompt's place is not refilled at once: it stays open, and
  is filled only if the buffer runs out of work short of its batch (:meth:`PromptSkipping.watch`).
  The places never needed save their rollouts (``prompts/rollouts_skipped``).
- Every call of ``_next_train_batch`` is one generation batch: the run tracker counts its rollouts
  (prompts x ``rollout.n``, or the allocator's first pass; in the async modes, the rollouts dispatched) in
  ``train/rollouts_generated``, ``train/gen_batches`` and ``train/rollouts_cumulative``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.utils import tensordict_utils as tu

from verl_avspo.core.prompt_refill import skip_and_refill
from verl_avspo.verl_plugin.prompt_identity import PROMPT_KEY_SETTING, prompt_key, prompt_keys
from verl_avspo.verl_plugin.v1_batch import read_scores, real_rows

__all__ = ["PromptRecords", "PromptSkipping", "dapo_tops_up", "dataset_rows", "verl_buffer"]

logger = logging.getLogger(__name__)


class PromptRecords:
    """Each step's prompt keys, and the groups verl's replay buffer clears unsampled, into the run's per-prompt
    history (module docstring)."""

    def __init__(self, tracker, source: str, group_size: int, allocation=None):
        """``source``: the prompt identity's field (``index`` or ``raw_prompt``); ``allocation``: the run's
        :class:`~verl_avspo.verl_plugin.rollout_allocation.RolloutAllocation` when the allocator is on."""
        self.tracker, self.source, self.group_size, self.allocation = tracker, source, group_size, allocation
        self._watched = None  # the replay buffer whose _clear_groups is wrapped
        self._warned_no_prompt_field = False

    def pass_keys(self, batch, uids: np.ndarray, prompts: list | None) -> None:
        """Hand the run tracker the stable prompt key of each uid of this batch, from its real rows' ``uids``
        and ``prompts`` (the identity field, None when the rows lack it), read with their scores."""
        if prompts is None:  # a custom agent loop that stores neither field: no history (DCPO refuses)
            if not self._warned_no_prompt_field:
                logger.warning(
                    "the batch's responses carry no %r field in TransferQueue, so the per-prompt history records "
                    "nothing (prompts/* are not logged); set %s to the field your agent loop stores",
                    self.source,
                    PROMPT_KEY_SETTING,
                )
                self._warned_no_prompt_field = True
            return
        # The padding rows _balance_batch appended (their key starts with their uid, as verl's replay buffer
        # reads it): no prompt, but DCPO's estimator, which sees them, must find them.
        keys: dict[str, Any] = {
            key.split("_")[0]: None for key, real in zip(batch.keys, real_rows(batch), strict=True) if not real
        }
        for uid, value in zip(uids, prompts, strict=True):
            if str(uid) not in keys:  # once per group: the G responses of a uid share the prompt
                keys[str(uid)] = prompt_key(value, self.source)
        if self.source == "index":
            _refuse_index_collisions(batch, keys)
        self.tracker.set_prompt_keys(keys)

    def watch(self, buffer) -> None:
        """Once per buffer: verl's replay buffer hands the groups it clears unmeasured to :meth:`record_cleared`
        first. verl has no hook there, so the buffer's bound ``_clear_groups`` is wrapped (``replay_buffer.py``;
        called from ``_evict_terminal_groups`` and, for DAPO's surplus, from ``sample``)."""
        if buffer is self._watched:
            return
        self._watched = buffer
        if not isinstance(buffer, ReplayBuffer):  # a user's own sampler: its dropped groups are its business
            logger.info(
                "verl-avspo: the replay buffer is a %s, not verl's: groups it drops before the advantage stage are "
                "not recorded in the per-prompt history",
                type(buffer).__name__,
            )
            return
        clear_groups = buffer._clear_groups

        def record_then_clear(partition_id: str, uids: set[str]) -> None:
            if partition_id == "train" and uids:
                self.record_cleared(buffer, partition_id, uids)
            clear_groups(partition_id, uids)

        buffer._clear_groups = record_then_clear

    def record_cleared(self, buffer, partition_id: str, uids: set[str]) -> None:
        """Record in the prompt history the finished groups among ``uids`` that have all their
        ``rollout.n`` responses (a failed group's partial responses say nothing about its prompt); with the
        rollout allocator, every finished group, whatever its size, and its pilots' extensions counted."""
        finished = (set(uids) & buffer.finished_keys[partition_id]) - buffer.failure_keys[partition_id]
        response_keys = [
            key
            for key, tag in buffer.partitions[partition_id].items()
            if not tag.get("is_prompt", False) and key.split("_")[0] in finished
        ]
        if not response_keys:
            return
        allocation = self.allocation
        pilot_field = allocation.pilot_field if allocation is not None else None
        scores, uids, prompts, pilot_sizes = read_scores(response_keys, partition_id, self.source, pilot_field)
        if prompts is None:
            return  # no prompt field in TransferQueue: pass_keys warns about it once
        if allocation is not None:  # evicted before the advantage stage: their extensions were generated all the same
            allocation.observe_pilots(response_keys, pilot_sizes)
        rows_of: dict[str, list[int]] = {}
        for row, uid in enumerate(uids):
            rows_of.setdefault(str(uid), []).append(row)
        by_size: dict[int, list[list[int]]] = {}
        for rows in rows_of.values():
            if allocation is not None or len(rows) == self.group_size:
                by_size.setdefault(len(rows), []).append(rows)
        for groups in by_size.values():  # record_groups takes groups of one size at a time
            keys = [prompt_key(prompts[rows[0]], self.source) for rows in groups]
            self.tracker.record_groups(keys, scores[torch.tensor(groups)])


def _refuse_index_collisions(batch, keys: dict[str, Any]) -> None:
    """Raise if two groups share an ``index`` but not their prompt. (The same prompt twice in
    one batch is legitimate, e.g. sampled again by DAPO's over-sampling across an epoch.)"""
    uids_by_key: dict[Any, list[str]] = {}
    for uid, key in keys.items():
        if key is not None:
            uids_by_key.setdefault(key, []).append(uid)
    shared = {key: uids for key, uids in uids_by_key.items() if len(uids) > 1}
    if not shared:
        return
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "raw_prompt"])
    prompt_of = dict(zip(map(str, data["uid"]), data["raw_prompt"], strict=True))
    for key, uids in shared.items():
        prompts = {prompt_key(prompt_of[uid], "raw_prompt") for uid in uids}
        if len(prompts) > 1:
            raise ValueError(
                f"{PROMPT_KEY_SETTING}=index: {len(prompts)} different prompts of this batch have the same index "
                f"{key!r}, so the run's per-prompt history (and DCPO's) would pool them. verl's RLHFDataset sets "
                "index from each row's extra_info.index (0 when it is missing; several train files often each "
                "count from 0). Give every row a unique extra_info.index (recipes/data does), or set "
                f"{PROMPT_KEY_SETTING}=raw_prompt."
            )


class PromptSkipping:
    """Skipping prompts before their rollout (``algorithm.prompts.skip``) and, where DAPO tops up, the places
    it leaves open (module docstring)."""

    def __init__(self, tracker, source: str, group_size: int):
        self.tracker, self.source, self.group_size = tracker, source, group_size
        self.open_places = 0
        """Places of this step's batch that skipping left open, for DAPO's buffer to fill if it runs short."""
        self._topping_up = False  # a dispatch of open places is under way
        self._watched = None  # the replay buffer whose _wait_for_next_poll is wrapped

    def kept(self, batch, draw, epoch: int, tops_up: bool):
        """The prompts of ``batch`` the skip rule keeps, refilled by the core's loop (``core.prompt_refill``) with
        chunks from ``draw()``: to the size verl asked for, or, where DAPO tops up (:func:`dapo_tops_up`), to one
        prompt, the other places left open for :meth:`watch`. ``epoch``: the dataloader's length, which bounds
        the refills."""

        def forced(number: int, _chunk) -> bool:
            # Bounded: once a whole epoch of refills has not filled the batch (every prompt rejected, which
            # the rule's exploration makes vanishingly rare), the rule must keep enough of the next chunk.
            if number == epoch:
                logger.warning(
                    "algorithm.prompts.skip: a whole epoch of prompts was skipped without filling one batch; "
                    "its remaining places take the next prompts whatever the skip rule says"
                )
            return number >= epoch

        picked = skip_and_refill(
            batch,
            lambda chunk: prompt_keys(dataset_rows(chunk, self.source), self.source),
            lambda keys, at_least, refill: self.tracker.select_prompts(
                keys, self.group_size, at_least=at_least, refill=refill
            ),
            lambda _missing: draw(),
            len(batch),
            fill=1 if tops_up else None,
            refill=self._topping_up,
            forced=forced,
        )
        if tops_up:
            self.open_places += picked.open_places
        chosen = [(chunk, torch.from_numpy(rows)) for chunk, rows in picked.chunks if len(rows)]
        kept = [tu.index_select_tensor_dict(chunk, rows) for chunk, rows in chosen]
        return kept[0] if len(kept) == 1 else tu.concat_tensordict(kept)

    def watch(self, buffer, batch_size: int, add_prompts) -> None:
        """Once per buffer, where DAPO tops up: verl's sync replay buffer dispatches more prompts only for the
        groups it evicts, and polls (``_wait_for_next_poll``) while it waits for the rest. When it polls with
        nothing in flight it is short of its ``batch_size`` groups with nothing coming: then, and only then, as
        many of the open places as it lacks groups are filled through ``add_prompts(count)`` (the trainer's
        dispatch; re-selections); the places never needed by the end of the step saved their rollouts. (Wrapped
        on the buffer: verl has no hook there.)"""
        buffer = verl_buffer(buffer)
        if buffer is self._watched:
            return
        self._watched = buffer
        wait = buffer._wait_for_next_poll

        def top_up_then_wait(partition_id: str, last_debug_time: float) -> float:
            idle = not (buffer.pending_keys[partition_id] or buffer.running_keys[partition_id])
            if partition_id == "train" and idle and self.open_places:
                # The groups it still lacks (those it holds are the sampleable ones: evictions are cleared).
                held = len(buffer.finished_keys[partition_id] | buffer.failure_keys[partition_id])
                places = min(self.open_places, batch_size - held)
                if places > 0:
                    self.open_places -= places
                    self._topping_up = True
                    try:
                        add_prompts(places)
                    finally:
                        self._topping_up = False
            return wait(partition_id, last_debug_time)

        buffer._wait_for_next_poll = top_up_then_wait

    def close_step(self) -> None:
        """At the end of a step: DAPO's sync buffer keeps nothing for the next one, so the places still
        open were never needed (the tracker counts them saved as the step closes)."""
        self.open_places = 0


def dapo_tops_up(config, trainer_mode: str, buffer) -> bool:
    """Whether the trainer's replay buffer generates more prompts until it has enough groups with spread (DAPO's
    ``algorithm.filter_groups`` in the ``sync`` mode): a skipped prompt's place then waits, open, until the buffer
    runs out of work short of its batch (:meth:`PromptSkipping.watch`). (A user's own sampler asks for the counts
    it needs: its places are refilled at once.)"""
    enabled = OmegaConf.select(config, "algorithm.filter_groups.enable", default=False)
    return bool(enabled) and trainer_mode == "sync" and isinstance(verl_buffer(buffer), ReplayBuffer)


def verl_buffer(buffer):
    """The trainer's replay buffer (verl's, inside the stock hook's wrapper); None before verl builds it."""
    return getattr(buffer, "buffer", buffer)


def dataset_rows(batch, field: str) -> list:
    """The values of one per-row field of a dataloader batch: a tensor, or the list tensordict hands back
    for a NonTensorStack (the same access as verl's own reads of ``raw_prompt``)."""
    values = batch[field]
    return values.tolist() if isinstance(values, torch.Tensor) else list(values)
