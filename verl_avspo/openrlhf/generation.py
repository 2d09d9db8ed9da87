"""The generation side of the OpenRLHF adapter: the wrappers of ``SamplesGenerator`` (and of OpenRLHF
0.11's prompt draw) that :func:`verl_avspo.openrlhf.trainer_wrap.install` puts in place.

- ``SamplesGenerator.generate_samples`` records the rewards of the groups dynamic filtering drops and
  hands them on as an attribute of the returned rollout list (:class:`GeneratedRollout`, so they cross
  the asynchronous trainer's queue with it); it counts the step's rollouts and generation batches with
  the run tracker the trainer attached (:func:`attach_tracker`), and reports the prompts exhausted once
  the stall alert stopped the run (:func:`stop_generation`);
- ``SamplesGenerator._process_response_into_experience`` records each generated response's reward;
- ``samples_generator._collect_prompt_batch`` (OpenRLHF 0.11): with the skip rule on, the prompts the run
  tracker rejects are drawn again before their rollout (``core.prompt_refill``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from verl_avspo.core.prompt_history import prompt_key
from verl_avspo.core.prompt_refill import skip_and_refill

__all__ = ["GeneratedRollout", "attach_tracker", "stop_generation", "GENERATOR_WRAPPERS", "PROMPT_DRAW_WRAPPER"]

_RECORDED = "_verl_avspo_rewards"
_CARRIED = "_verl_avspo_carried"
_STOPPED = "_verl_avspo_stopped"
_TRACKER = "_verl_avspo_tracker"


@dataclass
class Generation:
    """One ``generate_samples`` call's prompt draws: the run tracker that counts them (and, with the skip
    rule on, decides which prompts go out), the group size, and the draws sent to generation so far (the
    step's batch and each prompt dynamic filtering replaces: OpenRLHF's generation batches)."""

    tracker: Any
    group_size: int
    draws: int = 0


# While generate_samples runs in the trainer's actor (the synchronous trainer): its run tracker's draws.
_GENERATION: ContextVar[Generation | None] = ContextVar("verl_avspo_openrlhf_generation", default=None)


class GeneratedRollout(list):
    """The rollout samples ``SamplesGenerator.generate_samples`` returns, plus ``dropped_rewards``:
    (num_dropped, n_samples_per_prompt) float64 rewards of the groups dynamic filtering dropped while
    generating them, or None where nothing was dropped, rewards come later (a reward model) or
    nothing was generated (samples served from the buffer); and ``dropped_prompts``, their prompt
    texts (None where a response carried none), for the per-prompt history."""

    def __init__(self, samples: list, dropped_rewards: torch.Tensor | None, dropped_prompts: list | None = None):
        super().__init__(samples)
        self.dropped_rewards = dropped_rewards
        self.dropped_prompts = dropped_prompts


def _generate_samples(original: Callable) -> Callable:
    @functools.wraps(original)
    def generate_samples(self, *rest, **generate_kwargs):
        if getattr(self, _STOPPED, False):  # the stall alert stopped the run: no samples, prompts exhausted
            return GeneratedRollout([], None), None, 0, True
        group_size = generate_kwargs.get("n_samples_per_prompt", self.args.rollout.n_samples_per_prompt)
        setattr(self, _RECORDED, [])
        tracker = getattr(self, _TRACKER, None)
        generation = Generation(tracker, group_size) if tracker is not None else None
        token = _GENERATION.set(generation)
        try:
            result = original(self, *rest, **generate_kwargs)
            recorded = getattr(self, _RECORDED)
        finally:
            setattr(self, _RECORDED, None)
            _GENERATION.reset(token)
        if generation is not None:  # every response generated, those dynamic filtering dropped included
            tracker.count_rollouts(len(recorded), generation.draws)
        kept = [*result[0], *getattr(self, "_sample_buffer", ())]  # trained now, or served by a later step
        dropped = _joined_groups(getattr(self, _CARRIED, (None, None)), _dropped_groups(recorded, kept, group_size))
        # A call whose groups filtering all dropped trains no step (OpenRLHF draws again, or starts its next
        # episode): its groups are measured with the next step, which also counts their rollouts.
        setattr(self, _CARRIED, (None, None) if result[0] else dropped)
        return (GeneratedRollout(result[0], *dropped), *result[1:])

    return generate_samples


def _collect_kept_prompts(original: Callable) -> Callable:
    """OpenRLHF's prompt draw for rollout (the step's batch, and one prompt for each that dynamic filtering
    drops), counted as a generation batch; with the skip rule on, less the prompts the run tracker's rule
    rejects, drawn again by the core's loop (``core.prompt_refill``) until ``num_prompts`` are kept or the
    dataloader is exhausted (as OpenRLHF's own draw ends). Every place is refilled (re-selections): OpenRLHF
    trains on as many groups as it first sent out, so a place left open would shrink the step's batch."""

    @functools.wraps(original)
    def collect_prompt_batch(dataloader_iter, num_prompts: int, *rest, **kwargs):
        generation = _GENERATION.get()
        drawn = original(dataloader_iter, num_prompts, *rest, **kwargs)
        if generation is None:
            return drawn
        exhausted = drawn[3]
        if generation.tracker.skipper is not None and drawn[0]:

            def draw(missing: int):
                nonlocal exhausted
                if exhausted:
                    return None
                more = original(dataloader_iter, missing, *rest, **kwargs)
                exhausted = more[3]
                return more if more[0] else None

            picked = skip_and_refill(
                drawn,
                lambda chunk: [prompt_key(prompt) for prompt in chunk[0]],
                lambda keys, at_least, refill: generation.tracker.select_prompts(
                    keys, generation.group_size, at_least, refill
                ),
                draw,
                num_prompts,
            )
            prompts, labels, images = (
                [chunk[part][i] for chunk, chosen in picked.chunks for i in chosen] for part in range(3)
            )
            drawn = (prompts, labels, images, exhausted)
        generation.draws += bool(drawn[0])
        return drawn

    return collect_prompt_batch


def _dropped_groups(
    recorded: list[tuple[Any, float | None]], kept: list, group_size: int
) -> tuple[torch.Tensor | None, list | None]:
    """The generated groups none of whose responses was ``kept`` (those dynamic filtering dropped):
    their (num_dropped, group_size) rewards and their prompts, or (None, None). Each prompt's
    responses are processed one after the other, so the recorded (experience, reward) pairs come a
    group at a time."""
    if not recorded or len(recorded) % group_size or any(reward is None for _, reward in recorded):
        return None, None
    kept_ids = {id(experience) for experience in kept}
    groups = [recorded[i : i + group_size] for i in range(0, len(recorded), group_size)]
    dropped = [group for group in groups if all(id(experience) not in kept_ids for experience, _ in group)]
    if not dropped:
        return None, None
    rewards = torch.tensor([[reward for _, reward in group] for group in dropped], dtype=torch.float64)
    return rewards, [(group[0][0].prompts or [None])[0] for group in dropped]


def _joined_groups(
    first: tuple[torch.Tensor | None, list | None], second: tuple[torch.Tensor | None, list | None]
) -> tuple[torch.Tensor | None, list | None]:
    """Two calls' dropped groups (rewards, prompts) as one, either of them (None, None) where it has none."""
    if first[0] is None:
        return second
    if second[0] is None:
        return first
    prompts = None if first[1] is None or second[1] is None else [*first[1], *second[1]]
    return torch.cat([first[0], second[0]]), prompts


def _process_response(original: Callable) -> Callable:
    @functools.wraps(original)
    def process_response_into_experience(self, response, *rest, **kwargs):
        experience = original(self, response, *rest, **kwargs)
        recorded = getattr(self, _RECORDED, None)
        if recorded is not None:
            reward = response.get("reward")
            recorded.append((experience, None if reward is None else float(reward)))
        return experience

    return process_response_into_experience


def attach_tracker(generator: Any, tracker: Any) -> None:
    """Let ``generator`` (the synchronous trainer's, in the trainer's actor) count its rollouts with the run's
    ``tracker``, whose skip rule then decides which prompts go out."""
    setattr(generator, _TRACKER, tracker)


def stop_generation(generator: Any) -> None:
    """Make ``generator``'s next ``generate_samples`` report no samples and the prompts exhausted."""
    setattr(generator, _STOPPED, True)


# SamplesGenerator's methods and their wrappers.
GENERATOR_WRAPPERS = {
    "generate_samples": _generate_samples,
    "_process_response_into_experience": _process_response,
}
# OpenRLHF 0.11's prompt draw (a function of the samples_generator module) and its wrapper.
PROMPT_DRAW_WRAPPER = ("_collect_prompt_batch", _collect_kept_prompts)
