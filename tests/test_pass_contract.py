"""The rewrite's pass contract (issue 28: one of each concept, a pass contract): each pass in
graphkit.rewrite.engine.PASSES declares the analyses it reads (``requires``) and those still
true after it changes the model (``keeps``), and its PassResult returns what else it broke
(``invalidates``); a later pass reads an analysis only where ``ctx.holds`` says it holds."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import run_ort
from graphkit.rewrite import GraphSurgeonRule, rewrite_model
from graphkit.rewrite.engine import PASSES
from graphkit.rewrite.passes.base import ANALYSES


def test_every_pass_is_named_once_and_declares_known_analyses():
    names = [p.name for p in PASSES]
    assert len(names) == len(set(names)), names
    for p in PASSES:
        assert p.requires <= ANALYSES and p.keeps <= ANALYSES, (p.name, p.requires, p.keeps)


def _relu_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                               helper.make_node("Neg", ["r"], ["y"], name="neg")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_a_pass_that_keeps_nothing_leaves_no_stale_index():
    """A graphsurgeon rule rebuilds the model (it keeps no analysis) and writes a placeholder,
    custom::my_add(x, x): lowering, after it, finds that node in the rebuilt model (not in
    the input's index) and lowers it; ORT gives -(2x + x)."""
    pytest.importorskip("onnx_graphsurgeon")

    def relu_to_my_add(graph):
        for node in graph.nodes:
            if node.op == "Relu":
                node.op, node.domain = "my_add", "custom"
                node.inputs = [node.inputs[0], node.inputs[0]]
                return 1
        return 0

    model = _relu_model()
    out, report = rewrite_model(model, rules=[GraphSurgeonRule("relu_to_my_add", relu_to_my_add)])
    assert report.rules.applied == {"relu_to_my_add": 1}
    assert [name for name, _ in report.passes][:2] == ["graphsurgeon-rules", "lower"]
    assert dict(report.actions) == {("custom::my_add", "decompose:mul_add"): 1}
    assert "custom" not in {n.domain for n in out.graph.node}
    x = np.float32([-1.5, 0.0, 2.0])
    np.testing.assert_allclose(run_ort(out, {"x": x})[0], -(2 * x + x), rtol=1e-6)
