"""docs/architecture.md names every module of the package: each ``verl_avspo/<folder>/<name>.py`` in its
folder's row of the Package layout table (as `name`), a module of a subfolder such as
``verl_plugin/checks/`` inside the parentheses that follow the subfolder's `checks/`, the top-level
modules in the ``(top level)`` row, and ``__main__`` too; the state layout it gives is the one the run
tracker saves. A failure names each module left out and the line to add."""

import re
from pathlib import Path

import pytest

import verl_avspo

PACKAGE = Path(verl_avspo.__file__).parent
DOC = PACKAGE.parent / "docs" / "architecture.md"
TOP_LEVEL = "(top level)"


def layout_rows(text: str) -> dict[str, str]:
    """{folder ("" for the top level): its row's text} of the Package layout table."""
    section = text.partition("## Package layout")[2].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2:
            continue
        first = cells[0]
        if first == TOP_LEVEL:
            rows[""] = line
        elif re.fullmatch(r"`[a-z_]+/`", first):
            rows[first.strip("`/")] = line
    return rows


def named(row: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", row))


def subfolder_list(row: str, subfolder: str) -> str:
    """The text of the parentheses that follow `subfolder/` in ``row`` ("" when there are none)."""
    match = re.search(rf"`{re.escape(subfolder)}/`\s*\(([^)]*)\)", row)
    return match.group(1) if match else ""


def missing_modules(text: str) -> list[str]:
    """One line for each module the table does not name: the module and what to add where."""
    rows = layout_rows(text)
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        folder, stem = (parts[0], parts[-1]) if len(parts) > 1 else ("", parts[0])
        label = f"the `{folder}/` row" if folder else f"the {TOP_LEVEL} row"
        where = f"verl_avspo/{path.relative_to(PACKAGE).as_posix()}"
        if folder not in rows:
            missing.append(f"{where}: the table has no row for {folder or TOP_LEVEL}; add one naming `{stem}`")
            continue
        if len(parts) > 2:  # a module of a subfolder: named inside the subfolder's parentheses
            subfolder = "/".join(parts[1:-1])
            if stem not in named(subfolder_list(rows[folder], subfolder)):
                missing.append(
                    f"{where}: add `{stem}` (what it holds) inside the parentheses after `{subfolder}/` in {label}"
                )
        elif stem not in named(rows[folder]):
            missing.append(f"{where}: add `{stem}` (what it holds) to {label}")
    return missing


def test_every_module_is_named_in_its_folders_row():
    missing = missing_modules(DOC.read_text(encoding="utf-8"))
    assert not missing, "docs/architecture.md, section Package layout, does not name:\n  " + "\n  ".join(missing)


@pytest.mark.parametrize(
    "doc, expected",
    [
        ("", "the table has no row for"),  # no table: every module is missing
        ("## Package layout\n| `core/` | `run_tracker` |\n", "verl_avspo/core/collapse.py: add `collapse`"),
        (
            "## Package layout\n| `verl_plugin/` | `checks/` (`data`) |\n",
            "verl_avspo/verl_plugin/checks/settings.py: add `settings` (what it holds) inside the parentheses after "
            "`checks/`",
        ),
    ],
)
def test_a_module_left_out_is_named_with_the_line_to_add(doc, expected):
    assert any(line.startswith(expected) or expected in line for line in missing_modules(doc))


def test_the_state_layout_is_the_saved_one():
    from verl_avspo.core.acr_config import ACRConfig
    from verl_avspo.core.run_tracker import RunTracker

    text = DOC.read_text(encoding="utf-8")
    layout = re.search(r'`\{"version": \d+,(.*?)\}`', text, re.S)
    assert layout, 'docs/architecture.md gives no state layout of the form `{"version": N, ...}`'
    documented = {"version", *re.findall(r'"(\w+)"', layout.group(1))}
    saved = set(RunTracker(ACRConfig()).state_dict())
    assert documented == saved, f"docs/architecture.md's state layout {sorted(documented)} != saved {sorted(saved)}"
