"""What a run's log says about collapse, from whatever metrics it holds
(docs/diagnostics.md#what-the-report-reads-collapse-from): ``verl-avspo report`` and ``verl-avspo table``
read it from :func:`collapse_rate`.

Sources, preferred first:

- ``acr/rate`` (ours: the fraction of groups whose scores are all equal, split by ``acr/all_correct`` and
  ``acr/all_wrong``);
- Tinker's ``env/all/by_group/frac_all_good`` and ``frac_all_bad`` (the groups whose rewards are all equal,
  at a good or a bad reward: the same split), or ``1 - frac_mixed``;
- TRL's ``frac_reward_zero_std``;
- counts of groups: ``skipped_groups`` (or ``filtered_``, ``zero_std_``) over ``n_groups`` (or ``num_``,
  ``total_``);
- a step whose reward spread is 0 (TRL's ``reward_std``, OpenRLHF's ``group_reward_std``): every group of
  that step collapsed, so 1 there and 0 elsewhere is a lower bound on ACR per step;
- verl's ``critic/score/max == critic/score/min`` (the same lower bound, split by the value), unless the run
  used DAPO's dynamic sampling (``train/num_gen_batches``): its scores are logged after the filter drops the
  collapsed groups, and a step that generated more than one batch is the evidence of collapse left;
- last, in a custom loop's log (no framework's metrics, :func:`~verl_avspo.tools.hosts.framework_of`), a
  mean reward (:func:`~verl_avspo.tools.stats.score_column`) that stays within [0, 1] and is 0 or 1 on a
  step: every completion of that step scored the same, every group collapsed (all wrong at 0, all correct
  at 1; the same lower bound); and a policy loss exactly 0 on a step after the first, where a zero loss is
  exceptional in that log (:func:`_zero_loss`): every advantage of the step was 0. Such a log has no better
  measure; a framework's log has its own above (TRL's loss is about 0 on every step by construction with
  one iteration and no KL term, and 0 on its first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from verl_avspo.tools.hosts import framework_of
from verl_avspo.tools.stats import score_column

__all__ = ["KINDS", "SPREADS", "ZERO", "CollapseRate", "collapse_rate"]

ZERO = 1e-8  # a reward spread this small is none (TRL's own tolerance for frac_reward_zero_std)
# Reward spreads that are 0 only when every group of the step is collapsed.
SPREADS = ("reward_std", "train/reward_std", "group_reward_std", "train/group_reward_std")
_TINKER = re.compile(r"^(?P<prefix>.*)by_group/frac_(?P<part>all_good|all_bad|mixed)$")
_SKIPPED = re.compile(r"^(?P<prefix>.*?)(?:n_|num_)?(?:skipped|filtered|zero_std|zero_adv|degenerate)_groups$")
_GROUPS = ("n_groups", "num_groups", "total_groups", "groups")
_REGENERATED = ("train/num_gen_batches", "num_gen_batches")
# A custom loop's policy loss (under a framework's names the log is that framework's, with its own
# measure), and how far from 0 its values must stay for an exact 0 to be exceptional: 100 times the
# 4-decimal rounding the Hugging Face Trainer logs a loss with.
_LOSSES = ("loss", "pg_loss")
_CLEAR_LOSS = 0.01
# What each kind of source measures: ``rate``, the fraction of groups per step; ``every_group``, 1 at
# the steps where every group collapsed (a lower bound on ACR per step); ``regenerated``, 1 at the steps
# where DAPO's filter had to generate again (collapse evidence, no rate).
KINDS = ("rate", "every_group", "regenerated")


@dataclass
class CollapseRate:
    """A run's collapse per logged step, and what it is: ``source`` names the metric, ``what`` says in a
    few words what its values mean, ``kind`` which of :data:`KINDS` it is. ``all_correct`` and
    ``all_wrong`` split it where the log tells them apart; ``columns`` are the log's keys it was read from."""

    rate: pd.Series
    source: str
    what: str
    kind: str = "rate"
    all_correct: pd.Series | None = None
    all_wrong: pd.Series | None = None
    columns: tuple[str, ...] = ()

    @property
    def lower_bound(self) -> bool:
        """Whether the measure only sees steps where every group collapsed (or, DAPO's, where collapse made
        it generate again): not a fraction of groups."""
        return self.kind != "rate"


