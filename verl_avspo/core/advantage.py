"""The AVSPO outcome advantage (docs/method.md §3, step 6).

Framework-free: this is the estimator itself; ``verl_avspo.verl_plugin.register`` only adapts it to verl's
registry. Groups that AVSPO does not augment get exactly verl's GRPO advantage (singletons
included: mean 0, std 1); augmented groups are normalised with the mean and unbiased std of their
n real plus K virtual rewards. Only real samples get advantages.

``strategy: beta`` replaces the virtual samples by Beta-prior pseudo-counts in every group, with a
posterior-mean baseline (``verl_avspo.core.prior``, docs/method.md §6).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from verl_avspo.core.collapse import FINITE_REWARD_FIX, Collapse, GroupStats, Measurement, measure, non_finite_problem
from verl_avspo.core.config import ACRConfig, AVSPOConfig
from verl_avspo.core.controller import AdaptiveController, Decision
from verl_avspo.core.prior import BetaPrior, beta_baseline, beta_prior
from verl_avspo.core.virtual import virtual_counts, virtual_rewards

__all__ = ["AdvantageOutput", "response_scores", "token_advantages", "compute_avspo_outcome_advantage"]


@dataclass(frozen=True)
class AdvantageOutput:
    advantages: torch.Tensor  # (bs, L), masked by response_mask
    scalar_advantages: torch.Tensor  # (bs,)
    stats: GroupStats
    collapse: Collapse
    decision: Decision
    augmented: torch.Tensor  # (num_groups,) bool; for strategy beta, the collapsed groups given a signal
    virtual_k: torch.Tensor  # (num_groups,) int64, 0 where not augmented (always 0 for strategy beta)
    metrics: dict[str, float]  # the estimator's own avspo/* (acr/* are the step owner's: core.run_tracker)
    measurement: Measurement  # this batch's raw measurement (the host's, when it measured this very batch)


def _shape(value: Any) -> Any:
    return tuple(value.shape) if hasattr(value, "shape") else type(value).__name__


def response_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any) -> torch.Tensor:
    """Per-response scores (bs,) = token rewards summed, after checking shapes and finiteness.

    Raises:
        ValueError: wrong shapes, a missing index, or NaN/inf scores (with counts and uids).
    """
    if not isinstance(token_level_rewards, torch.Tensor) or token_level_rewards.dim() != 2:
        raise ValueError(
            f"token_level_rewards must be a (batch, response_length) tensor, got {_shape(token_level_rewards)}"
        )
    if not isinstance(response_mask, torch.Tensor) or response_mask.shape != token_level_rewards.shape:
        raise ValueError(
            f"response_mask shape {_shape(response_mask)} does not match token_level_rewards shape "
            f"{tuple(token_level_rewards.shape)}; both must be (batch, response_length)"
        )
    if token_level_rewards.shape[0] == 0:
        raise ValueError("the batch is empty: there are no responses to compute advantages for")
    if index is None:
        raise ValueError(
            "index is missing: AVSPO and DCPO group responses by prompt and need verl's non_tensor_batch['uid'] "
            "(one id per response, shared by the responses of one prompt)."
        )
    if len(index) != token_level_rewards.shape[0]:
        raise ValueError(
            f"index has {len(index)} entries but the batch has {token_level_rewards.shape[0]} responses; "
            "pass one group id per response"
        )
    scores = token_level_rewards.sum(dim=-1)
    problem = non_finite_problem(scores, index)
    if problem:
        raise ValueError(f"{problem}. {FINITE_REWARD_FIX}")
    return scores


def token_advantages(scalar: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each response's scalar advantage (bs,) on its response tokens -> (bs, L).

    Same values as ``scalar.unsqueeze(-1) * response_mask``, but on CPU that mixed-dtype multiply
    first copies verl's int64 mask into a float temporary: this form saves a (bs, L) pass and
    halves the peak memory (benchmarks/bench_advantage.py).
    """
    return response_mask.to(torch.result_type(scalar, response_mask), copy=True).mul_(scalar.unsqueeze(-1))


