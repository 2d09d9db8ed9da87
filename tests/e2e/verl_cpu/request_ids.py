"""Stable request ids for the harness's ``hf`` rollout in verl's V1 trainers.

With ``actor_rollout_ref.rollout.full_determinism=True`` verl's single-turn agent loop sends each
request as ``request_id=f"det-{priority}"`` (``single_turn_agent_loop.py:69``), where ``priority`` is
the prompt's position in the batch handed to rollout. verl's ``AgentLoopManager`` attaches it
(``agent_loop.py:1241-1245``); the V1 trainers' ``AgentLoopManagerTQ`` does not, so every request
would be ``det-0``. This attaches it the same way, in the trainer's process.

Why the harness needs it: :class:`~verl_cpu.hf_rollout.HFGenerateServer` seeds each chunk from the
weights, the tokens so far and how often that context was drawn. When a batch holds one prompt
twice (prompt skipping refills across an epoch boundary on the e2e's 8-prompt dataset), its two
groups draw from one counter, and which group gets which draw follows the arrival order of their
requests, so a resumed run could regroup the same responses differently from the uninterrupted
one. Keyed by the prompt's position as well, each group draws its own.
"""

from __future__ import annotations

import functools

import torch
from verl.trainer.ppo.v1 import agent_loop_tq

_generate_sequences = agent_loop_tq.AgentLoopManagerTQ.generate_sequences


@functools.wraps(_generate_sequences)
def _generate_sequences_with_priority(self, prompts):
    if "priority" not in prompts.keys():
        prompts = prompts.clone(recurse=False)
        prompts["priority"] = torch.arange(len(prompts))
    return _generate_sequences(self, prompts)


agent_loop_tq.AgentLoopManagerTQ.generate_sequences = _generate_sequences_with_priority