def _trl_release(frame: pd.DataFrame) -> str | None:
    """``older`` for a TRL log of the releases before ``completions/*`` (``completion_length``, per-function
    ``rewards/<name>``, ``reward_std`` the mean of the per-group stds), ``recent`` for later ones
    (``completions/mean_length``, ``rewards/<name>/mean``, ``reward_std`` the std of the whole batch),
    None when the log does not say."""
    columns = {str(column).removeprefix("train/") for column in frame}
    if "completions/mean_length" in columns or any(c.startswith("rewards/") and c.endswith("/mean") for c in columns):
        return "recent"
    if "completion_length" in columns:
        return "older"
    return None


def _tinker(frame: pd.DataFrame, has) -> CollapseRate | None:
    """Tinker's group fractions, those of ``env/all/`` preferred over a tag's."""
    prefixes: dict[str, dict[str, str]] = {}
    for column in frame:
        if (match := _TINKER.match(str(column))) is not None and has(column):
            prefixes.setdefault(match["prefix"], {})[match["part"]] = column
    if not prefixes:
        return None
    prefix = next((p for p in prefixes if p.endswith("all/")), min(prefixes, key=len))
    parts = prefixes[prefix]
    good = frame[parts["all_good"]] if "all_good" in parts else None
    bad = frame[parts["all_bad"]] if "all_bad" in parts else None
    if good is not None and bad is not None:
        rate = good + bad
    elif "mixed" in parts:
        rate = 1 - frame[parts["mixed"]]
    else:
        return None
    return CollapseRate(
        rate,
        f"{prefix}by_group/frac_all_good + frac_all_bad",
        "Tinker's fractions of groups whose rewards are all equal, at a good reward (all correct) or a bad one",
        all_correct=good,
        all_wrong=bad,
        columns=tuple(parts.values()),
    )


def _group_counts(frame: pd.DataFrame, has) -> CollapseRate | None:
    """A count of skipped (filtered, zero-std) groups over the count of groups."""
    for column in frame:
        match = _SKIPPED.match(str(column))
        if match is None or not has(column):
            continue
        total = next((match["prefix"] + name for name in _GROUPS if has(match["prefix"] + name)), None)
        if total is None:
            continue
        rate = (frame[column] / frame[total].where(frame[total] > 0)).clip(0, 1)
        return CollapseRate(
            rate,
            f"{column} / {total}",
            "the share of groups skipped as collapsed (zero reward spread) per step",
            columns=(column, total),
        )
    return None


def collapse_rate(frame: pd.DataFrame, usable: set[str] | None = None) -> CollapseRate | None:
    """The run's collapse from the first source the log holds (the module's docstring lists them),
    among columns in ``usable`` when given (a rate column with values outside [0, 1] is not); None
    when the log holds none."""

    def has(column: str) -> bool:
        return column in frame and frame[column].notna().any() and (usable is None or column in usable)

    if has("acr/rate"):
        split = {k: frame[f"acr/{k}"] for k in ("all_correct", "all_wrong") if has(f"acr/{k}")}
        return CollapseRate(
            frame["acr/rate"],
            "acr/rate",
            "the fraction of groups whose scores are all equal",
            columns=("acr/rate", *(f"acr/{k}" for k in split)),
            **split,
        )
    if (found := _tinker(frame, has)) is not None:
        return found
    if has("frac_reward_zero_std"):
        return CollapseRate(
            frame["frac_reward_zero_std"],
            "frac_reward_zero_std",
            "TRL's fraction of completions whose reward std is 0 (ACR with scale_rewards 'group' or 'none')",
            columns=("frac_reward_zero_std",),
        )
    if (found := _group_counts(frame, has)) is not None:
        return found
    spread = next((column for column in SPREADS if has(column)), None)
    if spread is not None:
        meaning = (
            "OpenRLHF's mean of per-group reward stds"
            if spread.endswith("group_reward_std")
            else {
                "older": "older TRL's mean of per-group reward stds",
                "recent": "TRL's std of the batch's rewards",
                None: "TRL's reward_std (the mean of per-group stds before TRL's completions/* metrics, the batch's "
                "std after)",
            }[_trl_release(frame)]
        )
        values = frame[spread].dropna()
        equal = values.abs() <= ZERO
        reward = next((c for c in ("reward", "train/reward") if c in frame), None)
        return CollapseRate(
            equal.astype(float),
            f"{spread} == 0",
            f"steps where {meaning} is 0, i.e. every group collapsed (a lower bound on ACR per step)",
            kind="every_group",
            all_wrong=None
            if reward is None
            else (equal & (frame[reward].reindex(values.index).abs() <= ZERO)).astype(float),
            columns=(spread,) + ((reward,) if reward else ()),
        )
    regenerated = next((column for column in _REGENERATED if has(column)), None)
    if regenerated is not None:
        batches = frame[regenerated].dropna()
        return CollapseRate(
            (batches > 1).astype(float),
            f"{regenerated} > 1",
            "steps where DAPO's dynamic sampling had to generate again because the filter dropped collapsed groups "
            "(its scores are logged after the filter, so the collapse rate itself is not in the log)",
            kind="regenerated",
            columns=(regenerated,),
        )
    if has("critic/score/max") and has("critic/score/min"):
        scores = frame[["critic/score/max", "critic/score/min"]].dropna()
        equal = (scores["critic/score/max"] - scores["critic/score/min"]).abs() <= ZERO
        value = scores["critic/score/max"]
        return CollapseRate(
            equal.astype(float),
            "critic/score/max == critic/score/min",
            "steps where every response scored the same, i.e. every group collapsed (a lower bound on ACR per step)",
            kind="every_group",
            all_correct=(equal & (value >= 1 - ZERO)).astype(float),
            all_wrong=(equal & (value <= ZERO)).astype(float),
            columns=("critic/score/max", "critic/score/min"),
        )
    return _custom_loop(frame, has) if framework_of(frame) == "other" else None