def compute_avspo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    config: AVSPOConfig,
    acr: ACRConfig,
    controller: AdaptiveController,
    norm_adv_by_std: bool = True,
    measured: Measurement | None = None,
    acr_section: str = "acr",
) -> AdvantageOutput:
    """AVSPO advantage for outcome rewards. Advances ``controller`` by one step.

    Args:
        token_level_rewards: (bs, L) token rewards; a response's score is their sum.
        response_mask: (bs, L) 1 for response tokens.
        index: (bs,) group labels (verl's uid array, strings or ints).
        config: resolved AVSPO settings.
        acr: resolved ACR settings: ``tau`` detects collapse, ``reward_range`` splits all-correct
            from all-wrong and bounds the virtual values.
        controller: the run's adaptive controller, built with ``config`` and ``acr`` (holds θ, the EMA,
            J_{t-1}, the RNG).
        norm_adv_by_std: divide by the group std (GRPO); False gives Dr. GRPO's A = r − μ'.
        measured: the step's raw measurement, made by the host before this call: its ACR and mean
            score J_t drive the controller, and its group statistics are reused when it is this very
            batch. None: this batch is the step's measurement.
        acr_section: how the host's user names ACR's settings (``algorithm.acr`` in verl), for the warning
            about scores outside ``reward_range``.

    Returns:
        AdvantageOutput with ``advantages`` (bs, L) and the step's metrics.
    """
    scores = response_scores(token_level_rewards, response_mask, index)
    lo, hi = acr.reward_range
    own = measured if measured is not None and measured.same_batch(scores, index) else None
    own = own or measure(scores, index, acr.tau, acr.reward_range)
    step = measured or own
    stats, collapse = own.stats, own.collapse
    batch_low, batch_high = torch.stack([stats.min.min(), stats.max.max()]).tolist()
    if batch_low < lo or batch_high > hi:
        warnings.warn(
            f"response scores fall outside {acr_section}.reward_range=[{lo}, {hi}]; the all-correct/all-wrong "
            "split and the virtual rewards assume that range. Set reward_range to your verifier's [low, high].",
            stacklevel=2,
        )
    decision = controller.observe(step.collapse.rate, step.mean_score)
    if config.strategy == "beta":
        scalar, augmented, prior = _beta_advantages(scores, stats, collapse, config, acr.reward_range, norm_adv_by_std)
        virtual_k = torch.zeros_like(stats.count)
        extra = {"avspo/prior_strength": prior.strength, "avspo/prior_mean": prior.mean}
    else:
        # trigger_scope=batch: the released code's rule, only when the whole batch is at one end.
        in_scope = config.trigger_scope == "group" or _batch_at_one_end(batch_low, batch_high, acr)
        scalar, augmented, virtual_k = _virtual_sample_advantages(
            scores, stats, collapse, decision, in_scope, config, acr.reward_range, controller, norm_adv_by_std
        )
        extra = {}
    advantages = token_advantages(scalar, response_mask)

    num_augmented = int(augmented.sum())
    metrics = {
        "avspo/threshold": decision.threshold,
        "avspo/signal": decision.signal,
        "avspo/triggered": num_augmented / max(collapse.num_eligible, 1),
        "avspo/virtual_k": float(virtual_k.sum()) / num_augmented if num_augmented else 0.0,
        **extra,
    }
    return AdvantageOutput(advantages, scalar, stats, collapse, decision, augmented, virtual_k, metrics, own)


def _batch_at_one_end(batch_low: float, batch_high: float, acr: ACRConfig) -> bool:
    """Whether every score of the batch is at ``reward_range``'s low end, or every one at its high
    end (within ``tau``): the released code's condition, all 0 or all 1 with the default range."""
    lo, hi = acr.reward_range
    same = batch_high - batch_low < acr.tau
    return same and (abs(batch_low - lo) < acr.tau or abs(batch_high - hi) < acr.tau)


