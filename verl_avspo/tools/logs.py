"""Finding the metric logs of runs, naming the runs and merging each run's logs: the one reader of
``verl-avspo report``, ``verl-avspo table`` and the sandbox.

Each file is read by its format (:mod:`verl_avspo.tools.log_formats`, whose public names are
re-exported here): verl's ``trainer.logger=[file]`` JSONL (``{"step": N, "data": {...}}`` per line,
also the CPU sandbox's; a custom loop's flat ``{"step": N, <metric>: value}`` lines too), console output
(:mod:`verl_avspo.tools.console_logs`), TensorBoard event files (verl's, OpenRLHF's and the Hugging Face Trainer's
``tensorboard`` loggers), wandb CSV exports (a run's history, or a chart panel's CSV of one or more
runs) and a Hugging Face Trainer's ``trainer_state.json`` (TRL's trainers: its ``log_history``, in a
checkpoint folder or the output folder, or a bare ``log_history`` list saved from a notebook). The
``train/`` that OpenRLHF's loggers and the Trainer's
wandb and TensorBoard callbacks put before training metrics is dropped from ours (``train/acr/rate``
is read as ``acr/rate``) and from TRL's reward metrics (:data:`UNPREFIXED`). Every reader returns one
frame per run: one row per step, one column per metric. A run's successive files (TensorBoard files,
the attempts of a resumed run) that log the same step keep the last value, with a warning. In a
directory every file is accounted for: read as a log, or listed with the reason it is not one
(:func:`read_run_logs`'s ``skipped``); a file that reads alone reads in a directory.
"""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from verl_avspo.tools.console_logs import holds_console_metrics
from verl_avspo.tools.log_formats import (
    NotTrainerState,
    is_metrics_log,
    is_step,
    parse_record,
    read_metrics,
    read_tensorboard,
    read_text_log,
    read_trainer_state,
    read_wandb_csv,
    step_list,
    write_record,
)

__all__ = [
    "write_record",
    "parse_record",
    "read_metrics",
    "read_trainer_state",
    "find_logs",
    "is_metrics_log",
    "run_names",
    "read_run",
    "read_run_logs",
    "merge_frames",
    "collect_runs",
    "UNPREFIXED",
    "TRAINER_STATE",
    "caught_warnings",
    "not_logs_summary",
]

# Files named after what they hold rather than after their run, so named after their folder: the
# recipes' runs/<run>/metrics.jsonl (training) and eval.jsonl (final evaluation), TensorBoard's, and
# the Trainer's trainer_state.json (named after its output folder, also in <output>/checkpoint-<N>/).
TRAINER_STATE = "trainer_state.json"
_NAMED_BY_FOLDER = ("metrics.jsonl", "eval.jsonl", "events.out.tfevents", TRAINER_STATE)
_CHECKPOINT_FOLDER = re.compile(r"^checkpoint-\d+$")


