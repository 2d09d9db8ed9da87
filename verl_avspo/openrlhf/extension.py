"""The adapter's subclasses of OpenRLHF's classes, and :func:`use_tracked_classes`, the one place OpenRLHF is
told to build them (imports OpenRLHF and Ray; :func:`verl_avspo.openrlhf.install` checks OpenRLHF first).

OpenRLHF offers no option to choose its trainer, experience maker or samples generator class: its
``train_ppo_ray`` imports ``PPOTrainer`` (or ``PPOTrainerAsync``) from their modules when it runs, and
``PPOTrainerAsync`` creates its ``TrainingActor`` and ``GenerateSamplesActor`` by their module names. The
trainers build their maker and generator themselves; ours adopt them as the adapter's subclasses
(:func:`verl_avspo.openrlhf.trainer_wrap.adopt`). So :func:`use_tracked_classes` sets three module names in
the launching process (``python -m verl_avspo.openrlhf``), before ``train_ppo_ray`` runs there:

- ``openrlhf.trainer.ppo_trainer.PPOTrainer``: the synchronous trainer, which ``train_ppo_ray`` imports;
- ``openrlhf.trainer.ppo_trainer_async.TrainingActor`` and ``.GenerateSamplesActor``: the asynchronous
  trainer's two actors. ``PPOTrainerAsync`` creates them in its own Ray actor; Ray ships a ``@ray.remote``
  class to its actor by value, with the module names its methods use as the launching process has them
  (the inventory's probe checks this), so no hook in the Ray workers is needed.
"""

from __future__ import annotations

import ray
from openrlhf.trainer import ppo_trainer, ppo_trainer_async
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

from verl_avspo.openrlhf.generation import GeneratorMixin
from verl_avspo.openrlhf.trainer_wrap import MakerMixin, TrainerMixin, adopt

__all__ = [
    "TrackedExperienceMaker",
    "TrackedSamplesGenerator",
    "TrackedTrainer",
    "tracked_actor_classes",
    "use_tracked_classes",
]


class TrackedExperienceMaker(MakerMixin, RemoteExperienceMaker):
    """OpenRLHF's experience maker with the run tracker in its advantage stage."""


class TrackedSamplesGenerator(GeneratorMixin, SamplesGenerator):
    """OpenRLHF's samples generator that records dropped groups, counts rollouts and skips prompts."""


class TrackedTrainer(TrainerMixin, ppo_trainer.BasePPOTrainer):
    """What the adapter adds to every OpenRLHF trainer (metrics, stall alert, checkpointed tracker state)."""

    maker_class = TrackedExperienceMaker
    generator_class = TrackedSamplesGenerator


def tracked_actor_classes() -> tuple[type, type, type]:
    """The tracked synchronous trainer, and the asynchronous trainer's training and generation actors.

    Made here, not at module level, so that Ray ships them by value, as it ships OpenRLHF's own actor classes
    (whose module names, once set, no longer find them): Ray calls an actor's methods through copies it makes
    of them, and an OpenRLHF method's zero-argument ``super()`` must find in the actor's ancestry the same copy of
    its class (``TrainingActor.broadcast_to_vllm``). Each call makes new classes; :func:`use_tracked_classes`
    makes them once.
    """

    class TrackedPPOTrainer(TrackedTrainer, ppo_trainer.PPOTrainer.__ray_actor_class__):
        """OpenRLHF's synchronous trainer actor, tracked."""

    class TrackedTrainingActor(TrackedTrainer, ppo_trainer_async.TrainingActor.__ray_actor_class__):
        """The asynchronous trainer's training actor, tracked."""

    class TrackedGenerateSamplesActor(ppo_trainer_async.GenerateSamplesActor.__ray_actor_class__):
        """The asynchronous trainer's generation actor, its generator tracked (dropped groups)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.samples_generator = adopt(TrackedSamplesGenerator, self.samples_generator)

    return TrackedPPOTrainer, TrackedTrainingActor, TrackedGenerateSamplesActor


def use_tracked_classes() -> None:
    """Make ``train_ppo_ray``, run in this process, build the tracked trainers (idempotent). OpenRLHF declares
    the three actor classes with a bare ``@ray.remote``, and so does this: the adapter's three attribute sets."""
    if issubclass(ppo_trainer.PPOTrainer.__ray_actor_class__, TrackedTrainer):
        return
    trainer, training_actor, generation_actor = tracked_actor_classes()
    ppo_trainer.PPOTrainer = ray.remote(trainer)
    ppo_trainer_async.TrainingActor = ray.remote(training_actor)
    ppo_trainer_async.GenerateSamplesActor = ray.remote(generation_actor)
