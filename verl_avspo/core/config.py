"""AVSPO settings: defaults, presets and validation (docs/configuration.md; the method: docs/method.md §3).

Framework-free. ``resolve_avspo`` takes any mapping (a plain dict, or verl's
``config.algorithm.avspo`` DictConfig) and returns the estimator's frozen, validated
:class:`AVSPOConfig`. ACR's own settings (``tau``, ``reward_range``, ``alert``) live in
:mod:`verl_avspo.core.acr_config`; :func:`resolve_run_settings` reads both from verl's
``config.algorithm`` (``algorithm.acr`` and ``algorithm.avspo``), and :func:`resolve_settings` from
one flat mapping that holds both (a notebook's dict).
A key set to ``None`` means "not given", so a Hydra config can declare every key with a null
default and still let ``preset`` decide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from verl_avspo.core.acr_config import (
    ACR_KEYS,
    ACR_SECTION,
    ALERT_ACTIONS,
    ALERT_KEYS,
    ALERT_RULES,
    ACRConfig,
    AlertConfig,
    resolve_acr,
    resolve_alert,
)
from verl_avspo.core.validation import (
    Problems,
    SettingsError,
    boolean,
    choice,
    fail,
    given_settings,
    integer,
    number,
    pair,
    unknown_key_problem,
)

__all__ = [
    "AVSPOConfig",
    "ACRConfig",
    "AlertConfig",
    "SettingsError",
    "PRESETS",
    "STRATEGIES",
    "APPLY_TO",
    "ACR_SIGNALS",
    "TRIGGER_SCOPES",
    "ALERT_ACTIONS",
    "ALERT_RULES",
    "PRIORS",
    "BASELINES",
    "RunSettings",
    "resolve_avspo",
    "resolve_settings",
    "resolve_run_settings",
    "resolve_acr",
    "resolve_alert",
    "unknown_key_problem",
    "misplaced_acr_key_problem",
    "given_settings",
    "AVSPO_KEYS",
    "ALERT_KEYS",
    "ACR_KEYS",
]

STRATEGIES = ("stratified", "opposite", "www", "random", "fixed", "exp_decay", "beta")
APPLY_TO = ("both", "all_correct", "all_wrong", "none")
ACR_SIGNALS = ("batch", "ema")
# group: each collapsed group (the paper); batch: only when every reward of the step is at the same
# end of reward_range, as the authors' released code (docs/method.md §5).
TRIGGER_SCOPES = ("group", "batch")
PRIORS = ("jeffreys", "laplace", "fitted")
BASELINES = ("loo", "group")
# Keys read only by `strategy: beta`, and the virtual-sample keys that it does not read: giving
# one where it has no effect is an error, so that a setting never silently does nothing.
BETA_KEYS = ("prior", "baseline", "prior_strength_max", "correct_weight")
VIRTUAL_SAMPLE_KEYS = ("gap", "apply_to", "k", "alpha", "trigger_scope")


@dataclass(frozen=True)
class AVSPOConfig:
    """Resolved AVSPO estimator settings (``algorithm.avspo``).
    The defaults are the ``paper`` preset."""

    preset: str = "paper"
    """The set of defaults the other keys override (``PRESETS``)."""
    strategy: str = "stratified"
    """How virtual values are placed (``STRATEGIES``); ``beta`` uses Beta-prior pseudo-counts instead."""
    gap: float = 0.1
    """Spacing of ``stratified`` / ``exp_decay`` virtual values, as a fraction of the reward range."""
    apply_to: str = "both"
    """Which collapsed groups may be augmented: ``both``, ``all_correct``, ``all_wrong`` or ``none``."""
    k: int | str = "adaptive"
    """Virtual samples per augmented group: an integer >= 1, or ``adaptive`` (max(1, min(n, ceil(n s^alpha))))."""
    alpha: float = 0.5
    """Exponent of the adaptive K."""
    acr_signal: str = "batch"
    """The trigger signal s_t: this step's ACR (``batch``) or its moving average (``ema``)."""
    trigger_scope: str = "group"
    """``group``: each collapsed group may trigger (the paper); ``batch``: only an all-equal batch (released code)."""
    ema_beta: float = 0.9
    """EMA coefficient of ``acr_signal: ema``, in [0, 1)."""
    adaptive_threshold: bool = True
    """Move the threshold with the sign of the reward change; False keeps it at ``threshold_init``."""
    threshold_init: float = 0.5
    """The first threshold theta_0; a group is augmented when s_t > theta_t."""
    eta: float = 0.01
    """Step size of the threshold update."""
    threshold_bounds: tuple[float, float] = (0.1, 0.9)
    """(low, high) clip of the adaptive threshold, within [0, 1]."""
    seed: int = 0
    """Seed of the ``random`` strategy (its RNG state is checkpointed)."""
    epsilon: float = 1e-6
    """Added to the std before dividing, as in verl's grpo."""
    prior: str = "jeffreys"
    """``strategy: beta`` only: the Beta prior, ``jeffreys``, ``laplace`` or ``fitted`` to the batch."""
    baseline: str = "loo"
    """``strategy: beta`` only: the posterior-mean baseline, leave-one-out (``loo``) or the whole ``group``."""
    prior_strength_max: float = 8.0
    """``strategy: beta``, ``prior: fitted`` only: cap on the fitted prior strength."""
    correct_weight: float = 1.0
    """``strategy: beta`` only: multiplies the advantages of collapsed all-correct groups."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS: dict[str, dict[str, Any]] = {
    "paper": {},
    # The authors' released code: one opposite-label virtual sample whenever a group collapses, and
    # std + 1e-4. It fires only on a batch that is all 0 or all 1; with one prompt per step (their
    # layout) that is the same as per group, which is the default here (docs/method.md §5).
    "paper_code": {
        "strategy": "opposite",
        "k": 1,
        "adaptive_threshold": False,
        "threshold_init": 0.0,
        "epsilon": 1e-4,
    },
    # Never triggers: the estimator reduces exactly to verl's grpo (ACR is still measured).
    "grpo": {"apply_to": "none", "adaptive_threshold": False},
    # Beta-prior pseudo-counts with a leave-one-out posterior-mean baseline: every group, always on.
    "beta_loo": {"strategy": "beta", "prior": "jeffreys", "baseline": "loo"},
    # The same with an empirical-Bayes prior fitted to the batch's group success rates.
    "beta_fitted": {"strategy": "beta", "prior": "fitted", "baseline": "loo"},
}

# Every key of algorithm.avspo, in the order the docs and the messages list them.
AVSPO_KEYS = tuple(f.name for f in fields(AVSPOConfig))
SECTION = "algorithm.avspo"
# The largest seed torch.Generator.manual_seed takes (an unsigned 64-bit integer).
MAX_SEED = 2**64 - 1


def _check_strategy_keys(
    strategy: str, given: Mapping[str, Any], preset_values: Mapping[str, Any], problems: Problems, section: str
) -> None:
    """Refuse a key set, to a value other than its preset's, where the chosen strategy does not read
    it. (A resolved config, which lists every key at its preset value, still round-trips.)"""

    def changed(key: str) -> bool:
        return key in given and given[key] != preset_values[key]

    if strategy == "beta":
        if "strategy" in given and preset_values["apply_to"] == "none":
            problems.check(
                fail,
                f"{section}.strategy",
                "beta",
                "the grpo preset is plain GRPO, but strategy=beta adds prior pseudo-counts to every group; use "
                "preset=beta_loo (or beta_fitted) instead",
            )
        if changed("prior_strength_max") and given.get("prior", preset_values["prior"]) != "fitted":
            problems.check(
                fail,
                f"{section}.prior_strength_max",
                given["prior_strength_max"],
                "it caps only the fitted prior's strength; set prior=fitted (or preset=beta_fitted), or remove it",
            )
        for key in VIRTUAL_SAMPLE_KEYS:
            if changed(key):
                problems.check(
                    fail,
                    f"{section}.{key}",
                    given[key],
                    "strategy=beta adds prior pseudo-counts to every group and reads no virtual-sample "
                    f"setting ({', '.join(VIRTUAL_SAMPLE_KEYS)}); remove it (to weight the all-correct half, "
                    "use correct_weight)",
                )
    else:
        for key in BETA_KEYS:
            if changed(key):
                problems.check(
                    fail,
                    f"{section}.{key}",
                    given[key],
                    f"it applies only with strategy=beta, and strategy is {strategy!r}; "
                    "set strategy=beta (or preset=beta_loo), or remove it",
                )


def _k(key: str, value: Any) -> int | str:
    if value == "adaptive":
        return value
    k = int(value) if isinstance(value, str) and value.isdigit() else value  # "4" from a shell or a YAML string
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        fail(key, value, "expected a positive integer or 'adaptive'")
    return k


def _threshold_bounds(key: str, value: Any) -> tuple[float, float]:
    bounds = pair(key, value)
    if bounds[0] < 0.0 or bounds[1] > 1.0:
        fail(key, list(bounds), "expected 0 <= low < high <= 1 (the threshold is compared with a rate)")
    return bounds


def misplaced_acr_key_problem(key: str, section: str = SECTION, acr_section: str = ACR_SECTION) -> str:
    """The message for ACR's ``key`` (``tau``, ``reward_range``, ``alert``) set in AVSPO's ``section``."""
    return (
        f"{section}.{key} is not an AVSPO setting: ACR's settings apply to every estimator and have a section of "
        f"their own; set {acr_section}.{key} instead."
    )


def _misplaced_acr_keys(mapping: Any, section: str, acr_section: str) -> list[str]:
    """:func:`misplaced_acr_key_problem` for each ACR key in ``mapping``."""
    if not isinstance(mapping, Mapping):
        return []
    return [misplaced_acr_key_problem(key, section, acr_section) for key in ACR_KEYS if key in mapping]


def _resolve_avspo(
    mapping: Mapping[str, Any] | None, problems: Problems, section: str = SECTION, acr_section: str = ACR_SECTION
) -> AVSPOConfig | None:
    """The keys of ``algorithm.avspo`` merged over their preset and validated; None with the messages in
    ``problems`` if any is bad. ``section`` and ``acr_section`` name AVSPO's and ACR's settings in the
    messages, as the host's user spells them."""
    example = f"{section}.preset={mapping if isinstance(mapping, str) and mapping in PRESETS else 'paper'}"
    problems.messages.extend(_misplaced_acr_keys(mapping, section, acr_section))
    if isinstance(mapping, Mapping):
        mapping = {key: value for key, value in mapping.items() if key not in ACR_KEYS}
    given = problems.check(given_settings, mapping, section, AVSPO_KEYS, problems, example=example)
    if given is None:
        return None
    preset = problems.check(choice, f"{section}.preset", given.get("preset", "paper"), tuple(PRESETS))
    preset_values = {**asdict(AVSPOConfig()), **PRESETS.get(preset, {})}
    values = {**preset_values, **given, "preset": preset}
    check = problems.check

    values["strategy"] = check(choice, f"{section}.strategy", values["strategy"], STRATEGIES)
    values["gap"] = check(number, f"{section}.gap", values["gap"], 0.0, 1.0, low_open=True)
    values["apply_to"] = check(choice, f"{section}.apply_to", values["apply_to"], APPLY_TO)
    values["k"] = check(_k, f"{section}.k", values["k"])
    values["alpha"] = check(number, f"{section}.alpha", values["alpha"], 0.0, math.inf, low_open=True)
    values["acr_signal"] = check(choice, f"{section}.acr_signal", values["acr_signal"], ACR_SIGNALS)
    values["trigger_scope"] = check(choice, f"{section}.trigger_scope", values["trigger_scope"], TRIGGER_SCOPES)
    values["ema_beta"] = check(number, f"{section}.ema_beta", values["ema_beta"], 0.0, 1.0, high_open=True)
    values["adaptive_threshold"] = check(boolean, f"{section}.adaptive_threshold", values["adaptive_threshold"])
    values["threshold_init"] = check(number, f"{section}.threshold_init", values["threshold_init"], 0.0, 1.0)
    values["eta"] = check(number, f"{section}.eta", values["eta"], 0.0, 1.0)
    values["threshold_bounds"] = check(_threshold_bounds, f"{section}.threshold_bounds", values["threshold_bounds"])
    values["seed"] = check(integer, f"{section}.seed", values["seed"], 0, MAX_SEED)
    values["epsilon"] = check(number, f"{section}.epsilon", values["epsilon"], 0.0, 1.0, low_open=True)
    values["prior"] = check(choice, f"{section}.prior", values["prior"], PRIORS)
    values["baseline"] = check(choice, f"{section}.baseline", values["baseline"], BASELINES)
    values["prior_strength_max"] = check(
        number, f"{section}.prior_strength_max", values["prior_strength_max"], 0.0, math.inf, low_open=True
    )
    # Bounded so that the weighted advantages stay far inside float32 (3.4e38 overflows at step 1).
    values["correct_weight"] = check(number, f"{section}.correct_weight", values["correct_weight"], 0.0, 1e6)
    bounds, init = values["threshold_bounds"], values["threshold_init"]
    if values["adaptive_threshold"] and None not in (bounds, init) and not bounds[0] <= init <= bounds[1]:
        within = f"with adaptive_threshold=true it must lie within threshold_bounds {list(bounds)}"
        check(fail, f"{section}.threshold_init", init, within)
    if values["strategy"] is not None:
        _check_strategy_keys(values["strategy"], given, preset_values, problems, section)
    return None if problems.messages else AVSPOConfig(**values)


