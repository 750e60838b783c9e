"""Every relative link of the README and docs/ leads somewhere: the file exists and, for a
``#section`` link into a Markdown page, a heading of that page has that anchor (GitHub's
rule: lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2`` for repeats).
Sections get renamed as the docs grow; a link into one that moved is caught here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "fixtures").rglob("README.md"))]


def _prose(md: Path):
    """(line number, line) outside fenced code blocks."""
    fence = False
    for number, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence:
            yield number, line


def anchor(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose(md):
        m = HEADING.match(line)
        if m:
            slug = anchor(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_anchor_follows_githubs_rule() -> None:
    assert anchor("Multi-node Megatron: the Megatron-LM paper's weak-scaling table (public, nothing fitted)") == \
        "multi-node-megatron-the-megatron-lm-papers-weak-scaling-table-public-nothing-fitted"
    assert anchor("`--partition-activations` and [the engine](x.md)") == "--partition-activations-and-the-engine"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    broken = []
    cache: dict[Path, set[str]] = {}
    for number, line in _prose(page):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):   # https:, mailto:, ...
                continue
            path, _, section = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}:{number}: {target}"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif section and dest.suffix == ".md":
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if section not in cache[dest]:
                    broken.append(f"{where}: no heading with that anchor")
    assert not broken, "\n".join(broken)
