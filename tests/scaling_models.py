"""The graph shapes the rewrite must handle in linear time, shared by tests/test_scaling.py
and bench/rewrite_scaling.py (which puts tests/ on its path, as bench/fusions.py does).

Each builder takes a count of repeated units (pairs, If or Loop nodes, calls), not of nodes:
the benchmark converts node totals, the tests grow the count 8x. Every model reads a float
[1, 4] input ``x`` and imports ai.onnx 17, ``custom`` 1 and ``local`` 1 (local functions).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import TensorProto, helper

__all__ = ["OPSETS", "chain", "fan_out", "functions", "if_bodies", "if_chain_18", "loop_bodies", "multi_output",
           "const_pairs", "root_pairs", "sibling_reuse"]

OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)]


def _vi(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])


def _model(nodes: list[onnx.NodeProto], outputs: Sequence[str],
           functions: Sequence[onnx.FunctionProto] = ()) -> onnx.ModelProto:
    return helper.make_model(helper.make_graph(nodes, "g", [_vi("x")], [_vi(o) for o in outputs]),
                             opset_imports=[*OPSETS, helper.make_opsetid("local", 1)], ir_version=10,
                             functions=list(functions))


def _reduce(x: str, y: str) -> onnx.NodeProto:
    """ReduceMean over axis 0 of a [1, 4] value: axes an attribute at 17, an input from 18."""
    return helper.make_node("ReduceMean", [x], [y], axes=[0], keepdims=1)


def chain(pairs: int, *, named: bool = False, reduce: bool = False) -> onnx.ModelProto:
    """x -> my_add -> Relu -> my_add -> Relu ... (``pairs`` pairs; node names only if ``named``;
    ReduceMean for Relu if ``reduce``: --target-opset 18 converts each)."""
    nodes, prev = [], "x"
    for i in range(pairs):
        second = _reduce(f"a{i}", f"r{i}") if reduce else helper.make_node("Relu", [f"a{i}"], [f"r{i}"])
        second.name = f"r{i}" if named else ""
        nodes += [helper.make_node("my_add", [prev, prev], [f"a{i}"], domain="custom", name=f"m{i}" if named else ""),
                  second]
        prev = f"r{i}"
    return _model(nodes, [prev])


def fan_out(n: int) -> onnx.ModelProto:
    """One input read by ``n`` unnamed my_add nodes, summed."""
    nodes = [helper.make_node("my_add", ["x", "x"], [f"y{i}"], domain="custom") for i in range(n)]
    nodes.append(helper.make_node("Sum", [f"y{i}" for i in range(n)], ["s"]))
    return _model(nodes, ["s"])


def multi_output(n: int) -> onnx.ModelProto:
    """my_add -> Split (2 outputs) -> Concat, ``n`` times (ai.onnx 18: Split's num_outputs)."""
    nodes, prev = [], "x"
    for i in range(n):
        nodes += [helper.make_node("my_add", [prev, prev], [f"a{i}"], domain="custom"),
                  helper.make_node("Split", [f"a{i}"], [f"s{i}a", f"s{i}b"], axis=1, num_outputs=2),
                  helper.make_node("Concat", [f"s{i}b", f"s{i}a"], [f"c{i}"], axis=1)]
        prev = f"c{i}"
    model = _model(nodes, [prev])
    model.opset_import[0].version = 18
    return model


def root_pairs(n: int, *, wide: bool = False) -> onnx.ModelProto:
    """``n`` pairs Neg(Abs(v)), Neg(Relu(v)): the two roots of a pattern joined only through v.
    ``wide``: every pair reads x, summed at the end; else a chain, each pair's Add the next v."""
    nodes, prev, ends = [], "x", []
    for i in range(n):
        nodes += [helper.make_node("Abs", [prev], [f"a{i}"]), helper.make_node("Neg", [f"a{i}"], [f"na{i}"]),
                  helper.make_node("Relu", [prev], [f"r{i}"]), helper.make_node("Neg", [f"r{i}"], [f"nr{i}"])]
        if wide:
            ends += [f"na{i}", f"nr{i}"]
        else:
            nodes.append(helper.make_node("Add", [f"na{i}", f"nr{i}"], [f"s{i}"]))
            prev = f"s{i}"
    if wide:
        nodes.append(helper.make_node("Sum", ends, ["s"]))
        prev = "s"
    return _model(nodes, [prev])


def const_pairs(n: int, *, separate: bool = False) -> onnx.ModelProto:
    """``n`` pairs Neg(Add(v, c)), Neg(Add(Exp(v), c)) of one initializer ``c``: the two roots of
    a pattern joined only through a constant, which all 2n Adds read; each pair's Sum the next v.
    ``separate``: each Add reads its own initializer (``c{i}a``, ``c{i}b``) of that same value."""
    nodes, prev, names = [], "x", []
    for i in range(n):
        ca, cb = (f"c{i}a", f"c{i}b") if separate else ("c", "c")
        nodes += [helper.make_node("Add", [prev, ca], [f"a{i}"]), helper.make_node("Neg", [f"a{i}"], [f"na{i}"]),
                  helper.make_node("Exp", [prev], [f"e{i}"]), helper.make_node("Add", [f"e{i}", cb], [f"b{i}"]),
                  helper.make_node("Neg", [f"b{i}"], [f"nb{i}"]), helper.make_node("Sum", [f"na{i}", f"nb{i}"], [f"s{i}"])]
        names += [ca, cb] if separate else []
        prev = f"s{i}"
    model = _model(nodes, [prev])
    model.graph.initializer.extend(helper.make_tensor(c, TensorProto.FLOAT, [], [1.5]) for c in names or ["c"])
    return model


def if_bodies(n: int, *, reduce: bool = False) -> onnx.ModelProto:
    """``n`` chained If nodes, each branch one my_add of the previous If's output (3 nodes per
    If); with ``reduce``, a ReduceMean of it after (5 nodes per If: --target-opset 18 converts them)."""
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))
    nodes, prev = [cond], "x"
    for i in range(n):
        def body(tag: str) -> onnx.GraphProto:
            add = helper.make_node("my_add", [prev, prev], [f"{tag}{i}"], domain="custom")
            if not reduce:
                return helper.make_graph([add], f"{tag}{i}", [], [_vi(f"{tag}{i}")])
            add.output[0] = f"{tag}{i}a"
            return helper.make_graph([add, _reduce(f"{tag}{i}a", f"{tag}{i}")], f"{tag}{i}", [], [_vi(f"{tag}{i}")])
        nodes.append(helper.make_node("If", ["c"], [f"o{i}"], then_branch=body("t"), else_branch=body("e")))
        prev = f"o{i}"
    return _model(nodes, [prev])


