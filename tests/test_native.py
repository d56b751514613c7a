"""The native ONNX Runtime kernel library: build cache, my_add semantics, errors, threads.

The library is built once per cache key (a few seconds); every ORT slot the kernels
use is exercised here: registration, tensor access, output allocation, statuses,
shape inference (ShapeInferContext_*) and KernelContext_ParallelFor.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conftest import NP_TYPES, REPO
from graphkit.errors import NativeBuildError
from graphkit.runtime import native

DOMAINS = ("custom", "graphkit.native")
RTOL = {np.float16: 1e-3, np.float32: 1e-6, np.float64: 1e-12}
PARALLEL_MIN = 1 << 16  # kParallelMin in my_add.cc


@pytest.fixture(scope="module")
def lib() -> Path:
    return native.library_path()


@pytest.fixture(scope="module")
def counters(lib):
    """The library's diagnostics, read from the same loaded instance ORT uses."""
    handle = ctypes.CDLL(str(lib))
    handle.graphkit_native_parallel_for_calls.restype = ctypes.c_uint64
    handle.graphkit_native_api_version.restype = ctypes.c_uint32
    return handle


def make_model(dtype=TensorProto.FLOAT, shape_a=("N", 3), shape_b=("N", 3), domain="graphkit.native",
               dtype_b=None, declare_output=True) -> onnx.ModelProto:
    node = helper.make_node("my_add", ["a", "b"], ["y"], domain=domain, name="add0")
    ins = [helper.make_tensor_value_info("a", dtype, None if shape_a is None else list(shape_a)),
           helper.make_tensor_value_info("b", dtype_b or dtype, None if shape_b is None else list(shape_b))]
    out = helper.make_tensor_value_info("y", dtype, None) if declare_output else onnx.ValueInfoProto(name="y")
    graph = helper.make_graph([node], "g", ins, [out])
    return helper.make_model(graph, ir_version=10,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])


def session(lib: Path, model: onnx.ModelProto, threads: int = 1) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(lib))
    so.intra_op_num_threads = threads
    so.log_severity_level = 4  # the error-path tests would otherwise log to stderr
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """2a + b as torch computes it: each operation rounded to the dtype (2a may overflow
    float16 where 2a + b would not: my_add(65504, -65504) is inf)."""
    return (a + a) + b


