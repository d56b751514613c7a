"""A pass that adds, removes or renames graph inputs and outputs (issue 28): Scope's
interface methods and GraphPass(main_only=True), on small models run in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import run_ort
from graphkit.errors import RewriteError
from graphkit.rewrite import GraphPass, Lowering, Rule, rewrite_model

F = TensorProto.FLOAT
X = np.float32([[-1.0, 0.5, 2.0]])


def model(nodes, inputs, outputs, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, F, s) for n, s in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def node(op, ins, outs, **kw):
    return helper.make_node(op, ins, outs, name=f"{op.lower()}_{outs[0]}", **kw)


def chain():
    """x -> Relu -> h -> Neg -> n -> Exp -> z (output);  x -> Abs -> y (output)"""
    return model([node("Relu", ["x"], ["h"]), node("Neg", ["h"], ["n"]), node("Exp", ["n"], ["z"]),
                  node("Abs", ["x"], ["y"])], [("x", [1, 3])], [("z", [1, 3]), ("y", [1, 3])])


def run(m, **feeds):
    return dict(zip([o.name for o in m.graph.output], run_ort(m, feeds)))


def interface(m):
    return [i.name for i in m.graph.input], [o.name for o in m.graph.output]


def test_isolate_a_subgraph():
    """h becomes an input, n the only output: what computes n from h is left."""
    def isolate(scope):
        scope.add_input("h")
        for name in scope.outputs:
            scope.remove_output(name)
        scope.add_output("n")
        scope.remove_input("x")  # nothing reads it once the rest is pruned
        return 1

    def isolate_and_prune(scope):
        scope.add_input("h")
        for name in scope.outputs:
            scope.remove_output(name)
        scope.add_output("n")
        removed = scope.prune()
        scope.remove_input("x")
        return removed

    with pytest.raises(RewriteError, match="remove_input: 'x' is read by node 'relu_h', node 'abs_y'"):
        rewrite_model(chain(), rules=[GraphPass("isolate", isolate, main_only=True)], lowering=Lowering.KEEP)
    out, report = rewrite_model(chain(), rules=[GraphPass("isolate", isolate_and_prune, main_only=True)],
                                lowering=Lowering.KEEP)
    assert report.rules.applied == {"isolate": 3}  # Relu, Exp and Abs pruned
    assert interface(out) == (["h"], ["n"]) and [n.op_type for n in out.graph.node] == ["Neg"]
    assert [d.dim_value for d in out.graph.input[0].type.tensor_type.shape.dim] == [1, 3]
    np.testing.assert_allclose(run(out, h=X)["n"], -X)


def test_rename_an_output_and_an_input():
    def rename(scope):
        scope.rename("z", "logits")
        scope.rename("x", "pixels")
        scope.rename("h", "hidden")  # an inner tensor: its producer and readers
        return 3

    out, report = rewrite_model(chain(), rules=[GraphPass("rename", rename, main_only=True)], lowering=Lowering.KEEP)
    assert interface(out) == (["pixels"], ["logits", "y"])
    assert [(list(n.input), list(n.output)) for n in out.graph.node][:2] == [(["pixels"], ["hidden"]),
                                                                            (["hidden"], ["n"])]
    want = run(chain(), x=X)
    got = run(out, pixels=X)
    np.testing.assert_allclose(got["logits"], want["z"])
    np.testing.assert_allclose(got["y"], want["y"])
    # a name the model has is refused, and so is one it has not
    for old, new, message in (("z", "y", "'y' is already a tensor of this graph"),
                              ("nothing", "w", "no tensor 'nothing' in this graph")):
        with pytest.raises(RewriteError, match=message):
            rewrite_model(chain(), rules=[GraphPass("bad", lambda s, o=old, n=new: s.rename(o, n) or 1,
                                                    main_only=True)], lowering=Lowering.KEEP)


def test_remove_an_unused_input_and_outputs_of_a_subgraph_read_outer_names():
    """mask is unused: removed. A name an If branch reads from outside is renamed there too."""
    branch = helper.make_graph([helper.make_node("Neg", ["h"], ["b"], name="neg_b")], "then", [],
                               [helper.make_tensor_value_info("b", F, [1, 3])])
    other = helper.make_graph([helper.make_node("Identity", ["h"], ["e"], name="id_e")], "else", [],
                              [helper.make_tensor_value_info("e", F, [1, 3])])
    m = model([node("Relu", ["x"], ["h"]), helper.make_node("If", ["c"], ["y"], then_branch=branch,
                                                             else_branch=other, name="if")],
              [("x", [1, 3]), ("mask", [1, 3])], [("y", [1, 3])])
    m.graph.input.insert(1, helper.make_tensor_value_info("c", TensorProto.BOOL, []))

    def tidy(scope):
        scope.remove_input("mask")
        scope.rename("h", "hidden")
        return 2

    out, report = rewrite_model(m, rules=[GraphPass("tidy", tidy, main_only=True)], lowering=Lowering.KEEP)
    assert report.rules.applied == {"tidy": 2}
    assert interface(out) == (["x", "c"], ["y"])
    assert [n.input[0] for g in (out.graph.node[1].attribute[0].g, out.graph.node[1].attribute[1].g)
            for n in g.node] == ["hidden", "hidden"]
    for cond in (True, False):
        got = run(out, x=X, c=np.array(cond))["y"]
        np.testing.assert_allclose(got, -np.maximum(X, 0) if cond else np.maximum(X, 0))


def test_interface_edits_are_the_main_graphs_only():
    """Without main_only the pass also runs in the If branches, where the interface is the
    If node's: adding or removing there is an error naming the method."""
    branch = helper.make_graph([helper.make_node("Neg", ["x"], ["b"], name="neg_b")], "then", [],
                               [helper.make_tensor_value_info("b", F, [1, 3])])
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch, name="if")],
              [("x", [1, 3])], [("y", [1, 3])])
    m.graph.input.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    seen = []

    def add(scope):
        seen.append(scope.main)
        scope.add_output("c")
        return 1

    with pytest.raises(RewriteError, match="add_output: only the main graph's interface can change"):
        rewrite_model(m, rules=[GraphPass("add", add)], lowering=Lowering.KEEP)
    seen.clear()
    out, report = rewrite_model(m, rules=[GraphPass("add", add, main_only=True)], lowering=Lowering.KEEP)
    assert seen == [True] and interface(out) == (["x", "c"], ["y", "c"])
    assert out.graph.output[1].type.tensor_type.elem_type == TensorProto.BOOL  # from the input's type


