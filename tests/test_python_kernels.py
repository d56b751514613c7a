"""Python kernels through onnxruntime-extensions: results, errors that do not abort, threads."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from conftest import NP_TYPES, REPO, my_add_model
from graphkit.errors import KernelError
from graphkit.ops import Attr, AttrType, OpDef, OpRegistry, Param, default_registry
from graphkit.runtime import open_session
from graphkit.runtime.python_kernels import (
    decode_kernel_attr,
    decode_list_attr,
    encode_kernel_attr,
    encode_kernel_attrs,
    encode_list_attr,
    python_kernel_table,
)

PY = "graphkit.python"
FLOATS = ("tensor(float16)", "tensor(float)", "tensor(double)")


def _op(name, kernel, *, attributes=(), types=FLOATS, n_in=1, n_out=1):
    return OpDef(name=name, doc="test op", inputs=tuple(Param(f"x{i}", "T") for i in range(n_in)),
                 outputs=tuple(Param(f"y{i}", "T") for i in range(n_out)),
                 type_constraints={"T": types}, reference=lambda *a, **k: None,
                 infer_shapes=lambda shapes, attrs: [shapes[0]] * n_out,
                 attributes=tuple(attributes), python_kernel=kernel)


def _raises(x):
    if (x < 0).any():
        raise ValueError(f"negative input, min {x.min()}")
    return x.copy()


def _wrong_dtype(x):
    return x.astype(np.float64)


def _two_outputs(x):
    return x


def _not_array(x):
    return x.tolist()


def _scaled(x, *, axes, alpha, mode, k):
    """Uses every attribute kind: INTS, FLOAT, STRING, INT."""
    assert isinstance(alpha, float) and isinstance(k, int) and isinstance(mode, str)
    assert all(isinstance(a, int) for a in axes)
    y = x.sum(axis=tuple(axes), keepdims=True) * x.dtype.type(alpha) + x.dtype.type(k)
    return -y if mode == "neg" else y


TEST_OPS = (
    _op("gk_test_raises", _raises),
    _op("gk_test_wrong_dtype", _wrong_dtype, types=("tensor(float)",)),
    _op("gk_test_two_outputs", _two_outputs, types=("tensor(float)",), n_out=2),
    _op("gk_test_not_array", _not_array, types=("tensor(float)",)),
    _op("gk_test_scaled", _scaled, types=("tensor(float)", "tensor(double)"), attributes=(
        Attr("axes", AttrType.INTS), Attr("alpha", AttrType.FLOAT),
        Attr("mode", AttrType.STRING, default="pos"), Attr("k", AttrType.INT, default=0))),
)
REGISTRY = default_registry().with_ops(*TEST_OPS)


def _unary_model(op_type, dtype=TensorProto.FLOAT, shape=("N", 3), n_out=1, **attrs):
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, ["x"], outs, domain=PY, name=f"{op_type}_node", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", dtype, list(shape))],
                              [helper.make_tensor_value_info(o, dtype, None) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(PY, 1)],
                             ir_version=10)


# -- attribute encoding ---------------------------------------------------------------------

def test_list_attr_round_trip():
    assert encode_list_attr([1, -2, 3]) == "1,-2,3"
    assert decode_list_attr("1,-2,3", AttrType.INTS) == [1, -2, 3]
    assert decode_list_attr(" 1, 2 ", AttrType.INTS) == [1, 2]
    assert encode_list_attr([]) == "" and decode_list_attr("", AttrType.FLOATS) == []
    values = [0.1, -2.5, 1e-30, float("inf")]
    decoded = decode_list_attr(encode_list_attr(values), AttrType.FLOATS)
    # FLOATS are float32 in ONNX: decoding rounds exactly as a FLOATS attribute would.
    assert decoded == [float(np.float32(v)) for v in values]
    with pytest.raises(ValueError, match="ints"):
        decode_list_attr("1,2.5", AttrType.INTS)
    with pytest.raises(TypeError):
        encode_list_attr([True])


def test_kernel_attr_encoding_is_lossless_for_float():
    x = 0.123456789
    text = encode_kernel_attr(x, AttrType.FLOAT)
    assert isinstance(text, str) and decode_kernel_attr(text, AttrType.FLOAT) == float(np.float32(x))
    assert encode_kernel_attr(3, AttrType.INT) == 3
    op = REGISTRY.get("gk_test_scaled")
    assert encode_kernel_attrs(op, {"axes": [1], "alpha": 0.5}) == {
        "axes": "1", "alpha": "0.5", "mode": "pos", "k": 0}


# -- results --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", sorted(NP_TYPES))
def test_my_add_matches_numpy(dtype, rng):
    npt = NP_TYPES[dtype]
    session = open_session(my_add_model(dtype, domain=PY, shape_b=(3,)))
    for batch in (1, 5):  # one session, dynamic batch, b broadcast over it
        a = rng.standard_normal((batch, 3)).astype(npt)
        b = rng.standard_normal(3).astype(npt)
        z = session.run({"a": a, "b": b})["z"]
        assert z.dtype == npt and z.shape == (batch, 3)
        np.testing.assert_array_equal(z, np.maximum(2 * a + b, 0))


def test_float16_kernel_sees_float16(rng):
    seen = []

    def spy(x):
        seen.append(x.dtype)
        return x * x.dtype.type(3)

    reg = OpRegistry([_op("gk_test_spy16", spy)])
    x = rng.standard_normal((2, 3)).astype(np.float16)
    y = open_session(_unary_model("gk_test_spy16", TensorProto.FLOAT16), registry=reg).run({"x": x})["y0"]
    assert seen == [np.float16] and y.dtype == np.float16
    np.testing.assert_array_equal(y, x * np.float16(3))


def test_float16_node_in_subgraph(rng):
    then = helper.make_graph([helper.make_node("my_add", ["a", "b"], ["t"], domain=PY, name="inner")],
                             "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT16, None)])
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT16, None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("a", TensorProto.FLOAT16, [2]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT16, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(PY, 1)],
                              ir_version=10)
    a, b = rng.standard_normal((2, 2)).astype(np.float16)
    session = open_session(model)
    np.testing.assert_array_equal(session.run({"c": np.array(True), "a": a, "b": b})["y"], 2 * a + b)
    np.testing.assert_array_equal(session.run({"c": np.array(False), "a": a, "b": b})["y"], a)


def test_attributes_reach_the_kernel_decoded(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    alpha = 0.123456789  # ort-extensions' own FLOAT path would print it as 0.123457
    expected = -(x.sum(axis=(0, 2), keepdims=True) * np.float32(alpha) + np.float32(7))
    op = REGISTRY.get("gk_test_scaled")
    encodings = {
        # what `graphkit rewrite --bind python` writes
        "kernel": encode_kernel_attrs(op, {"axes": [0, 2], "alpha": alpha, "mode": "neg", "k": 7}),
        # natural ONNX types, defaults left out: the session converts them in memory
        "natural": {"axes": [0, 2], "alpha": alpha, "mode": "neg", "k": 7},
        "lists encoded, FLOAT as FLOAT": {"axes": encode_list_attr([0, 2]), "alpha": alpha,
                                         "mode": "neg", "k": 7},
    }
    for name, attrs in encodings.items():
        model = _unary_model("gk_test_scaled", shape=(2, 3, 4), **attrs)
        before = model.SerializeToString()
        y = open_session(model, registry=REGISTRY).run({"x": x})["y0"]
        np.testing.assert_array_equal(y, expected, err_msg=name)
        assert model.SerializeToString() == before  # the caller's model is left alone
    y = open_session(_unary_model("gk_test_scaled", shape=(2, 3, 4), axes=[1], alpha=1.0),
                     registry=REGISTRY).run({"x": x})["y0"]
    np.testing.assert_array_equal(y, x.sum(axis=1, keepdims=True))  # defaults filled in


def test_bad_attributes_fail_before_running():
    with pytest.raises(KernelError, match="missing required attribute 'axes'") as exc:
        open_session(_unary_model("gk_test_scaled", alpha=1.0), registry=REGISTRY)
    assert exc.value.node == "gk_test_scaled_node"
    with pytest.raises(KernelError, match="ints"):
        open_session(_unary_model("gk_test_scaled", axes="1,x", alpha=1.0), registry=REGISTRY)


# -- kernel errors --------------------------------------------------------------------------

def test_raising_kernel_becomes_kernel_error(rng):
    session = open_session(_unary_model("gk_test_raises"), registry=REGISTRY)
    x = np.array([[1.0, -2.0, 3.0]], np.float32)
    with pytest.raises(KernelError) as exc:
        session.run({"x": x})
    err = exc.value
    assert "ValueError: negative input, min -2.0" in str(err)
    assert err.op == "graphkit.python::gk_test_raises" and "(T=float)" in str(err)
    assert err.node == "gk_test_raises_node"  # the only node of that op
    assert isinstance(err.__cause__, ValueError) and err.__cause__.__traceback__ is not None
    # The process and the session are fine: the next run works.
    ok = np.abs(x)
    np.testing.assert_array_equal(session.run({"x": ok})["y0"], ok)


def test_raising_kernel_does_not_abort_the_process():
    code = textwrap.dedent("""
        import sys
        import numpy as np
        sys.path.insert(0, "tests")
        import graphkit.runtime
        from test_python_kernels import REGISTRY, _unary_model
        from graphkit.errors import KernelError
        session = graphkit.runtime.open_session(_unary_model("gk_test_raises"), registry=REGISTRY)
        try:
            session.run({"x": np.array([[-1.0, 0.0, 1.0]], np.float32)})
        except KernelError as exc:
            print("caught:", repr(exc.__cause__))
        print("alive")
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "caught: ValueError('negative input, min -1.0')" in proc.stdout and "alive" in proc.stdout


