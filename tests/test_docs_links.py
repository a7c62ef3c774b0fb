"""Every relative link in README.md and docs/*.md resolves: the file exists and, when the
link names an anchor, the target has a heading with that GitHub-style slug. Code links to
docs/design.md anchors, so a renamed heading must fail here, not in a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _strip_code(text: str) -> list[str]:
    """Lines outside fenced code blocks, with inline code spans kept (headings use them)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = text.lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for line in _strip_code(path.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def links(path: Path) -> list[str]:
    # Whole text, so a link whose words wrap onto the next line is still seen; links
    # inside inline code spans (which may wrap too) are not links.
    text = re.sub(r"`[^`]*`", "", "\n".join(_strip_code(path.read_text())))
    return LINK.findall(text)


def test_slug_matches_github():
    assert slug("Hit rule") == "hit-rule"
    assert slug("`kvroute tail`: watch an engine's event stream") == (
        "kvroute-tail-watch-an-engines-event-stream"
    )
    assert slug("Prometheus metrics (`GET /metrics`)") == "prometheus-metrics-get-metrics"
    assert slug("Behaves like vLLM 0.33") == "behaves-like-vllm-033"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    broken = []
    for target in links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, "\n".join(broken)


def test_docs_cover_the_design_anchors_code_cites():
    """design.md keeps the anchors that code comments link to."""
    have = anchors(ROOT / "docs" / "design.md")
    for anchor in ("wire-format", "hit-rule", "rest-contract", "index-layout", "block-keys"):
        assert anchor in have, anchor


def test_no_unresolved_design_section_references_in_docs():
    stale = [str(p.relative_to(ROOT)) for p in DOCS if "DESIGN §" in p.read_text()]
    assert not stale, f"'DESIGN §N' left in {stale}: link docs/design.md#<anchor> instead"
