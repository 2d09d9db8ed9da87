"""A training run's console output (what it printed, saved with ``tee`` or a job scheduler) as one frame:
one row per step, one column per metric, as :mod:`verl_avspo.tools.log_formats` returns for the files
loggers write.

Three shapes are read, wherever they sit among a run's other output (Ray actor prefixes such as
``(TaskRunner pid=123)``, ANSI colours, ``[repeated 2x across cluster]``, progress bars redrawn with
``\\r``):

- verl's ``console`` logger: ``step:N - key:value - key:value ...`` per step (its validation at step 0
  too); numpy scalars printed as ``np.float64(0.5)`` are read as numbers;
- the Hugging Face Trainer's printed log dicts (TRL's trainers): ``{'loss': 0.1, 'reward': 0.5, ...}``,
  values as numbers or, in recent transformers, as strings (``'0.5'``), ``nan`` too, a dict broken
  across lines joined. The dicts carry no step: each takes the training progress bar's count printed
  before it (``10/300 [...]``), or, where no new count was printed (tqdm redraws sparsely in a file),
  the step after the dict before it (said in a warning). The dict that sums up training
  (``train_runtime``) is left out; an evaluation dict (``eval_*``) joins the step before it;
- OpenRLHF's ``Global step N: {...}`` and ``global_step N, eval_metrics: {...}`` lines;
- a custom loop's progress lines: two or more ``key=value`` pairs (``acc=62.5%`` read as 0.625) with a
  step, ``N/M`` (also a progress bar's postfix) or ``step N``: ``  3/100 | loss=-0.5 | reward=0.25``.

A run cut off mid-line (killed while printing) keeps every complete line, with a warning; the planned
number of steps (the training progress bar's total) is kept in ``attrs["planned_steps"]``.
"""

from __future__ import annotations

import ast
import itertools
import re
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["ConsoleRecords", "holds_console_metrics", "read_console"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]")
_VERL = re.compile(r"(?:^|[\s)>|])step:(\d+) - (\S.*)$")
_OPENRLHF = re.compile(r"(?:Global step|global_step) (\d+)(?::|, eval_metrics:) (\{.*\})\s*$")
_DICT = re.compile(r"\{'[^{}]*\}")
_BAR = re.compile(r"(\d+)/(\d+) \[")
# numpy scalars and tensors as numpy 2 and torch print them: np.float64(0.5), tensor(0.5, device='cuda:0').
_WRAPPED = re.compile(r"\b(?:np\.\w+|numpy\.\w+|tensor)\(([-+.\w]+)(?:,[^()]*)?\)")
_KEY_VALUE = re.compile(r"(?<![\w/.-])([A-Za-z_][\w/.@-]*)=(-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(%?)(?![\w.])")
_STEP_TOKEN = re.compile(r"\bstep[\s=:]+(\d+)\b|(?<![\w./])(\d+)/(\d+)(?![\w./])", re.IGNORECASE)
# A printed dict is the Trainer's log when it holds one of its keys (verl also prints its config as dicts).
_TRAINER_KEYS = frozenset({"loss", "learning_rate", "grad_norm", "epoch", "reward", "train_loss", "eval_loss"})
_LONGEST_DICT = 20_000  # characters a printed dict broken across lines may span before it is given up
# nan and inf as Python prints them (a grad_norm of nan): quoted, so that literal_eval reads the dict.
_NOT_FINITE = re.compile(r"(?<=: )(-?(?:nan|inf))(?=[,}])")
_MARKERS = re.compile(
    r"step:\d+ - \S|\{'[\w/@.-]+': |Global step \d+: \{"
    r"|(?:\bstep[\s=:]+\d+|(?<![\w./])\d+/\d+(?![\w./]))\b.*?[A-Za-z_][\w/.@-]*=-?[\d.]+.*?[A-Za-z_][\w/.@-]*=-?[\d.]",
    re.IGNORECASE,
)