def test_hooker_is_installed_lazily():
    code = ("import sys, graphkit.runtime; print('onnxruntime_extensions' in sys.modules); "
            "from graphkit.runtime.python_kernels import _table; print(_table)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=True)
    assert proc.stdout.split() == ["False", "None"]


@pytest.mark.parametrize("op_type, n_out, message", [
    ("gk_test_wrong_dtype", 1, "output 'y0' has dtype float64, expected float32"),
    ("gk_test_two_outputs", 2, "returned 1 output(s), expected 2"),
    ("gk_test_not_array", 1, "output 'y0' is a list, expected a numpy array"),
])
def test_kernel_contract_errors(op_type, n_out, message):
    session = open_session(_unary_model(op_type, n_out=n_out), registry=REGISTRY)
    with pytest.raises(KernelError) as exc:
        session.run({"x": np.ones((1, 3), np.float32)})
    assert message in str(exc.value) and exc.value.op == f"graphkit.python::{op_type}"


def test_failure_stops_the_run_at_the_failing_node():
    calls = []

    def counted(x):
        calls.append(1)
        return _raises(x)

    reg = OpRegistry([_op("gk_test_counted", counted)])
    nodes = [helper.make_node("gk_test_counted", [i], [o], domain=PY, name=f"n{k}")
             for k, (i, o) in enumerate([("x", "h1"), ("h1", "h2"), ("h2", "y")])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(PY, 1)],
                              ir_version=10)
    session = open_session(model, registry=reg)
    with pytest.raises(KernelError, match="negative input") as exc:
        session.run({"x": np.array([-1, 2, 3], np.float32)})
    assert exc.value.node is None  # three nodes run this op: the kernel cannot tell which
    assert len(calls) == 1


