"""The adapter's own command-line settings among OpenRLHF's arguments: ``--avspo.KEY VALUE``,
``--acr.KEY VALUE`` and ``--prompts.skip.KEY VALUE`` (the keys of docs/configuration.md), read into the
dicts the core's settings resolvers take. Numbers parse as numbers, other values as YAML.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from verl_avspo.core.acr_config import ACR_KEYS, ALERT_KEYS, ACRConfig, AlertConfig
from verl_avspo.core.config import AVSPO_KEYS, AVSPOConfig
from verl_avspo.core.prompt_skip import FIELDS as PROMPT_SKIP_KEYS
from verl_avspo.core.prompt_skip import PromptSkipConfig
from verl_avspo.openrlhf.advantage_step import ACR_FLAGS, AVSPO_FLAGS, PROMPT_SKIP_FLAGS

__all__ = ["UsageError", "parse_number", "split_settings_arguments", "split_prompt_skip_arguments"]

# Each group of settings: its flags' prefix, the keys it takes and what it is called in messages.
_GROUPS = {
    f"{AVSPO_FLAGS}.": (AVSPO_KEYS, "an AVSPO setting"),
    f"{ACR_FLAGS}.": (ACR_KEYS, "an ACR setting"),
    f"{PROMPT_SKIP_FLAGS}.": (PROMPT_SKIP_KEYS, "a prompt skip setting"),
}


class UsageError(ValueError):
    """A command-line value the launcher refuses, with the fix."""


def parse_number(token: str) -> int | float | None:
    """``4``, ``-1``, ``1e-3`` as numbers (YAML 1.1 reads ``1e-3`` as text); None otherwise."""
    for kind in (int, float):
        try:
            return kind(token)
        except ValueError:
            pass
    return None


def _example(key: str, prefix: str = "") -> str | None:
    """A valid value of ``key`` (``alert.window`` for the alert's) as typed after its flag (its
    default), for messages; None if ``key`` is no setting."""
    section, dot, alert_key = key.partition(".")
    if prefix == f"{PROMPT_SKIP_FLAGS}.":
        value = getattr(PromptSkipConfig(), key, None) if key in PROMPT_SKIP_KEYS else None
    elif dot:
        value = getattr(AlertConfig(), alert_key, None) if section == "alert" and alert_key in ALERT_KEYS else None
    elif key in ACR_KEYS:
        value = getattr(ACRConfig(), key)
    else:
        value = getattr(AVSPOConfig(), key, None)
    if value is None or isinstance(value, (tuple, list)):
        return value if value is None else " ".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def _value(tokens: Sequence[str], prefix: str, key: str) -> Any:
    if not tokens:
        keys, what = _GROUPS[prefix]
        example = _example(key, prefix)
        if example is None or key.partition(".")[0] not in keys:
            raise UsageError(f"{prefix}{key} needs a value, and {key!r} is not {what} (docs/configuration.md)")
        raise UsageError(f"{prefix}{key} needs a value, for example {prefix}{key} {example}")
    values = [number if (number := parse_number(token)) is not None else yaml.safe_load(token) for token in tokens]
    if any(value is None for value in values):  # "--avspo.k=", "--avspo.k null": not "the preset's default"
        example = _example(key, prefix)
        raise UsageError(
            f"{prefix}{key} got {' '.join(tokens)!r}, which is no value. To keep the default, leave {prefix}{key} "
            f"out" + (f"; to set it, give a value, for example {prefix}{key} {example}" if example else "")
        )
    return values[0] if len(values) == 1 else values


def _split_groups(argv: Sequence[str], prefixes: Sequence[str]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Separate the ``PREFIX.KEY VALUE...`` (or ``PREFIX.KEY=VALUE``) settings of each of ``prefixes`` (keys
    of :data:`_GROUPS`) from the other arguments: (the others, {prefix: its settings})."""
    rest: list[str] = []
    groups: dict[str, dict[str, Any]] = {prefix: {} for prefix in prefixes}
    i = 0
    while i < len(argv):
        token = argv[i]
        prefix = next((prefix for prefix in prefixes if token.startswith(prefix)), None)
        if prefix is None:
            rest.append(token)
            i += 1
            continue
        flag, has_value, inline = token.partition("=")
        key = flag[len(prefix) :]
        if has_value:
            values, i = [inline], i + 1
        else:
            end = i + 1
            while end < len(argv) and not (argv[end].startswith("-") and parse_number(argv[end]) is None):
                end += 1
            values, i = list(argv[i + 1 : end]), end
        if not key:
            raise UsageError(f"{flag} is not a setting: give a key, for example --avspo.preset paper or --acr.tau 1e-6")
        if key == "alert":
            raise UsageError(
                f"{flag} is a group of settings, not one: give its keys, for example {flag}.window 50 (keys: "
                f"{', '.join(ALERT_KEYS)})"
            )
        settings = groups[prefix]
        section, dot, alert_key = key.partition(".")
        target = settings.setdefault("alert", {}) if section == "alert" and dot else settings
        name = alert_key if target is not settings else key
        if not isinstance(target, dict) or name in target:
            raise UsageError(f"{flag} is given twice; give it once")
        target[name] = _value(values, prefix, key)
    return rest, groups


