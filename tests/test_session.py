"""open_session / Session: kernel registration, unsupported ops, load and feed errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conftest import REPO, my_add_model
from graphkit.errors import KernelError, ModelLoadError, UnsupportedOpError, UsageError
from graphkit.ops import OpDef, OpRegistry, Param, default_registry
from graphkit.runtime import Session, native, open_session
from graphkit.runtime.session import TensorInfo


PY, NATIVE = "graphkit.python", "graphkit.native"
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1),
          helper.make_opsetid(NATIVE, 1), helper.make_opsetid(PY, 1)]


def _model(nodes, inputs, outputs, **kw):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=kw.pop("opsets", OPSETS), ir_version=10, **kw)


def _vi(name, shape=("N", 3), dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, None if shape is None else list(shape))


@pytest.fixture
def no_ort(monkeypatch):
    """Fail the test if ONNX Runtime is asked for a session."""
    def refuse(*args, **kwargs):
        raise AssertionError("ONNX Runtime was touched")

    monkeypatch.setattr(ort, "InferenceSession", refuse)


# -- kernels --------------------------------------------------------------------------------

def test_native_and_python_kernels_in_one_session(rng):
    nodes = [helper.make_node("my_add", ["a", "b"], ["h"], domain=NATIVE, name="native_add"),
             helper.make_node("my_add", ["h", "b"], ["y"], domain=PY, name="python_add")]
    session = open_session(_model(nodes, [_vi("a"), _vi("b")], [_vi("y", None)]))
    a, b = rng.standard_normal((2, 4, 3)).astype(np.float32)
    np.testing.assert_allclose(session.run({"a": a, "b": b})["y"], 2 * (2 * a + b) + b, rtol=1e-6)


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16])
def test_placeholder_runs_on_the_native_library(dtype, rng):
    assert "custom::my_add" in native.served_ops()
    npt = helper.tensor_dtype_to_np_dtype(dtype)
    session = open_session(my_add_model(dtype, domain="custom"))
    a, b = rng.standard_normal((2, 5, 3)).astype(npt)
    np.testing.assert_allclose(session.run({"a": a, "b": b})["z"], np.maximum(2 * a + b, 0),
                               rtol=1e-3 if npt == np.float16 else 1e-6)


def test_standard_model_needs_no_library(monkeypatch, rng):
    monkeypatch.setattr(native, "library_path", lambda **kw: pytest.fail("native library loaded"))
    monkeypatch.setattr(native, "library_for", lambda *a, **kw: pytest.fail("native library built"))
    session = open_session(_model([helper.make_node("Relu", ["a"], ["y"])], [_vi("a")], [_vi("y")]))
    a = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(session.run({"a": a})["y"], np.maximum(a, 0))


def test_runtime_failure_is_kernel_error():
    session = open_session(my_add_model(domain="custom", shape_a=("N", "M"), shape_b=("N", "M")))
    with pytest.raises(KernelError, match="ONNX Runtime failed") as exc:
        session.run({"a": np.ones((2, 3), np.float32), "b": np.ones((4, 5), np.float32)})
    assert exc.value.__cause__ is not None and exc.value.node == "add0"


# -- unsupported ops, before ONNX Runtime is touched ----------------------------------------

def test_unknown_native_op_is_named(no_ort):
    nodes = [helper.make_node("frobnicate", ["a"], ["y"], domain="custom", name="frob0")]
    with pytest.raises(UnsupportedOpError) as exc:
        open_session(_model(nodes, [_vi("a")], [_vi("y")]))
    err = exc.value
    assert err.node == "frob0" and err.op == "custom::frobnicate"
    assert "no native kernel" in str(err)
    assert err.hint == "pass registry=graphkit.ops.discover(['PACKAGE']) or install the package that defines it"


def test_hint_names_the_ways_to_get_a_kernel(no_ort, tmp_path):
    from graphkit.ops import Decomposition

    op = OpDef(name="gk_twice", doc="", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
               type_constraints={"T": ("tensor(float)",)}, reference=lambda x: 2 * x,
               infer_shapes=lambda s, a: [s[0]], python_kernel=lambda x: 2 * x,
               decompositions=(Decomposition("add", lambda b, i, a: [b.op("Add", i[0], i[0])], 7),))
    path = tmp_path / "twice.onnx"
    onnx.save(_model([helper.make_node("gk_twice", ["a"], ["y"], domain="custom", name="t0")],
                     [_vi("a")], [_vi("y")]), path)
    with pytest.raises(UnsupportedOpError, match="no native kernel") as exc:
        open_session(path, registry=default_registry().with_ops(op))
    assert exc.value.hint == f"run `graphkit rewrite {path} OUT.onnx` to decompose it, or rewrite with --bind python"


def test_every_missing_kernel_is_listed(no_ort, tmp_path):
    no_kernel = OpDef(name="gk_nokernel", doc="", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
                      type_constraints={"T": ("tensor(float)",)}, reference=lambda x: x,
                      infer_shapes=lambda s, a: [s[0]])
    registry = default_registry().with_ops(no_kernel)
    body = helper.make_graph([helper.make_node("mystery", ["a"], ["t"], domain="vendor.ops", name="deep")],
                             "body", [], [_vi("t", None)])
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["t"])], "other", [], [_vi("t", None)])
    fn = helper.make_function("local.fns", "fn", ["x"], ["y"],
                              [helper.make_node("gk_nokernel", ["x"], ["y"], domain=PY, name="in_fn")],
                              OPSETS)
    nodes = [helper.make_node("my_add", ["a", "a"], ["h"], domain=PY, name="fine"),
             helper.make_node("gk_nokernel", ["h"], ["i"], domain=PY, name="nok"),
             helper.make_node("If", ["c"], ["j"], then_branch=body, else_branch=other, name="branch"),
             helper.make_node("fn", ["i"], ["y"], domain="local.fns", name="call")]
    model = _model(nodes, [_vi("a"), _vi("c", [], TensorProto.BOOL)], [_vi("y", None), _vi("j", None)],
                   opsets=OPSETS + [helper.make_opsetid("vendor.ops", 1), helper.make_opsetid("local.fns", 1)],
                   functions=[fn])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    with pytest.raises(UnsupportedOpError) as exc:
        open_session(path, registry=registry)
    text = str(exc.value)
    assert text.startswith(str(path)) and "3 nodes have no kernel" in text, text
    assert "node 'nok' (graphkit.python::gk_nokernel): no Python kernel" in text
    assert "node 'branch/then_branch/deep' (vendor.ops::mystery)" in text
    assert "domain 'vendor.ops' is unknown" in text
    assert "node 'function local.fns::fn/in_fn' (graphkit.python::gk_nokernel)" in text
    assert "'fine'" not in text and "'call'" not in text  # has a kernel / a local function


def test_python_op_missing_from_registry(no_ort):
    nodes = [helper.make_node("my_add", ["a", "a"], ["y"], domain=PY, name="n")]
    with pytest.raises(UnsupportedOpError, match="not defined in the registry"):
        open_session(_model(nodes, [_vi("a")], [_vi("y")]), registry=OpRegistry())


# -- loading and creation errors -------------------------------------------------------------

def test_load_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file") as exc:
        open_session(tmp_path / "missing.onnx")
    assert exc.value.path == str(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelLoadError, match="not an ONNX model"):
        open_session(junk)
    with pytest.raises(UsageError):
        open_session(42)


def test_ort_refusal_is_kernel_error():
    model = _model([helper.make_node("Relu", ["missing"], ["y"])], [_vi("a")], [_vi("y")])
    with pytest.raises(KernelError, match="ONNX Runtime cannot create the session") as exc:
        open_session(model)
    assert "missing" in str(exc.value)


def test_options_threads_and_reuse():
    so = ort.SessionOptions()
    session = open_session(my_add_model(domain="custom"), options=so, threads=1)
    assert session.run({"a": np.ones((1, 3), np.float32), "b": np.ones((1, 3), np.float32)})["z"].tolist() == [[3, 3, 3]]
    with pytest.raises(UsageError, match="already used"):
        open_session(my_add_model(domain="custom"), options=so)
    with pytest.raises(UsageError, match="threads"):
        open_session(my_add_model(domain="custom"), threads=-1)


def test_external_data_survives_in_memory_preparation(tmp_path, rng):
    """A float16 Python node makes the session load from memory; weights stay external."""
    w = rng.standard_normal((2, 3)).astype(np.float16)
    graph = helper.make_graph([helper.make_node("my_add", ["a", "w"], ["y"], domain=PY, name="n")], "g",
                              [_vi("a", (2, 3), TensorProto.FLOAT16)], [_vi("y", None, TensorProto.FLOAT16)],
                              [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=OPSETS, ir_version=10)
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=0)
    a = rng.standard_normal((2, 3)).astype(np.float16)
    np.testing.assert_array_equal(open_session(path).run({"a": a})["y"], 2 * a + w)


# -- feeds and metadata ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def session() -> Session:
    return open_session(my_add_model(domain="custom", shape_a=("batch", 3), shape_b=(3,)))


def test_metadata(session):
    assert session.inputs == (TensorInfo("a", "tensor(float)", np.dtype(np.float32), ("batch", 3)),
                              TensorInfo("b", "tensor(float)", np.dtype(np.float32), (3,)))
    assert [o.name for o in session.outputs] == ["z"] and session.outputs[0].shape is None


@pytest.mark.parametrize("feeds, message", [
    ({"a": np.ones((1, 3), np.float32)}, "missing input(s) ['b']"),
    ({"a": np.ones((1, 3), np.float32), "b": np.ones(3, np.float32), "c": 1}, "unknown input(s) ['c']"),
    ({"a": np.ones((1, 3), np.float64), "b": np.ones(3, np.float32)}, "'a' has dtype float64; expected float32"),
    ({"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}, "'a' has shape [3]; expected [batch, 3] (rank 2)"),
    ({"a": np.ones((1, 4), np.float32), "b": np.ones(3, np.float32)}, "'a' has shape [1, 4]; expected [batch, 3]"),
    ({"a": [[1.0, 2.0, 3.0]], "b": np.ones(3, np.float32)}, "'a' is a list; expected a numpy array"),
])
def test_feed_errors(session, feeds, message):
    with pytest.raises(UsageError) as exc:
        session.run(feeds)
    assert message in str(exc.value)


def test_output_names(session):
    feeds = {"a": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    assert list(session.run(feeds, output_names=["z"])) == ["z"]
    with pytest.raises(UsageError, match="unknown output"):
        session.run(feeds, output_names=["nope"])


def test_random_feeds(session):
    feeds = session.random_feeds(seed=3, dims={"batch": 4})
    assert feeds["a"].shape == (4, 3) and feeds["a"].dtype == np.float32 and feeds["b"].shape == (3,)
    again = session.random_feeds(seed=3, dims={"batch": 4})
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)
    assert session.random_feeds()["a"].shape == (1, 3)
    assert session.run(feeds)["z"].shape == (4, 3)
    with pytest.raises(UsageError, match=r"\['seq'\] match no input dimension"):
        session.random_feeds(dims={"seq": 2})


def test_import_does_not_load_torch():
    code = "import sys, graphkit.runtime; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=True)
    assert proc.stdout.strip() == "False"


def test_unknown_domain_left_to_ort_with_callers_options(no_ort):
    """With the caller's own SessionOptions, a domain no op package knows is not refused
    by graphkit (the caller may have registered a library for it): ONNX Runtime decides."""
    nodes = [helper.make_node("thing", ["a"], ["y"], domain="vendor.ops", name="v0")]
    model = _model(nodes, [_vi("a")], [_vi("y")], opsets=OPSETS + [helper.make_opsetid("vendor.ops", 1)])
    with pytest.raises(UnsupportedOpError, match="domain 'vendor.ops' is unknown") as exc:
        open_session(model)
    assert exc.value.hint.startswith("pass registry=graphkit.ops.discover(['PACKAGE']) or install the package")
    with pytest.raises(KernelError, match="ONNX Runtime was touched"):  # reached ORT
        open_session(model, options=ort.SessionOptions())


def _deform_model(domain: str, **attrs) -> onnx.ModelProto:
    """x[1,2,5,5] * w[3,2,3,3] deformed by offset[1,18,3,3], bias and mask given."""
    node = helper.make_node("deform_conv2d", ["x", "w", "off", "b", "m"], ["y"], domain=domain, name="dcn", **attrs)
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
           (("x", [1, 2, 5, 5]), ("w", [3, 2, 3, 3]), ("off", [1, 18, 3, 3]), ("b", [3]), ("m", [1, 9, 3, 3]))]
    return _model([node], ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                  opsets=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])


def test_python_binding_is_the_rewrites(rng):
    """One binding: a model `rewrite --bind python` bound is ready for the session's binding
    (which changes nothing), and a graphkit.python node written by hand in the natural
    encoding gets, from the session's binding, exactly the rewrite's attributes."""
    from graphkit.rewrite import Lowering, rewrite_model
    from graphkit.rewrite.lowering.binding import PythonNode, bind_python_nodes

    registry = default_registry()
    bound, _ = rewrite_model(_deform_model("custom", stride=[2, 2], padding=[1, 1]), lowering=Lowering.PYTHON)
    again = onnx.ModelProto()
    again.CopyFrom(bound)
    ref = PythonNode(again.graph.node[-1], again.graph, len(again.graph.node) - 1, 0, "dcn")
    assert not bind_python_nodes(again, registry, [ref])
    assert again.SerializeToString() == bound.SerializeToString()

    by_hand = _deform_model("graphkit.python", stride=[2, 2], padding=[1, 1])
    ref = PythonNode(by_hand.graph.node[0], by_hand.graph, 0, 0, "dcn")
    assert bind_python_nodes(by_hand, registry, [ref])
    assert list(by_hand.graph.node[0].attribute) == list(bound.graph.node[-1].attribute)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in
             (("x", (1, 2, 5, 5)), ("w", (3, 2, 3, 3)), ("off", (1, 18, 3, 3)), ("b", (3,)), ("m", (1, 9, 3, 3)))}
    hand = open_session(_deform_model("graphkit.python", stride=[2, 2], padding=[1, 1])).run(feeds)["y"]
    np.testing.assert_array_equal(hand, open_session(bound).run(feeds)["y"])


# -- the caller's own SessionOptions and words (issue 27 item 2) ------------------------------

def test_a_library_registered_twice_is_named_with_its_cause():
    """The caller registered the package's library on their SessionOptions, then asked
    open_session, which registers it too: ONNX Runtime says only "Domain already set in
    registry"; the error says a library was registered twice, which, and what to do."""
    from graphkit.rewrite import Lowering, rewrite_model

    bound, _ = rewrite_model(my_add_model(), lowering=Lowering.NATIVE)
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(native.library_path()))
    with pytest.raises(KernelError) as exc:
        open_session(bound, options=so)
    text = str(exc.value)
    assert "registered twice" in text and str(native.library_path()) in text
    assert "domains custom, graphkit.native" in text and "register_custom_ops_library" in exc.value.hint
    assert "names the failing node" not in text
    session = open_session(bound, options=ort.SessionOptions())  # without it: runs
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(session.run({"a": x, "b": x})["z"], 3 * x)


def test_api_errors_speak_the_api_and_the_command_its_own(no_ort, tmp_path):
    """open_session, rewrite_model and inspect_model without registry= name registry=, never
    --ops; `graphkit run` and `graphkit rewrite` on the same model name --ops."""
    from conftest import error_lines, run_cli
    from graphkit.inspection import inspect_model
    from graphkit.rewrite import rewrite_model

    model = my_add_model()
    model.graph.node[0].op_type = "mystery"
    for call in (lambda: open_session(model), lambda: open_session(my_add_model(domain="nosuch")),
                 lambda: rewrite_model(model)):
        with pytest.raises(UnsupportedOpError) as exc:
            call()
        assert "registry=graphkit.ops.discover(['PACKAGE'])" in exc.value.hint and "--ops" not in str(exc.value)
    (entry,) = [op for op in inspect_model(model)["custom_ops"] if op["op"] == "custom::mystery"]
    assert "registry=" in entry["hint"] and "--ops" not in entry["hint"]
    onnx.save(model, tmp_path / "m.onnx")
    for args in (["run", tmp_path / "m.onnx"], ["rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx"]):
        (line,) = error_lines(run_cli(*args, check_rc=6).stderr)
        assert "--ops PACKAGE" in line and "registry=" not in line
