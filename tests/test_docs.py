"""The README and docs/ link to each other and to the figures by relative paths: every such link must resolve, and
an anchor into the README must name one of its headings (the history moved to docs/ and points back into it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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


def test_the_history_pages_are_linked_from_the_readme():
    assert {"docs/omniglot-history.md", "docs/findings.md"} <= set(_local_links(ROOT / "README.md"))
