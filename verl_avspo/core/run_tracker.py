"""The one owner of a run's steps: the collapse measurement, the stall alert and the state a restart keeps
(docs/architecture.md).

Framework-free. Every host (verl's trainers and its replay-buffer hook, OpenRLHF, the sandbox) makes one
:class:`RunTracker` per run and calls it the same way each training step::

    tracker.measure(scores, index, dropped)       # the batch's raw scores, measured once
    ...  the advantage stage; avspo and dcpo compute through tracker.avspo_advantages / dcpo_advantages
    report = tracker.end_step(step, advantages)   # every acr/*, the estimator's avspo/*, acr/stalled

and saves ``tracker.state_dict()`` with each checkpoint (``load_state_dict`` on resume). A host keeps
only what is its own: where the scores, uids and advantages are read from, and where the state is stored.

Prompts (docs/prompts.md): a host that knows each group's prompt identity calls
``tracker.set_prompt_keys({uid: key})`` before ``end_step``; the tracker then records every group in
its per-prompt history (``core.prompt_history``) and logs ``prompts/*``. With the skip rule on
(``core.prompt_skip``), the host asks ``tracker.select_prompts(keys, n)`` before the rollout which
candidate prompts to roll out, through the one skip-and-refill loop (``core.prompt_refill``). A host that
counts its generated rollouts (``tracker.count_rollouts``) gets ``train/rollouts_*`` logged with each step.
With the rollout allocator on (``core.prompt_allocation``), the host asks ``tracker.allocate_prompts(keys, G)``
how many rollouts each candidate gets, rolls them out, and asks ``tracker.extend_pilots(allocation, spread)``
how many to add to each pilot (a host whose rollout extends pilots itself reports them with
``tracker.observe_pilots(extended)``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_avspo.core.acr_config import ACRConfig
from verl_avspo.core.advantage import AdvantageOutput, compute_avspo_outcome_advantage, response_scores
from verl_avspo.core.alert import NEUTRAL_ADVICE, StagnationMonitor
from verl_avspo.core.baseline_settings import DCPOConfig
from verl_avspo.core.collapse import (
    DroppedGroups,
    Measurement,
    acr_metrics,
    detect_collapse,
    effective_collapse_rate,
    group_ids,
    group_stats,
    measure,
)
from verl_avspo.core.config import AVSPOConfig
from verl_avspo.core.controller import AdaptiveController
from verl_avspo.core.dcpo import MissingPromptIdentity, PromptRewardHistory, batch_advantages
from verl_avspo.core.prompt_allocation import Allocation, PromptAllocationConfig, PromptAllocator
from verl_avspo.core.prompt_history import PromptHistory
from verl_avspo.core.prompt_skip import PromptSkipConfig, PromptSkipper
from verl_avspo.core.prompt_step import StepPrompts, group_keys
from verl_avspo.core.state_file import (
    STATE_FILE,
    STATE_VERSION,
    RunStateError,
    check_state_version,
    read_folder_state,
    read_state,
    write_state,
)

__all__ = [
    "StepReport",
    "RunTracker",
    # DCPO's error for groups without a prompt key (core.dcpo), raised through dcpo_advantages.
    "MissingPromptIdentity",
    # The saved state's names, whose home is core.state_file: the tracker writes and reads that file.
    "STATE_VERSION",
    "STATE_FILE",
    "RunStateError",
    "read_state",
    "check_state_version",
]

logger = logging.getLogger(__name__)


class StepReport(dict):
    """One step's metrics (``acr/*``, the estimator's ``avspo/*``, ``acr/stalled``), as a dict, plus
    ``newly_stalled``: True on the one step at which the run became stalled."""

    newly_stalled: bool = False


class RunTracker:
    """A run's collapse measurement, stall alert and restartable state.

    Args:
        acr: the collapse test, reward range and alert (``algorithm.acr``).
        avspo: AVSPO's settings when the run's estimator is avspo (it then owns AVSPO's controller).
        dcpo: DCPO's settings when the run's estimator is dcpo (it then owns DCPO's reward history).
        norm_adv_by_std: DCPO's standardisation (verl's ``norm_adv_by_std_in_grpo``).
        acr_section: how the host's user names ACR's settings (``algorithm.acr`` in verl, ``--acr`` in
            OpenRLHF), for the stall warning's rule and the reward range warning; the default names no host.
        advice: what the stall warning advises, in the host's settings (``core.alert.stall_advice``).
        prompt_skip: the pre-rollout skip rule's settings (``core.prompt_skip``); skipping is on when
            they are given with ``enable``.
        prompt_identity: what the host's prompt keys are (verl: ``index`` or ``raw_prompt``), saved with
            DCPO's reward history so that a run resumed with another identity starts it fresh.
    """

    def __init__(
        self,
        acr: ACRConfig,
        avspo: AVSPOConfig | None = None,
        dcpo: DCPOConfig | None = None,
        norm_adv_by_std: bool = True,
        acr_section: str = "acr",
        advice: str = NEUTRAL_ADVICE,
        prompt_skip: PromptSkipConfig | None = None,
        prompt_identity: str | None = None,
    ):
        self.acr = acr
        self.avspo = avspo
        self.dcpo = dcpo
        self.prompt_identity = prompt_identity
        self.norm_adv_by_std = norm_adv_by_std
        self.alert = StagnationMonitor(acr.alert)
        self.controller = AdaptiveController(avspo, acr) if avspo is not None else None
        self.dcpo_history = (
            PromptRewardHistory(epsilon=dcpo.epsilon, norm_adv_by_std=norm_adv_by_std) if dcpo is not None else None
        )
        self.acr_section = acr_section
        self.advice = advice
        self.prompt_history = PromptHistory()
        self.set_prompt_skip(prompt_skip)
        self.allocator: PromptAllocator | None = None
        self._prompts = StepPrompts()
        # The rollouts generated since the run started; None while the host counts none (count_rollouts).
        self.rollouts_cumulative: int | None = None
        # This step's: the raw measurement, the estimator's metrics, the prompt key per uid.
        self.measurement: Measurement | None = None
        self._host_measured = False  # False: the estimator measured its own batch (no host measured the step)
        self._estimator_metrics: dict[str, float] = {}
        self._prompt_keys: dict[str, Any] = {}

    # ---- one step ---------------------------------------------------------------------------

    def measure(self, scores: torch.Tensor, index: Any, dropped: DroppedGroups | None = None) -> Measurement:
        """The step's raw measurement of (bs,) ``scores`` grouped by (bs,) ``index``, with the groups
        ``dropped`` by a filter before this batch. A batch the estimator already measured this step
        is not measured again."""
        if self.measurement is None or dropped is not None or not self.measurement.same_batch(scores, index):
            self.measurement = measure(scores, index, self.acr.tau, self.acr.reward_range, dropped)
        self._host_measured = True
        return self.measurement

    def avspo_advantages(
        self, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, norm_adv_by_std: bool = True
    ) -> AdvantageOutput:
        """AVSPO's advantages of this step's batch (``core.advantage``), deciding on the step's
        measurement; the first call of a step without one measures this batch as the step's."""
        if self.controller is None:
            raise ValueError("this run's tracker was built without AVSPO settings: it cannot compute avspo advantages")
        measured = self.measurement if self._host_measured else None
        with torch.no_grad():
            output = compute_avspo_outcome_advantage(
                token_level_rewards,
                response_mask,
                index,
                self.avspo,
                self.acr,
                self.controller,
                norm_adv_by_std,
                measured=measured,
                acr_section=self.acr_section,
            )
        if measured is None:  # no host measured this step: the estimator's batch is the step's
            self.measurement = output.measurement
        self._estimator_metrics = output.metrics
        return output

    def set_prompt_keys(self, keys_by_uid: dict[str, Any]) -> None:
        """The stable prompt key (an int or a str, ``core.prompt_history``) of each uid of the batch about
        to be measured (None: padding rows, left out). DCPO reads them; every group of the batch with a
        key is recorded in the prompt history when the batch closes (:meth:`batch_metrics`)."""
        self._prompt_keys = {str(uid): key for uid, key in keys_by_uid.items()}

    def set_prompt_skip(self, config: PromptSkipConfig | None) -> None:
        """Turn the skip rule on (``config.enable``) or off, for a host that reads its settings after
        building the tracker; the skipper starts afresh (its state loads with :meth:`load_state_dict`)."""
        self.skipper = PromptSkipper(config) if config is not None and config.enable else None

    def select_prompts(
        self, keys: Any, rollouts_per_prompt: int, at_least: int = 0, refill: bool = False
    ) -> np.ndarray:
        """Before the rollout: (n,) bool, which of the candidate prompts ``keys`` to roll out (all of
        them when the skip rule is off). At least ``at_least`` are kept: when the rule keeps fewer, the
        first prompts it would skip are kept too (a host that must fill its batch). Hosts call it through
        ``core.prompt_refill.skip_and_refill``.

        A ``refill`` draw fills places an earlier draw's skipped prompts left open: those skipped prompts count
        as ``prompts/reselected``. The places still open when the step ends count their ``rollouts_per_prompt``
        rollouts each in ``prompts/rollouts_skipped`` (never generated, a saving)."""
        if self.skipper is None:
            return np.ones(len(keys), dtype=bool)
        keep = self.skipper.keep(keys, self.prompt_history)
        shortfall = int(at_least) - int(keep.sum())
        if shortfall > 0:
            keep[np.flatnonzero(~keep)[:shortfall]] = True
        self._prompts.count_selection(keep, rollouts_per_prompt, refill)
        return keep

    def set_prompt_allocation(self, config: PromptAllocationConfig | None) -> None:
        """Turn the rollout allocator on (``config.enable``) or off; it starts afresh (its state loads with
        :meth:`load_state_dict`)."""
        self.allocator = PromptAllocator(config) if config is not None and config.enable else None

    def allocate_prompts(self, keys: Any, group_size: int) -> Allocation:
        """Before the rollout: how many rollouts each candidate prompt of ``keys`` gets (0, a pilot, G or
        more; ``core.prompt_allocation``), from its history, within the step's budget."""
        if self.allocator is None:
            raise ValueError("this run's tracker has no rollout allocator: call set_prompt_allocation first")
        allocation = self.allocator.allocate(keys, self.prompt_history, group_size)
        self._prompts.count_allocation(allocation)
        return allocation

    def extend_pilots(self, allocation: Allocation, spread: Any) -> torch.Tensor:
        """After the first pass: (n,) rollouts to add to each candidate, the rest of the group for each
        pilot whose rewards showed a ``spread`` ((n,) bool), 0 elsewhere."""
        added = self.allocator.extend(allocation, spread)
        self._prompts.count_extension(added)
        return added

    def observe_pilots(self, extended: Any) -> None:
        """For a host whose rollout extends pilots itself (verl's agent loop): ``extended`` (k,) bool, one per
        pilot trained this step, whether it was extended to the full group; counted in
        ``prompts/pilots_extended`` and in the allocator's estimate of the extended share. The host counts
        the added rollouts with :meth:`count_rollouts`."""
        extended = torch.as_tensor(extended, dtype=torch.bool)
        self.allocator.observe_pilots(extended)
        self._prompts.count_extension(extended.to(torch.int64))

    def count_rollouts(self, rollouts: int, gen_batches: int = 1) -> None:
        """The host generated ``rollouts`` responses this step, in ``gen_batches`` generation batches (DAPO's
        extra batches and any refill included): from then on every step logs ``train/rollouts_generated``,
        ``train/gen_batches`` and ``train/rollouts_cumulative`` (saved with the run state)."""
        self._prompts.count_rollouts(rollouts, gen_batches)
        if self.rollouts_cumulative is None:
            self.rollouts_cumulative = 0

    def record_groups(self, keys: Any, scores: torch.Tensor) -> None:
        """Add groups of this step that are not in the measured batch (a filter dropped them) to the
        prompt history: ``keys`` (num_groups,), ``scores`` (num_groups, G) raw scores."""
        num_groups, size = scores.shape
        ids = torch.arange(num_groups, device=scores.device).repeat_interleave(size)
        stats = group_stats(scores.reshape(-1), ids, num_groups)
        self._prompts.add(list(keys), stats, detect_collapse(stats, self.acr.tau, self.acr.reward_range), self.acr)

    def dcpo_advantages(
        self, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any
    ) -> torch.Tensor:
        """DCPO's smooth standardisation (``core.dcpo``) of this step's batch, (bs,) scalar advantages,
        with the prompt keys set by :meth:`set_prompt_keys`; padding rows get 0."""
        if self.dcpo_history is None:
            raise ValueError("this run's tracker was built without DCPO settings: it cannot compute dcpo advantages")
        # Checked before the history is touched: a NaN reward would poison its prompt's history for good.
        scores = response_scores(token_level_rewards, response_mask, index)
        return batch_advantages(self.dcpo_history, scores, index, self._prompt_keys)

    def batch_metrics(self, advantages: torch.Tensor | None = None, index: Any = None) -> dict[str, float]:
        """The measured batch's ``acr/*`` (``acr/effective`` when its trained ``advantages`` are given:
        (bs,) or (bs, L), of the measured rows, or of the rows labelled by ``index`` when the host
        trained on other rows) and the estimator's ``avspo/*``; closes the batch.

        Raises:
            RuntimeError: nothing was measured.
        """
        measured = self.measurement
        if measured is None:
            raise RuntimeError("RunTracker: call measure() with the batch's raw scores first")
        effective = None
        if advantages is not None:
            if index is None:
                ids, count = measured.stats.ids, measured.stats.count
            else:
                ids, num_groups = group_ids(index, device=advantages.device)
                count = torch.bincount(ids, minlength=num_groups)
            effective = effective_collapse_rate(advantages, ids, count, self.acr.tau)
        metrics = acr_metrics(measured.step_collapse, effective)
        metrics.update(self._estimator_metrics)
        if self._prompt_keys:
            self._prompts.add(group_keys(measured, self._prompt_keys), measured.stats, measured.collapse, self.acr)
        self.measurement, self._host_measured, self._estimator_metrics = None, False, {}
        self._prompt_keys = {}
        return metrics

    def observe_step(self, step: int, metrics: dict[str, float]) -> bool:
        """Run the stall rule on a step's ``acr/*`` and add ``acr/stalled`` to ``metrics``; log the
        stall warning and return True on the step at which it first holds. Once per training step (a host
        that trains on several batches a step passes their aggregated metrics). A step with nothing
        measured (no ``acr/rate``: every response unscorable) moves no streak, but still closes the step's
        prompts, so what it skipped is logged in it."""
        newly_stalled = self.alert.update(metrics) if "acr/rate" in metrics else False
        metrics["acr/stalled"] = float(self.alert.stalled)
        step_prompts, self._prompts = self._prompts, StepPrompts()
        metrics.update(step_prompts.close(self.prompt_history, self.skipper, step))
        if self.allocator is not None:
            metrics.update({**step_prompts.allocation_metrics(), **self.allocator.metrics()})
        if self.rollouts_cumulative is not None:  # added as the step closes: what a checkpoint after it saves
            self.rollouts_cumulative += step_prompts.rollouts
            metrics.update(
                {
                    "train/rollouts_generated": float(step_prompts.rollouts),
                    "train/gen_batches": float(step_prompts.gen_batches),
                    "train/rollouts_cumulative": float(self.rollouts_cumulative),
                }
            )
        if newly_stalled:
            rule = f"{self.acr_section}.alert.rule={self.acr.alert.rule}"
            logger.warning(self.alert.message(step, rule_setting=rule, advice=self.advice))
        return newly_stalled

    def end_step(self, step: int, advantages: torch.Tensor | None = None, index: Any = None) -> StepReport:
        """:meth:`batch_metrics` then :meth:`observe_step`, for a host with one batch per step."""
        report = StepReport(self.batch_metrics(advantages, index))
        report.newly_stalled = self.observe_step(step, report)
        return report

    # ---- the state a restart keeps ------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue as if it never stopped (see :data:`STATE_VERSION`)."""
        dcpo = None
        if self.dcpo_history is not None:
            dcpo = {**self.dcpo_history.state_dict(), "prompt_key": self.prompt_identity}  # what its keys are
        return {
            "version": STATE_VERSION,
            "controller": self.controller.state_dict() if self.controller is not None else None,
            "stagnation": self.alert.state_dict(),
            "dcpo": dcpo,
            "prompt_history": self.prompt_history.state_dict(),
            "prompt_skip": self.skipper.state_dict() if self.skipper is not None else None,
            "rollouts_cumulative": self.rollouts_cumulative,
            "prompt_allocation": self.allocator.state_dict() if self.allocator is not None else None,
        }

    def save(self, folder: str | os.PathLike) -> Path:
        """Write :meth:`state_dict` to ``folder``/:data:`STATE_FILE` (``core.state_file.write_state``)."""
        return write_state(self.state_dict(), folder)

    def load(self, folder: str | os.PathLike) -> bool:
        """Restore the state saved in ``folder`` by :meth:`save`; False, with a warning, if it holds none."""
        state = read_folder_state(folder)
        if state is None:
            return False
        self.load_state_dict(state)
        return True

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (of :data:`STATE_VERSION`).

        Raises:
            ValueError: a state of another version, or AVSPO state saved with other settings.
        """
        check_state_version(state)
        if self.controller is not None and state.get("controller") is not None:
            self.controller.load_state_dict(state["controller"])
        elif self.controller is not None:
            logger.warning("the saved run state holds no AVSPO controller: the adaptive threshold starts afresh")
        if self.dcpo_history is not None:
            self._load_dcpo(state.get("dcpo"))
        self.alert.load_state_dict(state["stagnation"])
        self.prompt_history.load_state_dict(state["prompt_history"])
        if state["rollouts_cumulative"] is not None:  # None: a run that counts no rollouts
            self.rollouts_cumulative = int(state["rollouts_cumulative"])
        if self.skipper is not None and state.get("prompt_skip") is not None:
            self.skipper.load_state_dict(state["prompt_skip"])
        elif self.skipper is not None:
            logger.warning(
                "the saved run state holds no prompt skip rule (saved with skipping off): "
                "its exploration probabilities and generator start afresh"
            )
        if self.allocator is not None and state.get("prompt_allocation") is not None:
            self.allocator.load_state_dict(state["prompt_allocation"])
        elif self.allocator is not None:
            logger.warning(
                "the saved run state holds no rollout allocator (saved with allocation off): "
                "its extension rate and generator start afresh"
            )

    def _load_dcpo(self, saved: dict[str, Any] | None) -> None:
        if saved is None:
            logger.warning(
                "the saved run state holds no DCPO reward history (saved by a run with another estimator?): "
                "every prompt's next visit counts as its first"
            )
        elif saved["prompt_key"] != self.prompt_identity:
            logger.warning(
                "the saved DCPO reward history is keyed by %s, this run's prompts by %s: no prompt would match, so "
                "the history starts fresh (every next visit counts as the first)",
                saved["prompt_key"],
                self.prompt_identity,
            )
        else:
            self.dcpo_history.load_state_dict(saved)
