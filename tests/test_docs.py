"""The user documents stay a user's: short, linked, and free of this project's private paths.

The README and docs/performance.md are read by people deciding whether and how
to use lmkit, so they stay at about a page each (the history of the figures
lives in CHANGELOG.md). Every page of docs/ is reachable from the README's
index, and every relative link (file and heading) resolves, so a page that
moves or a heading that is renamed fails here instead of in a reader's browser.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
USER_DOCS = [README, ROOT / "CHANGELOG.md", *DOCS]
LINKED_DOCS = [README, *DOCS]
MAX_LINES = 300

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^()\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without code blocks and inline code, where brackets are not links."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def _relative_links(path: Path) -> Iterator[str]:
    for target in _LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked
            yield target


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> Set[str]:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub numbers them."""
    seen: Dict[str, int] = {}
    anchors = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize("path", [README, ROOT / "docs" / "performance.md"], ids=lambda p: p.name)
def test_page_is_about_a_page_long(path: Path) -> None:
    assert _line_count(path) <= MAX_LINES, (
        f"{path.relative_to(ROOT)} has {_line_count(path)} lines, more than {MAX_LINES}: move details into the "
        "docs/ page they belong to, and the story of how a figure moved into CHANGELOG.md")


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_paths(path: Path) -> None:
    lines = [f"{number}: {line.strip()}" for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if "../shared" in line or "/work/shared" in line]
    assert not lines, f"{path.relative_to(ROOT)} names this project's shared folder, which users do not have:\n" + \
        "\n".join(lines)


def test_readme_indexes_every_doc() -> None:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^## Documentation\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, "README.md has no '## Documentation' section (the docs index)"
    indexed = {target.split("#")[0] for target in _LINK.findall(match.group(1))}
    missing = [f"docs/{doc.name}" for doc in DOCS if f"docs/{doc.name}" not in indexed]
    assert not missing, f"the README's docs index lacks {missing}: add one line for each"


def _broken_links() -> List[Tuple[str, str, str]]:
    broken = []
    for source in LINKED_DOCS:
        for target in _relative_links(source):
            file_part, _, anchor = target.partition("#")
            resolved = (source.parent / file_part).resolve() if file_part else source
            where = str(source.relative_to(ROOT))
            if not resolved.exists():
                broken.append((where, target, "no such file"))
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append((where, target, f"no heading '#{anchor}' in {resolved.name}"))
    return broken


def test_relative_links_resolve() -> None:
    broken = _broken_links()
    assert not broken, "links that point nowhere:\n" + "\n".join(f"{s}: ({t}) {why}" for s, t, why in broken)


def test_slugs_follow_github() -> None:
    # The anchors the docs link to, as GitHub renders these headings.
    assert _slug("Toward 35 % MFU: what was changed") == "toward-35--mfu-what-was-changed"
    assert _slug("`lmkit train`") == "lmkit-train"
    assert _slug("A full run: WikiText-2 on 2 workers") == "a-full-run-wikitext-2-on-2-workers"
    assert _slug("The compiled step (`jit_compile = \"auto\"`)") == "the-compiled-step-jit_compile--auto"