def check(y: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    assert y.dtype == a.dtype
    assert y.shape == np.broadcast_shapes(a.shape, b.shape)
    np.testing.assert_allclose(y, 2 * a + b, rtol=RTOL[a.dtype.type], atol=RTOL[a.dtype.type])
    np.testing.assert_array_equal(y, reference(a, b))


def rand(rng, shape, np_t):
    return rng.standard_normal(shape).astype(np_t)


# ---- library ------------------------------------------------------------------------------


def test_served_ops_match_op_definitions(lib):
    from graphkit_ops import ALL_OPS

    assert "custom::my_add" in native.served_ops(lib)
    assert native.served_ops(lib) == {f"{domain}::{op.name}" for op in ALL_OPS if op.native
                                      for domain in DOMAINS}


def test_exports_only_the_c_entry_points(lib, counters):
    assert counters.graphkit_native_api_version() == 17
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("nm not available")
    ours = {line.split()[-1] for line in out.stdout.splitlines() if " T " in line}
    assert ours == {"RegisterCustomOps", "graphkit_native_ops", "graphkit_native_api_version",
                    "graphkit_native_op_types", "graphkit_native_parallel_for_calls"}


def test_op_types_list_each_kernels_element_types(lib):
    """graphkit_native_op_types(): per served op, each kernel's input and output element
    types (TensorProto numbers), what `graphkit deploy` writes into its manifest."""
    types = native.op_types(lib)
    assert set(types) == native.served_ops(lib)
    assert sorted(types["graphkit.native::my_add"]) == [((1, 1), (1,)), ((10, 10), (10,)), ((11, 11), (11,))]
    assert sorted(types["custom::deform_conv2d"]) == [((1,) * 5, (1,)), ((11,) * 5, (11,))]
    ldd = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
    assert "onnxruntime" not in ldd


def test_abi_header_static_asserts_compile(tmp_path):
    """ort_abi.h alone: its offsetof/sizeof static_asserts hold for this compiler."""
    src = tmp_path / "abi.cc"
    src.write_text('#include <graphkit/ort_abi.h>\n'
                   'static_assert(offsetof(OrtCustomOp, CreateKernelV2) == 136, "");\n'
                   'static_assert(offsetof(OrtCustomOp, GetStartVersion) == 160, "");\n'
                   'static_assert(sizeof(OrtCustomOp) == 208, "");\n'
                   'static_assert(ort::slot::KernelContext_ParallelFor == 274, "");\n'
                   'static_assert(ort::slot::ShapeInferContext_GetInputTypeShape == 268, "");\n'
                   'static_assert(ort::slot::ShapeInferContext_SetOutputTypeShape == 270, "");\n')
    include = native.include_dir()
    assert (include / "graphkit" / "kernel.h").is_file()
    cxx = os.environ.get("CXX") or "c++"
    proc = subprocess.run([*cxx.split(), "-std=c++17", "-fsyntax-only", "-I", str(include), str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---- my_add semantics ----------------------------------------------------------------------


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("dtype", list(NP_TYPES))
def test_my_add_types_and_domains(lib, dtype, domain, rng):
    np_t = NP_TYPES[dtype]
    sess = session(lib, make_model(dtype, domain=domain))
    for n in (1, 5, 37):  # dynamic batch; 37 rows leave an F16C tail
        a, b = rand(rng, (n, 3), np_t), rand(rng, (n, 3), np_t)
        (y,) = sess.run(None, {"a": a, "b": b})
        check(y, a, b)


def test_placeholder_model_with_relu_runs_directly(lib, rng):
    from conftest import my_add_model

    sess = session(lib, my_add_model(TensorProto.FLOAT))  # domain "custom", then Relu
    a, b = rand(rng, (4, 3), np.float32), rand(rng, (4, 3), np.float32)
    (z,) = sess.run(None, {"a": a, "b": b})
    np.testing.assert_allclose(z, np.maximum(2 * a + b, 0), rtol=1e-6)


BROADCASTS = {
    "scalar_b": ((4, 5), ()),
    "scalar_a": ((), (4, 5)),
    "one_element_b": ((3, 17), (1, 1)),
    "row": ((6, 17), (17,)),
    "column": ((6, 17), (6, 1)),
    "channel": ((2, 3, 4, 5), (1, 3, 1, 1)),
    "outer": ((6, 1), (1, 9)),
    "general": ((2, 1, 4, 1), (3, 1, 5)),
    "b_bigger": ((9,), (2, 3, 9)),
    "both_scalar": ((), ()),
}


@pytest.mark.parametrize("dtype", list(NP_TYPES))
@pytest.mark.parametrize("case", list(BROADCASTS))
def test_broadcasting(lib, case, dtype, rng):
    np_t = NP_TYPES[dtype]
    sa, sb = BROADCASTS[case]
    a, b = rand(rng, sa, np_t), rand(rng, sb, np_t)
    sess = session(lib, make_model(dtype, sa, sb))
    (y,) = sess.run(None, {"a": a, "b": b})
    check(y, a, b)


@pytest.mark.parametrize("sa,sb", [((0, 3), (0, 3)), ((0, 3), (3,)), ((2, 0), (2, 1)), ((1, 0), (4, 1)),
                                   ((3,), (0, 3))])
def test_zero_size_dims(lib, sa, sb):
    a, b = np.ones(sa, np.float32), np.ones(sb, np.float32)
    (y,) = session(lib, make_model(TensorProto.FLOAT, ["d%d" % i for i in range(len(sa))],
                                   ["e%d" % i for i in range(len(sb))])).run(None, {"a": a, "b": b})
    assert y.shape == np.broadcast_shapes(sa, sb)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("sa,sb,dtype", [
    ((3, 300, 301), (3, 300, 301), TensorProto.FLOAT),   # same shape, chunks end mid-row
    ((700, 501), (501,), TensorProto.FLOAT),             # row broadcast split across chunks
    ((700, 501), (700, 1), TensorProto.DOUBLE),          # column broadcast
    ((5, 1, 300, 77), (4, 1, 77), TensorProto.FLOAT),    # general, both broadcast
    ((300, 301), (300, 301), TensorProto.FLOAT16),       # F16C + chunks
])
def test_large_tensors_use_parallel_for(lib, counters, threads, sa, sb, dtype, rng):
    np_t = NP_TYPES[dtype]
    a, b = rand(rng, sa, np_t), rand(rng, sb, np_t)
    assert np.prod(np.broadcast_shapes(sa, sb)) > PARALLEL_MIN
    sess = session(lib, make_model(dtype, ["x%d" % i for i in range(len(sa))],
                                   ["y%d" % i for i in range(len(sb))]), threads=threads)
    before = counters.graphkit_native_parallel_for_calls()
    (y,) = sess.run(None, {"a": a, "b": b})
    assert counters.graphkit_native_parallel_for_calls() == before + 1
    check(y, a, b)


def test_small_tensors_run_inline(lib, counters, rng):
    sess = session(lib, make_model(TensorProto.FLOAT, ["N"], ["N"]), threads=2)
    a = rand(rng, (PARALLEL_MIN,), np.float32)
    before = counters.graphkit_native_parallel_for_calls()
    (y,) = sess.run(None, {"a": a, "b": a})
    assert counters.graphkit_native_parallel_for_calls() == before
    check(y, a, a)


def test_concurrent_runs_from_python_threads(lib, rng):
    sess = session(lib, make_model(TensorProto.FLOAT, ["N", "M"], ["M"]), threads=2)
    inputs = [(rand(rng, (40 * (i + 1), 2000), np.float32), rand(rng, (2000,), np.float32)) for i in range(4)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            a, b = inputs[i]
            for _ in range(10):
                (y,) = sess.run(None, {"a": a, "b": b})
                check(y, a, b)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("sa,sb,expected", [
    (["N", 3], ["N", 3], ["N", 3]),
    (["N", 3], [3], ["N", 3]),
    ([2, 1, 5], [4, 1], [2, 4, 5]),
    (["N", 1], [1, "M"], ["N", "M"]),
    (["N", "C"], ["M", "C"], None),   # N vs M: not expressible, left unknown
    ([2, 3], [4], None),              # incompatible: left to Compute
    (None, [3], None),                # unknown rank (ORT reports it as rank 0)
])
def test_output_shape_inference(lib, sa, sb, expected):
    sess = session(lib, make_model(TensorProto.FLOAT, sa, sb, declare_output=False))
    out = sess.get_outputs()[0]
    assert out.type == "tensor(float)"
    if expected is None:
        assert out.shape == []  # no shape
    else:
        assert out.shape == expected


def test_half_conversion_exhaustive(lib):
    """All 65536 float16 bit patterns as `a`, against numpy's conversions."""
    a = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    b = np.random.default_rng(1).permutation(a)
    run_half_exhaustive(lib, a, b)


def run_half_exhaustive(lib: Path, a: np.ndarray, b: np.ndarray) -> None:
    sess = session(lib, make_model(TensorProto.FLOAT16, None, None))  # any rank
    with np.errstate(all="ignore"):
        expected = reference(a, b)
        (y,) = sess.run(None, {"a": a, "b": b})
        nan = np.isnan(expected)
        np.testing.assert_array_equal(np.isnan(y), nan)
        np.testing.assert_array_equal(y[~nan].view(np.uint16), expected[~nan].view(np.uint16))
        # and the broadcast loops (scalar a, scalar b)
        for sa, sb in (((), (1 << 16,)), ((1 << 16,), ())):
            aa = np.float16(1.5) if sa == () else a
            bb = np.float16(-3.25) if sb == () else b
            (y,) = sess.run(None, {"a": np.asarray(aa).reshape(sa), "b": np.asarray(bb).reshape(sb)})
            exp = reference(np.asarray(aa, np.float16), np.asarray(bb, np.float16))
            nan = np.isnan(exp)
            np.testing.assert_array_equal(y[~nan].view(np.uint16), np.broadcast_to(exp, y.shape)[~nan].view(np.uint16))


def test_portable_half_conversion_without_f16c(tmp_path, monkeypatch):
    """The bit-twiddling float16 path (used when the compiler lacks F16C) is exact too."""
    from graphkit.ops import NativeKernels, OpPackage
    from graphkit_ops import MY_ADD, PACKAGE

    monkeypatch.setenv("GRAPHKIT_CACHE_DIR", str(tmp_path))
    only_add = OpPackage("my_add_only", ops=(MY_ADD,),
                         native=NativeKernels(root=PACKAGE.native.root, sources=("my_add/my_add.cc",)))
    out = native.library_for([only_add], extra_flags=("-mno-f16c",))
    a = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    b = np.random.default_rng(2).permutation(a)
    run_half_exhaustive(out, a, b)


# ---- errors ---------------------------------------------------------------------------------


def test_incompatible_shapes_raise_and_session_survives(lib, rng):
    sess = session(lib, make_model(TensorProto.FLOAT, ["N", "M"], ["K"]))
    with pytest.raises(Exception, match=r"\[my_add\] inputs have incompatible shapes \[2,3\] and \[4\]"):
        sess.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones(4, np.float32)})
    a, b = rand(rng, (2, 3), np.float32), rand(rng, (3,), np.float32)
    (y,) = sess.run(None, {"a": a, "b": b})
    check(y, a, b)


def test_statically_incompatible_shapes_fail_at_run(lib):
    sess = session(lib, make_model(TensorProto.FLOAT, [2, 3], [4]))
    with pytest.raises(Exception, match=r"\[my_add\].*\[2,3\] and \[4\]"):
        sess.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones(4, np.float32)})


