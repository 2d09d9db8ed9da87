"""``python -m verl_avspo.openrlhf``: OpenRLHF's ``train_ppo_ray`` with AVSPO and the ACR metrics.

The arguments are OpenRLHF's, plus ``--avspo.KEY VALUE`` for AVSPO's settings and ``--acr.KEY VALUE``
for ACR's (the keys of docs/configuration.md). AVSPO computes the advantages when
``--algo.advantage.estimator avspo`` is given (it runs as ``group_norm`` in OpenRLHF's argument
checks), or when ``--avspo.*`` keys are given with ``group_norm`` or ``dr_grpo`` (the latter without
the std division); ``--avspo.*`` keys with another estimator are refused. Without AVSPO, OpenRLHF's
own estimator runs and only the ``acr/*`` metrics and the stall alert are added. ``--acr.*`` applies to
every estimator.

OpenRLHF computes advantages inside its Ray actors. The launcher makes OpenRLHF build the adapter's
trainers (:func:`verl_avspo.openrlhf.install`, in this process: Ray ships them to their actors), adds the
settings to the runtime_env of the ``ray.init`` that OpenRLHF itself calls (the workers read them from
their environment), then runs ``openrlhf.cli.train_ppo_ray`` as ``__main__``. No hook runs in the workers.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from typing import Any

from verl_avspo.core.acr_config import ACRConfig
from verl_avspo.core.config import PRESETS
from verl_avspo.core.prompt_skip import SkipSpelling, resolve_prompt_skip, skip_problems
from verl_avspo.core.validation import SettingsError
from verl_avspo.openrlhf import install
from verl_avspo.openrlhf.advantage_step import (
    ACR_FLAGS,
    ACR_SETTINGS_ENV,
    AVSPO_ESTIMATORS,
    AVSPO_FLAGS,
    PROMPT_SKIP_ENV,
    PROMPT_SKIP_FLAGS,
    SETTINGS_ENV,
    resolve_flags,
)
from verl_avspo.openrlhf.compat import OpenRLHFIncompatibleError, check_openrlhf, trainer_modules
from verl_avspo.openrlhf.flags import UsageError, parse_number, split_prompt_skip_arguments, split_settings_arguments
from verl_avspo.openrlhf.surface import OPENRLHF_EPSILON, OPENRLHF_GROUP_ESTIMATORS

__all__ = ["choose_estimator", "runtime_env_hook", "main"]

_ESTIMATOR_FLAG = "--algo.advantage.estimator"
_ASYNC_FLAG = "--train.async_enable"
_GROUP_SIZE_FLAG = "--rollout.n_samples_per_prompt"
_SKIP_SPELLING = SkipSpelling(
    skip=PROMPT_SKIP_FLAGS,
    estimator=_ESTIMATOR_FLAG,
    group_size=_GROUP_SIZE_FLAG,
    group_estimators=f"avspo, {', '.join(OPENRLHF_GROUP_ESTIMATORS)}",
    assign=" ",
    true="true",
    false="false",
)

USAGE = f"""usage: python -m verl_avspo.openrlhf <openrlhf.cli.train_ppo_ray arguments> [--avspo.KEY VALUE ...]
                                 [--acr.KEY VALUE ...] [--prompts.skip.KEY VALUE ...]

  {_ESTIMATOR_FLAG} avspo     AVSPO replaces group_norm (preset paper unless --avspo.preset says otherwise)
  --avspo.preset {"|".join(PRESETS)},
  --avspo.strategy stratified, --avspo.k adaptive, ...
                                   any algorithm.avspo key of docs/configuration.md; with group_norm or
                                   dr_grpo they switch AVSPO on for that estimator, with any other
                                   estimator they are refused
  without AVSPO                    OpenRLHF's estimator, plus acr/rate, acr/all_correct, acr/all_wrong
                                   (and acr/effective for rloo, group_norm, dr_grpo) in its logged metrics
  --acr.tau 1e-6, --acr.reward_range 0 1
                                   any algorithm.acr key: the collapse test and the verifier's range, for
                                   every estimator
  --acr.alert.rule acr|all_wrong|acr_no_gain, --acr.alert.window 50, --acr.alert.threshold 0.35,
  --acr.alert.action warn|stop     the stall alert (acr/stalled), with or without AVSPO; stop checkpoints
                                   the stalled step and ends the run (synchronous trainer only)
  --prompts.skip.enable true, --prompts.skip.explore 0.5, ...
                                   skip prompts predicted to collapse before their rollout (GRESO's rule;
                                   any algorithm.prompts.skip key; synchronous trainer, a group estimator
                                   and --rollout.n_samples_per_prompt 2 or more only)
OpenRLHF's own options follow."""


