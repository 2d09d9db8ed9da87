"""``python -m verl_avspo.openrlhf``: OpenRLHF's ``train_ppo_ray`` with AVSPO and the ACR metrics.

The arguments are OpenRLHF's, plus ``--avspo.KEY VALUE`` for the AVSPO settings (the keys of docs/configuration.md).
AVSPO computes the advantages when ``--algo.advantage.estimator avspo`` is given (it runs as
``group_norm`` in OpenRLHF's argument checks), or when ``--avspo.*`` keys are given with
``group_norm`` or ``dr_grpo`` (the latter without the std division). Without either, OpenRLHF's own
estimator runs and only the ``acr/*`` metrics are added. The older flat spelling
``--advantage_estimator`` is accepted and rewritten.

The adapter must be installed where OpenRLHF computes advantages, i.e. inside its Ray actors. The
launcher therefore adds a ``worker_process_setup_hook`` and the settings to the runtime_env of the
``ray.init`` that OpenRLHF itself calls, then runs ``openrlhf.cli.train_ppo_ray`` as ``__main__``.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from typing import Any

import yaml

from verl_avspo.core.config import ACR_KEYS, ALERT_KEYS, AVSPO_KEYS, PRESETS, ACRConfig, AVSPOConfig, resolve_settings
from verl_avspo.openrlhf.advantage_step import ACR_SETTINGS_ENV, AVSPO_ESTIMATORS, SETTINGS_ENV
from verl_avspo.openrlhf.compat import OpenRLHFIncompatibleError, check_openrlhf

__all__ = ["WORKER_SETUP_HOOK", "split_avspo_arguments", "choose_estimator", "runtime_env_hook", "main"]

WORKER_SETUP_HOOK = "verl_avspo.openrlhf.worker_setup"
_ESTIMATOR_FLAG = "--algo.advantage.estimator"
_LEGACY_ESTIMATOR_FLAG = "--advantage_estimator"
_PREFIX = "--avspo."
_ASYNC_FLAG = "--train.async_enable"
_GROUP_SIZE_FLAG = "--rollout.n_samples_per_prompt"
# The estimators for which OpenRLHF asserts n_samples_per_prompt > 1 (train_ppo_ray.py).
OPENRLHF_GROUP_ESTIMATORS = ("rloo", "reinforce_baseline", "group_norm", "dr_grpo")
# OpenRLHF's group_norm divides by (std + 1e-9); the same epsilon makes untouched groups identical.
OPENRLHF_EPSILON = 1e-9

USAGE = f"""usage: python -m verl_avspo.openrlhf <openrlhf.cli.train_ppo_ray arguments> [--avspo.KEY VALUE ...]

  {_ESTIMATOR_FLAG} avspo     AVSPO replaces group_norm (preset paper unless --avspo.preset says otherwise)
  --avspo.preset {"|".join(PRESETS)},
  --avspo.strategy stratified, --avspo.reward_range 0 1, ...
                                   any algorithm.avspo key of docs/configuration.md; with group_norm or
                                   dr_grpo they switch AVSPO on for that estimator
  without AVSPO settings           OpenRLHF's estimator, plus acr/rate, acr/all_correct, acr/all_wrong
                                   (and acr/effective for rloo, group_norm, dr_grpo) in its logged metrics;
                                   --avspo.tau, --avspo.reward_range and --avspo.alert.* alone set only the
                                   metrics' and the alert's settings and leave OpenRLHF's estimator in place
  --avspo.alert.rule acr|all_wrong|acr_no_gain, --avspo.alert.window 50, --avspo.alert.threshold 0.35,
  --avspo.alert.action warn|stop   the stall alert (acr/stalled), with or without AVSPO; stop checkpoints
                                   the stalled step and ends the run (synchronous trainer only)
OpenRLHF's own options follow."""


class UsageError(ValueError):
    """A command-line value the launcher refuses, with the fix."""


def _number(token: str) -> int | float | None:
    """``4``, ``-1``, ``1e-3`` as numbers (YAML 1.1 reads ``1e-3`` as text); None otherwise."""
    for kind in (int, float):
        try:
            return kind(token)
        except ValueError:
            pass
    return None


def _example(key: str) -> str:
    """A valid value of ``key`` as typed after ``--avspo.KEY`` (its default), for messages."""
    value = getattr(ACRConfig() if key in ACR_KEYS else AVSPOConfig(), key, None)
    if isinstance(value, (tuple, list)):
        return " ".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def _value(tokens: Sequence[str], flag: str) -> Any:
    if not tokens:
        key = flag[len(_PREFIX) :]
        if key not in AVSPO_KEYS:
            raise UsageError(f"{flag} needs a value, and {key!r} is not an AVSPO setting (docs/configuration.md)")
        raise UsageError(f"{flag} needs a value, for example {flag} {_example(key)}")
    values = [number if (number := _number(token)) is not None else yaml.safe_load(token) for token in tokens]
    if any(value is None for value in values):  # "--avspo.k=", "--avspo.k null": not "the preset's default"
        key = flag[len(_PREFIX) :]
        raise UsageError(
            f"{flag} got {' '.join(tokens)!r}, which is no value. To keep the preset's default, leave {flag} out; "
            f"to set it, give a value, for example {flag} {_example(key)}"
        )
    return values[0] if len(values) == 1 else values


