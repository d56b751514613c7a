"""graphkit.rewrite.graph.walk: the one model walk; and the type table of ONNX inference built on it
(graph/types.py: TypeTable.inferred)."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.graph.walk import ENTER, EXIT, NODE, ModelIndex, graph_tree, graphs, held_graphs, scopes, walk


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


def _elems(table: TypeTable) -> dict[str, int]:
    return {name: tp.tensor_type.elem_type for name, tp in table.items()}


def test_inferred_types_read_subgraphs_and_initializers():
    model = _if_model()
    types = TypeTable.inferred(model)
    then, other = _branches(model.graph.node[0])
    assert types.scope(then)["t"].tensor_type.elem_type == TensorProto.FLOAT  # inferred inside the If body
    assert types.scope(then).elem_type("t") == TensorProto.FLOAT and types.shape("w") == [3]
    assert [d.dim_value for d in types["w"].tensor_type.shape.dim] == [3]
    every = {"x": TensorProto.FLOAT, "c": TensorProto.BOOL, "y": TensorProto.FLOAT, "w": TensorProto.INT64,
             "t": TensorProto.FLOAT, "e": TensorProto.FLOAT}
    assert not types.per_scope()  # no two graphs define a name: one map serves every scope
    assert _elems(types) == _elems(types.scope(then)) == _elems(types.scope(other)) == every
    assert types.elem_types == every
    assert "t" not in TypeTable.inferred(model, infer=False).scope(then)  # what the model states only


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
        types = TypeTable.inferred(model, infer=infer)
        assert types.per_scope() and "v" not in types and types.get("v") is None
        assert types.scope(then1)["v"].tensor_type.elem_type == TensorProto.FLOAT
        assert types.scope(else1)["v"].tensor_type.elem_type == TensorProto.FLOAT
        assert types.scope(then2)["v"].tensor_type.elem_type == TensorProto.FLOAT16
        assert types.scope(else2)["h"] is types["h"] and "v" not in types.scope(else2)
        assert types.scope(then2).elem_type("v") == TensorProto.FLOAT16 and types.scope(then2).elem_type("x") == TensorProto.FLOAT
        assert _elems(types.scope(else1)) == {"x": TensorProto.FLOAT, "h": TensorProto.FLOAT16, "c": TensorProto.BOOL,
                                              "f": TensorProto.FLOAT, "g": TensorProto.FLOAT16, "v": TensorProto.FLOAT}
    other = _siblings_model()
    foreign = other.graph.node[0].attribute[0].g
    with pytest.raises(KeyError, match="not a graph of this model"):
        TypeTable.inferred(model).scope(foreign)
    seen = TypeTable.inferred(model).scope(foreign, missing_ok=True)  # a graph of a function body: sees nothing
    assert seen.get("x") is None and seen.elem_type("x") is None and "x" not in seen
    # one map: any graph sees it
    assert TypeTable.inferred(_if_model()).scope(foreign)["x"].tensor_type.elem_type == TensorProto.FLOAT


class _BrokenSchemas:
    """A registry whose schemas make inference fail."""

    @contextlib.contextmanager
    def onnx_schemas(self):
        raise onnx.shape_inference.InferenceError("[custom::x] broken schema")
        yield


def test_inferred_types_fall_back_to_the_stated_types_when_inference_fails():
    assert _elems(TypeTable.inferred(_if_model(), _BrokenSchemas())) == {"x": TensorProto.FLOAT, "c": TensorProto.BOOL,
                                                         "y": TensorProto.FLOAT, "w": TensorProto.INT64}


# -- the walk itself


def _nested_model() -> onnx.ModelProto:
    """Main graph: Loop(body: Add, If(then: Neg, else: Scan(body: Identity))), a node with a
    GRAPHS attribute (two graphs); function f: Loop(body: If(then: Relu, else: Identity)).

        main ── Loop/body ── If/then_branch
           │            └── If/else_branch ── Scan/body
           └── custom::Multi/branches[0], branches[1]
        function custom::f ── Loop/body ── If/then_branch, If/else_branch
    """
    def g(name, nodes):
        return helper.make_graph(nodes, name, [], [])

    scan = helper.make_node("Scan", ["x"], ["s"], name="scan", num_scan_inputs=1,
                            body=g("scan_body", [helper.make_node("Identity", ["a"], ["b"], name="id")]))
    inner_if = helper.make_node("If", ["c"], ["i"], name="if",
                                then_branch=g("then", [helper.make_node("Neg", ["x"], ["n"], name="neg")]),
                                else_branch=g("else", [scan]))
    loop = helper.make_node("Loop", ["m", "c"], ["l"], name="loop",
                            body=g("loop_body", [helper.make_node("Add", ["x", "x"], ["y"], name="add"), inner_if]))
    multi = helper.make_node("Multi", ["x"], ["z"], name="multi", domain="custom",
                             branches=[g("b0", [helper.make_node("Abs", ["x"], ["p"], name="abs")]), g("b1", [])])
    graph = helper.make_graph([loop, multi], "main", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], [],
                              [numpy_helper.from_array(np.ones((2,), np.float32), "w")])
    fn_if = helper.make_node("If", ["c"], ["r"], name="fif",
                             then_branch=g("fthen", [helper.make_node("Relu", ["u"], ["v"], name="relu")]),
                             else_branch=g("felse", []))
    fn = helper.make_function("custom", "f", ["u", "c"], ["r2"],
                              [helper.make_node("Loop", ["", "c"], ["r2"], name="floop", body=g("fbody", [fn_if]))],
                              [helper.make_opsetid("", 17)])
    return helper.make_model(graph, functions=[fn], opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _reference(model: onnx.ModelProto) -> list[tuple[str, str, int]]:
    """(event, path, depth) by a plain recursion: what walk(model, exits=True) must give."""
    out: list[tuple[str, str, int]] = []

    def visit(nodes, path, depth):
        out.append((ENTER, path, depth))
        for node in nodes:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g.node, f"{path}/{node.name}/{attr.name}", depth + 1)
                for k, sub in enumerate(attr.graphs):
                    visit(sub.node, f"{path}/{node.name}/{attr.name}[{k}]", depth + 1)
        out.append((EXIT, path, depth))

    visit(model.graph.node, "main", 0)
    for fn in model.functions:
        visit(fn.node, f"function {fn.domain}::{fn.name}", 0)
    return out


def test_walk_enters_and_exits_every_graph_and_function_body_in_order():
    model = _nested_model()
    events = [(event, v.path, v.depth) for event, v in walk(model, exits=True)]
    assert events == _reference(model)
    assert [p for e, p, _ in events if e == ENTER] == [
        "main", "main/loop/body", "main/loop/body/if/else_branch", "main/loop/body/if/else_branch/scan/body",
        "main/loop/body/if/then_branch", "main/multi/branches[0]", "main/multi/branches[1]",
        "function custom::f", "function custom::f/floop/body", "function custom::f/floop/body/fif/else_branch",
        "function custom::f/floop/body/fif/then_branch"]  # make_node sorts attributes: else_branch first
    by_path = {v.path: v for _, v in walk(model)}
    scan_body = by_path["main/loop/body/if/else_branch/scan/body"]
    assert scan_body.graph.name == "scan_body" and scan_body.node.op_type == "Scan" and scan_body.index == -1
    assert scan_body.parent.graph.name == "else" and scan_body.function is None
    assert [v.graph.name for v in scan_body.outer()] == ["else", "loop_body", "main"]
    assert by_path["main/multi/branches[1]"].index == 1 and by_path["main/multi/branches[1]"].attribute.name == "branches"
    fthen = by_path["function custom::f/floop/body/fif/then_branch"]
    assert fthen.in_function and fthen.function.name == "f" and fthen.parent.parent.graph is None
    assert {"u", "c", "r", "r2"} <= fthen.outer_names() and "v" not in fthen.outer_names()
    assert {"x", "w", "y", "i", "l", "z"} <= scan_body.outer_names()  # inputs, initializers, outer node outputs
    # without functions, the main graph's tree only; reversed: a node's graphs last first
    assert [v.path for _, v in walk(model, functions=False)] == [p for e, p, _ in events if e == ENTER][:7]
    assert [v.graph.name for _, v in walk(model.graph, reverse=True)] == [
        "main", "b1", "b0", "loop_body", "then", "else", "scan_body"]
    assert [g.name for g in graphs(model.graph, reverse=True)] == [
        "main", "b1", "b0", "loop_body", "then", "else", "scan_body"]


def test_walk_node_events_interleave_the_graphs_a_node_holds():
    model = _nested_model()
    seen = []
    for event, v in walk(model, nodes=True, exits=True):
        seen.append(f"{event}:{v.nodes[v.at].name}" if event == NODE else f"{event}:{v.path.rsplit('/', 1)[-1]}")
    assert seen[:14] == ["enter:main", "node:loop", "enter:body", "node:add", "node:if", "enter:else_branch",
                         "node:scan", "enter:body", "node:id", "exit:body", "exit:else_branch", "enter:then_branch",
                         "node:neg", "exit:then_branch"]
    assert [s for s in seen if s.startswith("node:")] == [
        "node:loop", "node:add", "node:if", "node:scan", "node:id", "node:neg", "node:multi", "node:abs",
        "node:floop", "node:fif", "node:relu"]
    assert seen.count("enter:main") == 1 and seen[-1] == "exit:function custom::f"


def test_walk_callers_hand_over_the_graphs_they_found():
    model = _nested_model()
    entered = []
    for _, v in walk(model.graph):
        entered.append(v.graph.name)
        v.children = [c for c in held_graphs(v.nodes) if v.nodes[c[0]].attribute[c[1]].name != "else_branch"]  # a caller's own scan, filtered
    assert entered == ["main", "loop_body", "then", "b0", "b1"]


def _chain(depth: int, width: int = 1) -> onnx.ModelProto:
    """Loop bodies nested ``depth`` levels deep, each holding ``width`` Add nodes and the next Loop."""
    model = helper.make_model(helper.make_graph([], "main", [], []), ir_version=9,
                              opset_imports=[helper.make_opsetid("", 17)])
    g = model.graph
    for level in range(depth):
        for k in range(width):
            g.node.append(helper.make_node("Add", ["x", "x"], [f"a{level}_{k}"]))
        loop = g.node.add(op_type="Loop", name=f"loop{level}", input=["", "c"], output=[f"l{level}"])
        attr = loop.attribute.add(name="body", type=onnx.AttributeProto.GRAPH)
        attr.g.name = f"body{level}"
        g = attr.g
    return model


def test_walk_does_not_recurse_2000_levels_deep():
    model = _chain(2000)
    entered = exited = 0
    deepest = None
    for event, v in walk(model, exits=True):
        if event == ENTER:
            entered += 1
            deepest = v
        else:
            exited += 1
    assert entered == exited == 2001 and deepest.depth == 2000 and deepest.graph.name == "body1999"
    assert deepest.path.count("/body") == 2000
    assert len(ModelIndex(model).node_lists) == 2001 and len(graph_tree(model.graph)) == 2001
    assert len(list(scopes(model))) == 2001


def _walk_seconds(model: onnx.ModelProto) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _event, _v in walk(model, exits=True):
            pass
        ModelIndex(model)
        best = min(best, time.perf_counter() - start)
    return best


def test_walk_grows_linearly_with_nesting():
    small, large = _chain(150, 4), _chain(1500, 4)  # 10x the graphs and the nodes
    ratio = _walk_seconds(large) / _walk_seconds(small)
    assert ratio < 40, f"10x the nested bodies took {ratio:.1f}x the time (linear: 10x, quadratic: 100x)"


def test_inferred_getter_answers_as_get():
    model = _siblings_model()
    then2 = _branches(model.graph.node[1])[0]
    for table in (TypeTable.inferred(model), TypeTable.inferred(model).scope(then2), TypeTable.inferred(_if_model())):
        get = table.getter()
        for name in ("x", "h", "v", "w", "t", "nothing"):
            assert get(name) is table.get(name)
