"""Install-time behaviour: the Makefile's torch index choice and a plain `pip install .`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _make_n(tmp_path, *args):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    r = subprocess.run(
        ["make", "-n", "install", f"VENV={tmp_path / 'venv'}", *args],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    return [line for line in r.stdout.splitlines() if "torch==" in line]


def test_make_installs_torch_from_default_index(tmp_path):
    (line,) = _make_n(tmp_path)
    assert "--index-url" not in line and "--extra-index-url" not in line
    assert line.split()[-1] == "torch==2.13.0"


def test_make_torch_index_url_selects_index(tmp_path):
    url = "https://example.invalid/whl/cpu"
    (line,) = _make_n(tmp_path, f"TORCH_INDEX_URL={url}")
    assert f"--index-url {url} torch==2.13.0" in line