def split_avspo_arguments(argv: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """Separate ``--avspo.KEY VALUE...`` (or ``--avspo.KEY=VALUE``) from OpenRLHF's arguments.

    Values are numbers where they parse as one (``1e-3``, ``-1``), else YAML (``false``,
    ``adaptive``, ``[0, 1]``); several values after one key make a list (``--avspo.reward_range 0 1``).
    A key's values end at the next option (a token starting with ``-`` that is not a number).
    """
    rest: list[str] = []
    settings: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith(_PREFIX):
            rest.append(token)
            i += 1
            continue
        flag, has_value, inline = token.partition("=")
        key = flag[len(_PREFIX) :]
        if has_value:
            values, i = [inline], i + 1
        else:
            end = i + 1
            while end < len(argv) and not (argv[end].startswith("-") and _number(argv[end]) is None):
                end += 1
            values, i = list(argv[i + 1 : end]), end
        if not key:
            raise UsageError(f"{flag} is not an AVSPO setting: give a key, for example --avspo.preset paper")
        if key == "alert":
            raise UsageError(
                f"{flag} is a group of settings, not one: give its keys, for example {flag}.window 50 (keys: "
                f"{', '.join(ALERT_KEYS)})"
            )
        section, dot, alert_key = key.partition(".")
        # --avspo.alert.KEY: the stall alert's settings, nested as in algorithm.avspo.alert.KEY.
        target = settings.setdefault("alert", {}) if section == "alert" and dot else settings
        name = alert_key if target is not settings else key
        if not isinstance(target, dict) or name in target:
            raise UsageError(f"{flag} is given twice; give it once")
        target[name] = _value(values, flag)
    return rest, settings


def choose_estimator(argv: Sequence[str], settings: dict[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
    """OpenRLHF's arguments with the estimator OpenRLHF should see, and the AVSPO settings to run
    (None: OpenRLHF's own estimator, ACR metrics only)."""
    argv = list(argv)
    position, estimator = None, None
    for i, token in enumerate(argv):
        flag, has_value, inline = token.partition("=")
        # argparse also takes an unambiguous prefix; no other OpenRLHF option starts like this one.
        if flag == _LEGACY_ESTIMATOR_FLAG or _names(flag, _ESTIMATOR_FLAG):
            if has_value:
                position, estimator = i, inline
                argv[i] = f"{_ESTIMATOR_FLAG}={inline}"
            elif i + 1 < len(argv):
                position, estimator = i + 1, argv[i + 1]
                argv[i] = _ESTIMATOR_FLAG
            else:
                raise UsageError(f"{flag} needs a value, for example {flag} avspo")
    if estimator == "avspo":
        argv[position] = f"{_ESTIMATOR_FLAG}=group_norm" if "=" in argv[position] else "group_norm"
        return argv, settings
    if not settings or set(settings) <= set(ACR_KEYS):  # no settings, or the metrics' own only
        return argv, None
    if estimator not in AVSPO_ESTIMATORS:
        given = f"{_ESTIMATOR_FLAG}={estimator}" if estimator else f"no {_ESTIMATOR_FLAG} (OpenRLHF's default: gae)"
        raise UsageError(
            f"--avspo.* settings ({', '.join(sorted(settings))}) were given with {given}; AVSPO replaces a group "
            f"estimator: use {_ESTIMATOR_FLAG} avspo (or group_norm, or dr_grpo for no std division)"
        )
    return argv, settings


def _names(token: str, flag: str) -> bool:
    """Whether ``token`` (before any ``=``) is ``flag`` as OpenRLHF's argparse reads it: the flag itself,
    or an abbreviation of it (a prefix that goes past its section, ``--train.async_e``); an ambiguous
    one argparse refuses itself."""
    name = token.partition("=")[0]
    return flag.startswith(name) and len(name) > flag.rindex(".") + 1


def _option_value(argv: Sequence[str], flag: str) -> str | None:
    """The last value given to ``flag`` (``--flag VALUE``, ``--flag=VALUE``, or an abbreviation), or None."""
    value = None
    for i, token in enumerate(argv):
        if token.startswith("--") and _names(token, flag):
            name, has_value, inline = token.partition("=")
            value = inline if has_value else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


def _check_group_size(argv: Sequence[str], avspo: bool) -> None:
    """OpenRLHF asserts a group size above 1 for its group estimators (a bare AssertionError, after
    its imports); AVSPO runs as group_norm."""
    estimator = _option_value(argv, _ESTIMATOR_FLAG) or "gae"
    if estimator not in OPENRLHF_GROUP_ESTIMATORS:
        return
    given = _option_value(argv, _GROUP_SIZE_FLAG)
    size = _number(given) if given is not None else 1
    if isinstance(size, int) and size < 2:
        what = "AVSPO" if avspo else f"{_ESTIMATOR_FLAG} {estimator}"
        shown = f"{_GROUP_SIZE_FLAG} {given}" if given is not None else f"no {_GROUP_SIZE_FLAG} (OpenRLHF's default: 1)"
        raise UsageError(
            f"{what} compares the responses sampled for one prompt, so it needs at least 2 per prompt, and this "
            f"command has {shown}. Set {_GROUP_SIZE_FLAG} 8 (the paper's group size) or more."
        )


def _check_alert_stop(argv: Sequence[str], alert: Any) -> None:
    """``--avspo.alert.action stop`` ends the synchronous trainer's loop; the asynchronous one
    generates in another actor, which the alert cannot stop."""
    stops = isinstance(alert, dict) and alert.get("action") == "stop"
    if stops and any(token.startswith("--") and _names(token, _ASYNC_FLAG) for token in argv):
        raise UsageError(
            f"--avspo.alert.action stop needs OpenRLHF's synchronous trainer; with {_ASYNC_FLAG} the alert can only "
            f"warn. Drop {_ASYNC_FLAG} or use --avspo.alert.action warn."
        )


def _validated(settings: dict[str, Any]) -> dict[str, Any]:
    # OpenRLHF's epsilon, unless the preset sets its own (paper_code: the released code's 1e-4).
    if "epsilon" not in PRESETS.get(settings.get("preset", "paper"), {}):
        settings = {"epsilon": OPENRLHF_EPSILON, **settings}
    try:
        resolve_settings(settings)
    except ValueError as error:
        raise UsageError(str(error).replace("algorithm.avspo.", _PREFIX)) from None
    return settings


def _environment(settings: dict[str, Any] | None, acr: dict[str, Any]) -> dict[str, str]:
    """The environment variables that carry the settings to every worker."""
    return {
        SETTINGS_ENV: json.dumps(settings) if settings is not None else "",
        ACR_SETTINGS_ENV: json.dumps(acr) if settings is None and acr else "",
    }


def runtime_env_hook(
    init: Callable[..., Any], settings: dict[str, Any] | None, acr: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """``ray.init`` that adds the adapter's setup hook and settings to the runtime_env it is given
    (``acr``: the ACR metrics' tau and reward_range for a run without AVSPO)."""

    @functools.wraps(init)
    def ray_init(*args: Any, **kwargs: Any) -> Any:
        runtime_env = dict(kwargs.get("runtime_env") or {})
        hook = runtime_env.get("worker_process_setup_hook")
        if hook not in (None, WORKER_SETUP_HOOK):
            raise UsageError(
                f"the runtime_env already has worker_process_setup_hook={hook!r}; the OpenRLHF adapter needs "
                f"{WORKER_SETUP_HOOK!r} there (call {hook!r} from your own hook and import verl_avspo.openrlhf "
                "worker_setup there too)"
            )
        runtime_env["worker_process_setup_hook"] = WORKER_SETUP_HOOK
        runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **_environment(settings, acr or {})}
        kwargs["runtime_env"] = runtime_env
        return init(*args, **kwargs)

    return ray_init


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(token in ("-h", "--help") for token in argv):
        print(USAGE)
        try:
            check_openrlhf()
        except OpenRLHFIncompatibleError as error:  # ours are shown; OpenRLHF's need OpenRLHF importable
            print(f"\nOpenRLHF's own options cannot be listed here: {error}")
            return 0
    try:
        rest, given = split_avspo_arguments(argv)
        rest, settings = choose_estimator(rest, given)
        settings = None if settings is None else _validated(settings)
        acr = {key: given[key] for key in ACR_KEYS if key in given}
        if settings is None:
            _validated(acr)
        _check_alert_stop(rest, given.get("alert"))
        _check_group_size(rest, avspo=settings is not None)
        version = check_openrlhf()
    except (UsageError, OpenRLHFIncompatibleError) as error:
        print(f"verl_avspo.openrlhf: error: {error}", file=sys.stderr)
        return 2
    import ray

    os.environ.update(_environment(settings, acr))
    ray.init = runtime_env_hook(ray.init, settings, acr)
    what = f"AVSPO {json.dumps(settings)}" if settings is not None else f"ACR metrics {json.dumps(acr)}"
    print(f"verl_avspo.openrlhf: OpenRLHF {version}, {what} in every Ray worker", file=sys.stderr)
    sys.argv = ["openrlhf.cli.train_ppo_ray", *rest]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)
    return 0
