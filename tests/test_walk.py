"""graphkit.rewrite.graph.walk: the one model walk and the one "value -> type" map built on it."""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphkit.rewrite.graph.walk import elem_types, value_types


def _if_model() -> onnx.ModelProto:
    """x (float[2]) -> If(c) { then: t = Neg(x) } -> y; w is an int64 initializer.

        x ──> If ──> y        then: x ──> Neg ──> t
        c ──┘                 else: x ──> Identity ──> e
    """
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.UNDEFINED, None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.UNDEFINED, None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros((3,), np.int64), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _branches(node: onnx.NodeProto) -> tuple[onnx.GraphProto, onnx.GraphProto]:
    attrs = {a.name: a.g for a in node.attribute}
    return attrs["then_branch"], attrs["else_branch"]


def test_value_types_reads_subgraphs_and_initializers():
    model = _if_model()
    types = value_types(model)
    then, other = _branches(model.graph.node[0])
    assert types.scope(then)["t"].tensor_type.elem_type == TensorProto.FLOAT  # inferred inside the If body
    assert [d.dim_value for d in types["w"].tensor_type.shape.dim] == [3]
    every = {"x": TensorProto.FLOAT, "c": TensorProto.BOOL, "y": TensorProto.FLOAT, "w": TensorProto.INT64,
             "t": TensorProto.FLOAT, "e": TensorProto.FLOAT}
    elems = elem_types(model)
    assert not elems.per_scope  # no two graphs define a name: one map serves every scope
    assert dict(elems) == dict(elems.scope(then)) == dict(elems.scope(other)) == every
    assert "t" not in value_types(model, infer=False).scope(then)  # what the model states only


def _siblings_model() -> onnx.ModelProto:
    """Two If nodes whose branches each define "v", with their own element type:

        x (float) ─> If(c) ─> f     then: Identity(x) ─> v (float)   else: Cast(x) ─> v (float)
        h (f16)   ─> If(c) ─> g     then: Identity(h) ─> v (f16)     else: Identity(h) ─> w (f16)
    """
    def branch(nodes, out, elem):
        return helper.make_graph(nodes, "b", [], [helper.make_tensor_value_info(out, elem, [2])])

    first = helper.make_node(
        "If", ["c"], ["f"], then_branch=branch([helper.make_node("Identity", ["x"], ["v"])], "v", TensorProto.FLOAT),
        else_branch=branch([helper.make_node("Cast", ["x"], ["v"], to=TensorProto.FLOAT)], "v", TensorProto.FLOAT))
    second = helper.make_node(
        "If", ["c"], ["g"], then_branch=branch([helper.make_node("Identity", ["h"], ["v"])], "v", TensorProto.FLOAT16),
        else_branch=branch([helper.make_node("Identity", ["h"], ["w"])], "w", TensorProto.FLOAT16))
    graph = helper.make_graph(
        [first, second], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("h", TensorProto.FLOAT16, [2]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("f", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("g", TensorProto.FLOAT16, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_sibling_graphs_keep_their_own_type_for_a_reused_name():
    model = _siblings_model()
    onnx.checker.check_model(model, full_check=True)  # sibling reuse is valid ONNX
    then1, else1 = _branches(model.graph.node[0])
    then2, else2 = _branches(model.graph.node[1])
    for infer in (False, True):
        types = value_types(model, infer=infer)
        assert types.per_scope and "v" not in types
        assert types.scope(then1)["v"].tensor_type.elem_type == TensorProto.FLOAT
        assert types.scope(else1)["v"].tensor_type.elem_type == TensorProto.FLOAT
        assert types.scope(then2)["v"].tensor_type.elem_type == TensorProto.FLOAT16
        assert types.scope(else2)["h"] is types["h"] and "v" not in types.scope(else2)
    other = _siblings_model()
    with pytest.raises(KeyError, match="not a graph of this model"):
        value_types(model).scope(other.graph.node[0].attribute[0].g)


class _BrokenSchemas:
    """A registry whose schemas make inference fail."""

    @contextlib.contextmanager
    def onnx_schemas(self):
        raise onnx.shape_inference.InferenceError("[custom::x] broken schema")
        yield


def test_value_types_falls_back_to_the_stated_types_when_inference_fails():
    assert dict(elem_types(_if_model(), _BrokenSchemas())) == {"x": TensorProto.FLOAT, "c": TensorProto.BOOL,
                                                         "y": TensorProto.FLOAT, "w": TensorProto.INT64}