def choose_estimator(argv: Sequence[str], settings: dict[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
    """OpenRLHF's arguments with the estimator OpenRLHF should see, and the AVSPO settings to run
    (``settings``: the ``--avspo.*`` keys less ACR's; None: OpenRLHF's own estimator).

    Raises:
        UsageError: AVSPO settings with an estimator AVSPO does not replace, with the fix.
    """
    argv = list(argv)
    position, estimator = None, None
    for i, token in enumerate(argv):
        flag, has_value, inline = token.partition("=")
        if _names(flag, _ESTIMATOR_FLAG):
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
    if not settings:
        return argv, None
    if estimator not in AVSPO_ESTIMATORS:
        given = f"{_ESTIMATOR_FLAG}={estimator}" if estimator else f"no {_ESTIMATOR_FLAG} (OpenRLHF's default: gae)"
        flags = ", ".join(f"{AVSPO_FLAGS}.{key}" for key in sorted(settings))
        raise UsageError(
            f"{flags} given with {given}: AVSPO's settings apply only when AVSPO replaces a group estimator and "
            f"would do nothing. Use {_ESTIMATOR_FLAG} avspo (or group_norm, or dr_grpo for no std division), or "
            f"remove them (ACR's own settings are {ACR_FLAGS}.*)."
        )
    return argv, settings


def _names(token: str, flag: str) -> bool:
    """Whether ``token`` (before any ``=``) is ``flag`` as OpenRLHF's argparse reads it: the flag itself,
    or an abbreviation of it (a prefix that goes past its section, ``--train.async_e``); an ambiguous
    one argparse refuses itself."""
    name = token.partition("=")[0]
    return name.startswith("--") and flag.startswith(name) and len(name) > flag.rindex(".") + 1


def _option_value(argv: Sequence[str], flag: str) -> str | None:
    """The last value given to ``flag`` (``--flag VALUE``, ``--flag=VALUE``, or an abbreviation), or None."""
    value = None
    for i, token in enumerate(argv):
        if _names(token, flag):
            _, has_value, inline = token.partition("=")
            value = inline if has_value else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


def _check_group_size(argv: Sequence[str], avspo: bool) -> None:
    """OpenRLHF asserts a group size above 1 for its group estimators (a bare AssertionError, after
    its imports); AVSPO runs as group_norm."""
    estimator = _option_value(argv, _ESTIMATOR_FLAG) or "gae"
    if estimator not in OPENRLHF_GROUP_ESTIMATORS:
        return
    given = _option_value(argv, _GROUP_SIZE_FLAG)
    size = parse_number(given) if given is not None else 1
    if isinstance(size, int) and size < 2:
        what = "AVSPO" if avspo else f"{_ESTIMATOR_FLAG} {estimator}"
        shown = f"{_GROUP_SIZE_FLAG} {given}" if given is not None else f"no {_GROUP_SIZE_FLAG} (OpenRLHF's default: 1)"
        raise UsageError(
            f"{what} compares the responses sampled for one prompt, so it needs at least 2 per prompt, and this "
            f"command has {shown}. Set {_GROUP_SIZE_FLAG} 8 (the paper's group size) or more."
        )


def _check_alert_stop(argv: Sequence[str], acr: ACRConfig) -> None:
    """``--acr.alert.action stop`` ends the synchronous trainer's loop; the asynchronous one
    generates in another actor, which the alert cannot stop."""
    if acr.alert.action == "stop" and any(_names(token, _ASYNC_FLAG) for token in argv):
        raise UsageError(
            f"{ACR_FLAGS}.alert.action stop needs OpenRLHF's synchronous trainer; with {_ASYNC_FLAG} the alert can "
            f"only warn. Drop {_ASYNC_FLAG} or use {ACR_FLAGS}.alert.action warn."
        )


def _with_openrlhf_epsilon(settings: dict[str, Any]) -> dict[str, Any]:
    """OpenRLHF's epsilon, unless the preset sets its own (paper_code: the released code's 1e-4)."""
    if "epsilon" not in PRESETS.get(settings.get("preset", "paper"), {}):
        settings = {"epsilon": OPENRLHF_EPSILON, **settings}
    return settings


def _environment(
    settings: dict[str, Any] | None, acr: dict[str, Any], prompt_skip: dict[str, Any] | None = None
) -> dict[str, str]:
    """The environment variables that carry the settings to every worker."""
    return {
        SETTINGS_ENV: json.dumps(settings) if settings is not None else "",
        ACR_SETTINGS_ENV: json.dumps(acr) if acr else "",
        PROMPT_SKIP_ENV: json.dumps(prompt_skip) if prompt_skip else "",
    }


def runtime_env_hook(
    init: Callable[..., Any],
    settings: dict[str, Any] | None,
    acr: dict[str, Any] | None = None,
    prompt_skip: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """``ray.init`` that adds the adapter's settings to the environment variables of the runtime_env it is
    given (``settings``: AVSPO's, None without AVSPO; ``acr``: the ``--acr.*`` settings; ``prompt_skip``: the
    ``--prompts.skip.*`` settings, None without skipping). Not Ray's ``RAY_RUNTIME_ENV_HOOK`` variable: Ray skips
    that hook when the driver runs under ``uv run`` (``RAY_ENABLE_UV_RUN_RUNTIME_ENV``, on by default), which
    would drop the settings without a word."""

    @functools.wraps(init)
    def ray_init(*args: Any, **kwargs: Any) -> Any:
        runtime_env = dict(kwargs.get("runtime_env") or {})
        environment = _environment(settings, acr or {}, prompt_skip)
        runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **environment}
        kwargs["runtime_env"] = runtime_env
        return init(*args, **kwargs)

    return ray_init


def resolve_arguments(argv: Sequence[str]) -> tuple[list[str], dict[str, Any] | None, dict[str, Any]]:
    """OpenRLHF's arguments, the AVSPO settings (None: no AVSPO) and the ``--acr.*`` settings the
    workers get, every value checked.

    Raises:
        UsageError: every problem of the command line, with the fix.
    """
    rest, avspo, acr = split_settings_arguments(argv)
    rest, avspo = choose_estimator(rest, avspo)
    avspo = None if avspo is None else _with_openrlhf_epsilon(avspo)
    try:
        _, acr_config = resolve_flags(avspo, acr)
    except SettingsError as error:
        raise UsageError(str(error)) from None
    _check_alert_stop(rest, acr_config)
    return rest, avspo, acr


def check_prompt_skip(argv: Sequence[str], prompt_skip: dict[str, Any] | None) -> bool:
    """Whether this run skips prompts (``prompt_skip``: the ``--prompts.skip.*`` settings), once the settings
    are valid and this run can skip: groups of at least 2 responses compared by the estimator (``argv``:
    OpenRLHF's arguments, AVSPO's ``avspo`` already ``group_norm``; the rule verl's launcher applies,
    ``core.prompt_skip.skip_problems``), and the synchronous trainer, whose prompt draw runs in the actor
    that keeps the run's history. Needs no OpenRLHF import.

    Raises:
        UsageError: every problem, with the fix.
    """
    if prompt_skip is None:
        return False
    try:
        config = resolve_prompt_skip(prompt_skip, section=PROMPT_SKIP_FLAGS)
    except SettingsError as error:
        raise UsageError(str(error)) from None
    if not config.enable:
        return False
    estimator = _option_value(argv, _ESTIMATOR_FLAG) or "gae"
    given = _option_value(argv, _GROUP_SIZE_FLAG)
    group_size = parse_number(given) if given is not None else 1  # OpenRLHF's default
    problems = skip_problems(_SKIP_SPELLING, estimator, estimator in OPENRLHF_GROUP_ESTIMATORS, group_size)
    if problems:
        raise UsageError(" ".join(problems))
    if any(_names(token, _ASYNC_FLAG) for token in argv):
        raise UsageError(
            f"{PROMPT_SKIP_FLAGS}.enable true needs OpenRLHF's synchronous trainer: with {_ASYNC_FLAG} prompts are "
            "drawn in another actor than the one that keeps the run's per-prompt history, so nothing could decide "
            f"before the rollout. Drop {_ASYNC_FLAG} or {PROMPT_SKIP_FLAGS}.enable."
        )
    return True


def check_prompt_draw(samples_generator: Any) -> None:
    """OpenRLHF's ``samples_generator`` module has the prompt draw where the skip rule acts.

    Raises:
        UsageError: it has none, with the fix.
    """
    if not callable(getattr(samples_generator, "_collect_prompt_batch", None)):
        raise UsageError(
            f"{PROMPT_SKIP_FLAGS}.enable true: this OpenRLHF draws its prompts without "
            f"{samples_generator.__name__}._collect_prompt_batch, where the skip rule acts (OpenRLHF 0.11). "
            f"Install openrlhf 0.11, or drop {PROMPT_SKIP_FLAGS}.enable."
        )


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
        argv, prompt_skip = split_prompt_skip_arguments(argv)
        rest, settings, acr = resolve_arguments(argv)
        _check_group_size(rest, avspo=settings is not None)
        skipping = check_prompt_skip(rest, prompt_skip)
        version = install()
        if skipping:
            check_prompt_draw(trainer_modules()[1])
    except (UsageError, OpenRLHFIncompatibleError) as error:
        print(f"verl_avspo.openrlhf: error: {error}", file=sys.stderr)
        return 2
    import ray

    os.environ.update(_environment(settings, acr, prompt_skip))
    ray.init = runtime_env_hook(ray.init, settings, acr, prompt_skip)
    what = f"AVSPO {json.dumps(settings)}, " if settings is not None else "OpenRLHF's estimator, "
    print(f"verl_avspo.openrlhf: OpenRLHF {version}, {what}ACR {json.dumps(acr)} in its trainer", file=sys.stderr)
    sys.argv = ["openrlhf.cli.train_ppo_ray", *rest]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)
    return 0
