"""The README's commands and the samples run as documented."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import numpy as np
import onnx
import pytest

from conftest import REPO, my_add_model, run_cli


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


def test_readme_cli_commands_run(tmp_path):
    onnx.save(my_add_model(shape_a=(2, 3), shape_b=(2, 3)), tmp_path / "model.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", a=rng.random((2, 3), np.float32), b=rng.random((2, 3), np.float32))
    commands = _readme_block("## Using it")
    assert len(commands) == 4
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "graphkit"
        run_cli(*argv[1:], cwd=tmp_path, check_rc=0)
    y = np.load(tmp_path / "y.npz")
    x = np.load(tmp_path / "x.npz")
    np.testing.assert_allclose(y["z"], np.maximum(2 * x["a"] + x["b"], 0), rtol=1e-6)


def test_samples_run_all_matches_torch(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "samples" / "run_all.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all outputs match torch" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("my_add ")]
    assert len(rows) == 6  # 2 exporters x 3 lowerings
