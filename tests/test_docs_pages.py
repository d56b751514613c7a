"""docs/*.md, executed and built.

The python blocks of each page no other test runs (doc_pages.standalone_pages(): the pages
outside the reader's session of tests/test_readme.py and without a walk-through test of their
own, such as docs/writing-ops.md's) run in order, in a fresh folder, as a reader would paste
them. The site (`make docs`: mkdocs.yml, nav over docs/) builds with warnings as errors."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import REPO
from doc_pages import DOCS, blocks, name, standalone_pages

PAGES = standalone_pages()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_block_of_the_page_runs(page, tmp_path):
    """The page's python blocks, and its ```sh run=yes blocks line by line (with this
    environment's `graphkit` first on PATH), in page order in one folder."""
    import os

    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    for k, (lang, options, code, line) in enumerate(blocks(page)):
        if lang == "python":
            script = tmp_path / f"block{k}.py"
            script.write_text(code)
            argvs = [[sys.executable, str(script)]]
        elif lang == "sh" and options.get("run") == "yes":
            argvs = [["bash", "-c", cmd.split("  #")[0].strip()] for cmd in code.splitlines()
                     if cmd.strip() and not cmd.startswith("#")]
        else:
            continue
        for argv in argvs:
            proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
            assert proc.returncode == 0, (page.name, line, argv, proc.stdout, proc.stderr)
            if lang == "python":
                for want in re.findall(r"print\(.*\)  # (.+)", code):  # a printed value the page shows
                    assert want in proc.stdout, (page.name, line, want, proc.stdout)


def test_the_site_lists_every_page():
    """mkdocs.yml's nav names every docs page once, and only those."""
    config = (REPO / "mkdocs.yml").read_text()
    nav = config.split("\nnav:\n", 1)[1]
    listed = re.findall(r"^  - [^:\n]+: (\S+\.md)$", nav, re.M)
    assert len(listed) == len(set(listed)), listed
    assert sorted(listed) == sorted(p.name for p in DOCS.glob("*.md")), \
        f"add to or drop from mkdocs.yml's nav: {sorted(set(listed) ^ {p.name for p in DOCS.glob('*.md')})}"
    assert re.search(r"^docs_dir: docs$", config, re.M) and listed[0] == "index.md"


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    """`mkdocs build --strict`: a broken link, a missing #anchor or a page left out of the nav is
    an error (mkdocs.yml's validation)."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the dev extra installs it; `make docs` builds)")
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in DOCS.glob("*.md"):
        built = site / ("index.html" if page.name == "index.md" else f"{page.stem}/index.html")
        assert built.exists(), name(page)
    assert "<table>" in (site / "exit-codes" / "index.html").read_text()
