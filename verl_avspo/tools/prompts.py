"""``verl-avspo prompts``: which prompts a run found dead weight, from its saved per-prompt history, and
a training parquet without them.

    verl-avspo prompts checkpoints/                      # the latest checkpoint's history, by class
    verl-avspo prompts checkpoints/global_step_200 --show 20
    verl-avspo prompts checkpoints/ --data train.parquet --drop always_solved,never_solved --out kept.parquet
    verl-avspo prompts checkpoints/ --data train.parquet --annotate --out annotated.parquet

The run state is the run tracker's (docs/architecture.md): verl's trainers write it to
``global_step_N/avspo_state.pt`` in ``trainer.default_local_dir``; OpenRLHF keeps it in the
checkpoint's client states (``--ckpt.path/_actor/global_step<N>/mp_rank_00_model_states.pt``); TRL's
trainer writes ``checkpoint-N/avspo_state.pt`` in its ``output_dir``. Given a folder, the command reads
the state of its latest step (``--step`` picks another); in a verl folder, the step verl would resume from,
which its ``latest_checkpointed_iteration.txt`` names (a save that failed, a full disk, can leave a later
folder behind it, said with a warning).

A prompt seen by the run is **always_solved** (all-correct on every visit), **never_solved** (all-wrong
on every visit) or **mixed**. With ``--data``, each parquet row is matched to the history by the key
the run used: ``extra_info.index`` when the history is keyed by integers (``algorithm.prompts.key=index``;
``--index-column`` names another, such as the ``index`` column a TRL run keyed by ``prompts.key``),
else the hash of the row's prompt messages (``raw_prompt``: the ``--prompt-column``, verl's
``data.prompt_key``). ``--drop`` writes the rows of the other classes and the rows the run never
visited; ``--annotate`` adds ``prompt_visits``, ``prompt_all_correct``, ``prompt_all_wrong``,
``prompt_last_pass_rate`` and ``prompt_class`` (``unseen`` for unvisited rows). The output is the
input's table with rows removed or columns added, so verl reads it as it read the input. ``--out`` is
checked before the state is read (an existing file is replaced only with ``--force``) and written
through ``core.files.atomic_write``, so a failed write leaves what was there.

The state is read with ``core.run_tracker.read_state``, as a resume reads it: a torn, empty or foreign
file, or one of a newer release, is named with what to do.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from verl_avspo.core.files import FileWriteError, atomic_write, check_target
from verl_avspo.core.prompt_history import PROMPT_CLASSES, PromptHistory, prompt_key
from verl_avspo.core.run_tracker import STATE_FILE, RunStateError, read_state
from verl_avspo.core.state_file import checkpoint_step
from verl_avspo.openrlhf.trainer_wrap import CLIENT_STATES_FILE, STATE_KEY

__all__ = ["PromptsError", "SavedHistory", "load_history", "row_keys", "select_rows", "configure", "run"]

logger = logging.getLogger(__name__)

UNSEEN = "unseen"
# verl's checkpoint tracker (verl.utils.checkpoint.checkpoint_manager.get_checkpoint_tracker_filename, tested
# against it): the step a verl run resumes from. Named here, not imported: verl's import takes about 10 s.
VERL_TRACKER_FILE = "latest_checkpointed_iteration.txt"
INDEX_COLUMN = "extra_info.index"  # verl's dataset index, what algorithm.prompts.key=index keys by
ANNOTATIONS = ("visits", "all_correct", "all_wrong", "last_pass_rate", "class")
_WHERE = (
    f"verl's trainers write global_step_N/{STATE_FILE} in trainer.default_local_dir at every checkpoint "
    "(trainer.save_freq); OpenRLHF keeps the state in --ckpt.path/_actor/global_step<N>/"
    f"{CLIENT_STATES_FILE} (--ckpt.save_steps); TRL's trainer in output_dir/checkpoint-N/{STATE_FILE} (save_steps)"
)


class PromptsError(ValueError):
    """A run, state or data file the command cannot use; the message names the fix."""


@dataclass
class SavedHistory:
    """A run's per-prompt history and where it was read."""

    history: PromptHistory
    path: Path
    step: int | None

    def table(self) -> pd.DataFrame:
        """One row per seen prompt: ``key``, the history's columns and ``class``."""
        return pd.DataFrame(self.history.table())


def _state_files(folder: Path) -> list[Path]:
    return sorted(
        (
            p
            for name in (STATE_FILE, CLIENT_STATES_FILE)
            for p in folder.rglob(name)
            if checkpoint_step(p.parent) is not None
        ),
        key=lambda p: (checkpoint_step(p.parent), str(p)),
    )


