"""verl's training workers and FSDP engines on the CPU platform.

Import after :mod:`verl_cpu.platform` is registered: verl's FSDP engine module reads the platform's
device name when it is imported (``verl/workers/engine/fsdp/transformer_impl.py:89``).
"""

from __future__ import annotations

from verl.utils.distributed import initialize_global_process_group_ray
from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from verl_cpu.platform import NAME

# verl's FSDP engines have no device-specific code paths that CPU lacks once the strategy is fsdp2
# (FSDP1 hard-codes sync_module_states=True, which needs an accelerator): register them for cpu.
EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=NAME)(FSDPEngineWithLMHead)
EngineRegistry.register(model_type="value_model", backend=["fsdp", "fsdp2"], device=NAME)(FSDPEngineWithValueHead)


class GlooTrainingWorker(TrainingWorker):
    """verl's ``TrainingWorker`` whose process group is plain ``gloo``.

    verl builds the backend string ``cpu:gloo,{device}:{backend}``
    (``verl/utils/distributed.py:89``), which on the CPU platform reads ``cpu:gloo,cpu:gloo`` and
    torch refuses ("Duplicate device type cpu"). Initialised here first, the group is already up
    when ``TrainingWorker.__init__`` asks for it, and verl's call leaves it alone.
    """

    def __init__(self, config):
        initialize_global_process_group_ray(timeout_second=None, backend="gloo")
        super().__init__(config)


# Monkeypatch (the one way in): verl's V1 trainer builds ``ray.remote(ActorRolloutRefWorker)`` itself
# (verl/trainer/ppo/v1/trainer_base.py:805), so a worker subclass cannot be handed to it without
# replacing the trainer. ``actor_worker_cls`` / ``ref_worker_cls`` (verl/workers/engine_workers.py:459-460)
# are the class attributes verl reads to build the inner training workers; pointing them at the gloo
# worker makes every trainer class (verl's PPOTrainerSync, verl-avspo's AVSPOTrainerSync) CPU-capable.
ActorRolloutRefWorker.actor_worker_cls = GlooTrainingWorker
ActorRolloutRefWorker.ref_worker_cls = GlooTrainingWorker