def find_logs(paths: list[str | Path]) -> list[Path]:
    """Expand directories to the metric logs (``*.jsonl`` file-logger records) under them; keep
    files named explicitly as given, so a malformed one is reported rather than skipped."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found.extend(log for log in sorted(path.rglob("*.jsonl")) if is_metrics_log(log))
        elif path.exists():
            found.append(path)
        else:
            raise FileNotFoundError(f"no such log file or directory: {path}")
    return found


def _run_path(path: Path) -> Path:
    """The run a log belongs to, as a path: its folder for the recipes' ``metrics.jsonl`` and
    ``eval.jsonl``, for TensorBoard event files and for ``trainer_state.json`` (the output folder
    above a ``checkpoint-<N>`` folder), else the file without its suffix (verl's file logger writes
    ``<project>/<experiment_name>.jsonl``, the sandbox ``runs/<estimator>/seed<N>.jsonl``)."""
    path = path.absolute()
    if not path.name.startswith(_NAMED_BY_FOLDER):
        return path.with_suffix("")
    if path.name == TRAINER_STATE and _CHECKPOINT_FOLDER.match(path.parent.name):
        return path.parent.parent
    return path.parent


def run_names(paths: Sequence[str | Path]) -> list[str]:
    """The name of each log's run, as ``report`` and ``table`` show it: the last part of its run path
    (see :func:`_run_path`), with as many parent folders as it takes to tell different runs apart
    (``projA/exp`` and ``projB/exp``; ``grpo/seed0`` and ``avspo/seed0``). Logs of one run (a recipe
    folder's ``metrics.jsonl`` and ``eval.jsonl``, a run's TensorBoard files) share its name."""
    runs = [_run_path(Path(path)) for path in paths]
    depth = dict.fromkeys(runs, 1)
    while True:
        names = {run: "/".join(run.parts[-depth[run] :]) for run in depth}
        counts = Counter(names.values())
        clashing = [run for run in depth if counts[names[run]] > 1 and depth[run] < len(run.parts) - 1]
        if not clashing:
            return [names[run] for run in runs]
        for run in clashing:
            depth[run] += 1


# OpenRLHF's wandb and TensorBoard loggers, and the Hugging Face Trainer's wandb and TensorBoard
# callbacks (TRL's runs), put training metrics, ours included, under "train/".
_FRAMEWORK_PREFIXES = ("train/",)
# The metrics read without that prefix: ours, and TRL's reward metrics (its collapse rate
# frac_reward_zero_std, the batch's reward_std and each reward function's rewards/<name>/mean and /std).
UNPREFIXED = ("acr/", "avspo/", "frac_reward_zero_std", "reward_std", "rewards/")


def _standard_names(frame: pd.DataFrame) -> pd.DataFrame:
    """``train/acr/rate`` -> ``acr/rate`` (and the rest of :data:`UNPREFIXED`), unless the plain name
    is also logged."""
    renames = {}
    for column in frame.columns:
        for prefix in _FRAMEWORK_PREFIXES:
            plain = column.removeprefix(prefix)
            if column.startswith(prefix) and plain.startswith(UNPREFIXED) and plain not in frame:
                renames[column] = plain
    return frame.rename(columns=renames)


def _read_runs(path: Path) -> dict[str | None, pd.DataFrame]:
    """The runs of one log: None -> its metrics, or, for a wandb panel CSV, run name -> metrics."""
    if path.name.startswith("events.out.tfevents"):
        runs = {None: read_tensorboard(path)}
    elif path.suffix == ".csv":
        runs = read_wandb_csv(path)
    elif path.suffix == ".json":
        try:
            runs = {None: read_trainer_state(path)}
        except NotTrainerState:
            raise
        except ValueError as err:  # not one JSON document: JSON lines, or a console log, saved as .json
            try:
                runs = {None: read_text_log(path)}
            except ValueError:
                raise err from None
    else:
        runs = {None: read_text_log(path)}
    return {name: _standard_names(frame) for name, frame in runs.items()}


def read_run(path: str | Path) -> pd.DataFrame:
    """Metrics of one log, by its kind: ``*.jsonl`` (verl file logger), ``events.out.tfevents.*``
    (TensorBoard), ``*.csv`` (wandb export: a run history, or a chart panel holding one run) or
    ``*.json`` (a Trainer's ``trainer_state.json``). ``train/acr/*``, ``train/avspo/*`` and TRL's
    ``train/frac_reward_zero_std`` (:data:`UNPREFIXED`) are read without their ``train/``."""
    path = Path(path)
    runs = _read_runs(path)
    if len(runs) > 1:
        raise ValueError(
            f"{path} is a wandb panel export of {len(runs)} runs ({', '.join(map(str, runs))}); "
            "read it with collect_runs"
        )
    return next(iter(runs.values()))


def _global_step(path: Path) -> int:
    """A ``trainer_state.json``'s ``global_step`` (-1 when the file cannot be parsed)."""
    try:
        step = json.loads(path.read_text(errors="replace")).get("global_step")
    except (json.JSONDecodeError, AttributeError):
        return -1
    return int(step) if is_step(step) else -1


def _latest_trainer_states(files: Sequence[Path]) -> list[Path]:
    """``files`` with, of the ``trainer_state.json`` files of one run (its checkpoints' and its
    output folder's), only the one that reached the furthest step: the Trainer writes the whole
    ``log_history`` into every checkpoint, so the others hold a prefix of it (a run resumed from a
    checkpoint continues that checkpoint's history)."""
    states: dict[Path, list[Path]] = {}
    for file in files:
        if file.name == TRAINER_STATE:
            states.setdefault(_run_path(file), []).append(file)
    superseded = {
        file for group in states.values() if len(group) > 1 for file in group if file != max(group, key=_global_step)
    }
    return [file for file in files if file not in superseded]


# Files a folder holds beside its logs that are never read: weights, data, images, archives, code.
_NOT_LOGS = frozenset(
    ".pt .pth .bin .safetensors .ckpt .h5 .onnx .gguf .parquet .arrow .npy .npz .pkl .pickle .gz .zip .tar .tgz "
    ".xz .bz2 .7z .png .jpg .jpeg .gif .svg .pdf .mp4 .webp .ico .so .pyc .whl .model .py .sh .yaml .yml .toml "
    ".cfg .ini .ipynb .html .css .js .ts .lock".split()
)
_TEXT_LIMIT = 256 * 2**20  # a text file larger than this is not read whole to look for metrics
_STEPS_IN_JSON = re.compile(r'"(?:log_history|step|global_step|iteration|iter|train/step)"\s*:')


def _why_not_a_log(file: Path) -> str | None:
    """Why ``file``, found in a folder, is not read as a log, in words without parentheses (None: it is
    one, or may be: reading it says).
    A file of any name that reads when given alone (JSONL metrics, a console log, a JSON log history)
    is read in a folder too; a ``*.jsonl`` whose first lines do not parse is read, so that its problem is
    named."""
    if file.name.startswith("events.out.tfevents") or file.suffix == ".csv":
        return None
    if file.suffix.lower() in _NOT_LOGS:
        return "not a log format"
    if file.suffix == ".jsonl":
        return None if is_metrics_log(file) else "JSON lines without a step: not metrics, such as generations"
    if file.stat().st_size > _TEXT_LIMIT:
        return f"larger than {_TEXT_LIMIT >> 20} MiB and not a log format"
    with file.open("rb") as stream:
        head = stream.read(8192)
    if b"\0" in head:
        return "a binary file"
    text = file.read_text(errors="replace")
    if file.suffix == ".json":
        return None if _STEPS_IN_JSON.search(text) else "JSON without a step or a log_history: a config?"
    if (head.lstrip().startswith(b"{") and is_metrics_log(file)) or holds_console_metrics(text):
        return None
    return "no metrics record: no JSON lines with a step, no console metrics lines"


def _log_files(paths: Sequence[str | Path], evaluations: bool, skipped: list[str] | None = None) -> list[Path]:
    """The logs named by ``paths`` (files as given; every file under a directory that holds metrics),
    each once; of a run's ``trainer_state.json`` files found in directories, the latest
    (:func:`_latest_trainer_states`). Each other file under a directory is appended to ``skipped``
    with the reason it is not read (``path (why)``)."""
    files: list[Path] = []
    passed: list[str] = []
    for path in map(Path, paths):
        if not path.is_dir():
            files.extend(find_logs([path]))
            continue
        found = []
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            if file.name == "eval.jsonl" and not evaluations:
                passed.append(f"{file} (a final evaluation, read by `verl-avspo table`)")
            elif (why := _why_not_a_log(file)) is not None:
                passed.append(f"{file} ({why})")
            else:
                found.append(file)
        latest = _latest_trainer_states(found)
        passed += [
            f"{file} (an earlier checkpoint's copy of the run's log_history; its latest is read)"
            for file in found
            if file not in latest
        ]
        files.extend(latest)
    unique: dict[Path, Path] = {}
    for file in files:
        unique.setdefault(file.absolute(), file)
    if skipped is not None:
        skipped.extend(passed)
    return list(unique.values())


def read_run_logs(
    paths: Sequence[str | Path],
    names: Sequence[str] | None = None,
    evaluations: bool = False,
    unreadable: list[str] | None = None,
    skipped: list[str] | None = None,
) -> dict[str, list[pd.DataFrame]]:
    """Run name -> its metric frames, one per log file, the recipes' ``eval.jsonl`` last; for files
    and directories (searched for every kind of log).

    A run is named by :func:`run_names` (one name for all the logs of one run), or by its own name
    in a wandb panel CSV, or by ``names`` (one per run, in order). In directories the recipes'
    ``eval.jsonl`` (a final evaluation, no training steps) is read only with ``evaluations``. A
    log that cannot be read is skipped with a warning when other logs can be, and its problem (the
    file and why) is appended to ``unreadable`` when given, for the caller to say; if none can, this
    raises. Every other file found in a directory is appended to ``skipped``, with the reason it is not
    a log (:func:`_why_not_a_log`).
    """
    passed: list[str] = []
    files = _log_files(paths, evaluations, passed)
    if skipped is not None:
        skipped.extend(passed)
    if not files:
        raise ValueError(
            f"no logs (JSONL metrics, console logs, events.out.tfevents.*, *.csv, {TRAINER_STATE}) found in "
            f"{[str(p) for p in paths]}"
            + (f"; not read: {'; '.join(passed[:5])}" + (f" and {len(passed) - 5} more" if len(passed) > 5 else ""))
            * bool(passed)
        )
    grouped: dict[str, list[Path]] = {}
    for label, file in zip(run_names(files), files, strict=True):
        grouped.setdefault(label, []).append(file)
    if names is not None:
        if len(names) != len(grouped):
            raise ValueError(f"--name was given {len(names)} time(s) for {len(grouped)} run(s): {list(grouped)}")
        grouped = dict(zip(names, grouped.values(), strict=True))
    runs: dict[str, list[pd.DataFrame]] = {}
    problems: list[str] = []
    for label, group in grouped.items():
        for file in sorted(group, key=lambda log: log.name == "eval.jsonl"):
            try:
                found = _read_runs(file)
            except ValueError as err:
                problems.append(str(err))
                continue
            for panel_run, frame in found.items():
                name = label if panel_run is None else panel_run
                if panel_run is not None and panel_run in grouped:  # a panel's run named like another log's
                    name = f"{label}/{panel_run}"
                runs.setdefault(name, []).append(frame)
    if problems and not runs:
        raise ValueError("no log could be read: " + " | ".join(problems))
    if unreadable is not None:
        unreadable.extend(problems)
    else:
        for problem in problems:
            warnings.warn(f"skipped a log that cannot be read, the other runs are reported: {problem}", stacklevel=2)
    return runs


@contextmanager
def caught_warnings() -> Iterator[list[str]]:
    """The messages of the warnings raised inside the block (reading logs warns about what it skipped or
    repaired), each once, in order, filled when the block ends: the commands print them as plain lines,
    without Python's file and source line."""
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield messages
    messages.extend(dict.fromkeys(str(warning.message) for warning in caught))


def not_logs_summary(skipped: Sequence[str], shown: int = 3) -> list[str]:
    """The files of a folder that are not logs (``path (why)``, as :func:`read_run_logs` lists them), one
    line per reason: how many, and the first few."""
    by_reason: dict[str, list[str]] = {}
    for entry in skipped:
        path, _, why = entry.removesuffix(")").rpartition(" (")  # reasons hold no parentheses
        by_reason.setdefault(why, []).append(path)
    return [
        f"{len(paths)} file(s), {why}: {', '.join(paths[:shown])}"
        + (f" and {len(paths) - shown} more" if len(paths) > shown else "")
        for why, paths in by_reason.items()
    ]


def merge_frames(name: str, frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """One run's frames (its log files, in reading order) as one frame: a metric logged at the same
    step by several files keeps the last value, with a warning; ``attrs["repeated_steps"]`` lists
    the steps logged more than once, within a file or across files."""
    if len(frames) == 1:
        return frames[0]
    stacked = pd.concat(frames)
    merged = stacked.groupby(level=0).last()
    across = stacked.notna().groupby(level=0).sum()
    across_steps = across.index[(across > 1).any(axis=1)].tolist()
    if across_steps:
        warnings.warn(
            f"run {name}: step(s) {step_list(across_steps)} logged by more than one of its files (attempts of a "
            "resumed run?); kept the last value of each",
            stacklevel=2,
        )
    within = {step for frame in frames for step in frame.attrs.get("repeated_steps", ())}
    merged.attrs["repeated_steps"] = sorted(within.union(across_steps))
    merged.attrs["repeated_differing"] = sorted(
        {step for frame in frames for step in frame.attrs.get("repeated_differing", ())}.union(
            step for step in across_steps if (stacked.loc[[step]].nunique(dropna=True) > 1).any()
        )
    )
    intervals = {frame.attrs["logging_steps"] for frame in frames if "logging_steps" in frame.attrs}
    if len(intervals) == 1:
        merged.attrs["logging_steps"] = intervals.pop()
    planned = [frame.attrs["planned_steps"] for frame in frames if "planned_steps" in frame.attrs]
    if planned:
        merged.attrs["planned_steps"] = max(planned)
    return merged


def collect_runs(
    paths: Sequence[str | Path],
    names: Sequence[str] | None = None,
    unreadable: list[str] | None = None,
    skipped: list[str] | None = None,
) -> dict[str, pd.DataFrame]:
    """Run name -> metrics, as :func:`read_run_logs` finds and names them (the logs that cannot be read
    appended to ``unreadable``, the files of a folder that are not logs to ``skipped``), each run's logs
    merged (:func:`merge_frames`)."""
    runs = read_run_logs(paths, names, unreadable=unreadable, skipped=skipped)
    return {name: merge_frames(name, frames) for name, frames in runs.items()}
