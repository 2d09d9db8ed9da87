"""The settings validators every config section shares (``algorithm.avspo``, ``algorithm.acr``,
``algorithm.dcpo``, ``algorithm.intrinsic``, the OpenRLHF flags). Framework-free.

Each check takes the setting's full key (``algorithm.acr.tau``) and raises a ValueError naming the
key, the value and what is allowed; :class:`Problems` collects them, so that a config's mistakes are
all reported at once.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "SettingsError",
    "Problems",
    "fail",
    "choice",
    "number",
    "integer",
    "boolean",
    "pair",
    "unknown_key_problem",
    "given_settings",
]


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


def fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{key}={value!r} is invalid: {allowed}.")


def choice(key: str, value: Any, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        close = difflib.get_close_matches(str(value).lower(), allowed, n=1)  # PAPER -> paper
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        fail(key, value, "allowed values are " + ", ".join(allowed) + hint)
    return value


def number(key: str, value: Any, low: float, high: float, *, low_open=False, high_open=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        fail(key, value, "expected a finite number")
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        if math.isinf(high):  # only finite numbers pass, so no "inf]"
            fail(key, value, f"expected a finite number {'>' if low_open else '>='} {low}")
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        fail(key, value, f"expected a number in {interval}")
    return float(value)


def integer(key: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        fail(key, value, f"expected an integer >= {low}" + (f" and <= {high}" if high is not None else ""))
    return int(value)


def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        fail(key, value, "expected true or false")
    return value


def pair(key: str, value: Any) -> tuple[float, float]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        fail(key, value, "expected a pair [low, high]")
    low, high = (number(key, v, -math.inf, math.inf) for v in value)
    if not low < high:
        fail(key, list(value), "expected low < high")
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
    """The one reader of a settings section (``algorithm.avspo``, ``algorithm.acr``, their ``alert``,
    ``algorithm.dcpo``, ``algorithm.intrinsic``): the allowed keys actually set (not None; a null key
    means "not given"). Each unknown key is recorded in ``problems``, so that the known keys are still checked.

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
