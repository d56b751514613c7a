"""docs/deploy.md, executed: every file it shows is written, every command and snippet run, in
order, from an empty folder; the C program it shows is samples/deploy/run_model.c."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from doc_pages import steps as page_steps

pytest.importorskip("torch")

DOC = REPO / "docs" / "deploy.md"


def test_the_deployment_walk_through_runs_as_written(tmp_path):
    steps = page_steps(DOC.read_text())
    files = {target: body for kind, target, body in steps if kind == "file"}
    assert set(files) == {"model.py", "run_model.c"}
    assert files["run_model.c"] == (REPO / "samples" / "deploy" / "run_model.c").read_text()
    if not any(shutil.which(c) for c in ("cc",)):
        pytest.skip("no C compiler (cc): the page compiles a C program")
    env = {**{k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"},
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
           "PYTHONPATH": str(tmp_path), "GRAPHKIT_OPS": ""}
    outputs = []
    for kind, target, body in steps:
        if kind == "file":
            (tmp_path / target).write_text(body)
            continue
        if kind == "python":
            (tmp_path / "snippet.py").write_text(body)
            argvs = [[sys.executable, str(tmp_path / "snippet.py")]]
        else:
            argvs = [["bash", "-c", line.split("  #")[0].strip()]
                     for line in body.splitlines() if line.strip() and not line.startswith("#")]
        for argv in argvs:
            proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
            outputs.append((argv[-1], proc.stdout))
    by_command = dict(outputs)
    deployed = by_command["graphkit deploy model.native.onnx -o deploy --copy-model"]
    assert "libscipy_openblas.so" in deployed and "RegisterCustomOpsLibrary_V2" in deployed
    assert sorted(p.name for p in (tmp_path / "shipped").iterdir()) == \
        ["graphkit-deploy.json", "libgraphkit_ops.so", "libscipy_openblas.so", "model.native.onnx"]
    manifest_out = next(out for _, out in outputs if out.startswith("libgraphkit_ops.so 17"))
    assert "graphkit.native::deform_conv2d: float, double" in manifest_out
    errors = [float(e) for e in re.findall(r"max error vs torch (\S+)", outputs[-3][1])]
    assert len(errors) == 2 and max(errors) < 1e-4
    assert "NOTE: " in by_command["graphkit deploy model.py.onnx -o needs-graphkit"].splitlines()[1]