def sibling_reuse(n: int) -> onnx.ModelProto:
    """``n`` chained If nodes whose branches all define "v" and "w", float in the then
    branches and double in the else ones (5 nodes per If): types kept per scope."""
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))
    nodes, prev = [cond], "x"
    for i in range(n):
        def body(tag: str, to: int) -> onnx.GraphProto:
            return helper.make_graph([helper.make_node("Cast", [prev], ["v"], to=to),
                                      helper.make_node("my_add", ["v", "v"], ["w"], domain="custom"),
                                      helper.make_node("Cast", ["w"], [f"{tag}{i}"], to=TensorProto.FLOAT)],
                                     f"{tag}{i}", [], [_vi(f"{tag}{i}")])
        nodes.append(helper.make_node("If", ["c"], [f"o{i}"], then_branch=body("t", TensorProto.FLOAT),
                                      else_branch=body("e", TensorProto.DOUBLE)))
        prev = f"o{i}"
    return _model(nodes, [prev])


def loop_bodies(n: int) -> onnx.ModelProto:
    """``n`` chained Loop nodes (one trip), each body an Identity of the condition and a my_add
    of the carried value (3 nodes per Loop)."""
    nodes = [helper.make_node("Constant", [], ["m"], value=helper.make_tensor("m", TensorProto.INT64, [], [1])),
             helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))]
    prev = "x"
    for i in range(n):
        body = helper.make_graph(
            [helper.make_node("Identity", [f"ci{i}"], [f"co{i}"]),
             helper.make_node("my_add", [f"v{i}", f"v{i}"], [f"vo{i}"], domain="custom")], f"b{i}",
            [helper.make_tensor_value_info(f"it{i}", TensorProto.INT64, []),
             helper.make_tensor_value_info(f"ci{i}", TensorProto.BOOL, []), _vi(f"v{i}")],
            [helper.make_tensor_value_info(f"co{i}", TensorProto.BOOL, []), _vi(f"vo{i}")])
        nodes.append(helper.make_node("Loop", ["m", "c", prev], [f"o{i}"], body=body))
        prev = f"o{i}"
    return _model(nodes, [prev])


def functions(calls: int, count: int) -> onnx.ModelProto:
    """``count`` local functions (each a my_add), called ``calls`` times in a chain, in turn."""
    fns = [helper.make_function("local", f"f{k}", ["a"], ["b"],
                                [helper.make_node("my_add", ["a", "a"], ["b"], domain="custom")], OPSETS)
           for k in range(count)]
    nodes, prev = [], "x"
    for i in range(calls):
        nodes.append(helper.make_node(f"f{i % count}", [prev], [f"o{i}"], domain="local"))
        prev = f"o{i}"
    return _model(nodes, [prev], fns)


def if_chain_18(n: int, relus: int = 20) -> onnx.ModelProto:
    """Opset 18 (what the dynamo exporter makes; the others here are 17): ``n`` chained If
    nodes, each followed by ``relus`` Relus in the main graph (the values around the bodies
    grow with n); then: Add(v, ReduceMean-18(v, axes a Constant of the body)), else:
    Identity(v). Brought down to 17, each ReduceMean's axes become an attribute."""
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))
    nodes, prev = [cond], "x"
    for i in range(n):
        axes = helper.make_node("Constant", [], [f"ax{i}"],
                                value=helper.make_tensor(f"ax{i}", TensorProto.INT64, [1], [1]))
        then = helper.make_graph([axes, helper.make_node("ReduceMean", [prev, f"ax{i}"], [f"r{i}"], keepdims=1),
                                  helper.make_node("Add", [prev, f"r{i}"], [f"t{i}"])], f"t{i}", [], [_vi(f"t{i}")])
        other = helper.make_graph([helper.make_node("Identity", [prev], [f"e{i}"])], f"e{i}", [], [_vi(f"e{i}")])
        nodes.append(helper.make_node("If", ["c"], [f"o{i}"], then_branch=then, else_branch=other))
        prev = f"o{i}"
        for k in range(relus):
            nodes.append(helper.make_node("Relu", [prev], [f"o{i}_{k}"]))
            prev = f"o{i}_{k}"
    return helper.make_model(helper.make_graph(nodes, "g", [_vi("x")], [_vi(prev)]),
                             opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
