"""verl's legacy trainer (``trainer.use_v1=False``) with ACR metrics, the alert (warn only) and
AVSPO checkpoint state (what it logs and saves: :mod:`verl_avspo.verl_plugin.trainer`).

Imports verl's legacy ``RayPPOTrainer`` and ``main_ppo_v0`` only, not TransferQueue or the V1
trainers: this route keeps working with ``transfer_queue`` absent.
"""

from __future__ import annotations

import ray
from omegaconf import DictConfig
from verl import DataProto
from verl.trainer import main_ppo_v0
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from verl_avspo.verl_plugin.file_log import install_resumed_file_logger
from verl_avspo.verl_plugin.trainer import AVSPOTrainerMixin

__all__ = ["AVSPORayPPOTrainer", "install_legacy_trainer", "AVSPOLegacyTaskRunner"]


class AVSPORayPPOTrainer(AVSPOTrainerMixin, RayPPOTrainer):
    """verl's legacy trainer (``trainer.use_v1=False``) with ACR metrics, the alert (warn only)
    and AVSPO checkpoint state. Its ``fit`` is one monolithic loop; the batch with raw scores and
    final advantages first reaches an overridable method in ``_update_actor``, whose returned
    metrics ``fit`` merges into the step's log (so no ACR is logged during critic warmup)."""

    def _update_actor(self, batch: DataProto) -> DataProto:
        output = super()._update_actor(batch)
        output.meta_info["metrics"].update(self.batch_collapse_metrics(batch))
        return output

    def batch_collapse_metrics(self, batch: DataProto) -> dict[str, float]:
        """The step's ``acr/*`` (and ``avspo/*``) metrics from the legacy trainer's batch, and the
        alert. Empty for estimators without groups."""
        if not self.measures_collapse:
            return {}
        self.tracker.measure(batch.batch["token_level_scores"].sum(dim=-1), batch.non_tensor_batch["uid"])
        return self.tracker.end_step(self.global_steps, batch.batch["advantages"])


def install_legacy_trainer() -> None:
    """Make the legacy TaskRunner build :class:`AVSPORayPPOTrainer` (it looks the class up by its
    module-global name). Call inside the TaskRunner actor."""
    main_ppo_v0.RayPPOTrainer = AVSPORayPPOTrainer


@ray.remote
class AVSPOLegacyTaskRunner(main_ppo_v0.TaskRunner.__ray_actor_class__):
    """verl's legacy TaskRunner (``trainer.use_v1=False``) building our ``RayPPOTrainer`` subclass."""

    def run(self, config: DictConfig):
        install_legacy_trainer()
        install_resumed_file_logger(config)
        return super().run(config)