def _run_state(path: Path, steps: list[int]) -> dict[str, Any]:
    """The run tracker's state in a verl state file or a DeepSpeed client-states file (``steps``: the
    other steps of its folder, for the message of one that cannot be read)."""
    # DeepSpeed pickles its own objects (the engine's arguments) beside the client states: read as
    # OpenRLHF reads them on resume (read_state's ``within``).
    within = STATE_KEY if path.name == CLIENT_STATES_FILE else None
    try:
        return read_state(path, within=within)
    except RunStateError as err:
        others = [step for step in steps if step != checkpoint_step(path.parent)]
        earlier = f"; --step reads another checkpoint ({', '.join(map(str, others))} here)" if others else ""
        raise PromptsError(f"{err}{earlier}") from None


def _resumed_step(folder: Path, steps: list[int]) -> int | None:
    """The step verl resumes ``folder`` from (its tracker file), when that step has a run state; None (the
    latest) otherwise. A later step's folder is a save that did not finish: said with a warning."""
    tracker = folder / VERL_TRACKER_FILE
    try:
        step = int(tracker.read_text().strip())
    except (OSError, ValueError):
        return None
    if step not in steps:
        return None
    later = [other for other in steps if other > step]
    if later:
        logger.warning(
            "%s names step %d, the step verl resumes from; global_step_%s %s later, from a save that did not finish "
            "(a full disk, a killed run), and is not read: --step %d reads it anyway",
            tracker,
            step,
            ", ".join(map(str, later)),
            "is" if len(later) == 1 else "are",
            later[-1],
        )
    return step


def load_history(run: str | Path, step: int | None = None) -> SavedHistory:
    """The per-prompt history saved in ``run``: a state file, a checkpoint folder, or a folder of
    checkpoints (the step verl resumes from where it names one, else its latest; or ``step``).

    Raises:
        PromptsError: nothing to read there, or a state without a prompt history; the message says why.
    """
    path = Path(run).expanduser()
    if not path.exists():
        raise PromptsError(f"{path} does not exist: give a run's checkpoint folder or its state file ({_WHERE})")
    steps: list[int] = []
    if path.is_dir():
        found = _state_files(path)
        steps = sorted({checkpoint_step(p.parent) for p in found})
        files = found or [p for p in (path / STATE_FILE, path / CLIENT_STATES_FILE) if p.exists()]
        if step is None:
            step = _resumed_step(path, steps)
        if step is not None:
            files = [p for p in files if checkpoint_step(p.parent) == step]
        if not files and steps:
            raise PromptsError(
                f"no run state of step {step} under {path}: its checkpoints hold step{'s' if len(steps) > 1 else ''} "
                f"{', '.join(map(str, steps))}. Give --step one of them."
            )
        if not files:
            which = f"of step {step} " if step is not None else ""
            raise PromptsError(f"no run state {which}under {path}: {_WHERE}. Point at a folder holding one.")
        path = files[-1]
    state = _run_state(path, steps)
    history = PromptHistory()
    history.load_state_dict(state["prompt_history"])
    if not len(history):
        raise PromptsError(
            f"the run state {path} has no per-prompt history: it is empty: the run passed no prompt identity (an "
            "estimator without groups, or a batch without index/raw_prompt fields). Train with a group estimator "
            "(grpo, avspo, ...): every route records the history by default."
        )
    return SavedHistory(history, path, checkpoint_step(path.parent))


def _index_values(table: pa.Table, index_column: str) -> list | None:
    """The values of ``index_column`` (``column`` or ``column.field`` of a struct column), or None."""
    column, _, field = index_column.partition(".")
    if column not in table.column_names:
        return None
    values = table.column(column).combine_chunks()
    if field:
        if not isinstance(values.type, pa.StructType) or values.type.get_field_index(field) < 0:
            return None
        values = values.field(field)
    return values.to_pylist()


