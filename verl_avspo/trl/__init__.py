"""TRL adapter: ACR metrics, the stall alert and AVSPO in TRL's ``GRPOTrainer`` (docs/trl.md).

    from verl_avspo.trl import AVSPOGRPOTrainer        # instead of: from trl import GRPOTrainer

    trainer = AVSPOGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                               avspo={"preset": "paper"}, acr={"alert": {"action": "stop"}})

:class:`ACRTrainerMixin` is the same for any ``GRPOTrainer`` subclass (``class T(ACRTrainerMixin, MyGRPOTrainer)``).
Importing this package imports TRL (``pip install 'verl-avspo[trl]'``).
"""

from verl_avspo.trl.settings import ESTIMATORS, TRLSettings, resolve_trl_settings
from verl_avspo.trl.trainer import STATE_FILE, TESTED_TRL, ACRTrainerMixin, AVSPOGRPOTrainer

__all__ = [
    "ESTIMATORS",
    "STATE_FILE",
    "TESTED_TRL",
    "ACRTrainerMixin",
    "AVSPOGRPOTrainer",
    "TRLSettings",
    "resolve_trl_settings",
]
