"""Rule-based rewards for the paper's benchmarks, in verl's ``custom_reward_function`` form.

Select with::

    reward.custom_reward_function.path=pkg://verl_avspo.verl_plugin.rewards
    reward.custom_reward_function.name=compute_score

verl's reward manager calls ``compute_score(data_source=, solution_str=, ground_truth=,
extra_info=)`` once per response and logs the returned float as ``acc``, so validation reports
``val-core/<data_source>/acc/mean@N`` for every benchmark.

- Math sets: the answer is the content of the response's **last** ``\\boxed{...}`` (the system
  prompt asks for it; ``\\boxed {...}``, ``\\fbox{...}`` and ``\\boxed 5`` count too); math-verify
  decides equivalence (``\\frac{1}{2}`` = ``0.5``, ``x=3`` = ``3``, ``1,000`` = ``1000``). A response
  without a box scores 0: the box is the answer format the policy is trained to produce.
- Multiple choice (MMLU-Pro): the chosen letter is taken from the last ``\\boxed{...}``, else from
  the last "answer is (X)" / "answer is: X" / "Answer: X"; it must equal the gold letter.
- Any other ``data_source`` goes to verl's ``default_compute_score``.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from verl.utils.reward_score import default_compute_score

__all__ = [
    "MATH_SOURCES",
    "CHOICE_SOURCES",
    "compute_score",
    "scores_source",
    "verl_scores_source",
    "math_score",
    "choice_score",
    "extract_choice",
    "last_boxed_answer",
]

# The data sources written by recipes/data (short names) and the hub names verl's own examples use.
MATH_SOURCES = frozenset(
    {
        "math",
        "math500",
        "gsm8k",
        "minerva_math",
        "olympiadbench",
        "amc23",
        "aime2024",
        "lighteval/MATH",
        "DigitalLearningGmbH/MATH-lighteval",
        "HuggingFaceH4/MATH-500",
        "openai/gsm8k",
    }
)
CHOICE_SOURCES = frozenset({"mmlu_pro", "TIGER-Lab/MMLU-Pro"})

# math-verify's timeout uses signal.alarm, which works only in the main thread; verl's reward
# manager scores in an executor thread. Off the main thread we therefore parse without a timeout,
# and keep parsing cheap by handing math-verify only the boxed answer, never the whole response.
_TIMEOUT_S = 5
_GOLD_TARGETS = (LatexExtractionConfig(), ExprExtractionConfig())
_PRED_TARGETS = (LatexExtractionConfig(boxed_match_priority=0),)

# The last box is found here, not with verl's last_boxed_only_string: math-verify reads neither the
# "\boxed {5}" nor the "\fbox{5}" that function returns, and its remove_boxed asserts on "\fbox".
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*")
_BARE_TOKEN = re.compile(r"[^\s$]+")

_LETTER = r"\(?\s*([A-Z])\s*\)?"
_BOXED_LETTER = re.compile(rf"^(?:\\(?:text|textbf|mathrm|mathbf)\{{)?{_LETTER}\}}?(?:[.:)]|\s|$)")
# Only capital letters count, so "the answer is a prime" is not option A.
_STATED_LETTER = re.compile(rf"(?i:answer\s+is\s*:?|answer\s*:)[\s*]*(?i:option\s*)?{_LETTER}(?![A-Za-z])")


def _timeout() -> int | None:
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def last_boxed_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of ``text`` (braces balanced; ``\\boxed {...}`` and
    ``\\fbox{...}`` too; for ``\\boxed 5`` the token after it), or None when there is none or the
    last box is never closed (a response cut off at the length limit)."""
    openings = list(_BOX.finditer(text))
    if not openings:
        return None
    start = openings[-1].end()
    if not text.startswith("{", start):
        token = _BARE_TOKEN.match(text, start)
        return token.group(0).rstrip(".,;") if token else None
    depth = 0
    for position in range(start, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : position]
    return None


def math_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the last ``\\boxed{}`` of ``solution_str`` is equivalent to ``ground_truth``, else 0.0."""
    answer = last_boxed_answer(solution_str)
    if answer is None:
        return 0.0
    timeout = _timeout()
    gold = parse("\\boxed{" + str(ground_truth).strip().strip("$") + "}", _GOLD_TARGETS, parsing_timeout=timeout)
    pred = parse("\\boxed{" + answer + "}", _PRED_TARGETS, parsing_timeout=timeout)
    if not gold or not pred:
        return 0.0
    return float(verify(gold, pred, timeout_seconds=timeout))


def extract_choice(solution_str: str) -> str | None:
    """The option letter a response chose, or None: from its last ``\\boxed{}`` (``B``, ``(B)``,
    ``\\text{B}``, ``\\textbf{(B)}``, ``B. text``), else from its last "answer is (B)" / "Answer: B"."""
    boxed = last_boxed_answer(solution_str)
    if boxed is not None:
        match = _BOXED_LETTER.match(boxed.strip())
        if match:
            return match.group(1)
    stated = _STATED_LETTER.findall(solution_str)
    return stated[-1] if stated else None


def choice_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the chosen letter equals the gold letter (``"C"``), else 0.0."""
    return float(extract_choice(solution_str) == str(ground_truth).strip().upper())


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **kwargs: Any
) -> float | dict:
    """verl's custom reward signature; dispatches on ``data_source`` (see the module docstring)."""
    if data_source in CHOICE_SOURCES:
        return choice_score(solution_str, ground_truth)
    if data_source in MATH_SOURCES:
        return math_score(solution_str, ground_truth)
    return default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)


class _Placeholder:
    """Stands for the response and the answer in :func:`verl_scores_source`'s call: a scorer fails on it at
    once (no text to read), so nothing is scored and no code runs."""

    def __str__(self) -> str:
        raise TypeError("a placeholder of verl_avspo's dispatch probe, not a response")


@functools.cache
def verl_scores_source(data_source: str) -> bool:
    """Whether verl's ``default_compute_score`` has a scorer for ``data_source``, asked of verl itself: it
    raises NotImplementedError for a source it has none for (its documented contract), and only when the
    first reward is computed. Called with placeholders for the response and the answer, any other outcome
    (the scorer failing on them, or a score) means verl dispatched ``data_source`` to a scorer."""
    try:
        default_compute_score(data_source, _Placeholder(), _Placeholder())
    except NotImplementedError:
        return False
    except Exception:  # the scorer verl chose failed on the placeholders: it has one
        return True
    return True


def scores_source(data_source: str) -> bool:
    """Whether :func:`compute_score` has a scorer for ``data_source`` (ours, else verl's)."""
    return data_source in CHOICE_SOURCES or data_source in MATH_SOURCES or verl_scores_source(data_source)
