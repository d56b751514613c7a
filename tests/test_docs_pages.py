"""docs/*.md, executed: the python blocks of each page no other test runs
(doc_pages.standalone_pages(): the pages outside the reader's session of tests/test_readme.py
and without a walk-through test of their own, such as docs/writing-ops.md's) run in order, in
a fresh folder, as a reader would paste them."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from doc_pages import standalone_pages

PAGES = standalone_pages()


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_block_of_the_page_runs(page, tmp_path):
    blocks = python_blocks(page.read_text())
    for k, code in enumerate(blocks):
        script = tmp_path / f"block{k}.py"
        script.write_text(code)
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (page.name, k, proc.stdout, proc.stderr)
        for want in re.findall(r"print\(.*\)  # (.+)", code):  # a printed value the page shows
            assert want in proc.stdout, (page.name, k, want, proc.stdout)

