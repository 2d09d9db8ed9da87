"""The harness's reward, as OpenRLHF's ``--reward.remote_url <file>.py`` takes it (a ``reward_func``,
called by ``utils/agent.py:SingleTurnAgentExecutor`` on each response): 1 when the response writes
the prompt's sum anywhere, else 0, as :mod:`verl_cpu.reward` scores the verl runs."""

import torch


def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> dict:
    # A query is the prompt followed by the response, decoded with its special tokens.
    responses = [query[len(prompt) :] for query, prompt in zip(queries, prompts, strict=True)]
    rewards = torch.tensor([float(label in response) for response, label in zip(responses, labels, strict=True)])
    return {"rewards": rewards, "scores": rewards, "extra_logs": {}}