def holds_console_metrics(text: str) -> bool:
    """Whether ``text`` (a file's contents) holds any line of the console shapes this module reads."""
    return _MARKERS.search(text) is not None


def _number(text: str) -> float | None:
    try:
        return float(text)  # most values: a plain number, without the regex
    except ValueError:
        pass
    try:
        return float(_WRAPPED.sub(r"\1", text.strip()))
    except ValueError:
        return None


def _pairs(body: str) -> dict[str, float]:
    """``key:value - key:value`` (verl's console line after its step) as numbers; others dropped."""
    found = {}
    for part in body.split(" - "):
        key, colon, value = part.rpartition(":")
        if colon and key and (number := _number(value)) is not None:
            found[key.strip()] = number
    return found


def _literal(text: str) -> dict[str, float] | None:
    """The numbers of a printed Python dict (numpy and torch scalars unwrapped, numbers printed as strings
    read as numbers: recent transformers prints its floats so); None when it is no dict or holds none."""
    try:
        value = ast.literal_eval(_NOT_FINITE.sub(r"'\1'", _WRAPPED.sub(r"\1", text)))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    numbers = {
        str(key): number
        for key, item in value.items()
        if not isinstance(item, bool)
        and (
            number := float(item)
            if isinstance(item, (int, float))
            else _number(item)
            if isinstance(item, str)
            else None
        )
        is not None
    }
    return numbers or None


def _segments(text: str) -> Iterator[tuple[int, str]]:
    """(line number, piece) of ``text`` split at newlines and at the ``\\r`` of redrawn progress bars,
    without ANSI codes and Ray's repeat notes."""
    text = _REPEATED.sub("", _ANSI.sub("", text))
    for number, line in enumerate(text.split("\n"), 1):
        for piece in line.split("\r") if "\r" in line else (line,):
            if piece.strip():
                yield number, piece


def _key_values(piece: str) -> tuple[int, dict[str, float]] | None:
    """(step, metrics) of a custom loop's progress line (two or more ``key=value`` and a step), else None."""
    pairs = _KEY_VALUE.findall(piece)
    step = _STEP_TOKEN.search(piece)
    if len(pairs) < 2 or step is None:
        return None
    values = {key: float(value) / (100 if percent else 1) for key, value, percent in pairs}
    return int(step[1] or step[2]), values


def _training_bar(bars: list[tuple[int, int, bool]]) -> tuple[int, bool] | None:
    """(total, labelled) of the training progress bar: verl's ``Training Progress`` where printed, else the
    total printed most often (the bars of loading and evaluation are fewer); None without bars."""
    labelled = [total for _, total, label in bars if label]
    if labelled:
        return labelled[-1], True
    totals = Counter(total for _, total, _ in bars if total > 1)
    return (totals.most_common(1)[0][0], False) if totals else None


def _trainer_steps(
    records: list[tuple[str, int | None, dict[str, Any], int]], counts: list[int | None]
) -> tuple[list[tuple[str, int, dict[str, Any]]], int]:
    """The records with a step each: a printed Trainer dict (step None) takes the training bar's count
    printed before it when every training dict has a new, higher count; else the dicts are numbered 1, 2,
    ... in order (an evaluation dict joins the training step before it). Returns the records and how many
    dicts were numbered by order (0 when the bar gave the steps)."""
    dicts = [
        (data, next((c for c in reversed(counts[:seen]) if c is not None), None))
        for _, step, data, seen in records
        if step is None
    ]
    training = [bar for data, bar in dicts if not _evaluation(data)]
    by_bar = all(bar is not None for bar in training) and all(b > a for a, b in itertools.pairwise([0, *training]))
    stepped, previous = [], 0
    for where, step, data, seen in records:
        if step is None:
            bar = next((c for c in reversed(counts[:seen]) if c is not None), None)
            if _evaluation(data):
                step = max(previous, 1)
            else:
                step = previous = bar if by_bar else previous + 1
            data = {key: value for key, value in data.items() if key != "epoch"}
        stepped.append((where, step, data))
    return stepped, 0 if by_bar else len(training)


