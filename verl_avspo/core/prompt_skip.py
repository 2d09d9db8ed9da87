"""Skipping prompts predicted to collapse, before their rollouts (opt-in). Framework-free.

The rule is GRESO's (Zheng et al., arXiv 2506.02177, "Act Only When It Pays"): a prompt whose last
z visits all collapsed (its collapse streak, ``core.prompt_history``) is rolled out with probability
p^z and skipped otherwise, where p is an *exploration probability*; a prompt with streak 0 (never
seen, or a reward spread on its latest visit) is always kept. So a prompt is never skipped for good:
an improving (or forgetting) model can bring it back, and each further collapsed visit makes a
visit rarer. As in GRESO there are two exploration probabilities, one for prompts whose latest
visit was all-correct and one for all-wrong, and with ``adaptive`` each moves by ``explore_step``
per step toward keeping its kind's share of the step's groups at a target: above the target it
explores less (skips more), below it explores more.

Why this rule and not a fixed threshold ("skip after k collapsed visits"): the keep probability
p^z needs no horizon, gives every prompt a chance on every visit (no prompt is starved by an early
unlucky streak), and with the adaptive p it spends exploration where collapse actually occurs in
this run. The skipper draws from its own seeded ``torch.Generator``, saved with the run state, so
a resumed run skips exactly what an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch

from verl_avspo.core import validation
from verl_avspo.core.prompt_history import PromptHistory
from verl_avspo.core.validation import Problems, given_settings

__all__ = [
    "PromptSkipConfig",
    "PromptSkipper",
    "SkipSpelling",
    "resolve_prompt_skip",
    "skip_problems",
]

# The two kinds of a collapsed visit, in the order of PromptSkipper.explore.
KINDS = ("all_correct", "all_wrong")


@dataclass(frozen=True)
class PromptSkipConfig:
    """Settings of the pre-rollout skip rule (:class:`PromptSkipper`)."""

    enable: bool = False
    """Skip prompts predicted to collapse. Off by default: it changes which prompts are trained on."""
    explore: float = 0.5
    """Starting exploration probability p (both kinds): a prompt with a streak of z collapsed visits is
    kept with probability p^z. 0.5 keeps half of the once-collapsed prompts, a quarter of the twice-collapsed."""
    adaptive: bool = True
    """Move each kind's p by ``explore_step`` per step toward its target share (GRESO's adaptive rule);
    false keeps p at ``explore``."""
    target_all_correct: float = 0.125
    """Share of a step's groups that may be all-correct before p(all_correct) goes down."""
    target_all_wrong: float = 0.125
    """Share of a step's groups that may be all-wrong before p(all_wrong) goes down (the two targets
    sum to 25% collapsed groups, the overall target GRESO reports)."""
    explore_step: float = 0.01
    """How much each p moves per step (adaptive only)."""
    explore_bounds: tuple[float, float] = (0.05, 1.0)
    """[low, high] for p; low > 0 keeps exploring every prompt."""
    seed: int = 0
    """Seed of the skipper's own random generator (saved and restored with the run state)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FIELDS = tuple(f.name for f in fields(PromptSkipConfig))


def resolve_prompt_skip(mapping: Mapping[str, Any] | None, section: str = "prompt_skip") -> PromptSkipConfig:
    """Validated settings from a mapping (a dict or OmegaConf; a key set to None means "not given").
    ``section`` is how the host's user spells the group (``algorithm.prompt_skip`` in verl, ...), so
    each message names the full key.

    Raises:
        SettingsError: every bad key at once, each with its value and what is allowed.
    """
    problems = Problems()
    given = given_settings(mapping, section, FIELDS, problems, example=f"{section}.enable=true")
    values = PromptSkipConfig().to_dict() | given
    check = problems.check

    def key(name: str) -> str:
        return f"{section}.{name}"

    check(validation.boolean, key("enable"), values["enable"])
    check(validation.boolean, key("adaptive"), values["adaptive"])
    explore = check(validation.number, key("explore"), values["explore"], 0.0, 1.0, low_open=True)
    for name in ("target_all_correct", "target_all_wrong"):
        check(validation.number, key(name), values[name], 0.0, 1.0)
    check(validation.number, key("explore_step"), values["explore_step"], 0.0, 1.0)
    check(validation.integer, key("seed"), values["seed"], 0)
    bounds = check(_explore_bounds, key("explore_bounds"), values["explore_bounds"])
    if explore is not None and bounds is not None and not bounds[0] <= explore <= bounds[1]:
        problems.messages.append(
            f"{key('explore')}={explore!r} is invalid: it must lie within {key('explore_bounds')}={list(bounds)}. "
            f"Set {key('explore')} between them."
        )
    problems.raise_any()
    return PromptSkipConfig(**{**values, "explore_bounds": tuple(float(b) for b in bounds)})


def _explore_bounds(key: str, value: Any) -> tuple[float, float]:
    low, high = validation.pair(key, value)
    if not 0.0 < low <= high <= 1.0:
        validation.fail(
            key, list(value), "expected [low, high] with 0 < low <= high <= 1 (low > 0 keeps every prompt explored)"
        )
    return low, high


@dataclass(frozen=True)
class SkipSpelling:
    """How a host's user spells the settings :func:`skip_problems` names (verl's ``key=value``, OpenRLHF's
    ``--flag value``)."""

    skip: str
    """The skip settings' group: ``algorithm.prompts.skip``, ``--prompts.skip``."""
    estimator: str
    """The advantage estimator's key: ``algorithm.adv_estimator``, ``--algo.advantage.estimator``."""
    group_size: str
    """The responses sampled per prompt: ``actor_rollout_ref.rollout.n``, ``--rollout.n_samples_per_prompt``."""
    group_estimators: str
    """The host's estimators that compare a prompt's responses, for the fix: ``grpo, avspo, rloo, ...``."""
    assign: str = "="
    """Between a key and its value: ``=``, or a space for command-line flags."""
    true: str = "True"
    false: str = "False"

    def setting(self, key: str, value: Any) -> str:
        return f"{key}{self.assign}{value}"