def resolve_avspo(
    mapping: Mapping[str, Any] | None = None, *, section: str = SECTION, acr_section: str = ACR_SECTION
) -> AVSPOConfig:
    """The estimator's settings of ``algorithm.avspo``: ``preset`` defaults with the keys given beside
    it, every value validated. ``section`` and ``acr_section`` name AVSPO's and ACR's settings in the
    messages as the host's user spells them (OpenRLHF: ``--avspo``, ``--acr``); an ACR key given here is
    refused with the key to set instead.

    Raises:
        SettingsError (a ValueError): one message per bad key, each naming the key, the value and
        what is allowed.
    """
    problems = Problems()
    avspo = _resolve_avspo(mapping, problems, section, acr_section)
    problems.raise_any()
    return avspo


def resolve_settings(mapping: Mapping[str, Any] | None = None) -> tuple[AVSPOConfig, ACRConfig]:
    """Both configs from one flat mapping that holds the AVSPO keys and ACR's ``tau``,
    ``reward_range`` and ``alert`` side by side (a notebook's dict); messages name each key in its
    section of verl's config. verl's config itself is read by :func:`resolve_run_settings`.

    Raises:
        SettingsError: every bad key of both, at once.
    """
    problems = Problems()
    flat = isinstance(mapping, Mapping)
    avspo = _resolve_avspo({k: v for k, v in mapping.items() if k not in ACR_KEYS} if flat else mapping, problems)
    acr = problems.check(resolve_acr, {k: v for k, v in mapping.items() if k in ACR_KEYS} if flat else None)
    problems.raise_any()
    return avspo, acr