# -- threads and other users of ort-extensions ----------------------------------------------

def test_four_threads_share_a_session(rng):
    session = open_session(my_add_model(TensorProto.FLOAT, domain=PY))
    failing = open_session(_unary_model("gk_test_raises"), registry=REGISTRY)
    inputs = [rng.standard_normal((8, 3)).astype(np.float32) for _ in range(4)]
    problems = []

    def work(k):
        try:
            for i in range(30):
                a = inputs[k] + np.float32(i)
                np.testing.assert_array_equal(session.run({"a": a, "b": a})["z"], np.maximum(3 * a, 0))
                x = np.full((1, 3), -1.0 if (i + k) % 2 else 1.0, np.float32)
                try:
                    failing.run({"x": x})
                    assert (x > 0).all()
                except KernelError as exc:  # each thread sees exactly its own failures
                    assert (x < 0).all() and isinstance(exc.__cause__, ValueError)
        except BaseException as exc:  # noqa: BLE001
            problems.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not problems, problems


def test_sessions_survive_later_declarations(rng):
    first = open_session(my_add_model(TensorProto.FLOAT, domain=PY))
    table = python_kernel_table()
    before = table._size[PY]

    def adds(k):
        return lambda x: x + x.dtype.type(k)

    reg = OpRegistry([_op(f"gk_test_late_{k}", adds(k)) for k in range(3)])
    for k in range(3):
        out = open_session(_unary_model(f"gk_test_late_{k}"), registry=reg).run({"x": np.zeros((1, 3), np.float32)})
        assert out["y0"].tolist() == [[k, k, k]]
    assert table._size[PY] == before + 9 <= table._capacity[PY]  # no reallocation: `first` stays valid
    a = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(first.run({"a": a, "b": a})["z"], np.maximum(3 * a, 0))


