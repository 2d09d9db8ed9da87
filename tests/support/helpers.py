"""Test set-up that several test files share, written once: hand-built outcome batches (each
response's score on its last valid token, the response mask, one uid per prompt group), the same
batch as verl's ``DataProto`` and as the V1 trainer finds it in TransferQueue, verl's V1
trainer built from our config with its GPU parts stubbed, the authors' released advantage rule
(the reference of the core's and the TRL adapter's ``paper_code`` tests), and a script of benchmarks/
loaded as a module.

Imported as ``helpers``: tests/conftest.py puts this folder on ``sys.path`` (``tests`` is no package
here, and verl installs a top-level package of that name). The framework imports sit inside the
functions that need them, so that the core's tests (``make test-core``, torch and numpy only) can
use the batch builders.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "TRAINER_BASE",
    "RecordingWorkerGroup",
    "group_uids",
    "grouped_batch",
    "grouped_data",
    "make_trainer",
    "outcome_batch",
    "outcome_data",
    "put_groups",
    "released_code_rule",
    "with_checkpoint_parts",
]

# The smallest overrides with which verl's V1 trainer builds on a CPU machine (no rollout starts).
TRAINER_BASE = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=4", "trainer.logger=[console]")


def outcome_batch(scores, length: int = 3, lengths=None) -> tuple[torch.Tensor, torch.Tensor]:
    """verl-shaped inputs ``(token_level_rewards, response_mask)``: the score on the last valid
    token of each response (``lengths``, all ``length`` when None). float64 scores stay float64
    (continuous scores are compared with verl there, where neither side's rounding hides a
    difference in the math: verl's float32 two-pass std loses digits on close values); any other
    scores become float32, as verl's rewards are (binary rewards are exact in float32)."""
    scores = torch.as_tensor(scores)
    scores = scores if scores.dtype == torch.float64 else scores.float()
    lengths = torch.full((len(scores),), length) if lengths is None else torch.as_tensor(lengths)
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(scores.dtype)
    rewards = torch.zeros(len(scores), length, dtype=scores.dtype)
    rewards[torch.arange(len(scores)), lengths - 1] = scores
    return rewards, mask


def group_uids(sizes: Sequence[int], tag: str = "uid-") -> np.ndarray:
    """One uid per response for consecutive groups of ``sizes``: ``<tag>0`` for the first group's
    responses, ``<tag>1`` for the next, ... (an object array, as verl's ``uid``)."""
    return np.array([f"{tag}{g}" for g, size in enumerate(sizes) for _ in range(size)], dtype=object)


def grouped_batch(groups: Sequence[Sequence[float]], tag: str = "q", length: int = 3):
    """``(token_level_rewards, response_mask, uids)`` with one prompt group per list of scores."""
    rewards, mask = outcome_batch([score for group in groups for score in group], length)
    return rewards, mask, group_uids([len(group) for group in groups], tag)


def outcome_data(rewards: torch.Tensor, mask: torch.Tensor, uids: np.ndarray, **tensors):
    """The batch as verl's ``DataProto`` (``token_level_rewards``, ``response_mask``, any other
    ``tensors``, and the ``uid`` array) that ``compute_advantage`` reads."""
    from verl import DataProto

    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask, **tensors}, non_tensors={"uid": uids}
    )


def grouped_data(groups: Sequence[Sequence[float]], tag: str = "q", length: int = 3):
    """:func:`outcome_data` with one prompt group per list of scores (uids ``<tag>0``, ``<tag>1``, ...)."""
    return outcome_data(*grouped_batch(groups, tag, length))


def put_groups(tag: str, groups: Sequence[Sequence[float]], length: int | None = None, group_fields=None):
    """Write one prompt group per list of scores to TransferQueue's ``train`` partition as verl's
    agent and reward loops leave them for the V1 trainer: uid ``<tag>g<g>``, keys ``<uid>_<s>_0``,
    response ``s`` of ``2 + s`` tokens (``length`` tokens when given) with its score on the last
    (``rm_scores``); ``group_fields[g]`` adds fields to each response of group ``g``. Returns the
    batch meta."""
    import transfer_queue as tq
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys, fields = [], []
    for g, scores in enumerate(groups):
        for s, score in enumerate(scores):
            size = 2 + s if length is None else length
            rm_scores = torch.zeros(size)
            rm_scores[-1] = score
            keys.append(f"{tag}g{g}_{s}_0")
            fields.append(
                {
                    "uid": f"{tag}g{g}",
                    **(group_fields[g] if group_fields else {}),
                    "response_mask": torch.ones(size, dtype=torch.int64),
                    "rm_scores": rm_scores,
                }
            )
    return tq.kv_batch_put(
        keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=[{} for _ in keys]
    )


def make_trainer(*overrides: str, trainer_cls=None):
    """verl's V1 trainer (our ``AVSPOTrainerSync`` unless ``trainer_cls``), built by verl's own
    ``PPOTrainer.__init__`` (it needs no GPU) from our config with :data:`TRAINER_BASE` and
    ``overrides``."""
    from omegaconf import OmegaConf

    from verl_avspo.verl_plugin.launcher import compose_config
    from verl_avspo.verl_plugin.trainer_v1 import AVSPOTrainerSync

    config = compose_config([*TRAINER_BASE, *overrides])
    OmegaConf.resolve(config)  # as TaskRunnerV1.run does
    return (trainer_cls or AVSPOTrainerSync)(config=config)


class RecordingWorkerGroup:
    """Stands in for the FSDP actor worker group (it needs GPUs): records save/load and creates the
    folder it is asked to save in, so the checkpoint's layout is verl's."""

    def __init__(self):
        self.saved, self.loaded = [], []

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        self.saved.append((local_path, global_step))

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.loaded.append(local_path)


def with_checkpoint_parts(trainer):
    """``trainer`` with what its ``_save_checkpoint``/``_load_checkpoint`` touch besides our state:
    a :class:`RecordingWorkerGroup` actor and a (stateful) train dataloader."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    trainer.actor_rollout_wg = RecordingWorkerGroup()
    trainer.train_dataloader = StatefulDataLoader(list(range(8)), batch_size=2)
    return trainer


def released_code_rule(rewards, group_size):
    """A hand-written reference of the advantage rule of the authors' released code (hexixiang/ACR
    @ ca40ccf, trl_scope/trainer/grpo_trainer.py), written from its semantics: rewards arrive in
    contiguous groups; if the whole batch is all 0 (all 1), every group gets one virtual reward 1
    (0); each group is normalised by the mean and unbiased std of its rewards (with the virtual one
    when added), A = (r - mean) / (std + 1e-4); the virtual sample's own advantage is dropped."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    grouped = rewards.view(-1, group_size)
    normaliser = grouped
    if bool((rewards == 0).all()) or bool((rewards == 1).all()):
        virtual = 1.0 - rewards[0]
        normaliser = torch.cat([grouped, torch.full((grouped.shape[0], 1), float(virtual))], dim=1)
    mean, std = normaliser.mean(dim=1, keepdim=True), normaliser.std(dim=1, keepdim=True)
    return ((grouped - mean) / (std + 1e-4)).reshape(-1)


BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module; the scripts import each other from beside them, so that folder is on
    ``sys.path`` while it loads."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module
