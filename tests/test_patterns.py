"""The pattern language of issue 13: each feature on a small inline model, with ORT on the
original vs the rewritten model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import run_ort
from graphkit.errors import RewriteError
from graphkit.rewrite import (
    GraphPass,
    Lowering,
    MatchResult,
    Rule,
    RuleSet,
    const,
    either,
    optional,
    rewrite_model,
)

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, initializers=(), opset=17, value_info=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
                              initializer=list(initializers), value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def init(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32) if not isinstance(value, np.ndarray) else value, name)


def node(op, ins, outs, **kw):
    return helper.make_node(op, ins, outs, name=f"{op.lower()}_{outs[0]}", **kw)


def check_numbers(a, b, rtol=1e-5, atol=1e-5):
    rng = np.random.default_rng(0)
    x = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
         for i in a.graph.input}
    onnx.checker.check_model(b, full_check=True)
    for want, got in zip(run_ort(a, x), run_ort(b, x)):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def ops(m):
    return [n.op_type for n in m.graph.node]


# ---------------------------------------------------------------- DAG patterns

def layernorm_model(eps_as_constant=True):
    """
    x -> ReduceMean -> m;  d = Sub(x, m)   (d feeds Pow and Div: a shared value)
    d -> Pow(., 2) -> ReduceMean -> Add(., eps) -> Sqrt -> s;  Div(d, s) -> Mul(., g) -> Add(., b) -> y
    """
    nodes = [node("ReduceMean", ["x"], ["m"], axes=[-1]),
             node("Sub", ["x", "m"], ["d"]),
             node("Pow", ["d", "two"], ["p"]),
             node("ReduceMean", ["p"], ["v"], axes=[-1]),
             node("Add", ["v", "eps"], ["ve"]),
             node("Sqrt", ["ve"], ["s"]),
             node("Div", ["d", "s"], ["n"]),
             node("Mul", ["n", "g"], ["ng"]),
             node("Add", ["ng", "b"], ["y"])]
    inits = [init("two", 2.0), init("g", np.linspace(0.5, 1.5, 8).astype(np.float32)),
             init("b", np.linspace(-1, 1, 8).astype(np.float32))]
    if eps_as_constant:
        nodes.insert(0, helper.make_node("Constant", [], ["eps"], value=init("eps_t", 1e-5), name="eps_c"))
    else:
        inits.append(init("eps", 1e-5))
    return model(nodes, [("x", [2, 3, 8])], [("y", [2, 3, 8])], inits)


def layernorm_rule():
    def pattern(op, x, eps, g, b, axes):
        d = op.Sub(x, op.ReduceMean(x, axes=axes))
        var = op.ReduceMean(op.Pow(d, 2.0), axes=axes)
        return op.Add(op.Mul(op.Div(d, op.Sqrt(op.Add(var, const(eps)))), g), b)

    def check(ctx, x, eps, g, b, axes):
        if list(axes) != [-1] and list(axes) != [ctx.rank(x) - 1]:
            return MatchResult().fail(f"normalises axes {axes}, not the last")
        return MatchResult()

    def rewrite(op, x, eps, g, b, axes):
        return op.LayerNormalization(x, g, b, axis=-1, epsilon=float(eps))

    return Rule("layernorm", pattern, rewrite, check=check, commute=True)


@pytest.mark.parametrize("eps_as_constant", [True, False])
def test_dag_pattern_with_a_shared_value_and_constant_capture(eps_as_constant):
    m = layernorm_model(eps_as_constant)
    out, report = rewrite_model(m, rules=[layernorm_rule()], lowering=Lowering.KEEP)
    assert report.rules.applied == {"layernorm": 1}
    assert ops(out) == ["LayerNormalization"]
    eps = [a.f for a in out.graph.node[0].attribute if a.name == "epsilon"]
    assert np.isclose(eps[0], 1e-5)
    assert [t.name for t in out.graph.initializer] == ["g", "b"]  # two and eps pruned
    check_numbers(m, out)


def test_shared_value_used_outside_the_pattern_is_not_swallowed():
    m = layernorm_model()
    m.graph.node.append(node("Neg", ["d"], ["nd"]))
    m.graph.output.append(helper.make_tensor_value_info("nd", F, [2, 3, 8]))
    out, report = rewrite_model(m, rules=[layernorm_rule()], lowering=Lowering.KEEP)
    assert report.rules.applied.get("layernorm", 0) == 0
    assert any("output 'd' has other consumers" in r for r in report.rules.reasons["layernorm"])


def test_a_variable_in_two_nodes_is_one_tensor():
    """GELU (erf form): x feeds both Mul and Div."""
    def pattern(op, x):
        return op.Mul(op.Mul(x, 0.5), op.Add(op.Erf(op.Div(x, 1.4142135381698608)), 1.0))

    gelu = Rule("gelu", pattern, lambda op, x: op.Gelu(x), commute=True)
    nodes = [node("Div", ["x", "sqrt2"], ["q"]), node("Erf", ["q"], ["e"]), node("Add", ["one", "e"], ["a"]),
             node("Mul", ["half", "x"], ["h"]), node("Mul", ["a", "h"], ["y"])]
    inits = [init("sqrt2", np.sqrt(2)), init("one", 1.0), init("half", 0.5)]
    m = model(nodes, [("x", [4, 5])], [("y", [4, 5])], inits, opset=20)
    out, report = rewrite_model(m, rules=[gelu], lowering=Lowering.KEEP)
    assert ops(out) == ["Gelu"] and not out.graph.initializer
    check_numbers(m, out)
    # x in Div is another tensor than x in Mul: no match
    other = model([node("Div", ["z", "sqrt2"], ["q"]), *nodes[1:]], [("x", [4, 5]), ("z", [4, 5])],
                  [("y", [4, 5])], inits, opset=20)
    _, report = rewrite_model(other, rules=[gelu], lowering=Lowering.KEEP)
    assert not report.rules.applied.get("gelu")
    assert "node 'mul_y': node 'div_q': 'x' would be both 'x' and 'z'" in report.rules.reasons["gelu"]
    assert "  1x no match: 'x' would be two different tensors" in report.rules.explain()


# ---------------------------------------------------------------- several outputs and roots

def test_multi_root_pattern_two_slices_become_one_split():
    """
         x (4, 6)
        /        \\
    Slice[0:3]  Slice[3:6]   (axis 1)       ->   Split(x, [3, 3], axis=1)
       |           |
      Relu        Neg
    """
    nodes = [node("Slice", ["x", "s0", "e0", "ax"], ["lo"]), node("Relu", ["lo"], ["r"]),
             node("Slice", ["x", "s1", "e1", "ax"], ["hi"]), node("Neg", ["hi"], ["n"])]
    inits = [numpy_helper.from_array(np.array([v], np.int64), k)
             for k, v in (("s0", 0), ("e0", 3), ("s1", 3), ("e1", 6), ("ax", 1))]
    m = model(nodes, [("x", [4, 6])], [("r", [4, 3]), ("n", [4, 3])], inits)

    def pattern(op, x, a0, b0, a1, b1, axis):
        return op.Slice(x, const(a0), const(b0), const(axis)), op.Slice(x, const(a1), const(b1), const(axis))

    def check(ctx, x, a0, b0, a1, b1, axis):
        shape = ctx.shape(x)
        ok = a0[0] == 0 and b0[0] == a1[0] and shape is not None and b1[0] == shape[int(axis[0])]
        return MatchResult() if ok else MatchResult().fail("slices do not tile the axis")

    def rewrite(op, x, a0, b0, a1, b1, axis):
        sizes = op.initializer(np.array([b0[0] - a0[0], b1[0] - a1[0]], np.int64), name="split")
        return op.Split(x, sizes, axis=int(axis[0]), _outputs=2)

    out, report = rewrite_model(m, rules=[Rule("slices_to_split", pattern, rewrite, check=check)],
                                lowering=Lowering.KEEP)
    assert report.rules.applied == {"slices_to_split": 1}
    assert ops(out) == ["Split", "Relu", "Neg"]
    assert [t.name for t in out.graph.initializer] == ["slice_lo/split"]
    check_numbers(m, out)


def test_output_selection_on_a_multi_output_inner_node():
    """-TopK(x, k).values == TopK(-x, k, largest=0).values; the pattern names output 0, and
    output 1 (indices) must be unused."""
    nodes = [node("TopK", ["x", "k"], ["vals", "idx"], axis=-1), node("Neg", ["vals"], ["y"])]
    m = model(nodes, [("x", [3, 5])], [("y", [3, 2])], [numpy_helper.from_array(np.array([2], np.int64), "k")])

    def rewrite(op, x, k):
        return op.TopK(op.Neg(x), k, axis=-1, largest=0, _outputs=2)[0]

    rule = Rule("neg_topk", lambda op, x, k: op.Neg(op.TopK(x, k, largest=1, _outputs=2)[0]), rewrite)
    out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    assert report.rules.applied == {"neg_topk": 1}
    assert ops(out) == ["Neg", "TopK"]
    check_numbers(m, out)
    wrong = Rule("neg_topk_idx", lambda op, x, k: op.Neg(op.TopK(x, k, _outputs=2)[1]), rewrite)
    _, report = rewrite_model(m, rules=[wrong], lowering=Lowering.KEEP)
    assert "TopK output 1 is not the one used" in report.rules.explain()
    m.graph.output.append(helper.make_tensor_value_info("idx", TensorProto.INT64, [3, 2]))
    _, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    assert "output 'idx' has other consumers" in report.rules.reasons["neg_topk"][0]


# ---------------------------------------------------------------- alternatives, optional, variadic

def test_either_inside_a_pattern_and_a_list_of_patterns():
    """Relu6 written as Clip(x, 0, 6) or Min(Max(x, 0), 6); and, as a second pattern, HardTanh-ish Clip(x, -1, 1)."""
    nodes = [node("Clip", ["x", "zero", "six"], ["a"]), node("Max", ["x", "zero"], ["mx"]),
             node("Min", ["mx", "six"], ["b"]), node("Clip", ["x", "m1", "one"], ["c"])]
    inits = [init("zero", 0.0), init("six", 6.0), init("m1", -1.0), init("one", 1.0)]
    m = model(nodes, [("x", [8])], [("a", [8]), ("b", [8]), ("c", [8])], inits)

    def relu6(op, x):
        return either(op.Clip(x, 0.0, 6.0), op.Min(op.Max(x, 0.0), 6.0))

    def wrapped(op, x):  # either() at the root: a pattern list instead
        return op.Min(op.Max(x, 0.0), 6.0)

    def clip6(op, x):
        return op.Clip(x, 0.0, 6.0)

    def hardtanh(op, x):
        return op.Clip(x, -1.0, 1.0)

    def rewrite(op, x):
        return op.Min(op.Relu(x), op.initializer(np.float32(6.0)))

    for rule in (Rule("relu6", relu6, rewrite), Rule("relu6", [clip6, wrapped], rewrite)):
        out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
        assert report.rules.applied == {"relu6": 2}
        assert ops(out) == ["Relu", "Min", "Relu", "Min", "Clip"]
        check_numbers(m, out)
    with pytest.raises(RewriteError, match="pattern must return an op"):
        Rule("bad", lambda op, x: either(x, op.Relu(x)), rewrite)
    out, report = rewrite_model(m, rules=[Rule("hardtanh", hardtanh, lambda op, x: op.hardtanh(x, _domain="custom"))],
                                lowering=Lowering.KEEP)
    assert ops(out) == ["Clip", "Max", "Min", "hardtanh"]

    def inner(op, x, y):  # either() below the root: relu(x) + y, written two ways
        return op.Add(either(op.Relu(x), op.Max(x, 0.0)), y)

    def as_sub(op, x, y):  # y - min(-x, 0)
        return op.Sub(y, op.Min(op.Neg(x), op.initializer(np.float32(0.0))))

    n2 = [node("Relu", ["x"], ["r"]), node("Add", ["r", "x"], ["p"]),
          node("Max", ["x", "zero"], ["c"]), node("Add", ["x", "c"], ["q"])]
    m2 = model(n2, [("x", [8])], [("p", [8]), ("q", [8])], inits[:1])
    out, report = rewrite_model(m2, rules=[Rule("either_add", inner, as_sub, commute=True)], lowering=Lowering.KEEP)
    assert report.rules.applied == {"either_add": 2}
    assert ops(out) == ["Neg", "Min", "Sub"] * 2
    check_numbers(m2, out)


def test_optional_input_conv_with_and_without_bias():
    rng = np.random.default_rng(1)
    w = init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    bias = init("bias", rng.standard_normal(4).astype(np.float32))
    nodes = [node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1]), node("Relu", ["c1"], ["y1"]),
             node("Conv", ["x", "w", "bias"], ["c2"], pads=[1, 1, 1, 1]), node("Relu", ["c2"], ["y2"])]
    m = model(nodes, [("x", [1, 3, 5, 5])], [("y1", [1, 4, 5, 5]), ("y2", [1, 4, 5, 5])], [w, bias])
    seen = []

    def pattern(op, x, w, b, pads):
        return op.Relu(op.Conv(x, w, optional(b), pads=pads))

    def rewrite(op, x, w, b, pads):
        seen.append(b)
        conv = op.Conv(x, w, b, pads=pads) if b is not None else op.Conv(x, w, pads=pads)
        return op.Clip(conv, op.constant(0.0, dtype=F))

    out, report = rewrite_model(m, rules=[Rule("conv_relu", pattern, rewrite)], lowering=Lowering.KEEP)
    assert report.rules.applied == {"conv_relu": 2} and seen == [None, "bias"]
    assert ops(out).count("Clip") == 2
    check_numbers(m, out)


def test_variadic_inputs():
    """Concat(*xs) -> Relu: any number of inputs, handed to rewrite as a list."""
    nodes = [node("Concat", ["a", "b", "c"], ["k"], axis=0), node("Relu", ["k"], ["y"]),
             node("Concat", ["a", "b"], ["k2"], axis=0), node("Relu", ["k2"], ["y2"])]
    m = model(nodes, [("a", [2]), ("b", [2]), ("c", [2])], [("y", [6]), ("y2", [4])])
    counts = []

    def pattern(op, *xs):
        return op.Relu(op.Concat(*xs, axis=0))

    def rewrite(op, *xs):
        counts.append(len(xs))
        return op.Concat(*[op.Relu(x) for x in xs], axis=0)

    out, report = rewrite_model(m, rules=[Rule("push_relu", pattern, rewrite)], lowering=Lowering.KEEP)
    assert report.rules.applied == {"push_relu": 2} and counts == [3, 2]
    check_numbers(m, out)


# ---------------------------------------------------------------- attributes, shapes, dtypes

def test_attribute_capture_and_shape_dtype_in_check():
    """Transpose(perm) pairs that cancel; check reads the dtype and rank from value_info."""
    nodes = [node("Transpose", ["x"], ["t1"], perm=[0, 2, 1]), node("Transpose", ["t1"], ["t2"], perm=[0, 2, 1]),
             node("Relu", ["t2"], ["y"])]
    m = model(nodes, [("x", [2, 3, 4])], [("y", [2, 3, 4])],
              value_info=[helper.make_tensor_value_info("t1", F, [2, 4, 3])])
    seen = {}

    def pattern(op, x, p1, p2):
        return op.Transpose(op.Transpose(x, perm=p1), perm=p2)

    def check(ctx, x, p1, p2):
        seen.update(dtype=ctx.dtype(x), rank=ctx.rank(x), inner=ctx.shape(ctx.nodes[1].output[0]), opset=ctx.opset,
                    producer=ctx.producer(ctx.nodes[1].output[0]).name, x_producer=ctx.producer(x))
        if [p1[i] for i in p2] != list(range(len(p1))):
            return MatchResult().fail(f"perm {p1} then {p2} is no identity")
        return MatchResult()

    out, report = rewrite_model(m, rules=[Rule("cancel_transposes", pattern, lambda op, x, p1, p2: x, check=check)],
                                lowering=Lowering.KEEP)
    assert report.rules.applied == {"cancel_transposes": 1}
    assert seen == {"dtype": F, "rank": 3, "inner": [2, 4, 3], "opset": 17, "producer": "transpose_t1",
                    "x_producer": None}
    assert ops(out) == ["Relu"] and list(out.graph.node[0].input) == ["x"]  # removed for real: no Identity
    check_numbers(m, out)


def test_removal_keeps_graph_output_names_with_one_identity():
    nodes = [node("Identity", ["x"], ["i1"]), node("Relu", ["i1"], ["r"]), node("Identity", ["r"], ["y"])]
    m = model(nodes, [("x", [3])], [("y", [3])])
    rule = Rule.node("drop_identity", "Identity", lambda op, x0: x0)
    out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    # the first goes for real; the second produces the graph output 'y' and stays
    assert ops(out) == ["Relu", "Identity"] and list(out.graph.node[0].input) == ["x"]
    assert [o.name for o in out.graph.output] == ["y"]
    assert report.rules.applied == {"drop_identity": 1}  # the kept one does not count again
    assert "the replacement is the matched node itself (output 'y' keeps its name)" in report.rules.reasons[
        "drop_identity"][0]
    check_numbers(m, out)


def test_initializer_emission_and_constant_values_in_rewrite():
    """Mul(x, A) -> Mul(., B) with constant A and B folds to one Mul with initializer A*B."""
    a, b = np.arange(1, 5, dtype=np.float32), np.full(4, 0.5, np.float32)
    m = model([node("Mul", ["x", "A"], ["p"]), node("Mul", ["p", "B"], ["y"])], [("x", [4])], [("y", [4])],
              [init("A", a), init("B", b)])

    def rewrite(op, x, s, t):
        return op.Mul(x, op.initializer(op.constant_value(s) * op.constant_value(t), name="folded"))

    rule = Rule("fold_scales", lambda op, x, s, t: op.Mul(op.Mul(x, s), t), rewrite,
                check=lambda ctx, x, s, t: MatchResult() if ctx.constant(s) is not None and ctx.constant(t) is not None
                else MatchResult().fail("scales are not constant"))
    out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    assert ops(out) == ["Mul"] and [t.name for t in out.graph.initializer] == ["mul_y/folded"]
    np.testing.assert_array_equal(numpy_helper.to_array(out.graph.initializer[0]), a * b)
    check_numbers(m, out)


def test_initializer_in_a_function_body_becomes_a_constant_node():
    body = [helper.make_node("Mul", ["x", "two"], ["y"], name="fm"),
            helper.make_node("Constant", [], ["two"], value=init("two_t", 2.0), name="fc")]
    body = [body[1], body[0]]
    fn = helper.make_function("local", "double", ["x"], ["y"], body, [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("double", ["x"], ["y"], domain="local", name="call")], "g",
                              [helper.make_tensor_value_info("x", F, [3])], [helper.make_tensor_value_info("y", F, [3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                          functions=[fn], ir_version=10)
    rule = Rule("mul2", lambda op, x: op.Mul(x, 2.0),
                lambda op, x: op.Add(x, op.Mul(x, op.initializer(np.float32(1.0)))))
    out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    assert report.rules.applied == {"mul2": 1}
    assert [n.op_type for n in out.functions[0].node] == ["Constant", "Mul", "Add"]
    check_numbers(m, out)


# ---------------------------------------------------------------- graph passes

def test_graph_pass_runs_in_every_scope_and_reports():
    """A pass that removes Neg(Neg(x)) pairs in the main graph and in an If branch."""
    def branch(name):
        return helper.make_graph([helper.make_node("Neg", ["x"], [f"{name}1"], name=f"{name}_n1"),
                                  helper.make_node("Neg", [f"{name}1"], [f"{name}2"], name=f"{name}_n2"),
                                  helper.make_node("Relu", [f"{name}2"], [f"{name}_out"], name=f"{name}_r")],
                                 name, [], [helper.make_tensor_value_info(f"{name}_out", F, [3])])

    nodes = [node("Neg", ["x"], ["a"]), node("Neg", ["a"], ["b"]), node("Relu", ["b"], ["c"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch("then"), else_branch=branch("else"),
                              name="if")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3]),
                                           helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("c", F, [3]), helper.make_tensor_value_info("y", F, [3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)

    def drop_double_neg(scope):
        view = scope.view()
        rename, dead = {}, set()
        for i, n in enumerate(scope.nodes):
            p = view.producer.get(n.input[0]) if n.op_type == "Neg" else None
            if p is not None and scope.nodes[p].op_type == "Neg" and not view.other_uses(n.input[0], i) \
                    and n.output[0] not in scope.protected:
                rename[n.output[0]] = scope.nodes[p].input[0]
                dead.update((i, p))
        if not dead:
            return MatchResult().fail("no Neg pair")
        kept = [n for i, n in enumerate(scope.nodes) if i not in dead]
        for n in kept:
            n.input[:] = [rename.get(x, x) for x in n.input]
        del scope.nodes[:]
        scope.nodes.extend(kept)
        return len(dead) // 2

    out, report = rewrite_model(m, rules=[GraphPass("drop_double_neg", drop_double_neg)], lowering=Lowering.KEEP)
    assert report.rules.applied == {"drop_double_neg": 3}
    assert ops(out) == ["Relu", "If"]
    assert report.rules.explain().splitlines()[0] == "rule drop_double_neg: applied 3x (3 matched, 0 not)"
    assert report.rules.failures == {}
    x = np.float32([-1, 2, -3])
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        for want, got in zip(run_ort(m, feeds), run_ort(out, feeds)):
            np.testing.assert_allclose(got, want)


def test_shapes_from_shape_inference_are_computed_once_per_rewrite(monkeypatch):
    """Three Transpose pairs; check asks the undeclared shape of each inner tensor: ONNX shape
    inference runs once for the whole rewrite, not once per match."""
    nodes, prev = [], "x"
    for i in range(3):
        nodes += [node("Transpose", [prev], [f"a{i}"], perm=[1, 0]), node("Transpose", [f"a{i}"], [f"b{i}"], perm=[1, 0]),
                  node("Relu", [f"b{i}"], [f"r{i}"])]
        prev = f"r{i}"
    m = model(nodes, [("x", [2, 5])], [(prev, [2, 5])])
    calls, shapes = [], []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", lambda *a, **k: calls.append(1) or real(*a, **k))

    def check(ctx, x):
        shapes.append(ctx.shape(ctx.nodes[1].output[0]))
        return MatchResult()

    rule = Rule("cancel", lambda op, x: op.Transpose(op.Transpose(x, perm=(1, 0)), perm=(1, 0)), lambda op, x: x,
                check=check)
    out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP, check=False)
    assert report.rules.applied == {"cancel": 3} and ops(out) == ["Relu"] * 3
    assert shapes == [[5, 2]] * 3 and len(calls) == 1
    check_numbers(m, out)


# ---------------------------------------------------------------- no silent misses

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

BLOCK = st.tuples(st.sampled_from(["match", "other_tensor", "escapes"]), st.booleans(), st.booleans())


@settings(max_examples=40, deadline=None)
@given(st.lists(BLOCK, min_size=1, max_size=10))
def test_commuted_matches_are_all_found(blocks):
    """A chain of blocks x*s + x in every input order, among near misses: a second tensor in
    place of x, or a Mul whose output is also used elsewhere. The commutative rule rewrites
    exactly the real matches, whatever the orders, and the numbers stay the same."""
    nodes, extra, cur = [], [], "x"
    for i, (kind, swap_mul, swap_add) in enumerate(blocks):
        mul_in = ["s", cur] if swap_mul else [cur, "s"]
        other = "z" if kind == "other_tensor" else cur
        nodes.append(node("Mul", mul_in, [f"m{i}"]))
        nodes.append(node("Add", [other, f"m{i}"] if swap_add else [f"m{i}", other], [f"a{i}"]))
        if kind == "escapes":
            extra.append(f"m{i}")
        cur = f"a{i}"
    outputs = [(cur, [4])]
    if extra:
        nodes.append(helper.make_node("Sum", extra, ["side"], name="side"))
        outputs.append(("side", [4]))
    m = model(nodes, [("x", [4]), ("s", [4]), ("z", [4])], outputs)

    def rewrite(op, x, s):
        return op.Mul(x, op.Add(s, op.initializer(np.float32(1.0), name="one")))

    rule = Rule("scale_plus_self", lambda op, x, s: op.Add(op.Mul(x, s), x), rewrite, commute=True)
    out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    want = sum(kind == "match" for kind, _, _ in blocks)
    assert report.rules.applied.get("scale_plus_self", 0) == want
    # the final round's candidates: the near misses, and the Add(s, 1) each rewrite made
    assert len(report.rules.reasons.get("scale_plus_self", [])) == len(blocks)
    check_numbers(m, out)


def test_single_node_rule_with_several_outputs():
    """Rule.node(..., outputs=2): both outputs of a Split are replaced (two Slices here)."""
    m = model([node("Split", ["x"], ["lo", "hi"], axis=0, num_outputs=2), node("Sub", ["lo", "hi"], ["y"])],
              [("x", [4, 3])], [("y", [2, 3])], opset=18)

    def rewrite(op, x0):
        ints = [op.initializer(np.array([v], np.int64)) for v in (0, 2, 4)]
        return op.Slice(x0, ints[0], ints[1]), op.Slice(x0, ints[1], ints[2])

    out, report = rewrite_model(m, rules=[Rule.node("split_to_slices", "Split", rewrite, outputs=2)],
                                lowering=Lowering.KEEP)
    assert report.rules.applied == {"split_to_slices": 1} and ops(out) == ["Slice", "Slice", "Sub"]
    check_numbers(m, out)
    _, report = rewrite_model(m, rules=[Rule.node("split_first", "Split", lambda op, x0: x0)], lowering=Lowering.KEEP)
    assert "output 'hi' has other consumers" in report.rules.reasons["split_first"][0]


def test_optional_inputs_absent_in_the_middle_or_at_the_end():
    """Clip(x, '', hi), Clip(x, lo) and Clip(x): optional() matches an empty name and a missing input."""
    m = model([node("Clip", ["x", "", "hi"], ["a"]), node("Clip", ["a", "lo"], ["b"]), node("Clip", ["b"], ["y"])],
              [("x", [6])], [("y", [6])], [init("lo", -0.5), init("hi", 0.5)])
    seen = []

    def rewrite(op, x, lo, hi):
        seen.append((lo, hi))
        y = x if lo is None else op.Max(x, lo)
        return y if hi is None else op.Min(y, hi)

    rule = Rule("clip_to_minmax", lambda op, x, lo, hi: op.Clip(x, optional(lo), optional(hi)), rewrite)
    out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    assert seen == [(None, "hi"), ("lo", None), (None, None)]
    assert ops(out) == ["Min", "Max", "Identity"]  # Clip(x) is x, and y is the graph output
    check_numbers(m, out)


def test_multi_root_pairs_on_a_wide_fan_out_are_all_found_in_one_pass():
    """100 pairs of Slices of one tensor: each anchor's second root is looked for among x's
    consumers that no earlier match took (once, the 17th anchor gave up after 16 taken ones
    and the set never converged)."""
    nodes, inits = [], [numpy_helper.from_array(np.array([1], np.int64), "ax")]
    for k, (a, b) in enumerate(((0, 3), (3, 6))):
        inits += [numpy_helper.from_array(np.array([a], np.int64), f"s{k}"),
                  numpy_helper.from_array(np.array([b], np.int64), f"e{k}")]
    pairs = 100
    for i in range(pairs):
        nodes += [node("Slice", ["x", f"s{k}", f"e{k}", "ax"], [f"o{i}_{k}"]) for k in range(2)]
    nodes.append(node("Sum", [f"o{i}_{k}" for i in range(pairs) for k in range(2)], ["y"]))
    m = model(nodes, [("x", [4, 6])], [("y", [4, 3])], inits)

    def pattern(op, x, a0, b0, a1, b1, axis):
        return op.Slice(x, const(a0), const(b0), const(axis)), op.Slice(x, const(a1), const(b1), const(axis))

    def rewrite(op, x, a0, b0, a1, b1, axis):
        return op.Split(x, op.initializer(np.array([3, 3])), axis=1, _outputs=2)

    rule = Rule("pair", pattern, rewrite, check=lambda ctx, x, a0, b0, a1, b1, axis: MatchResult() if
                (a0[0], b0[0], a1[0]) == (0, 3, 3) else MatchResult().fail("not the two halves"))
    out, report = rewrite_model(m, rules=RuleSet([rule], max_rounds=2), lowering=Lowering.KEEP)
    assert report.rules.applied == {"pair": pairs}
    assert ops(out).count("Split") == pairs and "Slice" not in ops(out)
    check_numbers(m, out)


# ---------------------------------------------------------------- roots joined only through an input (issue 28)

def _two_branches(second="Neg"):
    """
         x (3)
        /     \\
      Abs     Relu
       |        |
      Neg     Neg (or ``second``)
    """
    nodes = [node("Abs", ["x"], ["a"]), node("Neg", ["a"], ["na"]), node("Relu", ["x"], ["r"]),
             node(second, ["r"], ["nr"])]
    return model(nodes, [("x", [3])], [("na", [3]), ("nr", [3])])


NEG_PAIR = Rule("neg_pair", lambda op, x: (op.Neg(op.Abs(x)), op.Neg(op.Relu(x))),
                lambda op, x: (op.Min(x, op.Neg(x)), op.Neg(op.Max(x, op.Sub(x, x)))))


def test_roots_that_share_only_an_input_match():
    """The second root is no reader of x: it is found from x's readers upwards."""
    m = _two_branches()
    out, report = rewrite_model(m, rules=[NEG_PAIR], lowering=Lowering.KEEP)
    assert report.rules.applied == {"neg_pair": 1}
    assert "Abs" not in ops(out) and "Relu" not in ops(out)
    check_numbers(m, out)


