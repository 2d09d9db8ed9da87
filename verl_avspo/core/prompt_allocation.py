"""How many rollouts each of a step's prompts gets, from its collapse history (opt-in). Framework-free.

The run tracker owns one per run (``RunTracker.allocate_prompts``, saved with the run state); the sandbox
(``+alloc``) and verl's V1 trainers (``algorithm.prompts.allocation``) use it. The skip rule
(``core.prompt_skip``) decides skip or keep; the allocator decides, for the kept prompts, *how many*
rollouts, within a per-step rollout budget:

- **0**: the skip rule turned the prompt down (the host passes its ``keep``), or the budget ran out
  (the least informative prompts go first, see below);
- **a pilot** of ``pilot_size`` rollouts for a prompt predicted to collapse (a collapse streak of at
  least ``pilot_streak``, ``core.prompt_history``): a cheap check (Pilot-Commit, arXiv 2605.26606).
  If the pilot shows a reward spread (:func:`pilots_spread`, the collapse test ACR counts with) the host
  extends it to the full group (:meth:`PromptAllocator.extend`, or :meth:`PromptAllocator.observe_pilots`
  where the host's rollout extends it); a collapsed pilot costs only its pilot;
- **G** (the group size) for a prompt never seen or not predicted to collapse;
- **more than G**, up to ``max_group_size``, for prompts whose predicted pass rate p (their last pass
  rate) lies within ``extra_band`` of 1/2: the rollouts the pilots saved go where the reward variance
  p(1-p), and so the expected gradient signal per group, is largest (Knapsack RL, arXiv 2509.25849;
  VIP, arXiv 2602.01601; Reinforce-Ada, arXiv 2510.04996), in proportion to p(1-p).

The budget is ``budget_share`` x (candidates x G), a bound, not an amount spent: at 1.0 a step spends no more
than a uniform GRPO step would; the pilots' savings buy larger groups only for prompts near p = 1/2, and are
not spent where there are none; below 1 the step also saves. The first pass plus a reserve for the
pilots expected to be extended (``extend_rate`` x pilots x (G - pilot_size), the rate an exponential
average of the share of pilots extended so far) stays within the budget. When it does not fit,
prompts are dropped in order of least expected signal: pilots first (longest streak first), then full
groups by lowest p(1-p) (an unseen prompt counts as 1/6, p(1-p)'s mean under a uniform prior), ties
broken by the allocator's own seeded ``torch.Generator`` so that no prompt loses every tie. An
extension is never refused (it is the informative case), so a step whose pilots spread more often than
the reserve assumed overshoots the budget by the difference; the rate then rises.

Why these defaults: a pilot of 2 is the smallest that can show a spread (GRESO, arXiv 2506.02177,
finds zero-variance prompts stay so across epochs, so most pilots of streak >= 1 are dropped);
``max_group_size`` 16 = 2G at the paper's G = 8 bounds the cost of one prompt as Reinforce-Ada's caps
do; the band [1/4, 3/4] holds the prompts where p(1-p) >= 3/16, at least 3/4 of its maximum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from verl_avspo.core import validation
from verl_avspo.core.collapse import detect_collapse, group_stats
from verl_avspo.core.prompt_history import PromptHistory
from verl_avspo.core.validation import Problems, given_settings

__all__ = [
    "Allocation",
    "PromptAllocationConfig",
    "PromptAllocator",
    "allocation_problems",
    "pilots_spread",
    "resolve_prompt_allocation",
]

# p(1-p)'s mean under a uniform prior on p: the expected variance of a prompt never seen.
UNSEEN_VARIANCE = 1.0 / 6.0


@dataclass(frozen=True)
class PromptAllocationConfig:
    """Settings of the per-prompt rollout allocator (:class:`PromptAllocator`)."""

    enable: bool = False
    """Give prompts unequal rollout counts. Off by default: it changes how many responses each prompt gets."""
    pilot_size: int = 2
    """Rollouts of a pilot for a prompt predicted to collapse; 2 is the fewest that can show a spread.
    Must be below the group size G."""
    pilot_streak: int = 1
    """Collapse streak (consecutive collapsed visits, ``core.prompt_history``) from which a prompt gets a
    pilot instead of the full group."""
    max_group_size: int = 16
    """Most rollouts one prompt gets (extras included); at least the group size G. 16 = 2G at G = 8."""
    extra_band: float = 0.25
    """Prompts whose last pass rate lies within this distance of 1/2 share the extra rollouts, in
    proportion to p(1-p). ``max_group_size`` = G turns extras off."""
    budget_share: float = 1.0
    """The step's rollout budget as a share of candidates x G: 1.0 spends a uniform step's rollouts (the
    pilots' savings become larger groups), below 1 saves rollouts too."""
    extend_rate: float = 0.25
    """Starting estimate of the share of pilots that show a spread and are extended: the budget reserves
    their extension. Adapted from the pilots seen (``extend_rate_decay``)."""
    extend_rate_decay: float = 0.9
    """Weight of the previous estimate in the exponential average of the extended share; 1 keeps it fixed."""
    seed: int = 0
    """Seed of the allocator's own random generator (ties in the drop order; saved with its state)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FIELDS = tuple(f.name for f in fields(PromptAllocationConfig))


def resolve_prompt_allocation(
    mapping: Mapping[str, Any] | None, section: str = "prompt_allocation"
) -> PromptAllocationConfig:
    """Validated settings from a mapping (a dict or OmegaConf; a key set to None means "not given");
    ``section`` is how the host's user spells the group, so each message names the full key.

    Raises:
        SettingsError: every bad key at once, each with its value and what is allowed.
    """
    problems = Problems()
    given = given_settings(mapping, section, FIELDS, problems, example=f"{section}.enable=true")
    values = PromptAllocationConfig().to_dict() | given
    check = problems.check

    def key(name: str) -> str:
        return f"{section}.{name}"

    check(validation.boolean, key("enable"), values["enable"])
    pilot = check(validation.integer, key("pilot_size"), values["pilot_size"], 2)
    check(validation.integer, key("pilot_streak"), values["pilot_streak"], 1)
    largest = check(validation.integer, key("max_group_size"), values["max_group_size"], 2)
    check(validation.number, key("extra_band"), values["extra_band"], 0.0, 0.5)
    check(validation.number, key("budget_share"), values["budget_share"], 0.0, math.inf, low_open=True)
    check(validation.number, key("extend_rate"), values["extend_rate"], 0.0, 1.0)
    check(validation.number, key("extend_rate_decay"), values["extend_rate_decay"], 0.0, 1.0)
    check(validation.integer, key("seed"), values["seed"], 0)
    if pilot is not None and largest is not None and pilot >= largest:
        problems.messages.append(
            f"{key('pilot_size')}={pilot} is invalid: a pilot must be smaller than {key('max_group_size')}={largest}. "
            f"Lower {key('pilot_size')} (2 is the fewest that can show a spread) or raise {key('max_group_size')}."
        )
    problems.raise_any()
    return PromptAllocationConfig(**values)


def allocation_problems(
    config: PromptAllocationConfig, group_size: int, section: str, group_size_key: str
) -> list[str]:
    """Why ``config`` cannot allocate around a group size G (empty when it can), each naming the settings,
    their values and the fix; ``group_size_key`` is how the host spells G (``actor_rollout_ref.rollout.n``)."""
    problems = []
    if group_size <= 2:  # no pilot fits: the smallest, 2, would be the whole group
        problems.append(
            f"{section}.enable=True with {group_size_key}={group_size}: a pilot of 2 responses, the fewest that can "
            f"show a spread, must be smaller than the group, so groups of {group_size} leave nothing to allocate. "
            f"Set {group_size_key} to 3 or more (8 is the paper's) or {section}.enable=False."
        )
    elif not config.pilot_size < group_size:
        problems.append(
            f"{section}.pilot_size={config.pilot_size} with {group_size_key}={group_size}: a pilot must be smaller "
            f"than the group it may be extended to. Set {section}.pilot_size below {group_size} (2 is the fewest "
            f"that can show a spread) or raise {group_size_key}."
        )
    if config.max_group_size < group_size:
        problems.append(
            f"{section}.max_group_size={config.max_group_size} with {group_size_key}={group_size}: the largest "
            f"group must hold at least the full group. Set {section}.max_group_size to {group_size} (no extras) "
            f"or more."
        )
    return problems


def pilots_spread(
    scores: torch.Tensor, ids: torch.Tensor, num_pilots: int, tau: float, reward_range: tuple[float, float]
) -> torch.Tensor:
    """(num_pilots,) bool: which pilots showed a reward spread, from their raw ``scores`` (bs,) grouped by
    ``ids`` (bs,), by the collapse test ACR counts with (``core.collapse``, the run's ``tau`` and
    ``reward_range``): a pilot extends exactly when it would not count as collapsed."""
    return ~detect_collapse(group_stats(scores, ids, num_pilots), tau, reward_range).collapsed


@dataclass(frozen=True)
class Allocation:
    """One step's plan, one entry per candidate prompt (in the order given)."""

    rollouts: torch.Tensor
    """(n,) int64: the rollouts of the first pass (0 = not rolled out)."""
    pilot: torch.Tensor
    """(n,) bool: the prompt gets a pilot; the host extends it to ``group_size`` if the pilot shows a spread."""
    group_size: int
    """G, the size a pilot is extended to."""
    budget: int
    """The step's rollout budget."""
    reserved: float
    """Rollouts the budget holds back for the pilots expected to be extended."""

    @property
    def total(self) -> int:
        """Rollouts of the first pass."""
        return int(self.rollouts.sum())


class PromptAllocator:
    """The allocation rule of the module docstring, with its own seeded generator and the adaptive
    estimate ``extend_rate`` of the share of pilots that are extended."""

    def __init__(self, config: PromptAllocationConfig):
        self.config = config
        self.generator = torch.Generator().manual_seed(config.seed)
        self.extend_rate = float(config.extend_rate)

    def allocate(
        self,
        keys: Any,
        history: PromptHistory,
        group_size: int,
        keep: Any = None,
        budget: int | None = None,
    ) -> Allocation:
        """Each candidate's rollouts: ``keys`` (n,) prompt keys, ``history`` the run's prompt history,
        ``group_size`` G, ``keep`` (n,) bool from the skip rule (None: keep all), ``budget`` the step's
        rollouts (None: ``budget_share`` x n x G). Draws one permutation of n from the generator."""
        config = self.config
        problems = allocation_problems(config, group_size, "prompt_allocation", "group_size")
        if problems:
            raise ValueError(" ".join(problems))
        records = history.lookup(keys)
        n = len(records.seen)
        budget = int(math.floor(config.budget_share * n * group_size)) if budget is None else int(budget)
        kept = torch.ones(n, dtype=torch.bool) if keep is None else torch.as_tensor(keep, dtype=torch.bool).clone()
        if kept.shape != (n,) or budget < 0:
            raise ValueError(
                f"PromptAllocator.allocate: {n} keys, keep of shape {tuple(kept.shape)} and budget={budget}: give one "
                "keep flag per key (the skip rule's decision, or None to keep all) and a budget of 0 or more rollouts"
            )
        streak = torch.from_numpy(records.collapse_streak.astype("int64"))
        rate = torch.from_numpy(records.last_pass_rate.astype("float64"))  # NaN where unseen
        seen = torch.from_numpy(records.seen)
        pilot = kept & (streak >= config.pilot_streak)
        variance = torch.where(seen, rate * (1.0 - rate), UNSEEN_VARIANCE)

        # First pass and the expected extension of each pilot, then the drop order: pilots last (longest
        # streak last of all), full groups by expected variance, ties broken at random.
        extension = self.extend_rate * (group_size - config.pilot_size)
        base = torch.where(pilot, config.pilot_size, group_size)
        cost = torch.where(pilot, config.pilot_size + extension, torch.tensor(float(group_size), dtype=torch.float64))
        priority = torch.where(pilot, -streak.to(torch.float64), variance)
        shuffled = torch.randperm(n, generator=self.generator)
        order = shuffled[torch.argsort(priority[shuffled], descending=True, stable=True)]
        cumulative = torch.cumsum(torch.where(kept, cost, 0.0)[order], dim=0)
        fits = torch.zeros(n, dtype=torch.bool)
        fits[order] = cumulative <= budget + 1e-9
        kept &= fits
        pilot &= kept
        rollouts = torch.where(kept, base, 0)
        reserved = extension * int(pilot.sum())

        # Extras: what is left, to the full groups near a pass rate of 1/2, in proportion to p(1-p).
        left = max(0, math.floor(budget - int(rollouts.sum()) - reserved + 1e-9))
        near_half = kept & ~pilot & seen & ((rate - 0.5).abs() <= config.extra_band)
        weight = torch.where(near_half, variance, 0.0)
        if left and float(weight.sum()) > 0:
            share = torch.floor(left * weight / weight.sum()).to(torch.int64)
            rollouts = rollouts + share.clamp(max=config.max_group_size - group_size)
        return Allocation(rollouts.to(torch.int64), pilot, int(group_size), budget, float(reserved))

    def extend(self, allocation: Allocation, spread: Any) -> torch.Tensor:
        """(n,) int64 rollouts to add: G - pilot_size for each pilot whose rewards showed a ``spread``
        ((n,) bool; read only at the pilots), 0 elsewhere (a collapsed pilot is dropped). Updates the
        estimate of the extended share with this step's pilots."""
        spread = torch.as_tensor(spread, dtype=torch.bool) & allocation.pilot
        self.observe_pilots(spread[allocation.pilot])
        return torch.where(spread, allocation.group_size - self.config.pilot_size, 0).to(torch.int64)

    def observe_pilots(self, extended: Any) -> None:
        """Update the estimate of the extended share with pilots' outcomes, ``extended`` (k,) bool, one per
        pilot (:meth:`extend` calls it; a host whose rollout extends pilots itself reports them here)."""
        extended = torch.as_tensor(extended, dtype=torch.bool)
        if extended.numel():
            decay = self.config.extend_rate_decay
            self.extend_rate = decay * self.extend_rate + (1.0 - decay) * int(extended.sum()) / extended.numel()

    def metrics(self) -> dict[str, float]:
        return {"prompts/pilot_extend_rate": self.extend_rate}

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "extend_rate": self.extend_rate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.extend_rate = float(state["extend_rate"])
