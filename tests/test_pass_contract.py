"""The rewrite's pass contract (issue 28: one of each concept, a pass contract): each pass in
graphkit.rewrite.engine.PASSES declares the analyses it reads (``requires``) and those still
true after it changes the model (``keeps``), and its PassResult returns what else it broke
(``invalidates``); a later pass reads an analysis only where ``ctx.holds`` says it holds."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

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


def test_a_pass_reading_an_analysis_it_does_not_require_is_refused(monkeypatch):
    """``ctx.holds`` answers only for what the running pass declares: lowering declared
    without "counts" fails naming the pass and the analysis, not silently reads it."""
    from graphkit.errors import RewriteError
    from graphkit.rewrite import engine

    lowering = next(p for p in PASSES if p.name == "lower")
    trimmed = dataclasses.replace(lowering, requires=frozenset({"index"}))
    monkeypatch.setattr(engine, "PASSES", tuple(trimmed if p is lowering else p for p in PASSES))
    with pytest.raises(RewriteError, match="pass 'lower' reads the analysis 'counts' it does not require"):
        engine.rewrite_model(_my_add_model())


def _my_add_model(opset: int = 17) -> onnx.ModelProto:
    nodes = [helper.make_node("my_add", ["x", "x"], ["a"], domain="custom", name="add"),
             helper.make_node("ReduceSum", ["a", "axes"], ["s"], keepdims=1, name="sum"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1])],
                              [numpy_helper.from_array(np.array([1], np.int64), "axes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("custom", 1)],
                             ir_version=8)


@pytest.mark.parametrize("case", ["plain", "rule", "rule_and_up", "up", "down", "simplify", "gs_rule"])
def test_the_reported_op_counts_are_the_outputs_whichever_passes_ran(case):
    """The report's ops_after is derived from the "counts" analysis where it holds and counted
    where a pass broke it (rules that cannot count, a conversion making nodes, simplify, a
    graphsurgeon rule): either way it is the output's own counts, and ORT's values are 2x."""
    from graphkit.rewrite import Rule
    from graphkit.rewrite.graph.walk import count_ops
    from graphkit.rewrite.simplify import simplify_options

    relu_to_abs = Rule("relu_to_abs", lambda op, x: op.Relu(x), lambda op, x: op.Abs(x))

    def gs_neg(graph):
        for node in graph.nodes:
            if node.op == "Relu":
                node.op = "Abs"
                return 1
        return 0

    kwargs = {"plain": {}, "rule": {"rules": [relu_to_abs]}, "rule_and_up": {"rules": [relu_to_abs], "target_opset": 18},
              "up": {"target_opset": 18}, "down": {"target_opset": 12}, "simplify": {"simplify": simplify_options()},
              "gs_rule": {"rules": [GraphSurgeonRule("gs_neg", gs_neg)]}}[case]
    if case == "gs_rule":
        pytest.importorskip("onnx_graphsurgeon")
    out, report = rewrite_model(_my_add_model(), **kwargs)
    assert +report.ops_after == +count_ops(out), case
    x = np.float32([[1.0, -2.0, 3.0], [0.5, 0.25, -4.0]])
    summed = 3 * x.sum(1, keepdims=True)
    expected = np.abs(summed) if case in ("rule", "rule_and_up", "gs_rule") else np.maximum(summed, 0)
    np.testing.assert_allclose(run_ort(out, {"x": x})[0], expected, rtol=1e-6)
