"""Native kernels of op packages other than graphkit's: build, link, register, run.

The rms_norm sample (samples/rms_norm_ops) and small packages written here are compiled
against <graphkit/kernel.h> into per-source cached objects and linked, per set of packages
a session needs, into one library. Builds go to a temporary cache shared by the module
(each compile takes seconds), except where a test needs a fresh one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import REPO
from graphkit import build_cache
from graphkit.errors import KernelError, NativeBuildError, OpDefinitionError
from graphkit.ops import NativeKernels, OpDef, OpPackage, Param, discover
from graphkit.runtime import native, open_session

SAMPLE = REPO / "samples" / "rms_norm_ops"
NP = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64}

DEMO_PACKAGE = '''
from pathlib import Path

from graphkit.ops import NativeKernels, OpDef, OpPackage, Param

# Same op name as the sample's custom::rms_norm, another domain: y = 2 * x.
RMS_NORM = OpDef(
    name="rms_norm", doc="2 * x (a stand-in with a clashing name)", domain="demo",
    torch_namespace="demo", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
    type_constraints={"T": ("tensor(float)",)}, reference=lambda x: 2 * x,
    infer_shapes=lambda shapes, attrs: [shapes[0]], native=True)

PACKAGE = OpPackage("demo_ops", (RMS_NORM,),
                    native=NativeKernels(root=Path(__file__).parent, sources=("twice.cc",)))
'''

TWICE_CC = '''
#include <graphkit/kernel.h>

namespace demo {
struct Twice {
  static const char* name() { return "rms_norm"; }
  static constexpr ONNXTensorElementDataType inputs[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
  static constexpr ONNXTensorElementDataType outputs[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
  Twice(const gk::Api&, const gk::KernelInfo&) {}
  void compute(gk::Context& ctx) {
    const gk::TensorView x = ctx.input(0);
    float* y = ctx.output<float>(0, x.shape);
    for (size_t i = 0; i < x.size; ++i) y[i] = 2 * x.as<float>()[i];
  }
};
}  // namespace demo

GRAPHKIT_OPS(rms_norm, gk::make_op<demo::Twice>())
'''


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    """A module-wide build cache, and the sample package importable."""
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("cache")
    mp.setenv("GRAPHKIT_CACHE_DIR", str(root))
    mp.syspath_prepend(str(SAMPLE))
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def registry(cache):
    return discover(ops=["rms_norm_ops"])


@pytest.fixture(scope="module")
def rms_package(registry):
    return next(p for p in registry.packages if p.name == "rms_norm_ops")


@pytest.fixture(scope="module")
def demo_registry(cache, tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo_ops")
    (folder / "demo_ops.py").write_text(DEMO_PACKAGE)
    (folder / "twice.cc").write_text(TWICE_CC)
    return discover(ops=["rms_norm_ops", str(folder / "demo_ops.py")])


def _model(nodes, inputs, outputs, domains=("custom", "graphkit.native")):
    opsets = [helper.make_opsetid("", 18)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=opsets,
                             ir_version=10)


def rms_model(dtype=TensorProto.FLOAT, *, weight=True, domain="custom", empty_name=False, epsilon=1e-5):
    inputs = ["x", "w"] if weight else (["x", ""] if empty_name else ["x"])
    node = helper.make_node("rms_norm", inputs, ["y", "inv_rms"], domain=domain, name="rms0", epsilon=epsilon)
    ins = [helper.make_tensor_value_info("x", dtype, ["N", "T", 8])]
    if weight:
        ins.append(helper.make_tensor_value_info("w", dtype, [8]))
    outs = [helper.make_tensor_value_info("y", dtype, None), helper.make_tensor_value_info("inv_rms", dtype, None)]
    return _model([node], ins, outs)


def rms_reference(x, w, eps):
    wide = x.astype(np.float64)
    inv = 1.0 / np.sqrt(np.mean(wide * wide, axis=-1, keepdims=True) + eps)
    y = wide * inv * (1.0 if w is None else w.astype(np.float64))
    return y.astype(x.dtype), inv.astype(x.dtype)


# ---- first use ----------------------------------------------------------------------------


def test_first_use_message_appears_once(tmp_path, monkeypatch, capfd, registry, rng):
    monkeypatch.setenv("GRAPHKIT_CACHE_DIR", str(tmp_path))
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    open_session(rms_model(), registry=registry).run({"x": x, "w": w})
    err = capfd.readouterr().err
    assert err.count("graphkit: building kernels for rms_norm_ops (first use)...") == 1, err
    assert " done in " in err
    open_session(rms_model(TensorProto.DOUBLE), registry=registry)  # same library: cached
    assert "building kernels" not in capfd.readouterr().err
    assert list((tmp_path / "native" / "lib").glob("*/libgraphkit_ops.so"))


# ---- the rms_norm sample ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE])
@pytest.mark.parametrize("domain", ["custom", "graphkit.native"])
@pytest.mark.parametrize("weight", [True, False, "empty"])
def test_rms_norm_matches_reference(registry, dtype, domain, weight, rng):
    npt = NP[dtype]
    model = rms_model(dtype, weight=weight is True, empty_name=weight == "empty", domain=domain)
    session = open_session(model, registry=registry)
    x = rng.standard_normal((3, 5, 8)).astype(npt)
    w = rng.standard_normal(8).astype(npt)
    feeds = {"x": x, "w": w} if weight is True else {"x": x}
    out = session.run(feeds)
    want_y, want_inv = rms_reference(x, w if weight is True else None, 1e-5)
    tol = 1e-5 if npt == np.float32 else 1e-12
    assert out["y"].dtype == npt and out["inv_rms"].shape == (3, 5, 1)
    np.testing.assert_allclose(out["y"], want_y, rtol=tol, atol=tol)
    np.testing.assert_allclose(out["inv_rms"], want_inv, rtol=tol, atol=tol)
    # the package's own numpy kernel agrees
    from rms_norm_ops import python_kernel

    py_y, py_inv = python_kernel(x, w if weight is True else None, 1e-5)
    np.testing.assert_allclose(out["y"], py_y, rtol=10 * tol, atol=10 * tol)
    np.testing.assert_allclose(out["inv_rms"], py_inv, rtol=10 * tol, atol=10 * tol)


def test_rms_norm_matches_torch_reference_and_threads(registry, rng):
    torch = pytest.importorskip("torch")
    from rms_norm_ops import reference

    x = rng.standard_normal((64, 40, 512)).astype(np.float32)  # large: split over threads
    w = rng.standard_normal(512).astype(np.float32)
    model = rms_model()
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 512
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 512
    out = open_session(model, registry=registry, threads=2).run({"x": x, "w": w})
    ty, tinv = reference(torch.from_numpy(x), torch.from_numpy(w), 1e-5)
    np.testing.assert_allclose(out["y"], ty.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["inv_rms"], tinv.numpy(), rtol=1e-5, atol=1e-6)


def test_rms_norm_errors_and_shapes(registry):
    model = rms_model()
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "D"
    session = open_session(model, registry=registry)
    with pytest.raises(KernelError, match=r"\[rms_norm\] weight must have shape \[8\], got \[4\]"):
        session.run({"x": np.ones((1, 1, 8), np.float32), "w": np.ones(4, np.float32)})
    model = rms_model()
    del model.graph.output[:]
    model.graph.output.extend([onnx.ValueInfoProto(name="y"), onnx.ValueInfoProto(name="inv_rms")])
    session = open_session(model, registry=registry)
    assert [o.shape for o in session._sess.get_outputs()] == [["N", "T", 8], ["N", "T", 1]]


# ---- several packages in one session ---------------------------------------------------------


def test_my_add_and_rms_norm_in_one_session(registry, rng):
    nodes = [helper.make_node("rms_norm", ["x", "w"], ["y", "inv_rms"], domain="custom", name="rms"),
             helper.make_node("my_add", ["y", "x"], ["z"], domain="custom", name="add")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [8])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
                    helper.make_tensor_value_info("inv_rms", TensorProto.FLOAT, None)])
    x = rng.standard_normal((2, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    out = open_session(model, registry=registry).run({"x": x, "w": w})
    y, _ = rms_reference(x, w, 1e-6)
    np.testing.assert_allclose(out["z"], 2 * y + x, rtol=1e-5, atol=1e-5)
    lib = native.library_for(registry.packages, registry)
    assert {"custom::my_add", "custom::rms_norm", "graphkit.native::rms_norm",
            "custom::deform_conv2d"} <= native.served_ops(lib)


def test_second_package_with_the_same_op_name_coexists(demo_registry, rng):
    nodes = [helper.make_node("rms_norm", ["x"], ["y", "inv_rms"], domain="custom", name="rms"),
             helper.make_node("rms_norm", ["y"], ["t"], domain="demo", name="twice"),
             helper.make_node("rms_norm", ["t"], ["u"], domain="graphkit.native.demo", name="twice_bound"),
             helper.make_node("my_add", ["u", "x"], ["z"], domain="custom", name="add")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                   domains=("custom", "demo", "graphkit.native.demo"))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    out = open_session(model, registry=demo_registry).run({"x": x})
    y, _ = rms_reference(x, None, 1e-6)
    np.testing.assert_allclose(out["z"], 2 * (4 * y) + x, rtol=1e-5, atol=1e-5)
    served = native.served_ops(native.library_for(demo_registry.packages, demo_registry))
    assert {"demo::rms_norm", "graphkit.native.demo::rms_norm", "custom::rms_norm", "custom::my_add"} <= served


def test_prebuilt_library_sharing_a_domain_is_refused(registry, rms_package):
    lib = native.library_for([rms_package], registry)
    op = OpDef(name="pb_op", doc="", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
               type_constraints={"T": ("tensor(float)",)}, reference=lambda x: x,
               infer_shapes=lambda s, a: [s[0]], native=True)
    prebuilt = OpPackage("prebuilt_ops", (op,), native=NativeKernels(library=str(lib)))
    reg = registry.with_ops(prebuilt)
    nodes = [helper.make_node("rms_norm", ["x"], ["y", "i"], domain="custom", name="rms"),
             helper.make_node("pb_op", ["y"], ["z"], domain="custom", name="pb")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    with pytest.raises(KernelError, match="domain 'custom'") as exc:
        open_session(model, registry=reg)
    assert "rms_norm_ops" in str(exc.value) and "prebuilt_ops" in str(exc.value)


# ---- build errors --------------------------------------------------------------------------


def _package(tmp_path: Path, name: str, source: str, ops: tuple[str, ...] = ("thing",)) -> OpPackage:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "kernels.cc").write_text(textwrap.dedent(source))
    defs = tuple(OpDef(name=o, doc="", domain=name, torch_namespace=name, inputs=(Param("x", "T"),),
                       outputs=(Param("y", "T"),), type_constraints={"T": ("tensor(float)",)},
                       reference=lambda x: x, infer_shapes=lambda s, a: [s[0]], native=True) for o in ops)
    return OpPackage(name, defs, native=NativeKernels(root=folder, sources=("kernels.cc",)))


def test_compile_error_names_file_and_line(tmp_path):
    package = _package(tmp_path, "broken_ops", """\
        #include <graphkit/kernel.h>

        int broken( { return 0; }
        """)
    with pytest.raises(NativeBuildError) as exc:
        native.library_for([package])
    err = exc.value
    assert err.message.startswith("package broken_ops: ")
    assert f"{tmp_path / 'broken_ops' / 'kernels.cc'}:3:" in err.message and "error:" in err.message
    assert "\n" not in err.message
    log = Path(err.hint.rsplit(" ", 1)[-1])
    assert log.is_file() and "kernels.cc:3" in log.read_text()


def test_declared_native_op_without_kernels_is_named(tmp_path):
    package = _package(tmp_path, "partial_ops", TWICE_CC.replace("rms_norm", "thing"), ops=("thing", "missing_op"))
    with pytest.raises(NativeBuildError) as exc:
        native.library_for([package])
    assert exc.value.message == ("package partial_ops declares native kernels for partial_ops::missing_op "
                                 "but its sources define no GRAPHKIT_OPS(missing_op, ...)")


# ---- the cache ----------------------------------------------------------------------------------


def test_corrupt_or_truncated_artefacts_are_rebuilt(cache, registry, rms_package, capfd):
    lib = native.library_for([rms_package], registry)
    good = lib.read_bytes()
    corrupt = bytearray(good)
    corrupt[len(corrupt) // 2] ^= 0xFF
    # os.replace, not writing in place: this process may have the library mapped.
    for bad in (bytes(corrupt), good[: len(good) // 3], b""):
        tmp = lib.with_name("corrupt.tmp")
        tmp.write_bytes(bad)
        tmp.replace(lib)
        assert build_cache.Entry("native/lib", lib.parent.name).valid(lib.name) is None
        assert native.library_for([rms_package], registry) == lib
        assert lib.read_bytes() != bad and lib.stat().st_size == len(good)
        assert "building kernels for rms_norm_ops" in capfd.readouterr().err
    # a corrupt object file is recompiled when the library is linked again
    objects = list((cache / "native" / "obj").glob("*/rms_norm.o"))
    assert objects
    for obj in objects:
        (obj.parent / "x.tmp").write_bytes(obj.read_bytes()[:100])
        (obj.parent / "x.tmp").replace(obj)
    build_cache.Entry("native/lib", lib.parent.name).invalidate(lib.name)
    assert native.library_for([rms_package], registry) == lib
    assert all(build_cache.Entry("native/obj", o.parent.name).valid(o.name) == o for o in objects
               if o.stat().st_size > 100)
    assert any(o.stat().st_size > 100 for o in objects)
    assert native.served_ops(lib) == {"custom::rms_norm", "graphkit.native::rms_norm"}


# ---- what only the build needs -------------------------------------------------------------------

_WITHOUT_OPENBLAS = '''
import sys
sys.modules["scipy_openblas32"] = None  # importing it now raises ImportError

import numpy as np
from onnx import TensorProto, helper

import graphkit
import graphkit_ops
from graphkit.errors import NativeBuildError
from graphkit.ops import OpDef, OpPackage, Param
from graphkit.runtime import native

twice = OpDef(name="twice", doc="2x", domain="nb", torch_namespace="nb", inputs=(Param("x", "T"),),
              outputs=(Param("y", "T"),), type_constraints={"T": ("tensor(float)",)},
              reference=lambda x: 2 * x, infer_shapes=lambda s, a: [s[0]])
OpPackage("nb_ops", (twice,), native=graphkit_ops.PACKAGE.native)
model = helper.make_model(helper.make_graph(
    [helper.make_node("my_add", ["a", "b"], ["y"], domain="custom")], "g",
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in "ab"],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])]),
    opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("custom", 1)], ir_version=10)
lowered, _ = graphkit.rewrite_model(model, lowering=graphkit.Lowering.DECOMPOSE)
a, b = np.array([1, -2, 0.5], np.float32), np.array([3, 4, 0.25], np.float32)
got = graphkit.open_session(lowered).run({"a": a, "b": b})["y"]
print("decomposed matches the reference:", np.array_equal(got, graphkit_ops.MY_ADD.reference(a, b)))
try:
    native.library_for([graphkit_ops.PACKAGE])
except NativeBuildError as exc:
    print("message:", exc.message)
    print("hint:", exc.hint)
'''


def test_graphkit_ops_needs_scipy_openblas32_only_to_build_its_kernels(tmp_path):
    """Importing graphkit_ops, defining ops and decomposing work without scipy_openblas32;
    the native build is then a NativeBuildError naming the module."""
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_OPENBLAS], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GRAPHKIT_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "decomposed matches the reference: True"
    assert lines[1].startswith("message: package graphkit_ops: building its native kernels needs the Python "
                               "module 'scipy_openblas32', which cannot be imported: "), lines
    assert lines[2].startswith("hint: install the Python package that provides 'scipy_openblas32'"), lines
    assert not any(tmp_path.rglob("*.o")), "nothing is compiled before the build options are known"


def test_build_options_are_added_and_checked(tmp_path):
    kernels = NativeKernels(root=tmp_path, sources=("k.cc",), include_dirs=("inc",),
                            build_options=lambda: {"include_dirs": ("more",), "libraries": "m"})
    resolved = kernels.resolved()
    assert (resolved.include_dirs, resolved.libraries, resolved.build_options) == (("inc", "more"), ("m",), None)
    assert resolved.include_paths() == [tmp_path / "inc", tmp_path / "more"]
    with pytest.raises(OpDefinitionError, match="build_options is a str, not a function"):
        NativeKernels(root=tmp_path, sources=("k.cc",), build_options="scipy_openblas32")
    with pytest.raises(OpDefinitionError, match="apply to kernel sources"):
        NativeKernels(library=tmp_path / "libx.so", build_options=lambda: {})

    def package(options):
        return OpPackage("opts_ops", (), native=NativeKernels(root=tmp_path, sources=("k.cc",), build_options=options))

    def failure(options) -> NativeBuildError:
        with pytest.raises(NativeBuildError) as info:
            native.library_for([package(options)])
        return info.value

    def raising():
        raise RuntimeError("no BLAS here")

    err = failure(lambda: {"libs": ("m",)})
    assert err.message == "package opts_ops: build_options() returned {'libs': ('m',)}"
    assert err.hint == "return a mapping with keys among include_dirs, library_dirs, libraries"
    err = failure(lambda: {"libraries": ("libm.so",)})
    assert err.message.startswith("package opts_ops: library 'libm.so' must be a name as passed to -l")
    err = failure(raising)
    assert err.message == "package opts_ops: NativeKernels(build_options=...) raised RuntimeError: no BLAS here"