def row_keys(table: pa.Table, key_kind: str, prompt_column: str, name: str, index_column: str = INDEX_COLUMN) -> list:
    """Each parquet row's prompt key, as the run keyed it (``key_kind``: ``int`` for the integer
    ``index_column``, verl's ``extra_info.index`` by default; ``str`` for the hash of the prompt messages).

    Raises:
        PromptsError: the rows have no such key.
    """
    if key_kind == "int":
        values = _index_values(table, index_column)
        if values is None:
            raise PromptsError(
                f"the run keyed prompts by integers, but {name} has no {index_column} column: give the parquet the "
                "run trained on (its rows carry the index the history is keyed by), and --index-column the column "
                f"holding it ({', '.join(table.column_names)})"
            )
        missing = [row for row, value in enumerate(values) if value is None]
        if missing:
            raise PromptsError(
                f"row {missing[0]} of {name} (and {len(missing) - 1} more) has no {index_column}, so it cannot be "
                "matched to the run's history: give the parquet the run trained on"
            )
        keys = [int(value) for value in values]
        shared = _shared_keys(table, keys, prompt_column)
        if shared:
            shown = ", ".join(map(str, shared[:5])) + (f" and {len(shared) - 5} more" if len(shared) > 5 else "")
            which = (
                "different prompts" if prompt_column in table.column_names else f"rows (no {prompt_column!r} column)"
            )
            raise PromptsError(
                f"{index_column} of {name} gives one value to {which} ({shown}), so they would take one prompt's "
                "history. The run keyed each prompt by its own index (verl refuses algorithm.prompts.key=index on "
                "train files whose extra_info.index repeats, and key=auto keys such files by raw_prompt): give the "
                "parquet the run trained on, or --index-column the column the run was keyed by"
            )
        return keys
    if prompt_column not in table.column_names:
        raise PromptsError(
            f"the run keyed prompts by a hash of their messages, but {name} has no {prompt_column!r} column: set "
            f"--prompt-column to the column verl read the prompts from (data.prompt_key), one of "
            f"{', '.join(table.column_names)}"
        )
    return [prompt_key(value) for value in table.column(prompt_column).to_pylist()]


def _shared_keys(table: pa.Table, keys: list[int], prompt_column: str) -> list[int]:
    """The keys that rows of different prompts share (a prompt listed twice under its one key is fine);
    without ``prompt_column``, every repeated key."""
    repeated = {key for key, count in Counter(keys).items() if count > 1}
    if not repeated or prompt_column not in table.column_names:
        return sorted(repeated)
    rows = [row for row, key in enumerate(keys) if key in repeated]
    prompts = table.column(prompt_column).take(pa.array(rows)).to_pylist()
    first: dict[int, str] = {}
    shared = set()
    for row, prompt in zip(rows, prompts, strict=True):
        key, hashed = keys[row], prompt_key(prompt)
        if first.setdefault(key, hashed) != hashed:
            shared.add(key)
    return sorted(shared)


def select_rows(saved: SavedHistory, table: pa.Table, keys: list) -> pd.DataFrame:
    """The history's columns for each row (``class`` ``unseen`` and NaN where the run never visited it)."""
    history = saved.table().set_index("key")
    rows = history.reindex(pd.Index(keys, dtype=history.index.dtype if len(keys) else None))
    rows["class"] = rows["class"].fillna(UNSEEN)
    return rows.reset_index(drop=True)


def _summary(saved: SavedHistory, show: int) -> str:
    table = saved.table()
    where = f"step {saved.step}, " if saved.step is not None else ""
    kind = "an integer index" if saved.history.key_kind == "int" else "a hash of the prompt"
    lines = [f"{saved.path} ({where}{len(table)} prompts seen, keyed by {kind})", ""]
    counts = table["class"].value_counts()
    width = max(map(len, PROMPT_CLASSES))
    for name in PROMPT_CLASSES:
        count = int(counts.get(name, 0))
        lines.append(f"  {name:<{width}}  {count:>8}  {count / len(table):6.1%}")
    for name in PROMPT_CLASSES:
        members = table[table["class"] == name]
        if show and len(members):
            shown = members.sort_values(["visits", "key"], ascending=[False, True]).head(show)
            more = f" (first {show} of {len(members)}, most visited first)" if len(members) > show else ""
            lines += ["", f"{name}{more}:"]
            lines += [
                f"  {row.key}  visits {row.visits}, last pass rate {row.last_pass_rate:.2f}"
                for row in shown.itertuples()
            ]
    return "\n".join(lines)


