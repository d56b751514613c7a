"""graphkit.rewrite._walk: the one model walk and the one "value -> type" map built on it."""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphkit.rewrite._walk import elem_types, value_types


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


def test_value_types_reads_subgraphs_and_initializers():
    types = value_types(_if_model())
    assert types["t"].tensor_type.elem_type == TensorProto.FLOAT  # inferred inside the If body
    assert [d.dim_value for d in types["w"].tensor_type.shape.dim] == [3]
    assert elem_types(_if_model()) == {"x": TensorProto.FLOAT, "c": TensorProto.BOOL, "y": TensorProto.FLOAT,
                                       "w": TensorProto.INT64, "t": TensorProto.FLOAT, "e": TensorProto.FLOAT}
    assert "t" not in value_types(_if_model(), infer=False)  # what the model states only


class _BrokenSchemas:
    """A registry whose schemas make inference fail."""

    @contextlib.contextmanager
    def onnx_schemas(self):
        raise onnx.shape_inference.InferenceError("[custom::x] broken schema")
        yield


def test_value_types_falls_back_to_the_stated_types_when_inference_fails():
    assert elem_types(_if_model(), _BrokenSchemas()) == {"x": TensorProto.FLOAT, "c": TensorProto.BOOL,
                                                         "y": TensorProto.FLOAT, "w": TensorProto.INT64}
