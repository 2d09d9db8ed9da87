"""The generation side of the OpenRLHF adapter: :class:`GeneratorMixin`, the overrides of
``SamplesGenerator`` that :mod:`verl_avspo.openrlhf.extension` puts into the generator of OpenRLHF's
trainers (imports no OpenRLHF).

- ``generate_samples`` records the rewards of the groups dynamic filtering drops and hands them on as an
  attribute of the returned rollout list (:class:`GeneratedRollout`, so they cross the asynchronous
  trainer's queue with it); it counts the step's rollouts and generation batches with the run tracker the
  trainer attached (:func:`attach_tracker`), and reports the prompts exhausted once the stall alert stopped
  the run (:func:`stop_generation`);
- ``_process_response_into_experience`` records each generated response's reward;
- ``_dispatch_prompts_to_vllm``, which receives each prompt batch OpenRLHF drew for rollout (the step's
  batch, and one prompt for each that dynamic filtering drops): counted as a generation batch and, with
  the skip rule on, less the prompts the run tracker rejects, whose places are refilled from the same
  prompt iterator through OpenRLHF 0.11's own draw (``core.prompt_refill``).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from verl_avspo.core.prompt_history import prompt_key
from verl_avspo.core.prompt_refill import skip_and_refill

__all__ = ["GeneratedRollout", "GeneratorMixin", "attach_tracker", "stop_generation"]


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


class GeneratorMixin:
    """The overrides of OpenRLHF's ``SamplesGenerator`` (put first in a subclass of it)."""

    # The run tracker (the synchronous trainer's, attached at its start), the alert's stop, the responses of
    # the running call and the dropped groups of a call that trained nothing.
    _verl_avspo_tracker: Any = None
    _verl_avspo_stopped = False
    _verl_avspo_rewards: list | None = None
    _verl_avspo_carried: tuple = (None, None)

    def generate_samples(self, *rest, **generate_kwargs):
        if self._verl_avspo_stopped:  # the stall alert stopped the run: no samples, prompts exhausted
            return GeneratedRollout([], None), None, 0, True
        group_size = generate_kwargs.get("n_samples_per_prompt", self.args.rollout.n_samples_per_prompt)
        self._verl_avspo_rewards = []
        tracker = self._verl_avspo_tracker
        generation = Generation(tracker, group_size) if tracker is not None else None
        token = _GENERATION.set(generation)
        try:
            result = super().generate_samples(*rest, **generate_kwargs)
            recorded = self._verl_avspo_rewards
        finally:
            self._verl_avspo_rewards = None
            _GENERATION.reset(token)
        if generation is not None:  # every response generated, those dynamic filtering dropped included
            tracker.count_rollouts(len(recorded), generation.draws)
        kept = [*result[0], *getattr(self, "_sample_buffer", ())]  # trained now, or served by a later step
        dropped = _joined_groups(self._verl_avspo_carried, _dropped_groups(recorded, kept, group_size))
        # A call whose groups filtering all dropped trains no step (OpenRLHF draws again, or starts its next
        # episode): its groups are measured with the next step, which also counts their rollouts.
        self._verl_avspo_carried = (None, None) if result[0] else dropped
        return (GeneratedRollout(result[0], *dropped), *result[1:])

    def _process_response_into_experience(self, response, *rest, **kwargs):
        experience = super()._process_response_into_experience(response, *rest, **kwargs)
        if self._verl_avspo_rewards is not None:
            reward = response.get("reward")
            self._verl_avspo_rewards.append((experience, None if reward is None else float(reward)))
        return experience

    def _dispatch_prompts_to_vllm(self, prompts, labels, *rest, images=None, **kwargs):
        """A prompt batch OpenRLHF drew for rollout, counted as a generation batch; with the skip rule on,
        less the prompts the run tracker's rule rejects, drawn again by the core's loop until the batch's
        places are filled or the prompts run out (as OpenRLHF's own draw ends). Every place is refilled
        (re-selections): OpenRLHF trains on as many groups as it first sent out."""
        generation = _GENERATION.get()
        if generation is None:  # evaluation, or a generator no trainer attached a tracker to
            return super()._dispatch_prompts_to_vllm(prompts, labels, *rest, images=images, **kwargs)
        if generation.tracker.skipper is not None and prompts:
            prompts, labels, images = self._kept_prompts(generation, prompts, labels, images)
        generation.draws += bool(prompts)
        if not prompts:  # every prompt skipped and none left to draw
            return []
        return super()._dispatch_prompts_to_vllm(prompts, labels, *rest, images=images, **kwargs)

    def _kept_prompts(self, generation: Generation, prompts: list, labels: list, images: list | None):
        from openrlhf.trainer.ppo_utils.samples_generator import _collect_prompt_batch

        exhausted = False

        def draw(missing: int):
            nonlocal exhausted
            if exhausted:
                return None
            more = _collect_prompt_batch(self._dataloader_iter, missing)
            exhausted = more[3]
            return more if more[0] else None

        first = (list(prompts), list(labels), list(images) if images is not None else [None] * len(prompts))
        picked = skip_and_refill(
            first,
            lambda chunk: [prompt_key(prompt) for prompt in chunk[0]],
            lambda keys, at_least, refill: generation.tracker.select_prompts(
                keys, generation.group_size, at_least, refill
            ),
            draw,
            len(prompts),
        )
        return tuple([chunk[part][i] for chunk, chosen in picked.chunks for i in chosen] for part in range(3))


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


def attach_tracker(generator: Any, tracker: Any) -> None:
    """Let ``generator`` (the synchronous trainer's, in the trainer's actor) count its rollouts with the run's
    ``tracker``, whose skip rule then decides which prompts go out."""
    generator._verl_avspo_tracker = tracker


def stop_generation(generator: Any) -> None:
    """Make ``generator``'s next ``generate_samples`` report no samples and the prompts exhausted."""
    generator._verl_avspo_stopped = True
