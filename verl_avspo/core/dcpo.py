"""DCPO's two changes to GRPO (Yang et al., "DCPO: Dynamic Clipping Policy Optimization",
arXiv 2509.02333), as framework-free math (torch only).

**Smooth advantage standardization (SAS).** GRPO standardizes a response's reward against its own
group only, so a group whose G rewards are equal gets zero advantages. DCPO also keeps, per prompt,
the mean and std of *every* reward the prompt has received so far (all i·G responses of its i
visits, the current one included) and blends the two standardized advantages. For response j of
a prompt on its i-th visit, with R its reward::

    Â_new   = (R - μ_new) / (σ_new + ε)          # this step's group, as GRPO
    Â_total = (R - μ_total) / (σ_total + ε)      # every response of the prompt so far
    SA_new   = (i-1)/i · Â_new + 1/i · Â_total
    SA_total = 1/i · Â_new + (i-1)/i · Â_total
    A = SA_new if |SA_new| < |SA_total| else SA_total

On a first visit (i = 1) the totals are the group's own statistics, so A is GRPO's advantage and a
collapsed group still gets zero. Later, a collapsed group (Â_new = 0) gets A = Â_total / i
(i > 2) or Â_total / 2 (i = 2): non-zero whenever the prompt's earlier rewards differed.

Choices where the paper leaves room, all matching its released code unless stated:

- σ is the Bessel-corrected (unbiased) std, as verl's GRPO (``torch.std``), both for the group and
  for the cumulative totals; the totals are exact over all responses (a Chan/Welford merge of
  count, mean and sum of squared deviations), not an average of per-step stds (ours).
- ε = 1e-6 is added to σ as verl's GRPO does; ``epsilon=0`` gives the released code's rule (divide
  only when σ > 0). Both give 0 for a collapsed group.
- A tie ``|SA_new| == |SA_total|`` takes SA_total, as the released code does.
- If one step holds several groups of the same prompt (the released code cannot), they are all
  merged into the totals first and each counts as a visit: i = earlier visits + this step's groups.
- A group of one response has no group baseline: Â_new = 0 (verl's GRPO would return its raw
  score), so only the prompt's history can give it an advantage.

**Dynamic-adaptive clipping.** PPO keeps the ratio r = p/q (new over old token probability) in a
fixed [1-ε_low, 1+ε_high]. DCPO bounds the change of the *probability* instead, ``|r - 1| · p <=
ε``, i.e. ``|r - 1| · r · q <= ε``, which allows rare tokens (small q) a wider ratio range::

    low  = 0.5 + 0.5 · sqrt(max(1 - 4 ε_low / q, 0))
    high = min(0.5 + 0.5 · sqrt(1 + 4 ε_high / q), r_max)       # r_max = 10 in the paper

At q = 1 these are the roots of r(1 - r) = ε_low and r(r - 1) = ε_high; as q -> 0 the lower bound
falls to 0.5 and the upper one rises to r_max. The token loss is PPO's with these bounds,
``max(-A·r, -A·clip(r, low, high))``. (The released code also applies dual-clip at 10 to tokens with
A < 0; that is left to the caller, e.g. verl's ``clip_ratio_c``.)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from verl_avspo.core.collapse import group_ids, group_stats

logger = logging.getLogger(__name__)

__all__ = [
    "MissingPromptIdentity",
    "PromptRewardHistory",
    "batch_advantages",
    "smooth_advantages",
    "dynamic_clip_bounds",
    "dynamic_clip_token_losses",
]


class MissingPromptIdentity(ValueError):
    """DCPO asked for advantages of groups whose prompt keys the host never passed; a host adds how
    its users get them passed."""


def smooth_advantages(adv_new: torch.Tensor, adv_total: torch.Tensor, visits: torch.Tensor) -> torch.Tensor:
    """SAS's blend of the two standardized advantages, all (N,), ``visits`` i >= 1 per sample."""
    weight_old = (visits - 1).to(adv_new.dtype) / visits.to(adv_new.dtype)
    sa_new = weight_old * adv_new + (1 - weight_old) * adv_total
    sa_total = (1 - weight_old) * adv_new + weight_old * adv_total
    return torch.where(sa_new.abs() < sa_total.abs(), sa_new, sa_total)


def _nonzero(denominator: torch.Tensor) -> torch.Tensor:
    """A zero std only occurs with zero deviations (epsilon=0, equal rewards): divide those by 1 to get 0."""
    return torch.where(denominator > 0, denominator, 1.0)


