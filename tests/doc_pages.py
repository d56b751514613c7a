"""The README and docs/*.md as the suite runs them: which test runs which page, and the pieces
those tests share (fenced blocks, a page's section, the README's links).

Every page's code is run by exactly one runner:

- READER_PAGES: the README, then the pages a reader goes on to, run top to bottom in one
  folder as one reader's session (tests/test_readme.py). The pages after the README may use
  what its tour made (`model.onnx`, `model.std.onnx`).
- walk-throughs: a page a test of its own walks from an empty folder (a tests/test_*.py with
  a module-level ``DOC = REPO / "docs" / "<page>"``: docs/writing-ops.md, docs/deploy.md).
- the other docs pages: their python blocks and ```sh run=yes blocks, in page order, in a fresh
  folder (tests/test_docs_pages.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"

# The README's tour, then the pages in the order a reader goes on to them.
READER_PAGES = (
    README,
    DOCS / "pictures.md",
    DOCS / "rules.md",
    DOCS / "export.md",
    DOCS / "rewrite.md",
    DOCS / "op-packages.md",
)

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]+\]\(([^)\s]+)\)")


def name(page: Path) -> str:
    """The page as a reader names it: README.md, docs/rules.md."""
    return page.relative_to(REPO).as_posix()


def blocks(page: Path) -> list[tuple[str, dict, str, int]]:
    """(language, options, body, line) of each fenced block."""
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        lang, *opts = m.group(1).split() or [""]
        options = dict(o.split("=", 1) for o in opts if "=" in o)
        out.append((lang, options, m.group(2), text[:m.start()].count("\n") + 1))
    return out


def section(page: Path, heading: str) -> str:
    """The text under `heading` (a line such as "## Fusions") up to the next heading of its
    level or above."""
    text = page.read_text()
    level = len(heading) - len(heading.lstrip("#"))
    m = re.search(rf"^{re.escape(heading)}\s*$", text, re.M)
    assert m, f"{name(page)} has no heading {heading!r}"
    rest = text[m.end():]
    fences = [f.span() for f in FENCE.finditer(rest)]  # a `# comment` in a code block is no heading
    for end in re.finditer(rf"^#{{1,{level}}} ", rest, re.M):
        if not any(a <= end.start() < b for a, b in fences):
            return rest[:end.start()]
    return rest


def walk_through_tests() -> dict[str, list[Path]]:
    """docs page name -> the tests/test_*.py that walk it from an empty folder."""
    found: dict[str, list[Path]] = {}
    for test in sorted((REPO / "tests").glob("test_*.py")):
        for page in re.findall(r'^DOC = REPO / "docs" / "([\w.-]+\.md)"', test.read_text(), re.M):
            found.setdefault(page, []).append(test)
    return found


def standalone_pages() -> list[Path]:
    """docs pages whose python blocks tests/test_docs_pages.py runs, each in a fresh folder."""
    walked = walk_through_tests()
    return sorted(p for p in DOCS.glob("*.md") if p not in READER_PAGES and p.name not in walked)


def slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) and GitHub give a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[\s]+", "-", text).strip("-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def relative_links(page: Path) -> list[str]:
    """Every link of the page that is not to a web address, outside code blocks."""
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


_STEP = re.compile(r"(?:<!-- file: (?P<path>[^ ]+) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```", re.S)


def steps(text: str) -> list[tuple[str, str, str]]:
    """A walk-through page's steps, (kind, target, body) in page order: ("file", path, text)
    for a block preceded by `<!-- file: PATH -->`, ("sh", "", commands) and ("python", "",
    code) for the others."""
    out = []
    for m in _STEP.finditer(text):
        if m.group("path"):
            out.append(("file", m.group("path"), m.group("body")))
        elif m.group("lang") in ("sh", "python"):
            out.append((m.group("lang"), "", m.group("body")))
    return out
