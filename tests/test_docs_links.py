"""Every relative Markdown link in README.md, docs/*.md, recipes/README.md and patches/README.md
leads somewhere: the file or folder exists, and a ``#anchor`` names a heading of the target page by
GitHub's slug rules. Links inside code spans and fenced code blocks are not links and are skipped;
web links are not fetched."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [ROOT / "README.md", ROOT / "recipes" / "README.md", ROOT / "patches" / "README.md"]
    + list((ROOT / "docs").glob("*.md"))
)
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with their 1-based numbers and code spans blanked."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, punctuation dropped, spaces
    to hyphens (github-slugger's rules)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page offers: one per heading (duplicates get -1, -2, ...), and HTML anchors."""
    found, seen = set(), {}
    text = page.read_text(encoding="utf-8")
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        if match := HEADING.match(line):
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def broken_links(page: Path) -> list[str]:
    problems = []
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            destination = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(page.parents[1]) if page.parent != ROOT else page.name}:{number}"
            if not destination.exists():
                problems.append(f"{where}: {target} -> no such file")
            elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
                problems.append(f"{where}: {target} -> no heading with anchor #{anchor}")
            elif anchor and destination.suffix != ".md":
                problems.append(f"{where}: {target} -> an anchor into a file that is not Markdown")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    assert page.exists(), f"{page} is gone: update PAGES"
    problems = broken_links(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        # GitHub's anchors for headings of this repository, as the docs linked them before this test.
        ("2a. ACR in stock `main_ppo`: the replay-buffer hook", "2a-acr-in-stock-main_ppo-the-replay-buffer-hook"),
        (
            "Per step and per rollout: AVSPO against DAPO's re-sampling",
            "per-step-and-per-rollout-avspo-against-dapos-re-sampling",
        ),
        (
            "In verl (`python -m verl_avspo.main_ppo`, V1 sync trainer only)",
            "in-verl-python--m-verl_avspomain_ppo-v1-sync-trainer-only",
        ),
        ("6.3 Why the leave-one-out baseline is unbiased", "63-why-the-leave-one-out-baseline-is-unbiased"),
        ("See [the docs](docs/method.md)", "see-the-docs"),
    ],
)
def test_slug_follows_github(heading, anchor):
    assert slug(heading) == anchor


def test_a_broken_link_and_a_broken_anchor_are_found(tmp_path):
    # The control for the test above: each kind of break is reported, code is not read as a link.
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Title\n\n## Part two\n\n## Part two\n", encoding="utf-8")
    page = docs / "b.md"
    page.write_text(
        "[ok](a.md#part-two-1) [ok](#local) [gone](missing.md) [bad](a.md#part-three)\n"
        "`[code](nowhere.md)` [web](https://example.com/x.md)\n"
        "```\n[fenced](nowhere.md)\n```\n## Local\n",
        encoding="utf-8",
    )
    problems = broken_links(page)
    assert len(problems) == 2, problems
    assert "missing.md -> no such file" in problems[0]
    assert "a.md#part-three -> no heading with anchor #part-three" in problems[1]
