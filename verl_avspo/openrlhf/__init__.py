"""OpenRLHF adapter: AVSPO and the ACR metrics for OpenRLHF's Ray PPO trainer.

- ``python -m verl_avspo.openrlhf <train_ppo_ray arguments> [--avspo.KEY VALUE ...]`` runs
  ``openrlhf.cli.train_ppo_ray`` with the adapter installed in every Ray worker
  (:mod:`verl_avspo.openrlhf.launcher`).
- :func:`install` / :func:`worker_setup` put it into OpenRLHF's trainer classes
  (:mod:`verl_avspo.openrlhf.trainer_wrap`; the generator's side, :mod:`verl_avspo.openrlhf.generation`),
  after :func:`check_openrlhf` found what they wrap
  (:mod:`verl_avspo.openrlhf.compat`).

Importing this package imports neither OpenRLHF nor Ray.
"""

from verl_avspo.openrlhf.compat import CHECKED_VERSIONS, SUPPORTED_VERSIONS, OpenRLHFIncompatibleError, check_openrlhf
from verl_avspo.openrlhf.trainer_wrap import install, worker_setup

__all__ = [
    "CHECKED_VERSIONS",
    "SUPPORTED_VERSIONS",
    "OpenRLHFIncompatibleError",
    "check_openrlhf",
    "install",
    "worker_setup",
]
