"""Our V1 trainer modes: their names in verl's trainer registry, verl's mode each one runs, and the one setting
that makes verl ignore them. Standard library only: the entry point (:mod:`verl_avspo.verl_plugin.register`)
imports this in every verl process. Nothing here reads the command line.

Stock ``python -m verl.trainer.main_ppo`` builds its trainer with ``get_trainer_cls(config.trainer.v1.trainer_mode)``
(``verl/trainer/main_ppo.py:141``); :mod:`verl_avspo.verl_plugin.trainer_v1` registers one trainer per verl mode
under the names of :data:`MODES`, so ``trainer.v1.trainer_mode=avspo_sync`` is the whole route. Each of our
trainers presents verl's own name to verl (it sets ``trainer.v1.trainer_mode`` back before verl's ``__init__``),
because verl compares the mode string literally (docs/architecture.md, "Trainer modes").

With ``trainer.use_v1=False`` verl runs its legacy trainer and never reads ``trainer.v1.trainer_mode``: the run
would log no ``acr/*``, keep no state and give no alert, and say nothing of it. The launcher's checks, ``verl-avspo
doctor`` and, in stock ``main_ppo``, the first call of our estimator
(:func:`verl_avspo.verl_plugin.run_state.tracker_for`, from the config verl hands it) refuse it with
:func:`legacy_mode_problem`; stock ``main_ppo`` with another estimator has nothing of ours to refuse it in.
"""

from __future__ import annotations

__all__ = [
    "MODE_KEY",
    "MODES",
    "DEFAULT_MODE",
    "MODE_OVERRIDE",
    "is_ours",
    "misspelt_mode",
    "verl_mode",
    "our_mode",
    "legacy_mode_problem",
]

MODE_KEY = "trainer.v1.trainer_mode"
# Our mode -> the verl mode it runs (and presents to verl).
MODES = {f"avspo_{mode}": mode for mode in ("sync", "colocate_async", "separate_async")}
DEFAULT_MODE = "avspo_sync"
MODE_OVERRIDE = f"{MODE_KEY}={DEFAULT_MODE}"


def is_ours(mode: object) -> bool:
    """Whether ``mode`` names one of our trainers."""
    return mode in MODES


def misspelt_mode(mode: object) -> bool:
    """Whether ``mode`` looks like one of our trainers' names (``avspo_...``, any case) and is none of them."""
    return isinstance(mode, str) and mode.lower().startswith("avspo") and not is_ours(mode)


def verl_mode(mode: object) -> object:
    """verl's mode for ``mode`` (ours or verl's own, which is returned as it is)."""
    return MODES.get(mode, mode)  # type: ignore[arg-type]


def our_mode(mode: object) -> object:
    """Our mode for verl's ``mode`` (``sync`` -> ``avspo_sync``); ours, or a mode we have no trainer for, as it is."""
    return f"avspo_{mode}" if f"avspo_{mode}" in MODES else mode


def legacy_mode_problem(mode: object) -> str:
    """Why our trainer ``mode`` does nothing with ``trainer.use_v1=False``, and the fix."""
    return (
        f"{MODE_KEY}={mode} is a V1 trainer, and trainer.use_v1=False runs verl's legacy trainer, which never reads "
        "it: the run would log no acr/*, save no run state and give no stall alert. Set trainer.use_v1=True."
    )
