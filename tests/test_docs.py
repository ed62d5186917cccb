"""The README's and docs' relative links lead somewhere: the file exists and the #anchor is one of its headings; every
results file they cite is in the tree, and none is large."""

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "research").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
RESULT = re.compile(r"(?<![\w/.-])(?:\.\./)*(results/[\w./+-]*[\w/])")  # a path under results/, however deep the page


def prose(page: Path) -> str:
    """The page without its code blocks and inline code, which may run over lines (where `](` is Python, not a link,
    and a command names the files it writes)."""
    return re.sub(r"`[^`]+`", "", FENCE.sub("", page.read_text()))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, letters, digits, spaces, '-' and '_' kept, spaces to '-'."""
    kept = "".join(c for c in heading.strip().lower() if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.M):
        slug = anchor(heading.replace("`", ""))
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_a_heading_becomes_the_anchor_github_gives_it():
    assert anchor("Backbones: smollm2-135m and qwen2.5-coder-0.5b") == "backbones-smollm2-135m-and-qwen25-coder-05b"
    assert (
        anchor("Why TokMem's routing collapses: recipe and budget") == "why-tokmems-routing-collapses-recipe-and-budget"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_of_a_page_names_an_existing_file_and_heading(page):
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, fragment = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_results_file_a_page_cites_is_in_the_tree(page):
    missing = sorted({path for path in RESULT.findall(prose(page)) if not (ROOT / path).exists()})
    assert not missing, f"{page.relative_to(ROOT)} cites {missing}"


def test_no_results_file_is_over_a_megabyte():
    large = [p.relative_to(ROOT).as_posix() for p in (ROOT / "results").rglob("*") if p.stat().st_size > 1_000_000]
    assert not large, f"{large}: keep a result's samples compressed (.json.xz, read by research/results.py)"


def test_the_results_page_keeps_its_lines_short():
    long = [n for n, line in enumerate((ROOT / "docs" / "results.md").read_text().splitlines(), 1) if len(line) > 200]
    assert not long, f"docs/results.md: lines {long} are over 200 characters"