def _qkv_branches(heads=2, d=4, tokens=3):
    """Three MatMul + Add + Reshape + Transpose branches of one input, as an attention block exports."""
    rng = np.random.default_rng(7)
    nodes, inits = [], [numpy_helper.from_array(np.array([1, tokens, heads, d // heads], np.int64), "shape")]
    for b in "qkv":
        inits += [init(f"w{b}", rng.standard_normal((d, d)).astype(np.float32)),
                  init(f"b{b}", rng.standard_normal(d).astype(np.float32))]
        nodes += [node("MatMul", ["x", f"w{b}"], [f"{b}_mm"]), node("Add", [f"b{b}", f"{b}_mm"], [f"{b}_add"]),
                  node("Reshape", [f"{b}_add", "shape"], [f"{b}_r"]),
                  node("Transpose", [f"{b}_r"], [b], perm=[0, 2, 1, 3])]
    return model(nodes, [("x", [1, tokens, d])], [(b, [1, heads, tokens, d // heads]) for b in "qkv"], inits)


def test_three_branches_of_one_input_match_at_their_far_ends():
    """(MatMul + Add + Reshape + Transpose) x 3 of one x: the shape of a packed-QKV fusion;
    the Reshapes share their shape constant, the roots nothing else."""
    def branch(op, x, w, b, shape, bias_first=True):
        mm = op.MatMul(x, w)
        return op.Transpose(op.Reshape(op.Add(b, mm) if bias_first else op.Add(mm, b), shape), perm=(0, 2, 1, 3))

    def pattern(op, x, wq, bq, wk, bk, wv, bv, shape):
        return branch(op, x, wq, bq, shape), branch(op, x, wk, bk, shape), branch(op, x, wv, bv, shape)

    seen = []

    def rewrite(op, x, wq, bq, wk, bk, wv, bv, shape):  # the bias second: the pattern does not match it again
        seen.append((wq, wk, wv))
        return tuple(branch(op, x, w, b, shape, bias_first=False) for w, b in ((wq, bq), (wk, bk), (wv, bv)))

    m = _qkv_branches()
    out, report = rewrite_model(m, rules=[Rule("qkv", pattern, rewrite)], lowering=Lowering.KEEP)
    assert report.rules.applied == {"qkv": 1} and seen == [("wq", "wk", "wv")]
    check_numbers(m, out)


@pytest.mark.parametrize("same_initializer", [True, False])
def test_roots_that_share_only_a_constant_match(same_initializer):
    """Neg(Add(x, c)) and Neg(Add(y, c)): joined by the constant c only (a variable: the same
    tensor; const(): the same value, in one initializer or two)."""
    nodes = [node("Add", ["x", "c"], ["a"]), node("Neg", ["a"], ["na"]),
             node("Add", ["y", "c" if same_initializer else "c2"], ["b"]), node("Neg", ["b"], ["nb"])]
    m = model(nodes, [("x", [3]), ("y", [3])], [("na", [3]), ("nb", [3])], [init("c", 1.5), init("c2", 1.5)])

    def rewrite(op, x, y, c):
        return op.Sub(op.Neg(x), c), op.Sub(op.Neg(y), c)

    by_name = Rule("by_name", lambda op, x, y, c: (op.Neg(op.Add(x, c)), op.Neg(op.Add(y, c))), rewrite)
    by_value = Rule("by_value", lambda op, x, y, c: (op.Neg(op.Add(x, const(c))), op.Neg(op.Add(y, const(c)))),
                    lambda op, x, y, c: rewrite(op, x, y, op.initializer(c)))
    for rule in (by_name, by_value):
        out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
        assert report.rules.applied == ({rule.name: 1} if same_initializer or rule is by_value else {}), rule.name
        check_numbers(m, out)


def test_explain_names_the_node_where_a_later_root_failed():
    """Neg(Relu(x)) is missing (the Relu feeds a Sigmoid): the reason names that Relu and its
    reader, not the first root's node, which matched."""
    _, report = rewrite_model(_two_branches(second="Sigmoid"), rules=[NEG_PAIR], lowering=Lowering.KEEP)
    assert report.rules.reasons["neg_pair"] == [
        "node 'neg_na': pattern output 2 (Neg(Relu(x))): node 'relu_r' output 'r' is read by Sigmoid, not Neg"]
    assert "1x no match: pattern output 2: Relu output is read by no Neg" in report.rules.explain()
    # no reader of x is a Relu at all
    m = model([node("Abs", ["x"], ["a"]), node("Neg", ["a"], ["na"]), node("Exp", ["x"], ["e"])],
              [("x", [3])], [("na", [3]), ("e", [3])])
    _, report = rewrite_model(m, rules=[NEG_PAIR], lowering=Lowering.KEEP)
    assert report.rules.reasons["neg_pair"] == [
        "node 'neg_na': pattern output 2 (Neg(Relu(x))): no Relu reads 'x' (its readers: Abs, Exp)"]
    # the only candidates are the first root's own nodes
    twice = Rule("twice", lambda op, x: (op.Neg(op.Abs(x)), op.Neg(op.Abs(x))), lambda op, x: (x, x))
    _, report = rewrite_model(m, rules=[twice], lowering=Lowering.KEEP)
    assert report.rules.reasons["twice"] == [
        "node 'neg_na': pattern output 2 (Neg(Abs(x))): the Abs readers of 'x' lead to no Neg outside this match"]
    twice = Rule("twice", lambda op, x: (op.Abs(x), op.Abs(x)), lambda op, x: (x, x))
    _, report = rewrite_model(m, rules=[twice], lowering=Lowering.KEEP)
    assert report.rules.reasons["twice"] == ["node 'abs_a': pattern output 2 (Abs(x)): no other Abs reads 'x'"]


def test_match_context_consumers_look_downstream():
    """A check that refuses a Relu whose output is read by a Sigmoid."""
    m = model([node("Relu", ["x"], ["r"]), node("Sigmoid", ["r"], ["s"]), node("Neg", ["r"], ["n"]),
               node("Relu", ["n"], ["y"])], [("x", [3])], [("s", [3]), ("y", [3])])
    seen = {}

    def check(ctx, x0):
        out = ctx.nodes[0].output[0]
        readers = ctx.consumers(out)
        seen[out] = [n.name for n in readers]
        if any(n.op_type == "Sigmoid" for n in readers):
            return MatchResult().fail(f"'{out}' is read by a Sigmoid")
        return MatchResult()

    rule = Rule.node("relu_to_max", "Relu", lambda op, x0: op.Max(x0, op.Sub(x0, x0)), check=check)
    out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    assert seen == {"r": ["sigmoid_s", "neg_n"], "y": []}
    assert report.rules.applied == {"relu_to_max": 1}
    assert report.rules.reasons["relu_to_max"] == ["node 'relu_r': 'r' is read by a Sigmoid"]
    check_numbers(m, out)