def _zero_loss(frame: pd.DataFrame, has) -> pd.Series | None:
    """The rows of a custom loop's log whose policy loss (:data:`_LOSSES`) is exactly 0, where that is
    exceptional in the log, else None. A step whose advantages are all 0 (every group collapsed) has a
    policy-gradient loss of exactly 0; a loss that is about 0 on every step by construction (a group-mean
    loss on-policy with no KL term) or that passes near 0 (a KL term growing from 0) is no such evidence.
    So a zero counts only where the log's other values stay clear of 0: 5 rows or more, and 95% of them,
    at :data:`_CLEAR_LOSS` or more in absolute value (an exact 0 among them is then not a small loss
    rounded). The first row never counts (its ratio is 1 and its KL 0 in any loop)."""
    column = next((name for name in _LOSSES if has(name)), None)
    if column is None:
        return None
    loss = frame[column].dropna()
    zero = (loss.abs() <= ZERO) & (loss.index != loss.index[0])
    clear = loss[~zero].iloc[1:].abs() >= _CLEAR_LOSS
    if not zero.any() or clear.sum() < 5 or clear.mean() < 0.95:
        return None
    return zero.rename(column)


def _custom_loop(frame: pd.DataFrame, has) -> CollapseRate | None:
    """A custom loop's whole-step collapse: its mean reward at 0 or 1 (where it stays within [0, 1]) or its
    policy loss exactly 0 (:func:`_zero_loss`); split into all correct and all wrong where the reward tells
    them apart on every step counted."""
    score = score_column(frame)
    reward = frame[score].dropna() if score is not None and has(score) else pd.Series(dtype=float)
    if len(reward) and (reward.min() < 0 or reward.max() > 1):
        reward = pd.Series(dtype=float)  # not a share of completions scored right: at 0 or 1 says nothing
    zero_loss = _zero_loss(frame, has)
    if reward.empty and zero_loss is None:
        return None
    rows = reward.index if zero_loss is None else reward.index.union(zero_loss.index)
    wrong = (reward <= ZERO).reindex(rows, fill_value=False)
    correct = (reward >= 1 - ZERO).reindex(rows, fill_value=False)
    lost = pd.Series(False, index=rows) if zero_loss is None else zero_loss.reindex(rows, fill_value=False)
    split = len(reward) > 0 and not (lost & ~(wrong | correct)).any()
    sources, meanings = [], []
    if len(reward):
        sources.append(f"{score} at 0 or 1")
        meanings.append(
            "whose mean reward, between 0 and 1 on every step, is 0 or 1: every completion scored the same (all "
            "wrong at 0, all correct at 1)"
        )
    if zero_loss is not None:
        sources.append(f"{zero_loss.name} == 0")
        meanings.append(f"whose {zero_loss.name} is exactly 0, its other values clear of 0 (every advantage was 0)")
    return CollapseRate(
        (wrong | correct | lost).astype(float),
        ", or ".join(sources),
        f"steps {', or '.join(meanings)}: every group collapsed (a lower bound on ACR per step"
        + ("" if split or reward.empty else "; all correct and all wrong not told apart where only the loss shows it")
        + ")",
        kind="every_group",
        all_correct=correct.astype(float) if split else None,
        all_wrong=wrong.astype(float) if split else None,
        columns=((score,) if len(reward) else ()) + (() if zero_loss is None else (zero_loss.name,)),
    )