def skip_problems(spelling: SkipSpelling, estimator: str, compares_groups: bool, group_size: Any) -> list[str]:
    """Why the skip rule could never act in a run (empty when it can), each naming the setting, its value
    and the fix in the host's ``spelling``. The rule predicts a prompt's collapse from its earlier groups,
    so it needs an ``estimator`` that ``compares_groups`` (a prompt's responses against each other; without
    it no history is kept) and a ``group_size`` of at least 2 (a single response has no spread to lose,
    so no visit ever collapses)."""
    enabled = spelling.setting(f"{spelling.skip}.enable", spelling.true)
    disable = spelling.setting(f"{spelling.skip}.enable", spelling.false)
    if not compares_groups:
        return [
            f"{enabled} with {spelling.setting(spelling.estimator, estimator)}: the skip rule predicts a prompt's "
            f"collapse from its earlier groups, and {estimator} compares no groups of responses, so no history is "
            f"kept. Use a group estimator ({spelling.group_estimators}) or set {disable}."
        ]
    if isinstance(group_size, int) and not isinstance(group_size, bool) and group_size < 2:
        return [
            f"{enabled} with {spelling.setting(spelling.group_size, group_size)}: the skip rule predicts a prompt's "
            "collapse from its earlier groups, and a group of one response has no spread to lose, so no prompt "
            f"would ever be skipped. Set {spelling.setting(spelling.group_size, 8)} (the paper's group size) or "
            f"more, or set {disable}."
        ]
    return []


class PromptSkipper:
    """GRESO's pre-rollout skip decision (see the module docstring) with its own seeded generator.

    ``explore`` holds p for (all_correct, all_wrong); since the start of the run, ``rollouts_skipped``
    counts the rollouts skipping saved (skipped prompts whose place stayed empty) and ``reselected`` the
    skipped prompts the host replaced by another draw (``core.prompt_step.StepPrompts``).
    """

    def __init__(self, config: PromptSkipConfig):
        self.config = config
        self.generator = torch.Generator().manual_seed(config.seed)
        self.explore = np.full(2, config.explore, dtype=np.float64)
        self.rollouts_skipped = 0
        self.reselected = 0

    def keep_probability(self, keys: Any, history: PromptHistory) -> np.ndarray:
        """(n,) float64: p(kind of the latest visit) ** (collapse streak), 1 for streak 0."""
        records = history.lookup(keys)
        kind = np.where(records.last_pass_rate >= 0.5, 0, 1)  # NaN (unseen) has streak 0 anyway
        return np.where(records.collapse_streak > 0, self.explore[kind] ** records.collapse_streak, 1.0)

    def keep(self, keys: Any, history: PromptHistory) -> np.ndarray:
        """(n,) bool: roll out prompt ``keys[i]``. One uniform draw per key, from this skipper's generator."""
        probability = self.keep_probability(keys, history)
        draws = torch.rand(len(probability), generator=self.generator, dtype=torch.float64).numpy()
        return draws < probability

    def update(self, all_correct_share: float, all_wrong_share: float) -> None:
        """After a step: move each p toward its target (adaptive only); shares of the step's groups."""
        if not self.config.adaptive:
            return
        shares = np.array([all_correct_share, all_wrong_share])
        targets = np.array([self.config.target_all_correct, self.config.target_all_wrong])
        step = np.where(shares > targets, -self.config.explore_step, self.config.explore_step)
        self.explore = np.clip(self.explore + step, *self.config.explore_bounds)

    def metrics(self) -> dict[str, float]:
        return {f"prompts/explore_{kind}": float(p) for kind, p in zip(KINDS, self.explore, strict=True)}

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "explore": torch.from_numpy(self.explore.copy()),
            "rollouts_skipped": self.rollouts_skipped,
            "reselected": self.reselected,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.explore = state["explore"].numpy().astype(np.float64).copy()
        self.rollouts_skipped = int(state["rollouts_skipped"])
        self.reselected = int(state.get("reselected", 0))  # a state saved before re-selections were counted
