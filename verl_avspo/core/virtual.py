"""Virtual-sample strategies and the virtual sample count K (docs/method.md §3, steps 4-5).

Framework-free. Virtual rewards have no tokens and give no gradient: they only enter the mean and
std of a collapsed group. Everything is computed for all augmented groups at once as an
(m, K_max) matrix with a validity mask, m being the number of augmented groups.
"""

from __future__ import annotations

import math

import torch

__all__ = ["virtual_counts", "virtual_rewards", "closed_form_advantage"]


def virtual_counts(group_sizes: torch.Tensor, k: int | str, signal: float, alpha: float, strategy: str) -> torch.Tensor:
    """K per augmented group.

    Args:
        group_sizes: (m,) int64, n of each augmented group.
        k: a fixed integer, or ``"adaptive"`` for K = max(1, min(n, ceil(n * signal**alpha))).
        signal: the collapse signal s_t in [0, 1].
        strategy: ``opposite`` forces K = 1 (one sample at the opposite bound).

    Returns:
        (m,) int64.
    """
    if strategy == "opposite":
        return torch.ones_like(group_sizes)
    if k == "adaptive":
        n = group_sizes.to(torch.float64)
        return torch.ceil(n * signal**alpha).clamp(min=torch.ones_like(n), max=n).to(torch.long)
    return torch.full_like(group_sizes, int(k))


def virtual_rewards(
    strategy: str,
    common_value: torch.Tensor,
    all_correct: torch.Tensor,
    counts: torch.Tensor,
    reward_range: tuple[float, float],
    gap: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Virtual reward values for m augmented groups.

    Args:
        strategy: one of ``stratified``, ``opposite``, ``www``, ``random``, ``fixed``, ``exp_decay``.
        common_value: (m,) float64, the collapsed group's common reward c.
        all_correct: (m,) bool, True for all-correct groups, False for all-wrong.
        counts: (m,) int64, K per group.
        reward_range: (lo, hi).
        gap: the spacing fraction of the range for ``stratified`` and ``exp_decay``.
        generator: the seeded RNG for ``random`` (drawn on CPU so results do not depend on device).

    Returns:
        values: (m, K_max) float64; entries beyond a group's K are 0.
        valid: (m, K_max) bool, True for the first K entries of each row.
    """
    lo, hi = reward_range
    span = hi - lo
    device = common_value.device
    k_max = int(counts.max()) if counts.numel() else 0
    rank = torch.arange(1, k_max + 1, device=device, dtype=torch.float64).unsqueeze(0)  # k = 1..K_max
    valid = rank <= counts.unsqueeze(1)
    K = counts.to(torch.float64).unsqueeze(1)
    c = common_value.unsqueeze(1)
    # All-correct groups are pulled down, all-wrong groups pushed up.
    toward_other = torch.where(all_correct, -1.0, 1.0).to(torch.float64).unsqueeze(1)

    if strategy == "stratified":
        values = c + toward_other * gap * span * rank / K
    elif strategy == "exp_decay":
        values = c + toward_other * gap * span * torch.pow(2.0, -(rank - 1))
    elif strategy == "opposite":
        values = torch.where(all_correct, lo, hi).to(torch.float64).unsqueeze(1).expand(-1, k_max)
    elif strategy == "www":
        values = c * (1 - (rank - 1) / K)
    elif strategy == "fixed":
        values = torch.full((c.shape[0], k_max), 0.5 * (lo + hi), dtype=torch.float64, device=device)
    elif strategy == "random":
        draws = torch.rand((c.shape[0], k_max), generator=generator, dtype=torch.float64)
        values = (lo + span * draws).to(device)
    else:
        raise ValueError(f"unknown virtual-sample strategy {strategy!r}")
    return torch.where(valid, values, 0.0), valid


def closed_form_advantage(n: int, k: int) -> float:
    """|A| of every real sample when K identical virtual values differ from the common value c:
    sqrt(K (n+K-1) / (n (n+K))), independent of |c - v| (docs/method.md §4)."""
    return math.sqrt(k * (n + k - 1) / (n * (n + k)))
