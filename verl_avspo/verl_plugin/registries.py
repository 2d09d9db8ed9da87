"""verl's registries (advantage estimators, policy losses, V1 trainers) read through their public getters, so that
we register through verl's ``register_*`` functions only and only once per process: no entry of verl's is ever
deleted or written by hand, a module reload included.

verl's register functions differ on a second registration of a name (verl 0.9.1): ``register_adv_est`` and
``register_trainer`` accept the same object again and raise ``ValueError`` for another one, while
``register_policy_loss`` replaces whatever the name held without a word. A reload of one of our modules makes
new function and class objects; registering those would be refused (estimators, trainers) or would replace
silently (the loss). So a name that holds ours already (:func:`is_ours`) is left as it is. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["registered", "is_ours"]


def registered(getter: Callable[[str], Any], name: str) -> Any:
    """What verl's registry getter ``getter`` (``get_adv_estimator_fn``, ``get_policy_loss_fn``,
    ``get_trainer_cls``) holds under ``name``, or None: each raises ``ValueError`` for a name it does not know."""
    try:
        return getter(name)
    except ValueError:
        return None


def is_ours(current: Any, ours: Any) -> bool:
    """Whether the registered ``current`` is our ``ours``: the same object, or the one of an earlier import of its
    module (a reload re-runs the module in the same namespace, so the registered one runs today's globals)."""
    return current is ours or (
        getattr(current, "__module__", None) == ours.__module__
        and getattr(current, "__qualname__", None) == ours.__qualname__
    )
