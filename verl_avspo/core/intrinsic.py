"""Intrinsic rewards from the policy's own token distributions (torch only): no verifier.

- **INTUITOR** (Zhao et al., "Learning to Reason without External Rewards", arXiv 2505.19590)
  rewards a response by its *self-certainty*, the mean over its tokens of the KL divergence from
  the uniform distribution U over the V-token vocabulary to the policy's next-token distribution
  p_t::

      KL(U || p_t) = sum_v 1/V · log((1/V) / p_t(v)) = -log V - (1/V) · sum_v log p_t(v)
                   = logsumexp(z_t) - mean_v(z_t) - log V        (z_t: the logits)

  It is 0 for a uniform p_t and grows as p_t concentrates.
- **RENT** (Prabhudesai et al., "Maximizing Confidence Alone Improves Reasoning", arXiv 2505.22660)
  rewards a response by its negative mean token entropy, ``-mean_t H(p_t)`` with
  ``H(p_t) = logsumexp(z_t) - sum_v softmax(z_t)_v · z_t(v)``, optionally over only its last
  tokens (the paper found the entropy of the final, answer-bearing tokens the most useful).

Both are computed in float32 (whatever the logits' dtype) over chunks of ``chunk_size`` token
positions, so that at most a (chunk_size, V) float32 temporary exists beside the logits.
"""

from __future__ import annotations

import math

import torch

__all__ = ["token_self_certainty", "self_certainty", "token_entropy", "negative_entropy", "masked_token_mean"]


def _per_token(logits: torch.Tensor, chunk_size: int, reduce) -> torch.Tensor:
    """``reduce`` applied to (n, V) float32 chunks of the flattened (..., V) logits -> (...,) float32."""
    if logits.dim() < 2:
        raise ValueError(f"logits must be (..., V) with a vocabulary axis last, got shape {tuple(logits.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r}: must be a positive number of token positions, e.g. 1024")
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [reduce(chunk.float()) for chunk in flat.split(chunk_size)]
    return torch.cat(parts).reshape(logits.shape[:-1]) if parts else flat.new_zeros(logits.shape[:-1]).float()


def token_self_certainty(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """KL(U || p_t) per position: logits (B, T, V) -> (B, T) float32, >= 0."""
    log_vocab = math.log(logits.shape[-1])
    return _per_token(logits, chunk_size, lambda z: torch.logsumexp(z, dim=-1) - z.mean(dim=-1) - log_vocab)


def token_entropy(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Entropy H(p_t) in nats per position: logits (B, T, V) -> (B, T) float32, in [0, log V]."""

    def entropy(z: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(z, dim=-1)
        return torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1)

    return _per_token(logits, chunk_size, entropy)


def masked_token_mean(
    values: torch.Tensor, response_mask: torch.Tensor, last_tokens: int | None = None
) -> torch.Tensor:
    """Mean of ``values`` (B, T) over each response's tokens -> (B,).

    Args:
        values: (B, T) per-token values.
        response_mask: (B, T) 1 on response tokens (verl's ``response_mask``), any layout.
        last_tokens: average over only the last ``last_tokens`` response tokens of each row (all of
            them if the response is shorter); None averages over the whole response.

    A row without response tokens gets 0.
    """
    if values.shape != response_mask.shape:
        raise ValueError(
            f"values {tuple(values.shape)} and response_mask {tuple(response_mask.shape)} must have one shape (B, T)"
        )
    mask = response_mask.to(torch.bool)
    if last_tokens is not None:
        if isinstance(last_tokens, bool) or not isinstance(last_tokens, int) or last_tokens < 1:
            raise ValueError(f"last_tokens={last_tokens!r}: must be a positive integer, or None for every token")
        # Response tokens at or after each position: 1 on the last token, 2 on the one before, ...
        from_end = mask.flip(-1).cumsum(-1).flip(-1)
        mask = mask & (from_end <= last_tokens)
    weights = mask.to(values.dtype)
    return (values * weights).sum(-1) / weights.sum(-1).clamp(min=1)


def self_certainty(logits: torch.Tensor, response_mask: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """INTUITOR's reward: mean KL(U || p_t) over the response tokens. (B, T, V), (B, T) -> (B,)."""
    return masked_token_mean(token_self_certainty(logits, chunk_size), response_mask)


def negative_entropy(
    entropy: torch.Tensor, response_mask: torch.Tensor, last_tokens: int | None = None
) -> torch.Tensor:
    """RENT's reward: minus the mean token entropy over the response (or its last ``last_tokens``
    tokens). entropy (B, T) as from :func:`token_entropy`, response_mask (B, T) -> (B,)."""
    return -masked_token_mean(entropy, response_mask, last_tokens)