def _virtual_sample_advantages(
    scores: torch.Tensor,
    stats: GroupStats,
    collapse: Collapse,
    decision: Decision,
    in_scope: bool,
    config: AVSPOConfig,
    reward_range: tuple[float, float],
    controller: AdaptiveController,
    norm_adv_by_std: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The paper's construction: (bs,) advantages in the scores' dtype, (num_groups,) augmented and K.
    ``in_scope`` False (``trigger_scope: batch`` on a batch not all at one end) augments nothing."""
    ids = stats.ids
    # verl's GRPO statistics: singletons get mean 0 and std 1.
    single = stats.count < 2
    mean = torch.where(single, 0.0, stats.mean)
    std = torch.where(single, 1.0, stats.std_unbiased)

    eligible_kind = {
        "both": collapse.collapsed,
        "all_correct": collapse.all_correct,
        "all_wrong": collapse.all_wrong,
        "none": torch.zeros_like(collapse.collapsed),
    }[config.apply_to]
    augmented = eligible_kind & (decision.triggered and in_scope)
    virtual_k = torch.zeros_like(stats.count)
    groups = augmented.nonzero().squeeze(1)
    if groups.numel():
        n = stats.count[groups]
        k = virtual_counts(n, config.k, decision.signal, config.alpha, config.strategy)
        values, valid = virtual_rewards(
            config.strategy,
            stats.mean[groups],
            collapse.all_correct[groups],
            k,
            reward_range,
            config.gap,
            controller.generator,
        )
        real_n, size = n.to(torch.float64), (n + k).to(torch.float64)
        real_mean = stats.mean[groups]
        joint_mean = (real_n * real_mean + values.sum(dim=1)) / size
        # Exact sum of squares of the n real and K virtual values around the joint mean.
        real_sq = stats.sq_dev[groups] + real_n * (real_mean - joint_mean) ** 2
        virtual_sq = torch.where(valid, values - joint_mean.unsqueeze(1), 0.0).pow(2).sum(dim=1)
        mean = mean.index_copy(0, groups, joint_mean)
        std = std.index_copy(0, groups, ((real_sq + virtual_sq) / (size - 1)).sqrt())
        virtual_k = virtual_k.index_copy(0, groups, k)

    centred = scores.to(torch.float64) - mean[ids]
    scalar = centred / (std[ids] + config.epsilon) if norm_adv_by_std else centred
    return scalar.to(scores.dtype), augmented, virtual_k


def _beta_advantages(
    scores: torch.Tensor,
    stats: GroupStats,
    collapse: Collapse,
    config: AVSPOConfig,
    reward_range: tuple[float, float],
    norm_adv_by_std: bool,
) -> tuple[torch.Tensor, torch.Tensor, BetaPrior]:
    """``strategy: beta``: A_i = (x_i − b_i)/(sqrt(b_i (1 − b_i)) + ε) for every response, with x the
    reward mapped to [0, 1] and b_i the posterior-mean baseline; without std normalisation
    A_i = R·(x_i − b_i), in reward units. Collapsed all-correct groups are scaled by ``correct_weight``.

    Returns (bs,) advantages in the scores' dtype, the (num_groups,) collapsed groups given a
    non-zero advantage, and the prior used.
    """
    lo, hi = reward_range
    # Clipped so that scores outside reward_range (already warned about) keep the posterior proper.
    x = ((scores.to(torch.float64) - lo) / (hi - lo)).clamp(0.0, 1.0)
    successes = torch.zeros_like(stats.mean).index_add_(0, stats.ids, x)
    prior = beta_prior(config.prior, successes, stats.count, config.prior_strength_max)
    baseline, scale = beta_baseline(x, stats.ids, successes, stats.count, prior, config.baseline)
    centred = x - baseline
    scalar = centred / (scale + config.epsilon) if norm_adv_by_std else (hi - lo) * centred
    weight = torch.where(collapse.all_correct, config.correct_weight, 1.0).to(torch.float64)
    scalar = scalar * weight[stats.ids]
    augmented = collapse.collapsed & (weight > 0)
    return scalar.to(scores.dtype), augmented, prior
