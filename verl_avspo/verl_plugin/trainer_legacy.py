"""verl's legacy trainer (``trainer.use_v1=False``) with ACR metrics, the alert (warn only), the
per-prompt history and AVSPO checkpoint state (what it logs and saves: :mod:`verl_avspo.verl_plugin.trainer`).
Prompt skipping is refused with it (the launcher's checks): its ``fit`` reads the dataloader inside
one monolithic loop, with no method between the dataloader and generation to override.

Imports verl's legacy ``RayPPOTrainer`` and ``main_ppo_v0`` only, not TransferQueue or the V1
trainers: this route keeps working with ``transfer_queue`` absent.
"""

from __future__ import annotations

import logging

import ray
from omegaconf import DictConfig
from verl import DataProto
from verl.trainer import main_ppo_v0
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from verl_avspo.verl_plugin.file_log import install_resumed_file_logger
from verl_avspo.verl_plugin.prompt_identity import prompt_key
from verl_avspo.verl_plugin.trainer import AVSPOTrainerMixin

__all__ = ["AVSPORayPPOTrainer", "install_legacy_trainer", "AVSPOLegacyTaskRunner"]

logger = logging.getLogger(__name__)


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
        self.tracker.set_prompt_keys(self.prompt_keys(batch))
        self.tracker.measure(batch.batch["token_level_scores"].sum(dim=-1), batch.non_tensor_batch["uid"])
        return self.tracker.end_step(self.global_steps, batch.batch["advantages"])

    def prompt_keys(self, batch: DataProto) -> dict[str, object]:
        """The stable prompt key of each uid of the batch, for the run's per-prompt history (empty,
        with a warning, when the batch lacks the field). verl's legacy ``fit`` hands generation the
        ``index`` and ``raw_prompt`` columns and keeps ``extra_info``, so ``index`` is read from
        ``extra_info`` (0 when missing, as verl's RLHFDataset does) and ``raw_prompt`` from what the
        agent loop returned with each response."""
        source, rows = self.prompt_identity.source, batch.non_tensor_batch
        if source == "index":
            values = [(info or {}).get("index", 0) for info in rows["extra_info"]]
        elif "raw_prompt" in rows:
            values = rows["raw_prompt"]
        else:
            logger.warning(
                "the legacy trainer's batch holds no raw_prompt, so this step's prompts are not recorded in the "
                "per-prompt history; set algorithm.prompts.key=index with a unique extra_info.index per row"
            )
            return {}
        keys: dict[str, object] = {}
        for uid, value in zip(rows["uid"], values, strict=True):
            keys.setdefault(str(uid), prompt_key(value, source))
        return keys


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
