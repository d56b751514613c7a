"""graphkit.export._opset_down: the dynamo exporter's opset-18 model brought down to an older
opset by onnx's version converter, with what the converter gets wrong fixed in every graph,
subgraph and model-local function."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphkit.export._opset_down import convert_down
from graphkit.rewrite._walk import node_lists

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT


def _split(x: str, outs: list[str], n: int) -> onnx.NodeProto:
    return helper.make_node("Split", [x], outs, axis=1, num_outputs=n)


def _model() -> onnx.ModelProto:
    """Opset 18; x: float[2, 7]. Split-18 into 3 (sizes 3, 3, 1) in the main graph, in an If
    branch and in a local function, which also has a ReduceMean-18:

        x ─ Split ─ a0 a1 a2 ─ Concat(a2, a0) ─> m                      (main graph)
        c ─ If ─> y     then: Split(x) ─ t0 t1 t2 ─ Concat(t2, t1) ─> t   else: Identity(x)
        x ─ local.tail ─> z     body: Split(u) ─ p0 p1 p2; ReduceMean(p0, axes=[1]) ─> r;
                                      Add(p2, r) ─> v
    """
    then = helper.make_graph([_split("x", ["t0", "t1", "t2"], 3), helper.make_node("Concat", ["t2", "t1"], ["t"], axis=1)],
                             "then", [], [helper.make_tensor_value_info("t", F, [2, 4])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, [2, 7])])
    axes = helper.make_node("Constant", [], ["ax"], value=helper.make_tensor("ax", TensorProto.INT64, [1], [1]))
    tail = helper.make_function(
        "local", "tail", ["u"], ["v"],
        [_split("u", ["p0", "p1", "p2"], 3), axes,
         helper.make_node("ReduceMean", ["p0", "ax"], ["r"], keepdims=1, noop_with_empty_axes=0),
         helper.make_node("Add", ["p2", "r"], ["v"])],
        [helper.make_opsetid("", 18)])
    tail.value_info.append(helper.make_tensor_value_info("u", F, [2, 7]))
    graph = helper.make_graph(
        [_split("x", ["a0", "a1", "a2"], 3), helper.make_node("Concat", ["a2", "a0"], ["m"], axis=1),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
         helper.make_node("tail", ["x"], ["z"], domain="local")],
        "g", [helper.make_tensor_value_info("x", F, [2, 7]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("m", F, [2, 4]), helper.make_tensor_value_info("y", F, [2, "w"]),
         helper.make_tensor_value_info("z", F, [2, 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
                             functions=[tail], ir_version=10)


def _expected(x: np.ndarray) -> dict[str, np.ndarray]:
    a0, a1, a2 = x[:, :3], x[:, 3:6], x[:, 6:]
    return {"m": np.concatenate([a2, a0], axis=1), "y": np.concatenate([a2, a1], axis=1),
            "z": a2 + a0.mean(axis=1, keepdims=True)}


def test_split_is_fixed_in_if_bodies_and_local_functions():
    x = np.arange(14, dtype=np.float32).reshape(2, 7)
    at18 = ort.InferenceSession(_model().SerializeToString()).run(None, {"x": x, "c": np.array(True)})
    assert all(np.allclose(g, w) for g, w in zip(at18, _expected(x).values()))  # the model is right at 18
    out = convert_down(_model(), 17)
    assert [(i.domain, i.version) for i in out.opset_import] == [("", 17), ("local", 1)]
    (fn,) = out.functions
    assert [(i.domain, i.version) for i in fn.opset_import] == [("", 17)]
    for nodes, _ in node_lists(out):
        for node in nodes:
            assert node.domain in ("", "local")
            assert "num_outputs" not in {a.name for a in node.attribute}, node
            assert "noop_with_empty_axes" not in {a.name for a in node.attribute}, node
    onnx.checker.check_model(out)
    got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x, "c": np.array(True)})
    for name, g, w in zip(("m", "y", "z"), got, _expected(x).values()):
        np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=name)


def test_a_split_of_unknown_length_is_left_for_the_load_check():
    model = _model()
    model.functions[0].ClearField("value_info")  # the body's Split no longer knows its length
    out = convert_down(model, 17)
    (split,) = [n for n in out.functions[0].node if n.op_type == "Split"]
    assert [a.name for a in split.attribute] == ["axis", "num_outputs"]
