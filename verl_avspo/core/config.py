"""AVSPO settings: defaults, presets and validation (docs/configuration.md; the method: docs/method.md §3).

Framework-free. ``resolve_settings`` takes any mapping (a plain dict, or verl's
``config.algorithm.avspo`` DictConfig) and returns two frozen, validated configs: the estimator's
:class:`AVSPOConfig` and the ACR metrics' :class:`ACRConfig` (``tau``, ``reward_range``, ``alert``),
which every group estimator reads. Users set both under the same ``algorithm.avspo`` keys.
A key set to ``None`` means "not given", so a Hydra config can declare every key with a null
default and still let ``preset`` decide.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

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
    "resolve_settings",
    "resolve_alert",
    "unknown_key_problem",
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
ALERT_ACTIONS = ("warn", "stop")
ALERT_RULES = ("acr", "all_wrong", "acr_no_gain")  # core.alert: what each one watches
PRIORS = ("jeffreys", "laplace", "fitted")
BASELINES = ("loo", "group")
# Keys read only by `strategy: beta`, and the virtual-sample keys that it does not read: giving
# one where it has no effect is an error, so that a setting never silently does nothing.
BETA_KEYS = ("prior", "baseline", "prior_strength_max", "correct_weight")
VIRTUAL_SAMPLE_KEYS = ("gap", "apply_to", "k", "alpha", "trigger_scope")


@dataclass(frozen=True)
class AlertConfig:
    """Stagnation alert: ``window`` consecutive steps with the ``rule``'s signal above
    ``threshold`` (``verl_avspo.core.alert``)."""

    window: int = 50
    """Consecutive steps the rule's rate must stay above ``threshold`` before the alert fires."""
    threshold: float = 0.35
    """The rate the rule's signal must stay strictly above, in [0, 1]."""
    action: str = "warn"
    """``warn``: log once with advice and set ``acr/stalled``; ``stop``: also checkpoint and end the run."""
    rule: str = "acr_no_gain"
    """What is watched: ``acr_no_gain`` (docs/diagnostics.md's best), ``acr`` (the paper's) or ``all_wrong``."""


@dataclass(frozen=True)
class ACRConfig:
    """The ACR metrics' settings and the stagnation alert: the ``tau``, ``reward_range`` and ``alert``
    keys of ``algorithm.avspo``, read with every group estimator (AVSPO or not)."""

    tau: float = 1e-6
    """A group is collapsed iff the population std of its scores is below this; also the |A| bound of acr/effective."""
    reward_range: tuple[float, float] = (0.0, 1.0)
    """The verifier's (low, high): its midpoint splits all-correct from all-wrong; R in the virtual values."""
    alert: AlertConfig = field(default_factory=AlertConfig)
    """The stagnation alert (``algorithm.avspo.alert.*``), read by every estimator."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AVSPOConfig:
    """Resolved AVSPO estimator settings (``algorithm.avspo`` less the ACR keys of :class:`ACRConfig`).
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

ACR_KEYS = tuple(f.name for f in fields(ACRConfig))
_ESTIMATOR_KEYS = tuple(f.name for f in fields(AVSPOConfig))
# Every key of algorithm.avspo, in the order the docs and the messages list them.
AVSPO_KEYS = (_ESTIMATOR_KEYS[0], "tau", "reward_range", *_ESTIMATOR_KEYS[1:], "alert")
ALERT_KEYS = tuple(f.name for f in fields(AlertConfig))


class SettingsError(ValueError):
    """Invalid settings. ``problems`` holds one message per bad key, each naming the key, the value
    and what is allowed, so that a config's mistakes are all reported at once."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class Problems:
    """Collects the messages of failed validations, so that one bad key does not hide the next."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def check(self, validate: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``validate(*args, **kwargs)``, or None with its message recorded if it raises ValueError."""
        try:
            return validate(*args, **kwargs)
        except ValueError as err:
            self.messages.extend(err.problems if isinstance(err, SettingsError) else [str(err)])
            return None

    def raise_any(self) -> None:
        if self.messages:
            raise SettingsError(self.messages)


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"algorithm.avspo.{key}={value!r} is invalid: {allowed}.")


