"""Sibling graphs that reuse a value name with another element type are typed per scope.

ONNX's SSA form spans nested graphs, but sibling graphs (an If's then/else branches, two
Loop bodies) may each define the same name. A flat name -> type map gave every branch the
first branch's type: my_add's decomposition (which guards float16 overflow and types its
constants like its input) and the float16 Casts of a Python-kernel binding went wrong in
the other branch.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import run_ort
from graphkit.rewrite import Lowering, rewrite_model
from graphkit.rewrite.files import rewrite_bytes

F, F16, F64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE


def _model() -> onnx.ModelProto:
    """x (float[3]) -> If(c) -> y; the branches and a Loop body each make "v" and "w":

        then: v = Identity(x)        (float)    w = my_add(v, v)  ─ Cast(float) ─> t
        else: v = Cast(x, float16)   (float16)  w = my_add(v, v)  ─ Cast(float) ─> e
        Loop body (one trip): v = Cast(x, double) w = my_add(v, v) ─ Cast(float) ─> o
    """
    def body(cast_to: int | None, out: str) -> list[onnx.NodeProto]:
        first = (helper.make_node("Identity", ["x"], ["v"]) if cast_to is None
                 else helper.make_node("Cast", ["x"], ["v"], to=cast_to))
        return [first, helper.make_node("my_add", ["v", "v"], ["w"], domain="custom"),
                helper.make_node("Cast", ["w"], [out], to=F)]

    then = helper.make_graph(body(None, "t"), "then", [], [helper.make_tensor_value_info("t", F, [3])])
    other = helper.make_graph(body(F16, "e"), "else", [], [helper.make_tensor_value_info("e", F, [3])])
    loop = helper.make_graph(
        [helper.make_node("Identity", ["ci"], ["co"]), *body(F64, "o")], "loop",
        [helper.make_tensor_value_info("it", TensorProto.INT64, []), helper.make_tensor_value_info("ci", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("co", TensorProto.BOOL, []), helper.make_tensor_value_info("o", F, [3])])
    trips = helper.make_node("Constant", [], ["m"], value=helper.make_tensor("m", TensorProto.INT64, [], [1]))
    go = helper.make_node("Constant", [], ["go"], value=helper.make_tensor("go", TensorProto.BOOL, [], [True]))
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other), trips, go,
         helper.make_node("Loop", ["m", "go"], ["z"], body=loop)], "g",
        [helper.make_tensor_value_info("x", F, [3]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, [3]), helper.make_tensor_value_info("z", F, [1, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=10)


X = np.array([1.5, -2.25, 40000.0], np.float32)  # 2 * 40000 overflows float16: inf in that branch


def _expected(c: bool) -> dict[str, np.ndarray]:
    def my_add(a):  # torch's rounding: 2a in a's type, then the sum
        return (a * a.dtype.type(2) + a).astype(np.float32)

    return {"y": my_add(X if c else X.astype(np.float16)), "z": my_add(X.astype(np.float64))[None]}


def _check_runs(model: onnx.ModelProto, run) -> None:
    for c in (True, False):
        got = run(model, {"x": X, "c": np.array(c)})
        want = _expected(c)
        assert not c or np.isfinite(want["y"]).all()
        assert c or np.isinf(want["y"][2])  # the float16 branch overflows as torch does
        np.testing.assert_array_equal(got[0], want["y"], err_msg=f"c={c}")
        np.testing.assert_array_equal(got[1], want["z"], err_msg=f"c={c}")


def _constants_of_my_add(model: onnx.ModelProto) -> dict[str, set[int]]:
    """Per body: the element types of the Constants the decomposition made."""
    out = {}
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                out[attr.g.name] = {n.attribute[0].t.data_type for n in attr.g.node
                                    if n.op_type == "Constant"}
    return out


def test_decomposition_types_each_branch_in_its_own_scope():
    out, report = rewrite_model(_model())
    assert report.ops_after[("", "Greater")] == 1  # the float16 overflow guard, in the float16 branch only
    assert _constants_of_my_add(out) == {"then": {F}, "else": {F16}, "loop": {F64}}
    _check_runs(out, run_ort)


def test_both_writers_agree():
    model = _model()
    objects, _ = rewrite_model(model)
    data, report = rewrite_bytes(model.SerializeToString())
    # The byte writer types every scope with one map: it steps aside, saying why.
    assert report.writer == "objects" and "sibling subgraphs both define" in report.writer_reason
    assert data == objects.SerializeToString()
    _check_runs(onnx.ModelProto.FromString(data), run_ort)


def test_python_binding_casts_only_the_float16_branch():
    from graphkit.runtime import open_session

    out, _ = rewrite_model(_model(), lowering=Lowering.PYTHON)
    session = open_session(out)
    _check_runs(out, lambda _, feeds: list(session.run(feeds).values()))


def _if(then_nodes, else_nodes, outs=("w", "w")) -> onnx.ModelProto:
    """x (float[3]) -> If(c) -> y, each branch's nodes then a float Cast of "v" (or of
    what ``outs`` names) to its output ``outs[i]``."""
    def branch(nodes, name, out):
        last = [helper.make_node("Cast", ["v"], [out], to=F)] if out == "w" else []
        return helper.make_graph([*nodes, *last], name, [], [helper.make_tensor_value_info(out, F, [3])])

    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch(then_nodes, "then", outs[0]),
                          else_branch=branch(else_nodes, "else", outs[1]))], "g",
        [helper.make_tensor_value_info("x", F, [3]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _tables(model: onnx.ModelProto):
    from graphkit.rewrite.lowering.builder import TypeTable

    table = TypeTable(model)
    branches = {a.name: a.g for a in model.graph.node[0].attribute}
    return table, table.scope(branches["then_branch"]), table.scope(branches["else_branch"])


@pytest.mark.parametrize("untyped_first", [False, True], ids=["typed-first", "untyped-first"])
def test_type_table_scopes_only_where_siblings_reuse_a_name(untyped_first):
    cast16 = helper.make_node("Cast", ["x"], ["v"], to=F16)
    unknown = helper.make_node("Mystery", ["x"], ["v"], domain="elsewhere")  # nothing types its output
    first = unknown if untyped_first else helper.make_node("Identity", ["x"], ["v"])
    table, then, other = _tables(_if([first], [cast16]))
    assert table.per_scope() and then is not other
    assert then.elem_type("v") == (None if untyped_first else F)
    assert other.elem_type("v") == F16
    assert then.elem_type("x") == other.elem_type("x") == F  # outer values through the chain
    assert table.elem_type("v") is None  # not a main-graph value


def test_type_table_keeps_one_map_without_reuse():
    """then: Identity(x) -> t; else: Neg(x) -> e: no name defined twice."""
    model = _if([helper.make_node("Identity", ["x"], ["t"])], [helper.make_node("Neg", ["x"], ["e"])], outs=("t", "e"))
    table, then, other = _tables(model)
    assert not table.per_scope() and then is table and other is table
    assert table.elem_type("t") == table.elem_type("e") == F


def test_scopes_found_again_after_a_rule_rebuilds_the_main_graph():
    """A user rule rewriting a main-graph node rebuilds that node list, which copies the If
    and Loop bodies in it: the lowering still types each copy in its own scope."""
    from graphkit.rewrite import Rule

    model = _model()
    model.graph.node.append(helper.make_node("Relu", ["x"], ["r"]))
    model.graph.output.append(helper.make_tensor_value_info("r", F, [3]))
    # The check reads a type: the tables are made before the rewrite rebuilds the main graph.
    rule = Rule.node("relu_as_max", "Relu", lambda op, x0: op.Max(x0, op.Sub(x0, x0)), inputs=1,
                     check=lambda ctx, x0: ctx.dtype(x0) == F)
    out, report = rewrite_model(model, rules=[rule])
    assert report.rules.applied == {"relu_as_max": 1}
    assert _constants_of_my_add(out) == {"then": {F}, "else": {F16}, "loop": {F64}}
    _check_runs(out, run_ort)


def test_a_graph_in_a_rebuilt_body_is_typed_in_that_body_scope():
    """A main-graph node list rebuilt after the forward pass copies the bodies in it: asked
    for a graph nested in a copy, the table types the new graphs in their places (TypeTable's
    _index_new_graphs), so the nested graph reads the copied branch's float16 "v", not None
    (what a table hung under the main graph's would read) nor the other branch's float."""
    nested = helper.make_node("If", ["c"], ["n"],
                              then_branch=helper.make_graph([helper.make_node("Neg", ["v"], ["p"])], "then2", [],
                                                            [helper.make_tensor_value_info("p", F16, [3])]),
                              else_branch=helper.make_graph([helper.make_node("Abs", ["v"], ["q"])], "else2", [],
                                                            [helper.make_tensor_value_info("q", F16, [3])]))
    model = _if([helper.make_node("Cast", ["x"], ["v"], to=F16), nested],
                [helper.make_node("Identity", ["x"], ["v"])])
    table, then, other = _tables(model)
    assert table.per_scope() and then.elem_type("v") == F16 and other.elem_type("v") == F
    rebuilt = [onnx.NodeProto.FromString(n.SerializeToString()) for n in model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(rebuilt)
    branches = {a.name: a.g for a in model.graph.node[0].attribute}
    inner = {a.name: a.g for a in branches["then_branch"].node[1].attribute}
    for name in ("then_branch", "else_branch"):
        assert branches[name] is not (then if name == "then_branch" else other)._graph  # copies
    assert table.scope(inner["else_branch"]).elem_type("v") == F16
    assert table.scope(inner["then_branch"]).elem_type("p") == F16
    assert table.scope(branches["then_branch"]).elem_type("v") == F16
    assert table.scope(branches["else_branch"]).elem_type("v") == F


def test_a_name_declared_twice_reads_the_first_statement():
    """Which declaration wins where a name is declared twice (simplify's dims read this table,
    issue 28: TypeTable.inferred, first stated wins): in one graph, initializers, then inputs,
    value_info, outputs (the model's initializers too where inference runs without the large
    ones); a subgraph output naming an outer value keeps the outer value's; sibling graphs
    each their own, the main graph's table none."""
    import numpy as np
    from onnx import numpy_helper

    from graphkit.rewrite.graph.types import TypeTable

    rng = np.random.default_rng(0)
    big = numpy_helper.from_array(rng.standard_normal((64, 3)).astype(np.float32), "W")  # > the skeleton's 1 KiB
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, [2, 5]), helper.make_tensor_value_info("x", F, [3, 3])])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["t"])], "else", [],
                              [helper.make_tensor_value_info("t", F, [2, 7]), helper.make_tensor_value_info("x", F, [3, 3])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y", "z"], then_branch=then, else_branch=other),
         helper.make_node("MatMul", ["W", "x"], ["m"])], "g",
        [helper.make_tensor_value_info("x", F, [3, "N"]), helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("W", F, ["K", 3])],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("z", F, None),
         helper.make_tensor_value_info("x", F, [3, "M"])], [big],
        value_info=[helper.make_tensor_value_info("x", F, [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    for options in ({}, {"without_weights": True, "data_prop": True}):
        table = TypeTable.inferred(model, **options)
        assert table.per_scope()  # then and else both define t
        assert len(table.dims("m")) == 2  # (inference ran: what it reads of an inconsistent model is its own)
        assert table.dims("x") == [3, "N"]  # the input, not the value_info nor the output
        assert table.dims("W") == [64, 3]  # the initializer, not the input
        assert table.static_shape("W") == [64, 3] and table.static_shape("x") is None
        scopes = {a.name: table.scope(a.g) for a in model.graph.node[0].attribute}
        assert scopes["then_branch"].dims("t") == [2, 5] and scopes["else_branch"].dims("t") == [2, 7]
        assert scopes["then_branch"].dims("x") == [3, "N"]  # the outer value's, not the branch output's
        assert table.dims("t") is None  # not a main-graph value
