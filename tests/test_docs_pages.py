"""docs/*.md, executed: each page's python blocks run in order, in a fresh folder, as a
reader would paste them (docs/writing-ops.md has its own walk-through test)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import REPO

PAGES = sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "writing-ops.md")


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