def _prompt_codes(keys: list) -> tuple[torch.Tensor, list]:
    """(N,) int64 code of each key in order of first appearance, and the distinct keys."""
    code = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    return torch.tensor(list(map(code.__getitem__, keys)), dtype=torch.long), list(code)


class PromptRewardHistory:
    """Per-prompt running reward statistics across visits, and DCPO's SAS advantages.

    State per prompt: number of visits, number of rewards seen, their mean and sum of squared
    deviations from it (float64). ``state_dict`` returns plain Python lists and tensors;
    ``load_state_dict`` restores them bit-exactly.

    Args:
        epsilon: added to both stds before dividing (verl's GRPO uses 1e-6).
        norm_adv_by_std: False standardizes by the mean only (Dr. GRPO style), as verl's
            ``norm_adv_by_std_in_grpo=False``.
    """

    def __init__(self, epsilon: float = 1e-6, norm_adv_by_std: bool = True):
        if not epsilon >= 0:
            raise ValueError(f"DCPO epsilon={epsilon!r}: must be a number >= 0 (verl's GRPO uses 1e-6)")
        self.epsilon = float(epsilon)
        self.norm_adv_by_std = bool(norm_adv_by_std)
        self._rows: dict[Any, int] = {}
        self._visits = torch.zeros(0, dtype=torch.long)
        self._count = torch.zeros(0, dtype=torch.float64)
        self._mean = torch.zeros(0, dtype=torch.float64)
        self._sq_dev = torch.zeros(0, dtype=torch.float64)

    def __len__(self) -> int:
        """Number of distinct prompts seen."""
        return len(self._rows)

    def stats(self, key: Any) -> dict[str, float]:
        """``{"visits", "count", "mean", "std"}`` of one prompt (std unbiased; NaN below 2 rewards)."""
        if key not in self._rows:
            raise KeyError(f"prompt {key!r} has not been seen by this DCPO history ({len(self)} prompts seen)")
        row = self._rows[key]
        count = float(self._count[row])
        std = float((self._sq_dev[row] / (count - 1)).sqrt()) if count > 1 else float("nan")
        return {"visits": int(self._visits[row]), "count": count, "mean": float(self._mean[row]), "std": std}

    def _rows_for(self, keys: list) -> torch.Tensor:
        """Row of each key, appending zeroed rows for new prompts."""
        rows = [self._rows.setdefault(key, len(self._rows)) for key in keys]
        grow = len(self._rows) - self._visits.numel()
        if grow:
            self._visits = torch.cat([self._visits, torch.zeros(grow, dtype=torch.long)])
            self._count, self._mean, self._sq_dev = (
                torch.cat([t, torch.zeros(grow, dtype=torch.float64)]) for t in (self._count, self._mean, self._sq_dev)
            )
        return torch.tensor(rows, dtype=torch.long)

    def advantages(self, scores: torch.Tensor, prompt_keys: Sequence[Any] | torch.Tensor, index: Any) -> torch.Tensor:
        """Add this step's rewards to the history and return the SAS advantages.

        Args:
            scores: (N,) outcome reward per response.
            prompt_keys: (N,) stable identity of each response's prompt across steps (a dataset
                index, a hash of the prompt); hashable Python values or an integer tensor.
            index: (N,) group label of each response this step (verl's ``uid``); every response of
                a group must have the same prompt key.

        Returns:
            (N,) scalar advantages, in ``scores``' dtype (float32 if it is not floating point).
        """
        scores = scores.reshape(-1)
        # Plain Python keys (ints for a tensor) survive a state_dict round trip unchanged.
        keys = prompt_keys.reshape(-1).tolist() if isinstance(prompt_keys, torch.Tensor) else list(prompt_keys)
        if len(keys) != scores.numel():
            raise ValueError(
                f"DCPO prompt_keys has {len(keys)} entries but scores has {scores.numel()}: give one prompt key "
                "per response (for verl, the dataset row's extra_info.index repeated rollout.n times)"
            )
        ids, num_groups = group_ids(index, device=scores.device)
        if ids.numel() != scores.numel():
            raise ValueError(f"DCPO index has {ids.numel()} entries but scores has {scores.numel()}: one per response")
        prompt_codes, distinct_keys = _prompt_codes(keys)
        prompt_codes, num_prompts = prompt_codes.to(scores.device), len(distinct_keys)
        positions = torch.arange(scores.numel(), device=scores.device)
        first_of_group = torch.full((num_groups,), scores.numel(), device=scores.device)
        first_of_group = first_of_group.scatter_reduce(0, ids, positions, reduce="amin")
        group_prompt = prompt_codes[first_of_group]
        if not torch.equal(group_prompt[ids], prompt_codes):
            bad = int(torch.nonzero(group_prompt[ids] != prompt_codes)[0])
            raise ValueError(
                f"DCPO: response {bad} has prompt key {keys[bad]!r} but the first response of its group has "
                f"{keys[int(first_of_group[ids[bad]])]!r}; all responses of one group (one uid) must share one "
                "prompt key"
            )

        # This step's statistics per group (the GRPO part) and per prompt (merged into the totals).
        group = group_stats(scores, ids, num_groups)
        step = group_stats(scores, prompt_codes, num_prompts)
        rows = self._rows_for(distinct_keys)
        groups_per_prompt = torch.bincount(group_prompt.cpu(), minlength=num_prompts)

        # Chan et al.'s merge of (count, mean, sum of squared deviations): exact for any split,
        # and a prompt whose rewards are all equal keeps a sum of exactly zero.
        count_old, mean_old, sq_old = self._count[rows], self._mean[rows], self._sq_dev[rows]
        count_step = step.count.cpu().to(torch.float64)
        count = count_old + count_step
        share = count_step / count
        delta = step.mean.cpu() - mean_old
        mean = mean_old + delta * share
        sq_dev = sq_old + step.sq_dev.cpu() + delta * delta * count_old * share
        self._count[rows], self._mean[rows], self._sq_dev[rows] = count, mean, sq_dev
        self._visits[rows] += groups_per_prompt
        visits = self._visits[rows].to(scores.device)

        x = scores.detach().to(torch.float64)
        adv_new = x - group.mean[ids]
        adv_total = x - mean.to(scores.device)[prompt_codes]
        if self.norm_adv_by_std:
            # A single reward has no spread: its deviation from itself is 0 and the std is not needed.
            group_std = torch.nan_to_num(group.std_unbiased, nan=1.0)
            total_std = (sq_dev / (count - 1).clamp(min=1)).sqrt().to(scores.device)
            adv_new = adv_new / _nonzero(group_std[ids] + self.epsilon)
            adv_total = adv_total / _nonzero(total_std[prompt_codes] + self.epsilon)
        out_dtype = scores.dtype if scores.dtype.is_floating_point else torch.float32
        return smooth_advantages(adv_new, adv_total, visits[prompt_codes]).to(out_dtype)

    def state_dict(self) -> dict[str, Any]:
        """Plain Python and tensors (``torch.save``-able); copies, so later steps do not alter it."""
        return {
            "keys": list(self._rows),
            "visits": self._visits.clone(),
            "count": self._count.clone(),
            "mean": self._mean.clone(),
            "sq_dev": self._sq_dev.clone(),
            "epsilon": self.epsilon,
            "norm_by_std": self.norm_adv_by_std,  # the key checkpoints have always had
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()``'s statistics bit-exactly (they replace the whole history);
        ``epsilon`` and ``norm_adv_by_std`` stay this history's, with a warning if the saved ones differ."""
        missing = {"keys", "visits", "count", "mean", "sq_dev"} - set(state)
        if missing:
            raise ValueError(
                f"DCPO state is missing {sorted(missing)}: load a dict saved by PromptRewardHistory.state_dict()"
            )
        keys = list(state["keys"])
        tensors = [torch.as_tensor(state[name]) for name in ("visits", "count", "mean", "sq_dev")]
        if any(t.shape != (len(keys),) for t in tensors):
            raise ValueError(
                f"DCPO state: {len(keys)} keys but tensors of shapes {[tuple(t.shape) for t in tensors]}; "
                "the checkpoint is corrupt or not from PromptRewardHistory.state_dict()"
            )
        self._rows = {key: row for row, key in enumerate(keys)}
        self._visits = tensors[0].to(torch.long).clone()
        self._count, self._mean, self._sq_dev = (t.to(torch.float64).clone() for t in tensors[1:])
        # The statistics do not depend on the settings, so this history keeps its own (the
        # resumed run's config) and says when the checkpoint's differ.
        saved = {
            "epsilon": state.get("epsilon", self.epsilon),
            "norm_by_std": state.get("norm_by_std", self.norm_adv_by_std),
        }
        current = {"epsilon": self.epsilon, "norm_by_std": self.norm_adv_by_std}
        if saved != current:
            logger.warning(
                "the DCPO history was saved with %s and is resumed with %s: the statistics carry over, the "
                "advantages follow the new settings",
                saved,
                current,
            )


def batch_advantages(
    history: PromptRewardHistory, scores: torch.Tensor, index: Any, keys_by_uid: dict[str, Any]
) -> torch.Tensor:
    """A step's (bs,) SAS advantages of ``scores`` grouped by (bs,) ``index`` (uids), each group's prompt
    key looked up in ``keys_by_uid`` ({str(uid): key}, None for padding rows, which get 0).

    Raises:
        MissingPromptIdentity: a uid has no key.
    """
    uids, inverse = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)
    missing = [uid for uid in uids if uid not in keys_by_uid]
    if missing:
        detail = f"uid {missing[0]!r} (and {len(missing) - 1} more)" if keys_by_uid else "any uid"
        raise MissingPromptIdentity(
            f"DCPO has no prompt identity for {detail}: it keeps per-prompt reward statistics across steps, "
            "so the host must pass each group's prompt key before the advantages (set_prompt_keys)."
        )
    group_keys = np.empty(len(uids), dtype=object)  # one look-up per group
    group_keys[:] = [keys_by_uid[uid] for uid in uids]
    real = np.array([key is not None for key in group_keys], dtype=bool)[inverse]
    keys = group_keys[inverse[real]].tolist()
    advantage = torch.zeros_like(scores)
    if keys:
        real_rows = torch.from_numpy(real).to(scores.device)
        real_index = np.asarray(index, dtype=object)[real]
        with torch.no_grad():
            advantage[real_rows] = history.advantages(scores[real_rows], keys, real_index).to(scores.dtype)
    return advantage


