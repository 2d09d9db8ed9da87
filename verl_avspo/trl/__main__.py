"""``python -m verl_avspo.trl``: the TRL adapter is a trainer class, not a command; say how to use it."""

import sys

sys.exit(
    "verl_avspo.trl has no command: it is TRL's GRPOTrainer with ACR and AVSPO. In your training script, use "
    "`from verl_avspo.trl import AVSPOGRPOTrainer` instead of `from trl import GRPOTrainer` (same arguments, plus "
    "estimator=, avspo=, acr=, prompts=); see docs/trl.md. For a verl run, `python -m verl_avspo.main_ppo`; for "
    "OpenRLHF, `python -m verl_avspo.openrlhf`; the tools: `python -m verl_avspo --help`."
)