@dataclass(frozen=True)
class RunSettings:
    """What verl's ``config.algorithm`` says of ACR and AVSPO for one run."""

    estimator: str
    """``algorithm.adv_estimator``."""
    acr: ACRConfig
    """``algorithm.acr``."""
    avspo: AVSPOConfig | None
    """``algorithm.avspo``; None unless the estimator is ``avspo``."""


def resolve_run_settings(algorithm: Mapping[str, Any] | None, estimator: str | None = None) -> RunSettings:
    """Read verl's ``config.algorithm``: ``acr`` for every estimator, ``avspo`` for ``avspo`` only.

    ``estimator`` overrides ``algorithm.adv_estimator`` (the ``avspo`` estimator knows its name).
    AVSPO keys set with another estimator are refused, because they would do nothing, and so are ACR's
    keys under ``algorithm.avspo`` (the message names their ``algorithm.acr`` key).

    Raises:
        SettingsError: every bad key, at once.
    """
    algorithm = algorithm if algorithm is not None else {}
    estimator = str(estimator or algorithm.get("adv_estimator", None) or "avspo")
    raw = algorithm.get("avspo", None)
    problems = Problems()
    acr = problems.check(resolve_acr, algorithm.get("acr", None))
    avspo = None
    if estimator == "avspo":
        avspo = _resolve_avspo(raw, problems)
    elif isinstance(raw, Mapping):
        problems.messages.extend(_misplaced_acr_keys(raw, SECTION, ACR_SECTION))
        unused = sorted(str(k) for k, v in raw.items() if v is not None and k not in ACR_KEYS)
        if unused:
            problems.messages.append(
                f"{', '.join(f'{SECTION}.{k}={raw[k]!r}' for k in unused)} set with algorithm.adv_estimator="
                f"{estimator}: AVSPO's settings apply only to the avspo estimator and would do nothing. Set "
                f"algorithm.adv_estimator=avspo, or remove them (ACR's own settings are {ACR_SECTION}.*)."
            )
    elif raw is not None:
        problems.messages.append(
            f"{SECTION}={raw!r} is invalid: it is a group of settings, used with adv_estimator=avspo."
        )
    problems.raise_any()
    return RunSettings(estimator, acr, avspo)
