"""Python kernels keep BLAS to one thread while they run (issue 14, Deliver 6): ONNX Runtime's
intra-op threads own the cores, so more ORT threads never means BLAS threads fighting them
(graphkit/runtime/_blas.py). Timings: bench/deform_conv.py --model (the python row)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from graphkit.ops import OpDef, Param, default_registry
from graphkit.runtime import open_session
from graphkit.runtime._blas import one_blas_thread

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas_threads() -> dict[str, int]:
    """Thread count of each loaded BLAS library (numpy's; OpenBLAS of native kernels once loaded)."""
    return {i["filepath"]: i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}


def _single(counts: dict[str, int]) -> bool:
    return bool(counts) and all(n == 1 for n in counts.values())


def _restored(before: dict[str, int]) -> bool:
    now = _blas_threads()
    return all(now[path] == n for path, n in before.items())


def _recording_kernel(seen: list):
    def kernel(x):
        seen.append(_blas_threads())
        return x @ np.eye(x.shape[-1], dtype=x.dtype)  # a BLAS call
    return kernel


def _model():
    node = helper.make_node("gk_blas_probe", ["x"], ["y"], domain="graphkit.python", name="probe")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17),
                                                                  helper.make_opsetid("graphkit.python", 1)])


def test_python_kernel_runs_with_one_blas_thread_and_restores_it():
    before = _blas_threads()
    assert before, "numpy's BLAS is visible to threadpoolctl"
    seen: list = []
    op = OpDef(name="gk_blas_probe", doc="x @ I", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
               type_constraints={"T": ("tensor(float)",)}, reference=lambda x: x,
               infer_shapes=lambda shapes, attrs: [shapes[0]], python_kernel=_recording_kernel(seen))
    registry = default_registry().with_ops(op)
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    for threads in (1, 2):
        (y,) = open_session(_model(), registry=registry, threads=threads).run({"x": x}).values()
        np.testing.assert_array_equal(y, x)
    assert len(seen) == 2 and all(_single(counts) for counts in seen)
    assert _restored(before)


def test_overlapping_blocks_restore_only_when_the_last_ends():
    """Kernels of two sessions overlap: the one that finishes first must not put BLAS back to
    many threads under the other; the last one puts the original counts back."""
    before = _blas_threads()
    done = []

    def other():  # enters after and leaves before this thread's block
        with one_blas_thread():
            done.append(True)

    with one_blas_thread():
        assert _single(_blas_threads())
        t = threading.Thread(target=other)
        t.start()
        t.join(10)
        assert done and _single(_blas_threads())  # still limited: this block runs on
    assert _restored(before)