def split_settings_arguments(argv: Sequence[str]) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """Separate ``--avspo.KEY VALUE...`` and ``--acr.KEY VALUE...`` (or ``--avspo.KEY=VALUE``) from
    OpenRLHF's arguments: (OpenRLHF's, the ``--avspo.*`` settings, the ``--acr.*`` settings).

    Values are numbers where they parse as one (``1e-3``, ``-1``), else YAML (``false``,
    ``adaptive``, ``[0, 1]``); several values after one key make a list (``--acr.reward_range 0 1``).
    A key's values end at the next option (a token starting with ``-`` that is not a number).
    ``--acr.alert.KEY`` nests as ``{"alert": {"KEY": ...}}``, as in ``algorithm.acr.alert.KEY``.
    """
    rest, groups = _split_groups(argv, (f"{AVSPO_FLAGS}.", f"{ACR_FLAGS}."))
    return rest, groups[f"{AVSPO_FLAGS}."], groups[f"{ACR_FLAGS}."]


# The adapter's --prompts.* flags: --prompts.skip.KEY only (OpenRLHF has no --prompts flag of its own; the
# allocator's --prompts.allocation.KEY is refused with the reason).
_PROMPTS_FLAGS = PROMPT_SKIP_FLAGS.rpartition(".")[0]


def _other_prompts_flag_problem(argv: Sequence[str]) -> str | None:
    """The message for the first ``--prompts...`` flag that is not ``--prompts.skip.KEY`` (None if none is):
    OpenRLHF's argparse would answer it with its whole usage."""
    for i, token in enumerate(argv):
        flag, has_value, inline = token.partition("=")
        if not flag.startswith(_PROMPTS_FLAGS) or flag.startswith(f"{PROMPT_SKIP_FLAGS}."):
            continue
        value = inline if has_value else (argv[i + 1] if i + 1 < len(argv) else "")
        given = f"{flag} {value}".strip()
        keys = ", ".join(PROMPT_SKIP_KEYS)
        if flag == PROMPT_SKIP_FLAGS:
            return (
                f"{given}: {PROMPT_SKIP_FLAGS} is a group of settings, not one: give its keys, for example "
                f"{PROMPT_SKIP_FLAGS}.enable true (keys: {keys})"
            )
        if flag.startswith(f"{_PROMPTS_FLAGS}.allocation"):
            return (
                f"{given}: the rollout allocator is not available with OpenRLHF: OpenRLHF 0.11 gives every prompt "
                "--rollout.n_samples_per_prompt samples and reshapes the rewards by it for every group estimator "
                "(experience_maker.py), so no prompt can have a pilot or a larger group. Remove the flag "
                f"({PROMPT_SKIP_FLAGS}.KEY saves rollouts with OpenRLHF's synchronous trainer); docs/prompts.md says "
                "what OpenRLHF would need"
            )
        if flag == f"{_PROMPTS_FLAGS}.key":
            return (
                f"{given}: there is no {flag} in OpenRLHF, whose prompts carry no dataset index: the adapter keys "
                f"every prompt by a hash of its text. Remove {flag} (the prompt settings here are "
                f"{PROMPT_SKIP_FLAGS}.KEY, keys: {keys})"
            )
        return f"{given}: {flag} is not a setting; the prompt settings are {PROMPT_SKIP_FLAGS}.KEY (keys: {keys})"
    return None


def split_prompt_skip_arguments(argv: Sequence[str]) -> tuple[list[str], dict[str, Any] | None]:
    """Separate ``--prompts.skip.KEY VALUE`` (the pre-rollout skip rule, docs/configuration.md) from the
    other arguments, read as :func:`split_settings_arguments` reads its groups; None when none is given.

    Raises:
        UsageError: a bad value, or another ``--prompts`` flag (``--prompts.skip true``, ``--prompts.key``),
            in one line with the fix.
    """
    problem = _other_prompts_flag_problem(argv)
    if problem:
        raise UsageError(problem)
    rest, groups = _split_groups(argv, (f"{PROMPT_SKIP_FLAGS}.",))
    return rest, groups[f"{PROMPT_SKIP_FLAGS}."] or None
