"""The README's first commands and the samples run as documented (every README block runs in
tests/test_readme.py)."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO


def _readme_block(heading: str) -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split(heading, 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_starts_with_demo_and_test_commands():
    first = _readme_block("# graphkit")
    assert first == ["make demo", "make test"]
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in ci


def test_samples_run_all_matches_torch(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "samples" / "run_all.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all outputs match torch" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("my_add ")]
    assert len(rows) == 6  # 2 exporters x 3 lowerings
