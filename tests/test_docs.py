"""The README (the user's guide) and docs/research/ (one page per study) link to each other and to the figures by
relative paths: every such link must resolve, and an anchor into a page must name one of its headings. The README
stays a guide of at most 400 lines; no page reads as a session log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lstrip("#").strip().lower())
    return text.replace(" ", "-")


def _local_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text()) if not re.match(r"[a-z]+://", t) and not t.startswith("#")]


def test_the_anchor_rule_matches_github():
    assert _anchor("## Results on real images: Omniglot") == "results-on-real-images-omniglot"
    assert _anchor("### CIFAR-100, miniImageNet, CUB-200") == "cifar-100-miniimagenet-cub-200"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    links = _local_links(page)
    for target in links:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve()
        assert file.is_file(), f"{page.name}: link to {target} does not resolve"
        if anchor and file.suffix == ".md":
            headings = {_anchor(line) for line in file.read_text().splitlines() if line.startswith("#")}
            assert anchor in headings, f"{page.name}: {target} names no heading of {file.name}"


def test_the_research_pages_are_linked_from_their_index_and_the_index_from_the_readme():
    assert "docs/research/README.md" in _local_links(ROOT / "README.md")
    index = ROOT / "docs" / "research" / "README.md"
    pages = {p.name for p in index.parent.glob("*.md")} - {"README.md"}
    assert pages <= {Path(link).name for link in _local_links(index)}


RESEARCH = sorted((ROOT / "docs" / "research").glob("*.md"))
LOG_TALK = (
    r"\b[Ss]top \d+\b", r"\b[Tt]his stop\b", r"[Ww]ritten down before", r"\bcp -a", r"\bln -s", r"\bprintf\b",
    r"/work/", r"\.\./shared/", r"import _\w+", r"\b_run_cached\b",
)


def test_the_readme_is_a_guide_and_nothing_reads_as_a_log():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 400
    for page in PAGES:
        body = page.read_text()
        for pattern in LOG_TALK:  # no session talk, no work-folder surgery, no paths outside, no private calls
            assert not re.search(pattern, body), f"{page.name}: {pattern}"


@pytest.mark.parametrize("page", [p for p in RESEARCH if p.name != "README.md"], ids=lambda p: p.name)
def test_each_research_page_has_headings_and_says_which_configuration_layout_it_used(page):
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# ")
    assert any(line.startswith("## ") for line in lines), f"{page.name} has no section headings"
    assert "configuration layout" in "\n".join(lines[:12]).lower(), f"{page.name} does not say its layout"