@pytest.mark.parametrize("dtype,dtype_b", [(TensorProto.INT32, None), (TensorProto.FLOAT, TensorProto.DOUBLE)])
def test_unsupported_types_are_session_errors(lib, dtype, dtype_b):
    with pytest.raises(Exception, match="my_add"):
        session(lib, make_model(dtype, [2], [2], dtype_b=dtype_b))
    (y,) = session(lib, make_model(TensorProto.FLOAT, [2], [2])).run(
        None, {"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)})
    np.testing.assert_array_equal(y, [3, 3])


# ---- build cache ------------------------------------------------------------------------------


def _build_in_subprocess(cache: Path) -> subprocess.Popen:
    code = "from graphkit.runtime import native; print(native.library_path())"
    env = {**os.environ, "GRAPHKIT_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_build_cache_is_shared_reused_and_self_healing(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRAPHKIT_CACHE_DIR", str(cache))
    # Two processes build at once: one compiles, the other waits and reuses.
    procs = [_build_in_subprocess(cache) for _ in range(2)]
    paths = set()
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        paths.add(out.strip())
    assert len(paths) == 1
    lib = native.library_path()
    assert str(lib) in paths
    assert lib.parent.parent == cache / "native" / "lib" and len(lib.parent.name) == 16
    assert not list(lib.parent.glob(".*.tmp"))
    mtime = lib.stat().st_mtime_ns
    assert native.library_path() == lib and lib.stat().st_mtime_ns == mtime  # no recompile

    # A truncated library (e.g. copied in by hand, or a checksum mismatch) is not used:
    # the next call rebuilds it, and leftovers of killed builds are cleaned up.
    data = lib.read_bytes()
    lib.write_bytes(data[: len(data) // 2])
    (lib.parent / ".libgraphkit_ops.so.dead.tmp").write_bytes(b"partial")
    rebuilt = native.library_path()
    assert rebuilt == lib and rebuilt.read_bytes() != data[: len(data) // 2]
    assert not list(lib.parent.glob(".*.tmp"))
    from graphkit_ops import ALL_OPS

    assert native.served_ops(rebuilt) == {f"{d}::{op.name}" for op in ALL_OPS if op.native for d in DOMAINS}


def test_compiler_failure_raises_native_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/bin/false")
    with pytest.raises(NativeBuildError) as info:
        native.library_path()
    assert "compiling" in str(info.value) and info.value.hint and "CXX" in info.value.hint
    assert not list(tmp_path.rglob("libgraphkit_ops.so"))


def test_missing_compiler_raises_native_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(NativeBuildError, match="compiler"):
        native.library_path()


def test_compiler_errors_are_reported(tmp_path, monkeypatch):
    """A source that does not compile: the message carries the compiler's stderr."""
    bad = tmp_path / "cxx"
    bad.write_text("#!/bin/sh\necho 'my_add.cc:1:1: error: something broke' >&2\nexit 1\n")
    bad.chmod(0o755)
    monkeypatch.setenv("GRAPHKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(bad))
    with pytest.raises(NativeBuildError, match="error: something broke"):
        native.library_path()
