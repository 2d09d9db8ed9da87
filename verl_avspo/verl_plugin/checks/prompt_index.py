"""The check of the train files' ``extra_info.index``: keyed by ``index`` (``algorithm.prompts.key``,
DCPO's default), each prompt's history is keyed by its row's index, read here
from the parquet files before Ray starts."""

from __future__ import annotations

from pathlib import Path

__all__ = ["prompt_index_problems"]


def prompt_index_problems(
    train_files, needed_by: str = "algorithm.adv_estimator=dcpo", what: str = "DCPO"
) -> tuple[list[str], list[str]]:
    """Refuse local parquet train files in which ``extra_info.index`` is missing, null or repeated
    (across all files), since verl's RLHFDataset would then give different prompts one history.

    Args:
        train_files: verl's ``data.train_files``.
        needed_by: the setting that keys prompts by index, as the messages name it.
        what: what would pool two prompts' rewards, as the messages name it.

    Returns:
        (problems, warnings): one problem per bad file (its first bad row); one warning per file
        that cannot be read here (not a local parquet file).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if train_files is None:
        return [], []
    files = [train_files] if isinstance(train_files, str) else [str(f) for f in train_files]
    fix = "Give every row a unique extra_info.index (recipes/data does), or set algorithm.prompts.key=raw_prompt."
    first_seen: dict = {}
    problems: list[str] = []
    warnings: list[str] = []
    for name in dict.fromkeys(files):  # a file listed twice (upweighted) repeats its own prompts only
        path = Path(name).expanduser()
        if not (path.is_file() and path.suffix == ".parquet"):
            warnings.append(
                f"cannot check extra_info.index of {name} for {what} here (not a local parquet file); during training "
                "only different prompts sharing an index within one batch are caught. If its indices may repeat, set "
                "algorithm.prompts.key=raw_prompt."
            )
            continue
        try:
            schema = pq.read_schema(path)
            info = schema.field("extra_info").type if "extra_info" in schema.names else None
            if info is not None and not isinstance(info, pa.StructType):
                problems.append(
                    f"{needed_by}: {name}'s extra_info column is {info}, but verl's RLHFDataset needs "
                    f"a struct (a dict per row) with an index field. {fix}"
                )
                continue
            if info is None or info.get_field_index("index") < 0:
                problems.append(
                    f"{needed_by} keys prompts by extra_info.index, but {name} has no "
                    f"extra_info.index column, so verl's RLHFDataset gives every row index 0 and {what} would pool all "
                    f"prompts. {fix}"
                )
                continue
            column = pq.read_table(path, columns=["extra_info"]).column("extra_info").combine_chunks()
        except pa.ArrowException as err:
            problems.append(f"{needed_by}: cannot read {name} as parquet ({err}).")
            continue
        for row, index in enumerate(column.field("index").to_pylist()):
            if index is None:
                problems.append(f"{needed_by}: row {row} of {name} has no extra_info.index (null). {fix}")
                break
            if index in first_seen:
                where = first_seen[index]
                problems.append(
                    f"{needed_by}: extra_info.index {index!r} appears in row {where[1]} of "
                    f"{where[0]} and row {row} of {name}, so {what} would pool two prompts' rewards. {fix}"
                )
                break
            first_seen[index] = (name, row)
    return problems, warnings