def dynamic_clip_bounds(
    old_log_prob: torch.Tensor, eps_low: float, eps_high: float, max_ratio: float = 10.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """DCPO's token-wise bounds on the ratio r = p/q from the old probability q = exp(old_log_prob).

    ``low = 0.5 + 0.5 sqrt(max(1 - 4 eps_low / q, 0))``,
    ``high = min(0.5 + 0.5 sqrt(1 + 4 eps_high / q), max_ratio)`` (module docstring).

    Args:
        old_log_prob: (B, T) log q of each sampled token under the behaviour policy.
        eps_low, eps_high: DCPO's ε (the paper's released run uses clip_ratio_high 0.28).
        max_ratio: cap on the upper bound (10 in the paper, the dual-clip constant of its code).

    Returns:
        low, high: (B, T) each, in old_log_prob's dtype; 0.5 <= low <= 1 <= high <= max_ratio.
    """
    for name, value in (("eps_low", eps_low), ("eps_high", eps_high)):
        if not value >= 0:
            raise ValueError(f"DCPO clip {name}={value!r}: must be a number >= 0 (PPO's usual value is 0.2)")
    if not max_ratio >= 1:
        raise ValueError(f"DCPO clip max_ratio={max_ratio!r}: must be >= 1 (the paper uses 10)")
    q = old_log_prob.detach().exp()
    # q = 0 (log q = -inf) gives 4 eps / q = inf: low 0.5 and high max_ratio, the limits.
    low = 0.5 + 0.5 * (1 - 4 * eps_low / q).clamp(min=0).sqrt()
    high = (0.5 + 0.5 * (1 + 4 * eps_high / q).sqrt()).clamp(max=max_ratio)
    return low, high


def dynamic_clip_token_losses(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    max_ratio: float = 10.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-clip token losses with DCPO's bounds: ``max(-A r, -A clip(r, low, high))``.

    Args:
        old_log_prob, log_prob: (B, T) log q (behaviour policy) and log p (with gradients).
        advantages: (B, T) token advantages.

    Returns:
        losses: (B, T) to aggregate over the response mask as the trainer does.
        clipped: (B, T) bool, where the clipped term was the larger (PPO's clipfrac numerator).
    """
    low, high = dynamic_clip_bounds(old_log_prob, eps_low, eps_high, max_ratio)
    ratio = (log_prob - old_log_prob.detach()).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * torch.minimum(torch.maximum(ratio, low), high)
    return torch.maximum(unclipped, clipped), clipped > unclipped