def _classes(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PROMPT_CLASSES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give classes separated by commas, from {', '.join(PROMPT_CLASSES)}"
        )
    return names


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a count of 0 or more (0: counts only)")
    return count


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a checkpoint folder (or a folder of them), or a run state file")
    parser.add_argument(
        "--step", type=int, help="the checkpoint step to read (default: the one verl resumes from, else the latest)"
    )
    parser.add_argument("--show", type=_count, default=10, help="prompts listed per class (default 10; 0: counts only)")
    parser.add_argument("--data", help="the training parquet (verl format) to write a new one from")
    parser.add_argument("--out", help="where to write the new parquet (needs --data; an existing file needs --force)")
    parser.add_argument("--force", action="store_true", help="replace the --out file if it exists")
    parser.add_argument(
        "--drop", type=_classes, default=[], help=f"classes whose rows to leave out: {', '.join(PROMPT_CLASSES)}"
    )
    parser.add_argument("--annotate", action="store_true", help="add the history's prompt_* columns to each row")
    parser.add_argument(
        "--index-column",
        default=INDEX_COLUMN,
        help=f"the integer column a history keyed by index matches (column or column.field; default {INDEX_COLUMN})",
    )
    parser.add_argument(
        "--prompt-column",
        default="prompt",
        help="the parquet column of the prompt messages (data.prompt_key; default prompt)",
    )


def _paths(args: argparse.Namespace) -> tuple[Path, Path]:
    """--data and --out, checked before the run state is read: the input is a file, and the output can
    be written without replacing what the user did not ask to replace."""
    data, out = Path(args.data).expanduser(), Path(args.out).expanduser()
    if not data.is_file():
        raise PromptsError(f"--data {data} is not a file: give the training parquet")
    if out.exists() and out.resolve() == data.resolve():
        raise PromptsError(f"--out {out} is the input file: write the new parquet elsewhere")
    try:
        check_target(out, overwrite=args.force, how_to_overwrite="--force")
    except FileWriteError as err:
        raise PromptsError(f"--out: {err}") from None
    return data, out


def _read_table(data: Path) -> pa.Table:
    try:
        return pq.read_table(data)
    except pa.ArrowException as err:
        with data.open("rb") as head:
            first = head.read(4096).lstrip()[:1]
        if first in (b"{", b"["):  # OpenRLHF's prompt data (--data.prompt_data) is JSON lines
            raise PromptsError(
                f"--data {data} is JSON, not parquet (OpenRLHF's prompt data?): this command reads and writes "
                f"verl's parquet. Convert it (pd.read_json('{data}', lines=True).to_parquet('train.parquet'), with "
                "pandas) and give --prompt-column the column of the prompt text (OpenRLHF's --data.input_key); "
                "pd.read_parquet(out).to_json(path, orient='records', lines=True) converts the result back. OpenRLHF "
                "keys a prompt by the hash of the text it generated from (after --data.input_template or "
                "--data.apply_chat_template), so only rows whose column holds that text match"
            ) from None
        raise PromptsError(f"--data {data} cannot be read as parquet ({err})") from None


def _write(args: argparse.Namespace, saved: SavedHistory, data: Path, out: Path) -> str:
    table = _read_table(data)
    keys = row_keys(table, saved.history.key_kind, args.prompt_column, str(data), args.index_column)
    rows = select_rows(saved, table, keys)
    matched = int((rows["class"] != UNSEEN).sum())
    if not matched:
        raise PromptsError(
            f"none of the {len(keys)} rows of {data} matches a prompt of the run's history (keyed by "
            f"{args.index_column if saved.history.key_kind == 'int' else 'a hash of the prompt'}): was the run "
            "trained on this file?"
        )
    if args.annotate:
        for name in ANNOTATIONS:
            column = rows[name]
            if name != "class":
                column = column.astype("float64" if name == "last_pass_rate" else "Int64")
            table = table.append_column(f"prompt_{name}", pa.array(column, from_pandas=True))
    keep = ~rows["class"].isin(args.drop).to_numpy()
    table = table.filter(pa.array(keep))
    with atomic_write(out) as temporary:
        pq.write_table(table, temporary)
    dropped = f", {int((~keep).sum())} dropped ({', '.join(args.drop)})" if args.drop else ""
    return (
        f"wrote {out}: {table.num_rows} of {len(keys)} rows{dropped}; {matched} rows matched a visited prompt, "
        f"{len(keys) - matched} were never visited (kept)"
    )


def run(args: argparse.Namespace) -> int:
    if (args.drop or args.annotate or args.out) and not (args.data and args.out):
        print("verl-avspo prompts: --drop and --annotate need --data (the training parquet) and --out", file=sys.stderr)
        return 2
    if args.data and not (args.drop or args.annotate):
        print("verl-avspo prompts: --data needs --drop CLASSES or --annotate (what to write)", file=sys.stderr)
        return 2
    try:
        paths = _paths(args) if args.data else None
        saved = load_history(args.run, args.step)
        print(_summary(saved, args.show))
        if paths is not None:
            print("\n" + _write(args, saved, *paths))
    except (PromptsError, FileWriteError) as err:
        print(f"verl-avspo prompts: {err}", file=sys.stderr)
        return 1
    return 0