def _choice(key: str, value: Any, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        close = difflib.get_close_matches(str(value).lower(), allowed, n=1)  # PAPER -> paper
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        _fail(key, value, "allowed values are " + ", ".join(allowed) + hint)
    return value


def _number(key: str, value: Any, low: float, high: float, *, low_open=False, high_open=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(key, value, "expected a finite number")
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        _fail(key, value, f"expected a number in {interval}")
    return float(value)


def _integer(key: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        _fail(
            key, value, f"expected an integer >= {low}" if high is None else f"expected an integer in [{low}, {high}]"
        )
    return int(value)


def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        _fail(key, value, "expected true or false")
    return value


def _pair(key: str, value: Any) -> tuple[float, float]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        _fail(key, value, "expected a pair [low, high]")
    low, high = (_number(key, v, -math.inf, math.inf) for v in value)
    if not low < high:
        _fail(key, list(value), "expected low < high")
    return low, high


def unknown_key_problem(key: str, allowed: Sequence[str]) -> str:
    """The message for an unknown setting ``key`` (dotted; its last part is compared with ``allowed``),
    with the closest allowed name when one is close."""
    section, _, name = key.rpartition(".")
    close = difflib.get_close_matches(name, allowed, n=1)
    hint = f" Did you mean {section}.{close[0]}?" if close else ""
    return f"{key} is not a setting.{hint} Allowed keys of {section}: {', '.join(allowed)}."


def given_settings(
    mapping: Mapping[str, Any] | None, section: str, allowed: Sequence[str], problems: Problems, *, example: str
) -> dict[str, Any]:
    """The one reader of a settings section (``algorithm.avspo``, its ``alert``, ``algorithm.dcpo``,
    ``algorithm.intrinsic``): the allowed keys actually set (not None; a null key means "not given").
    Each unknown key is recorded in ``problems``, so that the known keys are still checked.

    Raises:
        SettingsError: ``mapping`` is not a mapping; ``example`` shows how to set one of its keys.
    """
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        raise SettingsError(
            [f"{section}={mapping!r} is invalid: it is a group of settings; set its keys, for example {example}."]
        )
    for key in sorted(set(mapping) - set(allowed), key=str):
        problems.messages.append(unknown_key_problem(f"{section}.{key}", allowed))
    return {str(k): v for k, v in mapping.items() if v is not None and k in allowed}


def _check_strategy_keys(
    strategy: str, given: Mapping[str, Any], preset_values: Mapping[str, Any], problems: Problems
) -> None:
    """Refuse a key set, to a value other than its preset's, where the chosen strategy does not read
    it. (A resolved config, which lists every key at its preset value, still round-trips.)"""

    def changed(key: str) -> bool:
        return key in given and given[key] != preset_values[key]

    if strategy == "beta":
        if "strategy" in given and preset_values["apply_to"] == "none":
            problems.check(
                _fail,
                "strategy",
                "beta",
                "the grpo preset is plain GRPO, but strategy=beta adds prior pseudo-counts to every group; use "
                "preset=beta_loo (or beta_fitted) instead",
            )
        if changed("prior_strength_max") and given.get("prior", preset_values["prior"]) != "fitted":
            problems.check(
                _fail,
                "prior_strength_max",
                given["prior_strength_max"],
                "it caps only the fitted prior's strength; set prior=fitted (or preset=beta_fitted), or remove it",
            )
        for key in VIRTUAL_SAMPLE_KEYS:
            if changed(key):
                problems.check(
                    _fail,
                    key,
                    given[key],
                    "strategy=beta adds prior pseudo-counts to every group and reads no virtual-sample "
                    f"setting ({', '.join(VIRTUAL_SAMPLE_KEYS)}); remove it (to weight the all-correct half, "
                    "use correct_weight)",
                )
    else:
        for key in BETA_KEYS:
            if changed(key):
                problems.check(
                    _fail,
                    key,
                    given[key],
                    f"it applies only with strategy=beta, and strategy is {strategy!r}; "
                    "set strategy=beta (or preset=beta_loo), or remove it",
                )


def resolve_alert(mapping: Mapping[str, Any] | None) -> AlertConfig:
    """Validate ``algorithm.avspo.alert``.

    Raises:
        SettingsError: listing every bad key.
    """
    problems = Problems()
    example = f"algorithm.avspo.alert.window=50 (allowed: {', '.join(ALERT_KEYS)})"
    alert = replace(
        AlertConfig(), **given_settings(mapping, "algorithm.avspo.alert", ALERT_KEYS, problems, example=example)
    )
    problems.check(_integer, "alert.window", alert.window, 1)
    threshold = problems.check(_number, "alert.threshold", alert.threshold, 0.0, 1.0)
    problems.check(_choice, "alert.action", alert.action, ALERT_ACTIONS)
    problems.check(_choice, "alert.rule", alert.rule, ALERT_RULES)
    problems.raise_any()
    return replace(alert, threshold=threshold)


def _k(key: str, value: Any) -> int | str:
    if value == "adaptive":
        return value
    k = int(value) if isinstance(value, str) and value.isdigit() else value  # "4" from a shell or a YAML string
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        _fail(key, value, "expected a positive integer or 'adaptive'")
    return k


def _threshold_bounds(key: str, value: Any) -> tuple[float, float]:
    bounds = _pair(key, value)
    if bounds[0] < 0.0 or bounds[1] > 1.0:
        _fail(key, list(bounds), "expected 0 <= low < high <= 1 (the threshold is compared with a rate)")
    return bounds


def resolve_settings(mapping: Mapping[str, Any] | None = None) -> tuple[AVSPOConfig, ACRConfig]:
    """Merge ``preset`` defaults with the keys given beside it, validate every value, and split
    them into the estimator's settings and the ACR metrics' (``tau``, ``reward_range``, ``alert``).

    Raises:
        SettingsError (a ValueError): one message per bad key, each naming the key, the value and
        what is allowed.
    """
    problems = Problems()
    example = f"algorithm.avspo.preset={mapping if isinstance(mapping, str) and mapping in PRESETS else 'paper'}"
    given = given_settings(mapping, "algorithm.avspo", AVSPO_KEYS, problems, example=example)
    preset = problems.check(_choice, "preset", given.get("preset", "paper"), tuple(PRESETS))
    preset_values = {**asdict(AVSPOConfig()), **asdict(ACRConfig()), **PRESETS.get(preset, {})}
    values = {**preset_values, **given, "preset": preset}
    check = problems.check

    values["tau"] = check(_number, "tau", values["tau"], 0.0, math.inf, low_open=True)
    values["reward_range"] = check(_pair, "reward_range", values["reward_range"])
    values["strategy"] = check(_choice, "strategy", values["strategy"], STRATEGIES)
    values["gap"] = check(_number, "gap", values["gap"], 0.0, 1.0, low_open=True)
    values["apply_to"] = check(_choice, "apply_to", values["apply_to"], APPLY_TO)
    values["k"] = check(_k, "k", values["k"])
    values["alpha"] = check(_number, "alpha", values["alpha"], 0.0, math.inf, low_open=True)
    values["acr_signal"] = check(_choice, "acr_signal", values["acr_signal"], ACR_SIGNALS)
    values["trigger_scope"] = check(_choice, "trigger_scope", values["trigger_scope"], TRIGGER_SCOPES)
    values["ema_beta"] = check(_number, "ema_beta", values["ema_beta"], 0.0, 1.0, high_open=True)
    values["adaptive_threshold"] = check(_boolean, "adaptive_threshold", values["adaptive_threshold"])
    values["threshold_init"] = check(_number, "threshold_init", values["threshold_init"], 0.0, 1.0)
    values["eta"] = check(_number, "eta", values["eta"], 0.0, 1.0)
    values["threshold_bounds"] = check(_threshold_bounds, "threshold_bounds", values["threshold_bounds"])
    # torch.Generator.manual_seed takes at most 2**64 - 1 (it fails at the first advantage step otherwise).
    values["seed"] = check(_integer, "seed", values["seed"], 0, 2**64 - 1)
    values["epsilon"] = check(_number, "epsilon", values["epsilon"], 0.0, 1.0, low_open=True)
    values["prior"] = check(_choice, "prior", values["prior"], PRIORS)
    values["baseline"] = check(_choice, "baseline", values["baseline"], BASELINES)
    values["prior_strength_max"] = check(
        _number, "prior_strength_max", values["prior_strength_max"], 0.0, math.inf, low_open=True
    )
    # Bounded so that the weighted advantages stay far inside float32 (3.4e38 overflows at step 1).
    values["correct_weight"] = check(_number, "correct_weight", values["correct_weight"], 0.0, 1e6)
    alert = values["alert"]
    values["alert"] = alert if isinstance(alert, AlertConfig) else check(resolve_alert, alert)
    bounds, init = values["threshold_bounds"], values["threshold_init"]
    if values["adaptive_threshold"] and None not in (bounds, init) and not bounds[0] <= init <= bounds[1]:
        within = f"with adaptive_threshold=true it must lie within threshold_bounds {list(bounds)}"
        check(_fail, "threshold_init", init, within)
    if values["strategy"] is not None:
        _check_strategy_keys(values["strategy"], given, preset_values, problems)
    problems.raise_any()
    acr = ACRConfig(**{key: values.pop(key) for key in ACR_KEYS})
    return AVSPOConfig(**values), acr
