"""The paper's other baselines inside the launcher's V1 trainer: the intrinsic rewards of RENT and
INTUITOR (docs/baselines.md): :class:`IntrinsicReward`, a part the trainer holds. (DCPO's prompt identity is
the run's, passed every step by :mod:`verl_avspo.verl_plugin.prompt_hooks`.)

The launcher refuses them outside V1's ``sync`` mode.

- ``algorithm.intrinsic.reward=negative_entropy`` (RENT) / ``self_certainty`` (INTUITOR): the
  verifier's ``rm_scores`` are replaced, before the advantage stage, by the intrinsic reward of
  each response, computed from the old policy's per-token entropy (which verl's old-log-prob pass
  already returns) or self-certainty (which it returns only with
  ``patches/verl-0.9.1-intrinsic.patch``); the verifier's mean score is still logged
  (``intrinsic/verifier_score``). ``acr/*`` then measure the intrinsic reward's groups.
"""

from __future__ import annotations

import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.workers.utils.padding import response_from_nested, response_to_nested

from verl_avspo.core.baseline_settings import IntrinsicConfig
from verl_avspo.core.intrinsic import masked_token_mean, negative_entropy
from verl_avspo.verl_plugin.v1_batch import real_rows

__all__ = ["SELF_CERTAINTY_KEY", "intrinsic_rewards", "IntrinsicReward"]

# The per-token output that patches/verl-0.9.1-intrinsic.patch adds to the actor's log-prob pass,
# and the flag that requests it.
SELF_CERTAINTY_KEY = "self_certainty"
_SELF_CERTAINTY_FLAG = "calculate_self_certainty"


def intrinsic_rewards(
    reward: str, token_values: torch.Tensor, response_mask: torch.Tensor, last_tokens: int | None = None
) -> torch.Tensor:
    """Each response's intrinsic reward from per-token values of the old policy.

    Args:
        reward: ``negative_entropy`` (RENT; ``token_values`` are entropies) or ``self_certainty``
            (INTUITOR; ``token_values`` are KL(U || p_t)).
        token_values: (bs, response_length).
        response_mask: (bs, response_length).
        last_tokens: RENT only, average over the last ``last_tokens`` response tokens.

    Returns:
        (bs,) float32.
    """
    if reward == "negative_entropy":
        return negative_entropy(token_values.float(), response_mask, last_tokens)
    if reward == "self_certainty":
        return masked_token_mean(token_values.float(), response_mask)
    raise ValueError(
        f"algorithm.intrinsic.reward={reward!r} has no per-token source: use self_certainty or negative_entropy"
    )


class IntrinsicReward:
    """The trainer's part for RENT and INTUITOR: the old-log-prob pass asked for self-certainty (INTUITOR), and
    the intrinsic reward in place of ``rm_scores`` before verl's advantage stage."""

    def __init__(self, settings: IntrinsicConfig):
        self.settings = settings

    def request(self, batch) -> None:
        """Before verl's old-log-prob pass: INTUITOR asks the actor for each token's self-certainty (an output
        only a verl patched with patches/verl-0.9.1-intrinsic.patch produces)."""
        if self.settings.reward == "self_certainty":
            batch.extra_info[_SELF_CERTAINTY_FLAG] = True

    def store(self, batch):
        """After verl's old-log-prob pass (``batch``: the new batch meta it returned, without the flag): INTUITOR's
        per-token self-certainty, its response part, stored in TransferQueue."""
        if self.settings.reward != "self_certainty":
            return batch
        fields = tq.kv_batch_get(keys=batch.keys[:1], partition_id=batch.partition_id)
        if SELF_CERTAINTY_KEY not in fields.keys():
            raise RuntimeError(
                "algorithm.intrinsic.reward=self_certainty (INTUITOR): the actor returned no per-token "
                "self-certainty. verl 0.9.1 computes it only when patched: apply "
                "patches/verl-0.9.1-intrinsic.patch (FSDP engine) to the verl that the workers import, and "
                "leave actor_rollout_ref.model.use_fused_kernels off."
            )
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=[SELF_CERTAINTY_KEY, "response_mask"]
        )
        data[SELF_CERTAINTY_KEY] = response_from_nested(data[SELF_CERTAINTY_KEY], data["response_mask"])
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=data.select(SELF_CERTAINTY_KEY))

    def apply(self, batch, metrics: dict) -> None:
        """Replace ``rm_scores`` by each response's intrinsic reward (on its last token, where verl's
        reward loop puts a score), from the old policy's per-token entropy or self-certainty."""
        reward = self.settings.reward
        source = "entropy" if reward == "negative_entropy" else SELF_CERTAINTY_KEY
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["rm_scores", "response_mask", source]
        )
        response_mask = data["response_mask"]
        mask = response_mask.to_padded_tensor(0)
        rewards = intrinsic_rewards(reward, data[source].to_padded_tensor(0.0), mask, self.settings.last_tokens)
        verifier = data["rm_scores"].to_padded_tensor(0.0)
        lengths = response_mask.offsets().diff()
        scores = torch.zeros_like(verifier)
        rows = torch.arange(len(lengths))
        scores[rows, (lengths - 1).clamp(min=0)] = rewards.to(scores.dtype)
        # _balance_batch's padding rows have an all-zero response mask, so their reward is already 0.
        real = torch.tensor(real_rows(batch), dtype=torch.bool)
        tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({"rm_scores": response_to_nested(scores, response_mask)}, batch_size=len(batch)),
        )
        metrics["intrinsic/reward"] = float(rewards[real].mean())
        metrics["intrinsic/verifier_score"] = float(verifier[real].sum(dim=-1).mean())
