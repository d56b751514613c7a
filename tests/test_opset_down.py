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


def _ref(name: str, ref: str) -> onnx.AttributeProto:
    attr = onnx.AttributeProto(name=name, ref_attr_name=ref, type=onnx.AttributeProto.INT)
    return attr


def _attribute_model() -> onnx.ModelProto:
    """Opset 18; x: float[3, 3]. Functions that read their caller's attribute values:

        local.pick(u; ax):  Gather(u, [1], axis=@ax) ─ ReduceSum(axes=[0]) ─> s     (a Gather in an If
                            branch: the reference sits in a nested graph)
        local.outer(w; bx): pick(w; ax=@bx) ─ Neg ─> n                             (passes its attribute on)
        local.plain(q):     ReduceSum-18 with noop_with_empty_axes=0 ─> r        (no references: stays a function)
        main: pick(x; ax=1) ─> p, outer(x; bx=1) ─> o, plain(x) ─> r

    ax=1 is not the default (0): a converter that loses the reference gives x[1, :] sums."""
    one = helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.INT64, [1], [1]))
    zero = helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [1], [0]))
    gather = helper.make_node("Gather", ["u", "one"], ["g"])
    gather.attribute.append(_ref("axis", "ax"))
    branch = helper.make_graph([gather], "then", [], [helper.make_tensor_value_info("g", F, ["a", "b"])])
    other = helper.make_graph([helper.make_node("Identity", ["u"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, ["a", "b"])])
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))
    pick = helper.make_function(
        "local", "pick", ["u"], ["s"],
        [one, zero, cond, helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other),
         helper.make_node("ReduceSum", ["y", "zero"], ["s"], keepdims=0)],
        [helper.make_opsetid("", 18)], attributes=["ax"])
    call = helper.make_node("pick", ["w"], ["t"], domain="local")
    call.attribute.append(_ref("ax", "bx"))
    outer = helper.make_function("local", "outer", ["w"], ["n"], [call, helper.make_node("Neg", ["t"], ["n"])],
                                 [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)], attributes=["bx"])
    plain = helper.make_function(
        "local", "plain", ["q"], ["r"],
        [zero, helper.make_node("ReduceSum", ["q", "zero"], ["r"], keepdims=0, noop_with_empty_axes=0)],
        [helper.make_opsetid("", 18)])
    graph = helper.make_graph(
        [helper.make_node("pick", ["x"], ["p"], domain="local", ax=1),
         helper.make_node("outer", ["x"], ["o"], domain="local", bx=1),
         helper.make_node("plain", ["x"], ["r"], domain="local")],
        "g", [helper.make_tensor_value_info("x", F, [3, 3])],
        [helper.make_tensor_value_info(n, F, ["n"]) for n in ("p", "o", "r")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
                             functions=[pick, outer, plain], ir_version=10)


def test_a_function_reading_its_callers_attribute_keeps_the_callers_value():
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    at18 = ort.InferenceSession(_attribute_model().SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(at18[0], [x[:, 1].sum()])  # axis=1 taken from the call
    out = convert_down(_attribute_model(), 17)
    got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x})
    for name, g, w in zip(("p", "o", "r"), got, at18):
        np.testing.assert_array_equal(g, w, err_msg=name)
    assert [fn.name for fn in out.functions] == ["plain"]  # the referring ones are inlined
    for nodes, _ in node_lists(out):
        assert not any(a.ref_attr_name for node in nodes for a in node.attribute)
    onnx.checker.check_model(out)


def test_the_split_sizes_constant_takes_a_name_nothing_else_has():
    """x: float[2, 7] split unevenly by a node named "s"; the model already has a tensor named
    "s_split_sizes" (an input) and two Splits named "s" (one in an If branch)."""
    then = helper.make_graph([helper.make_node("Split", ["x"], ["t0", "t1", "t2"], name="s", axis=1, num_outputs=3)],
                             "then", [], [helper.make_tensor_value_info("t2", F, [2, 1])])
    other = helper.make_graph([helper.make_node("Identity", ["w"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, [2, 1])])
    graph = helper.make_graph(
        [helper.make_node("Split", ["x"], ["a0", "a1", "a2"], name="s", axis=1, num_outputs=3),
         helper.make_node("Add", ["a2", "s_split_sizes"], ["m"]),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        "g", [helper.make_tensor_value_info("x", F, [2, 7]), helper.make_tensor_value_info("s_split_sizes", F, [2, 1]),
              helper.make_tensor_value_info("w", F, [2, 1]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("m", F, [2, 1]), helper.make_tensor_value_info("y", F, [2, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    out = convert_down(model, 17)
    made = [n.output[0] for nodes, _ in node_lists(out) for n in nodes if n.op_type == "Constant"]
    assert len(made) == 2 and len(set(made)) == 2 and "s_split_sizes" not in made, made
    onnx.checker.check_model(out)
    x = np.arange(14, dtype=np.float32).reshape(2, 7)
    feeds = {"x": x, "s_split_sizes": np.full((2, 1), 10, np.float32), "w": np.zeros((2, 1), np.float32),
             "c": np.array(True)}
    m, y = ort.InferenceSession(out.SerializeToString()).run(None, feeds)
    np.testing.assert_array_equal(m, x[:, 6:] + 10)
    np.testing.assert_array_equal(y, x[:, 6:])