def _evaluation(data: dict[str, Any]) -> bool:
    return all(str(key).startswith("eval_") or key == "epoch" for key in data)


class ConsoleRecords(NamedTuple):
    """What :func:`read_console` found: the metric records ``(where, step, metrics)`` in order, the
    problems met (a line cut off) and the steps the training progress bar planned when the log ends before
    them (None otherwise)."""

    records: list[tuple[str, int, dict[str, Any]]]
    problems: list[str]
    planned: int | None


def read_console(path: str | Path, text: str | None = None) -> ConsoleRecords:
    """The metric records of a console log, for :func:`verl_avspo.tools.log_formats.merge_records`.

    Raises:
        ValueError: the text holds no line of the shapes the module's docstring lists.
    """
    path = Path(path)
    text = path.read_text(errors="replace") if text is None else text
    cut = not text.endswith("\n")
    last_line = text.count("\n") + 1
    bars: list[tuple[int, int, bool]] = []  # (count, total, verl's training bar) of every progress bar, in order
    records: list[tuple] = []  # (shape, where, step, metrics, bars seen); step None: a Trainer dict, stepped below
    problems: list[str] = []
    pending = ""  # a printed dict broken across lines, joined until it closes
    for number, piece in _segments(text):
        where = f"{path}:{number}"
        if pending:
            piece, pending = pending + piece, ""
        opened = piece.rfind("{'")
        if opened >= 0 and "}" not in piece[opened:] and len(piece) - opened < _LONGEST_DICT:
            pending = piece[opened:]
            continue
        if cut and number == last_line:
            if _MARKERS.search(piece):
                problems.append(f"{where} (the last line is cut off: the run stopped while printing it)")
            continue
        labelled = "Training Progress" in piece  # verl's own training bar
        bars.extend((int(count), int(total), labelled) for count, total in _BAR.findall(piece))
        if (match := _VERL.search(piece)) is not None:
            found = [(0, int(match[1]), _pairs(match[2]))]
        elif (match := _OPENRLHF.search(piece)) is not None:
            found = [(0, int(match[1]), data)] if (data := _literal(match[2])) is not None else []
        elif dicts := [data for text in _DICT.findall(piece) if (data := _literal(text)) and _TRAINER_KEYS & set(data)]:
            found = [(1, None, data) for data in dicts if "train_runtime" not in data]
        else:
            found = [(2, *stepped)] if (stepped := _key_values(piece)) is not None else []
        records += [(shape, where, step, data, len(bars)) for shape, step, data in found]
    # One shape per log, the most specific found: verl's or OpenRLHF's lines, else the Trainer's dicts, else
    # key=value lines (the other shapes are then other output: verl's printed config, vLLM's key=value notes).
    first = min((record[0] for record in records), default=None)
    records = [record[1:] for record in records if record[0] == first]
    if not records:
        raise ValueError(
            f"{path} holds no metrics record: neither a JSONL log nor a console log (verl's 'step:N - key:value' "
            "lines, the Trainer's printed {'loss': ...} dicts, OpenRLHF's 'Global step N: {...}', a custom loop's "
            "'N/M | key=value' lines)"
        )
    training = _training_bar(bars)
    counts = [count if (total, labelled) == training else None for count, total, labelled in bars]
    stepped, ordered = _trainer_steps(records, counts)
    if ordered:
        warnings.warn(
            f"{path}: the training progress bar was not printed before every printed log dict (tqdm redraws "
            f"sparsely in a file): the {ordered} dicts are numbered 1, 2, ... in order, each a logging step",
            stacklevel=3,
        )
    final = next((count for count in reversed(counts) if count is not None), None)
    planned = training[0] if training and not ordered and final is not None and final < training[0] else None
    return ConsoleRecords(stepped, problems, planned)