def test_an_added_output_or_input_needs_a_known_type():
    def add(scope):
        scope.add_output("q")
        return 1

    m = model([helper.make_node("my_op", ["x"], ["q"], domain="acme", name="mine"), node("Neg", ["q"], ["y"])],
              [("x", [1, 3])], [("y", [1, 3])])
    m.opset_import.append(helper.make_opsetid("acme", 1))
    with pytest.raises(RewriteError, match="the element type of 'q' is unknown"):
        rewrite_model(m, rules=[GraphPass("add", add, main_only=True)], lowering=Lowering.KEEP)

    def typed(scope):
        scope.add_output("q", elem_type=TensorProto.FLOAT, shape=[1, 3])
        return 1

    out, _ = rewrite_model(m, rules=[GraphPass("add", typed, main_only=True)], lowering=Lowering.KEEP, check=False)
    assert interface(out) == (["x"], ["y", "q"])


def test_rules_and_interface_passes_run_together():
    """A rule rewrites, then the pass renames the rule's output tensor (passes run first in a
    round; the rule's round after the rename sees the new name)."""
    fold = Rule("neg_neg", lambda op, x: op.Neg(op.Neg(x)), lambda op, x: op.Identity(x))
    m = model([node("Neg", ["x"], ["a"]), node("Neg", ["a"], ["y"])], [("x", [1, 3])], [("y", [1, 3])])
    out, report = rewrite_model(m, rules=[GraphPass("name_it", lambda s: s.rename("y", "same") or 1, main_only=True),
                                          fold], lowering=Lowering.KEEP)
    assert report.rules.applied == {"name_it": 1, "neg_neg": 1}
    assert interface(out) == (["x"], ["same"])
    np.testing.assert_allclose(run(out, x=X)["same"], X)
    onnx.checker.check_model(out, full_check=True)


def test_prune_runs_in_every_scope():
    """prune() keeps what the graph's (or the function's) outputs need, in every scope."""
    fn = helper.make_function("local", "f", ["a"], ["b"],
                              [helper.make_node("Neg", ["a"], ["b"]), helper.make_node("Exp", ["a"], ["dead_f"])],
                              [helper.make_opsetid("", 17)])
    m = model([helper.make_node("f", ["x"], ["y"], domain="local", name="call"), node("Abs", ["x"], ["dead"])],
              [("x", [1, 3])], [("y", [1, 3])])
    m.opset_import.append(helper.make_opsetid("local", 1))
    m.functions.append(fn)
    out, report = rewrite_model(m, rules=[GraphPass("prune", lambda scope: scope.prune())], lowering=Lowering.KEEP)
    assert report.rules.applied == {"prune": 2}
    assert [n.op_type for n in out.graph.node] == ["f"] and [n.op_type for n in out.functions[0].node] == ["Neg"]
    np.testing.assert_allclose(run(out, x=X)["y"], -X)