def test_full_table_refuses_instead_of_invalidating_sessions(monkeypatch):
    alive = open_session(my_add_model(TensorProto.FLOAT, domain=PY))
    table = python_kernel_table()
    monkeypatch.setattr(table, "_capacity", dict(table._size))  # pretend the vector is full
    reg = OpRegistry([_op("gk_test_overflow", lambda x: x)])
    with pytest.raises(KernelError, match="table for graphkit.python is full"):
        open_session(_unary_model("gk_test_overflow"), registry=reg)
    assert not table.declared("gk_test_overflow")
    assert alive.run({"a": np.ones((1, 3), np.float32), "b": np.ones((1, 3), np.float32)})["z"].tolist() == [[3, 3, 3]]


def test_foreign_onnx_op_keeps_working(rng):
    import onnxruntime as ort
    import onnxruntime_extensions
    from onnxruntime_extensions import PyCustomOpDef, onnx_op

    open_session(my_add_model(TensorProto.FLOAT, domain=PY))  # graphkit's hooker is installed

    @onnx_op(op_type="GkTestForeignTimes10", inputs=[PyCustomOpDef.dt_float], outputs=[PyCustomOpDef.dt_float])
    def times10(x):
        if (x < 0).any():
            raise ValueError("foreign kernel refuses negatives")
        return x * 10

    node = helper.make_node("GkTestForeignTimes10", ["x"], ["y"], domain="ai.onnx.contrib", name="foreign")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.contrib", 1)], ir_version=10)
    x = np.array([1, 2, 3], np.float32)
    so = ort.SessionOptions()
    so.register_custom_ops_library(onnxruntime_extensions.get_library_path())
    raw = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(raw.run(None, {"x": x})[0], x * 10)
    session = open_session(model)  # ort-extensions' domains are served too
    np.testing.assert_array_equal(session.run({"x": x})["y"], x * 10)
    with pytest.raises(KernelError, match="foreign kernel refuses negatives") as exc:
        session.run({"x": -x})  # inside graphkit's run a foreign exception is caught as well
    assert exc.value.op == "ai.onnx.contrib::GkTestForeignTimes10"


def test_importing_ort_extensions_leaves_the_protobuf_backend_of_child_processes_alone():
    """onnxruntime_extensions sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python on import."""
    import subprocess
    import sys

    code = ("import os; from graphkit.runtime.python_kernels import python_kernel_table; "
            "python_kernel_table(); print(os.environ.get('PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION'))")
    env = {k: v for k, v in __import__("os").environ.items() if k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "None"


@pytest.mark.parametrize("first", ["", "import torch; "], ids=["bare", "torch-loaded"])
def test_python_kernel_sessions_do_not_import_torch_or_transformers(tmp_path, first):
    """onnxruntime-extensions would import torch (~1 s) and transformers (~0.9 s, also when
    torch is loaded, as in an export's load check) for converters Python kernels never use."""
    import subprocess
    import sys

    import onnx

    onnx.save(my_add_model(TensorProto.FLOAT, domain=PY), tmp_path / "m.onnx")
    script = (f"{first}import sys, numpy as np; from graphkit.runtime import open_session; "
              "s = open_session(sys.argv[1]); a = np.ones((2, 3), np.float32); "
              "print(s.run({'a': a, 'b': a})['z'].tolist(), 'torch' in sys.modules, 'transformers' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "m.onnx")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[[3.0,", "3.0,", "3.0],", "[3.0,", "3.0,", "3.0]]", str(bool(first)), "False"]
