"""docs/writing-ops.md, executed: every file it shows is written, every command and snippet run.

The walk starts from an empty folder. `pip install` puts the package into a folder of its
own (PIP_TARGET, on PYTHONPATH), as an installed distribution is found, so the test's
environment stays as it was.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest

from conftest import REPO
from doc_pages import steps as page_steps

pytest.importorskip("torch")

DOC = REPO / "docs" / "writing-ops.md"


def test_the_walk_through_runs_as_written(tmp_path):
    steps = page_steps(DOC.read_text())
    assert [k for k, _, _ in steps].count("file") == 4 and [k for k, _, _ in steps].count("sh") == 2
    site = tmp_path / "site"
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ,
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
           "PYTHONPATH": os.pathsep.join([str(site), str(work)]),
           "PIP_TARGET": str(site), "PIP_NO_DEPS": "1", "PIP_QUIET": "1",
           "GRAPHKIT_OPS": ""}
    outputs = []
    for kind, target, body in steps:
        if kind == "file":
            path = work / target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
            continue
        if kind == "python":
            script = work / "snippet.py"
            script.write_text(body)
            argvs = [[sys.executable, str(script)]]
        else:
            argvs = [["bash", "-c", line.split("  #")[0].strip()]
                     for line in body.splitlines() if line.strip() and not line.startswith("#")]
        for argv in argvs:
            proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
            outputs.append((argv[-1], proc.stdout, proc.stderr))
    by_command = {cmd: (out, err) for cmd, out, err in outputs}
    listing = by_command["graphkit ops"][0]
    assert "acme::swish" in listing and "acme_ops" in listing and "1.0.0" in listing
    for name in ("model.onnx", "model.ts.onnx"):
        nodes = [(n.domain, n.op_type) for n in onnx.load(work / name).graph.node if n.domain not in ("", "ai.onnx")]
        assert nodes == [("acme", "swish")], name
    assert {n.op_type for n in onnx.load(work / "model.std.onnx").graph.node} >= {"Sigmoid", "Mul"}
    assert {n.domain for n in onnx.load(work / "model.native.onnx").graph.node} >= {"graphkit.native.acme"}
    assert {n.domain for n in onnx.load(work / "model.py.onnx").graph.node} >= {"graphkit.python.acme"}
    inspect_out = next(out for cmd, out, _ in outputs if cmd.startswith("graphkit inspect"))
    assert "acme::swish" in inspect_out and "UNKNOWN" not in inspect_out
    snippet = next(out for _, out, _ in outputs if "max error vs torch" in out)
    error = float(re.search(r"max error vs torch: (\S+)", snippet).group(1))
    assert np.isfinite(error) and error < 1e-5
    assert outputs[-2][1].splitlines() == ["acme swish 2.0"] * 2  # step 6: both exporters
    assert outputs[-1][1].splitlines() == ["['swish', 'Add']"]  # step 7: simplify folded through acme::swish


def test_op_packages_page_commands_run(tmp_path):
    """docs/op-packages.md's commands, with its one-op package file ./my_ops.py."""
    from conftest import run_cli
    from doc_pages import DOCS

    text = (DOCS / "op-packages.md").read_text()
    block = re.search(r"## The smallest package.*?```sh\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    my_ops = re.search(r"## The smallest package.*?```python file=my_ops.py\n(.*?)```", text, re.S).group(1)
    (tmp_path / "my_ops.py").write_text(my_ops)
    outputs = [run_cli(*command.split()[1:], cwd=tmp_path, check_rc=0, env={"GRAPHKIT_OPS": ""}).stdout
               for command in commands]
    assert "my_add" in outputs[0] and "graphkit_ops" in outputs[0]
    import json

    listing = json.loads(outputs[1])
    assert any(op["name"] == "half" and op["domain"] == "mine" for op in listing["ops"])
