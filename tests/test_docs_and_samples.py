"""The README's commands and the samples run as documented."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import onnx

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


def _prepare(tmp_path):
    onnx.save(my_add_model(shape_a=(2, 3), shape_b=(2, 3)), tmp_path / "model.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", a=rng.random((2, 3), np.float32), b=rng.random((2, 3), np.float32))
    shutil.copy(REPO / "samples" / "rules" / "fuse_my_add.py", tmp_path / "my_rules.py")


def test_readme_cli_commands_run(tmp_path):
    _prepare(tmp_path)
    commands = _readme_block("## Using it")
    assert len(commands) == 6
    outputs = {}
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "graphkit"
        outputs[argv[1]] = run_cli(*argv[1:], cwd=tmp_path, check_rc=0).stdout
    assert "rule fuse_my_add: applied 1x" in outputs["rewrite"]
    assert "custom::my_add x1" in outputs["inspect"]
    fused = onnx.load(tmp_path / "fused.onnx")
    assert [(n.domain, n.op_type) for n in fused.graph.node] == [("custom", "my_add"), ("", "Relu")]
    y = np.load(tmp_path / "y.npz")
    x = np.load(tmp_path / "x.npz")
    np.testing.assert_allclose(y["z"], np.maximum(2 * x["a"] + x["b"], 0), rtol=1e-6)


def test_readme_python_example_runs(tmp_path):
    """The README's node-substitution example, run as a script after the CLI made its input."""
    _prepare(tmp_path)
    run_cli("rewrite", "model.onnx", "model.std.onnx", cwd=tmp_path, check_rc=0)
    text = (REPO / "README.md").read_text()
    example = re.search(r"### Node substitution in Python.*?```python\n(.*?)```", text, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text("import numpy as np\na = b = np.ones((2, 3), np.float32)\n" + example)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "rule fuse_my_add: applied 1x" in proc.stdout
    assert "3." in proc.stdout  # relu(2 * 1 + 1)


def test_samples_run_all_matches_torch(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "samples" / "run_all.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all outputs match torch" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("my_add ")]
    assert len(rows) == 6  # 2 exporters x 3 lowerings
