"""Shared helpers: small inline models and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[1]

NP_TYPES = {TensorProto.FLOAT16: np.float16, TensorProto.FLOAT: np.float32,
            TensorProto.DOUBLE: np.float64}


def my_add_model(dtype: int = TensorProto.FLOAT, opset: int = 17, shape_a=("N", 3), shape_b=("N", 3),
                 domain: str = "custom", ir_version: int = 10) -> onnx.ModelProto:
    """
        a   b
         \\ /
       my_add (custom)
           |
          Relu
           |
           z
    """
    nodes = [helper.make_node("my_add", ["a", "b"], ["y"], domain=domain, name="add0"),
             helper.make_node("Relu", ["y"], ["z"], name="relu0")]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("a", dtype, list(shape_a)),
         helper.make_tensor_value_info("b", dtype, list(shape_b))],
        [helper.make_tensor_value_info("z", dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid(domain, 1)],
                             ir_version=ir_version)


def run_ort(model: onnx.ModelProto, feeds: dict) -> list:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_same_outputs(run, model, out, feeds_list, rel: float = 1e-5) -> None:
    """``run(model, feeds)`` and ``run(out, feeds)`` (dicts of outputs) agree within ``rel``
    of each output's largest magnitude, on every feeds of ``feeds_list``."""
    for feeds in feeds_list:
        want, got = run(model, feeds), run(out, feeds)
        assert want.keys() == got.keys()
        for k in want:
            scale = max(float(np.max(np.abs(want[k]))), 1e-30)
            np.testing.assert_allclose(got[k], want[k], rtol=0, atol=rel * scale)


def run_cli(*args: str, cwd: Path | None = None, check_rc: int | None = None, env: dict | None = None):
    """Run `python -m graphkit ARGS` in a subprocess, as a user would (``env`` adds variables)."""
    full_env = None if env is None else {**os.environ, **env}
    proc = subprocess.run([sys.executable, "-m", "graphkit", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=600, env=full_env)
    if check_rc is not None:
        assert proc.returncode == check_rc, (proc.returncode, proc.stdout, proc.stderr)
    return proc


# The one informational stderr line graphkit may print before an error: a first-use build.
BUILD_MESSAGE = "graphkit: building kernels for "


def error_lines(stderr: str) -> list[str]:
    """stderr's lines, less the first-use build message (progress, not part of an error)."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith(BUILD_MESSAGE)]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _protobuf_implementation_kept():
    """onnxruntime_extensions sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python on import; every
    child process (the CLI tests' included) would then parse protobuf in pure Python, more
    strictly. graphkit imports it with the variable kept; a test that leaks it fails here."""
    before = os.environ.get("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION")
    yield
    after = os.environ.get("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION")
    if after != before:
        if before is None:
            del os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"]
        else:
            os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = before
        pytest.fail(f"the test left PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION={after!r} in the environment "
                    "(import onnxruntime_extensions through graphkit.runtime, which keeps it)")
