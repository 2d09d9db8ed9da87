"""OpenRLHF adapter: AVSPO and the ACR metrics for OpenRLHF's Ray PPO trainer.

- ``python -m verl_avspo.openrlhf <train_ppo_ray arguments> [--avspo.KEY VALUE ...]`` runs
  ``openrlhf.cli.train_ppo_ray`` with the adapter's trainers (:mod:`verl_avspo.openrlhf.launcher`).
- :func:`install` makes OpenRLHF build the adapter's subclasses of its trainers, experience maker and samples
  generator (:mod:`verl_avspo.openrlhf.extension`; their overrides, :mod:`verl_avspo.openrlhf.trainer_wrap`
  and :mod:`verl_avspo.openrlhf.generation`), after :func:`check_openrlhf` found what they extend
  (:mod:`verl_avspo.openrlhf.compat`).

Importing this package imports neither OpenRLHF nor Ray.
"""

import logging

from verl_avspo.openrlhf.advantage_step import settings_from_env
from verl_avspo.openrlhf.compat import CHECKED_VERSIONS, SUPPORTED_VERSIONS, OpenRLHFIncompatibleError, check_openrlhf

__all__ = [
    "CHECKED_VERSIONS",
    "SUPPORTED_VERSIONS",
    "OpenRLHFIncompatibleError",
    "check_openrlhf",
    "install",
]

logger = logging.getLogger(__name__)


def install() -> str:
    """Make OpenRLHF's ``train_ppo_ray``, run in this process, build the adapter's trainers, once the installed
    OpenRLHF has what they extend (idempotent; imports OpenRLHF); return OpenRLHF's version.

    Raises:
        OpenRLHFIncompatibleError: see :func:`check_openrlhf`.
    """
    version = check_openrlhf()
    from verl_avspo.openrlhf.extension import use_tracked_classes

    use_tracked_classes()
    what = "ACR metrics and AVSPO" if settings_from_env() is not None else "ACR metrics"
    logger.info("verl_avspo: %s installed in OpenRLHF %s", what, version)
    return version
