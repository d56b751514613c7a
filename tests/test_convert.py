"""--target-opset by graphkit's own adapters (graphkit/rewrite/convert/), against onnx's
version converter and ONNX Runtime.

Each case is one node at a source opset, put in the main graph, in both branches of an If,
in a Loop body and in a model-local function. Converted by rewrite_model, it must be what
onnx.version_converter makes of the same model (node for node: op, attributes, inputs with
constants compared by value; onnx writes Constant nodes beside the node, graphkit shared
initializers of the main graph) and run in ONNX Runtime as onnx's result and the original
do. onnx's converter drops model-local functions, so a function's result is compared with
the original model's run only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, version_converter

from conftest import error_lines, run_cli
from graphkit.errors import RewriteError
from graphkit.rewrite import Lowering, rewrite_model
from graphkit.rewrite.convert import opset
from graphkit.rewrite.convert import steps as step_tables
from graphkit.rewrite.graph.walk import node_lists

F = TensorProto.FLOAT
SHAPE = [2, 1, 4]


def _axes(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64), name))


def _reduce(op: str, opset: int) -> list[onnx.NodeProto]:
    """op over axis 2 (keepdims 0), axes an attribute below the op's change, an input from it."""
    if opset >= (13 if op == "ReduceSum" else 18):
        return [_axes("ax", [2]), helper.make_node(op, ["x", "ax"], ["y"], keepdims=0)]
    return [helper.make_node(op, ["x"], ["y"], axes=[2], keepdims=0)]


def _squeeze(op: str, axes: list[int]):
    def build(opset: int) -> list[onnx.NodeProto]:
        if opset >= 13:
            return [_axes("ax", axes), helper.make_node(op, ["x", "ax"], ["y"])]
        return [helper.make_node(op, ["x"], ["y"], axes=axes)]
    return build


def _split_sizes(opset: int) -> list[onnx.NodeProto]:
    if opset >= 13:
        return [_axes("sp", [1, 3]), helper.make_node("Split", ["x", "sp"], ["y", "z"], axis=2)]
    return [helper.make_node("Split", ["x"], ["y", "z"], axis=2, split=[1, 3])]


def _split_even(opset: int) -> list[onnx.NodeProto]:
    if opset >= 18:
        return [helper.make_node("Split", ["x"], ["y", "z"], axis=2, num_outputs=2)]
    return [helper.make_node("Split", ["x"], ["y", "z"], axis=2)]


def _plain(op: str, **attrs):
    return lambda opset: [helper.make_node(op, ["x"], ["y"], **attrs)]


def _add(opset: int) -> list[onnx.NodeProto]:
    return [helper.make_node("Add", ["x", "x"], ["y"])]


def _reshape(opset: int) -> list[onnx.NodeProto]:
    return [_axes("shape", [8]), helper.make_node("Reshape", ["x", "shape"], ["y"])]


def _pad(opset: int) -> list[onnx.NodeProto]:
    return [_axes("pads", [0, 0, 1, 0, 0, 2]), helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")]


def _topk(opset: int) -> list[onnx.NodeProto]:
    k = helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([2], np.int64), "k"))
    return [k, helper.make_node("TopK", ["x", "k"], ["y", "z"], axis=2)]


# name -> (node builder at an opset, [(source, target)], output count). Each pair onnx converts.
CASES = {
    **{op: (lambda opset, op=op: _reduce(op, opset), [(17, 18), (18, 17)], 1) for op in step_tables._REDUCE},
    "ReduceSum": (lambda opset: _reduce("ReduceSum", opset), [(12, 13), (13, 12), (11, 18)], 1),
    "Squeeze": (_squeeze("Squeeze", [1]), [(12, 13), (13, 12)], 1),
    "Unsqueeze": (_squeeze("Unsqueeze", [0, 4]), [(12, 13), (13, 12)], 1),
    "Split sizes": (_split_sizes, [(12, 13), (13, 12)], 2),
    "Split even": (_split_even, [(12, 13), (17, 18)], 2),
    "Relu (types)": (_plain("Relu"), [(12, 13), (13, 12), (13, 14), (14, 13)], 1),
    "Add (types)": (_add, [(13, 14), (14, 13)], 1),
    "Softplus (types)": (_plain("Softplus"), [(17, 22), (22, 17)], 1),
    "Reshape (attributes)": (_reshape, [(13, 14), (14, 13)], 1),
    "TopK (attributes)": (_topk, [(10, 11), (11, 10)], 2),
    "Cast (attributes)": (_plain("Cast", to=TensorProto.DOUBLE), [(18, 19), (19, 18)], 1),
    "Pad (optional input)": (_pad, [(17, 18), (18, 17)], 1),
    **{f"{op} (last axis {axis})": (_plain(op, axis=axis), [(12, 13), (13, 12), (11, 17)], 1)
       for op in ("Softmax", "LogSoftmax", "Hardmax") for axis in (-1, 2)},
}


def _out(name: str) -> onnx.ValueInfoProto:
    return onnx.ValueInfoProto(name=name)  # typed by _typed


def _typed(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its graph outputs typed by shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for vi, typed in zip(model.graph.output, inferred.graph.output):
        vi.type.CopyFrom(typed.type)
    return model


def _model(nodes: list[onnx.NodeProto], opset: int, outs: int, where: str) -> onnx.ModelProto:
    """``nodes`` (reading x, writing y[, z]) in the main graph, both If branches, a Loop body
    or a model-local function."""
    names = ["y", "z"][:outs]
    if where != "main":  # the subgraphs' outputs typed as the main graph's
        main = _model(nodes, opset, outs, "main").graph.output
        types = {vi.name: vi.type for vi in main}

        def _out(name: str) -> onnx.ValueInfoProto:  # noqa: F811 - typed for the bodies
            vi = onnx.ValueInfoProto(name=name)
            vi.type.CopyFrom(types[name.split("_")[-1]])
            return vi
    x = helper.make_tensor_value_info("x", F, SHAPE)
    imports = [helper.make_opsetid("", opset)]
    functions = []
    if where == "main":
        body = nodes
    elif where == "if":
        def branch(tag: str) -> onnx.GraphProto:
            renamed = []
            for n in nodes:
                c = onnx.NodeProto()
                c.CopyFrom(n)
                c.input[:] = [i if i == "x" or not i else f"{tag}_{i}" for i in c.input]
                c.output[:] = [f"{tag}_{o}" for o in c.output]
                renamed.append(c)
            return helper.make_graph(renamed, tag, [], [_out(f"{tag}_{o}") for o in names])
        cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))
        body = [cond, helper.make_node("If", ["c"], names, then_branch=branch("t"), else_branch=branch("e"))]
    elif where == "loop":
        consts = [helper.make_node("Constant", [], ["m"], value=helper.make_tensor("m", TensorProto.INT64, [], [1])),
                  helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))]
        graph = helper.make_graph([helper.make_node("Identity", ["ci"], ["co"]), *nodes], "b",
                                  [helper.make_tensor_value_info("it", TensorProto.INT64, []),
                                   helper.make_tensor_value_info("ci", TensorProto.BOOL, [])],
                                  [helper.make_tensor_value_info("co", TensorProto.BOOL, []), *map(_out, names)])
        body = [*consts, helper.make_node("Loop", ["m", "c"], names, body=graph)]
    else:
        fn = helper.make_function("local", "f", ["x"], names, nodes, imports)
        functions = [fn]
        imports = [*imports, helper.make_opsetid("local", 1)]
        body = [helper.make_node("f", ["x"], names, domain="local")]
    graph = helper.make_graph(body, "g", [x], [onnx.ValueInfoProto(name=o) for o in names])
    return _typed(helper.make_model(graph, opset_imports=imports, ir_version=8, functions=functions))


def _signature(model: onnx.ModelProto) -> list:
    """Every non-Constant node of every graph, in order: op, attributes (subgraphs as their
    signatures) and inputs, a constant input by its value (wherever it is defined)."""
    constants: dict[str, list] = {}
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        constants.update({t.name: numpy_helper.to_array(t).tolist() for t in g.initializer})
        for n in g.node:
            if n.op_type == "Constant":
                constants[n.output[0]] = numpy_helper.to_array(n.attribute[0].t).tolist()
            graphs.extend(a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH)

    def sig(g: onnx.GraphProto) -> list:
        out = []
        for n in g.node:
            if n.op_type == "Constant":
                continue
            attrs = {a.name: sig(a.g) if a.type == onnx.AttributeProto.GRAPH else helper.get_attribute_value(a)
                     for a in n.attribute}
            out.append((n.op_type, sorted(attrs.items()), [constants.get(i, i) for i in n.input]))
        return out
    return sig(model.graph)


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


PARAMS = [(name, a, b) for name, (_, pairs, _) in CASES.items() for a, b in pairs]


@pytest.mark.parametrize("where", ["main", "if", "loop", "function"])
@pytest.mark.parametrize("name, source, target", PARAMS, ids=[f"{n}-{a}-{b}" for n, a, b in PARAMS])
def test_adapter_agrees_with_onnx_converter_and_onnxruntime(name, source, target, where):
    if where in ("if", "loop") and min(source, target) < 11:
        pytest.skip("Loop-1 needs a carried value; If-11 -> 10 is onnx's (below 12 down), which has no adapter")
    build, _, outs = CASES[name]
    model = _model(build(source), source, outs, where)
    onnx.checker.check_model(model, full_check=True)
    # a function body declares no ranks: a Softmax over axis 2 there is onnx's, node by node
    by_onnx = where == "function" and "last axis 2" in name
    if by_onnx and target < source:  # below 13 axis 2 might not be the last one, whose rank is unknown
        with pytest.raises(RewriteError, match="rank of its input 'x' is not declared"):
            rewrite_model(model, target_opset=target, lowering=Lowering.KEEP)
        return
    out, report = rewrite_model(model, target_opset=target, lowering=Lowering.KEEP)
    how = f"adapters; onnx's converter node by node: {name.split()[0]} {source}->{target}" if by_onnx else "adapters"
    assert report.conversions == [(source, target, how)]
    assert {i.domain: i.version for i in out.opset_import}[""] == target
    assert all(i.version == target for fn in out.functions for i in fn.opset_import if i.domain == "")
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    ours = _run(out, x)
    for got, want in zip(ours, _run(model, x)):
        np.testing.assert_array_equal(got, want)
    if where == "function":
        return
    try:
        reference = version_converter.convert_version(model, target)
    except RuntimeError as exc:  # mostly down: onnx has no adapter (If-13 -> 12, Add-14 -> 13, Pad-18 -> 17...)
        assert "No Adapter" in str(exc)
        return
    if "last axis 2" not in name or where == "main":  # in a body onnx does not see x's rank: Flatten, Reshape
        assert _signature(out) == _signature(reference)
    for got, want in zip(ours, _run(reference, x)):
        np.testing.assert_array_equal(got, want)


def test_split_18_down_is_done_where_onnx_has_no_adapter():
    """onnx has no adapter from Split-18: graphkit drops num_outputs where the parts are even,
    else gives opset 18's sizes (ceil-sized parts, the last smaller) as the split input."""
    for length, want in ((4, None), (5, [3, 2])):
        x = helper.make_tensor_value_info("x", F, [2, length])
        node = helper.make_node("Split", ["x"], ["y", "z"], axis=1, num_outputs=2)
        model = _typed(helper.make_model(helper.make_graph([node], "g", [x], [_out("y"), _out("z")]),
                                         opset_imports=[helper.make_opsetid("", 18)], ir_version=8))
        with pytest.raises(Exception, match="No Adapter From Version \\$18 for Split"):
            version_converter.convert_version(model, 17)
        out, report = rewrite_model(model, target_opset=17, lowering=Lowering.KEEP)
        assert report.conversions == [(18, 17, "adapters")]
        (split,) = out.graph.node
        assert not [a for a in split.attribute if a.name == "num_outputs"]
        assert (numpy_helper.to_array(out.graph.initializer[0]).tolist() if want else len(split.input)) == (want or 1)
        data = np.arange(2 * length, dtype=np.float32).reshape(2, length)
        for got, ref in zip(_run(out, data), _run(model, data)):
            np.testing.assert_array_equal(got, ref)


def test_split_18_down_empty_last_part_and_refused_negative_one():
    """length 2 in 3 parts: opset 18 gives 1, 1, 0 (the older Split's even split refuses it);
    length 5 in 4 parts: opset 18 refuses the node (2, 2, 2, -1), so does the conversion."""
    def model(length: int, parts: int) -> onnx.ModelProto:
        outs = [f"y{i}" for i in range(parts)]
        node = helper.make_node("Split", ["x"], outs, axis=1, num_outputs=parts, name="s")
        return helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [2, length])],
                                                   [helper.make_tensor_value_info(o, F, [2, None]) for o in outs]),
                                 opset_imports=[helper.make_opsetid("", 18)], ir_version=8)

    out, _ = rewrite_model(model(2, 3), target_opset=17, lowering=Lowering.KEEP)
    data = np.arange(4, dtype=np.float32).reshape(2, 2)
    assert [g.shape[1] for g in _run(out, data)] == [1, 1, 0]
    with pytest.raises(RewriteError, match="opset 18 refuses it") as info:
        rewrite_model(model(5, 4), target_opset=17, lowering=Lowering.KEEP)
    assert info.value.node == "s" and info.value.op == "ai.onnx::Split"


def test_split_18_down_in_sibling_bodies_takes_each_bodys_own_length():
    """Both If branches split a value named "u" in two: Neg(x) of length 5 in one, Concat(x, x)
    of length 10 in the other, each declared in its own branch: the sizes are each branch's
    (a name -> type map over the whole model gave both the first's; one of the main graph's
    only, none)."""
    def branch(name: str, make_u: onnx.NodeProto, length: int) -> onnx.GraphProto:
        return helper.make_graph(
            [make_u, helper.make_node("Split", ["u"], ["p0", "p1"], axis=1, num_outputs=2),
             helper.make_node("Concat", ["p1", "p0"], [name], axis=1)], name, [],
            [helper.make_tensor_value_info(name, F, [2, None])],
            value_info=[helper.make_tensor_value_info("u", F, [2, length])])

    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch("t", helper.make_node("Neg", ["x"], ["u"]), 5),
                          else_branch=branch("e", helper.make_node("Concat", ["x", "x"], ["u"], axis=1), 10))], "g",
        [helper.make_tensor_value_info("x", F, [2, 5]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, [2, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    out, report = rewrite_model(model, target_opset=17, lowering=Lowering.KEEP)
    assert report.conversions == [(18, 17, "adapters")]
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    (then,) = session.run(None, {"x": x, "c": np.array(True)})
    np.testing.assert_array_equal(then, -np.concatenate([x[:, 3:], x[:, :3]], axis=1))
    (other,) = session.run(None, {"x": x, "c": np.array(False)})
    doubled = np.concatenate([x, x], axis=1)
    np.testing.assert_array_equal(other, np.concatenate([doubled[:, 5:], doubled[:, :5]], axis=1))


def test_constants_are_shared_and_put_where_every_body_sees_them():
    """Going up, one initializer of the main graph per distinct axes value, read by every If
    body; no node is added to any graph."""
    model = _model(_reduce("ReduceMean", 17) + [helper.make_node("ReduceMean", ["x"], ["w"], axes=[2], keepdims=0)],
                   17, 1, "if")
    out, _ = rewrite_model(model, target_opset=18, lowering=Lowering.KEEP)
    assert [t.name for t in out.graph.initializer] == ["t_y_axes"] and len(out.graph.node) == 2
    for attr in out.graph.node[1].attribute:
        assert [n.input[1] for n in attr.g.node] == ["t_y_axes", "t_y_axes"]


def test_function_attribute_reference_becomes_a_constant_referring_to_it():
    """ReduceMean-17's axes = @ax in a function body: up, a Constant <value_ints = @ax> read as
    the axes input (each call site's own value), and back down the attribute reference."""
    body = [helper.make_node("ReduceMean", ["x"], ["y"], keepdims=0)]
    body[0].attribute.append(onnx.AttributeProto(name="axes", ref_attr_name="ax", type=onnx.AttributeProto.INTS))
    fn = helper.make_function("local", "f", ["x"], ["y"], body, [helper.make_opsetid("", 17)], attributes=["ax"])
    calls = [helper.make_node("f", ["x"], ["a"], domain="local", ax=[2]),
             helper.make_node("f", ["x"], ["b"], domain="local", ax=[0])]
    model = _typed(helper.make_model(helper.make_graph(calls, "g", [helper.make_tensor_value_info("x", F, SHAPE)],
                                                       [_out("a"), _out("b")]), functions=[fn], ir_version=8,
                                     opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]))
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    want = _run(model, x)
    up, _ = rewrite_model(model, target_opset=18, lowering=Lowering.KEEP)
    constant, reduce = up.functions[0].node
    assert constant.op_type == "Constant" and constant.attribute[0].ref_attr_name == "ax"
    assert reduce.input[1] == constant.output[0]
    down, _ = rewrite_model(up, target_opset=17, lowering=Lowering.KEEP)
    (reduce,) = down.functions[0].node
    assert [(a.name, a.ref_attr_name) for a in reduce.attribute] == [("keepdims", ""), ("axes", "ax")]
    for converted in (up, down):
        for got, ref in zip(_run(converted, x), want):
            np.testing.assert_array_equal(got, ref)


def _refusal(model: onnx.ModelProto, target: int) -> RewriteError:
    with pytest.raises(RewriteError) as info:
        rewrite_model(model, target_opset=target, lowering=Lowering.KEEP, path="m.onnx")
    assert info.value.exit_code == 7 and info.value.path == "m.onnx" and info.value.hint
    return info.value


def _main(nodes, opset, inputs=(("x", F, SHAPE),), outs=("y",)) -> onnx.ModelProto:
    return helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                                               [helper.make_tensor_value_info(o, F, None) for o in outs]),
                             opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def test_axes_that_are_not_constant_are_refused():
    model = _main([helper.make_node("ReduceMean", ["x", "ax"], ["y"], name="mean")], 18,
                  inputs=(("x", F, SHAPE), ("ax", TensorProto.INT64, [1])))
    err = _refusal(model, 17)
    assert err.node == "mean" and err.op == "ai.onnx::ReduceMean"
    assert "its axes (ax) are not a constant" in err.message and "--target-opset of at least 18" in err.hint


def test_what_the_older_op_lacks_is_refused():
    pads = _axes("pads", [0, 0, 1, 0, 0, 2])
    err = _refusal(_main([pads, helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap", name="p")], 19), 18)
    assert err.node == "p" and "mode=wrap is new in Pad-19" in err.message
    int8 = _main([helper.make_node("Add", ["x", "x"], ["y"], name="a")], 14, inputs=(("x", TensorProto.INT8, [2]),))
    err = _refusal(int8, 13)
    assert err.node == "a" and "Add-13 does not take int8" in err.message and "at least 14" in err.hint
    noop = _main([helper.make_node("ReduceMean", ["x"], ["y"], noop_with_empty_axes=1, name="r")], 18)
    assert "noop_with_empty_axes=1" in _refusal(noop, 17).message
    allowzero = _main([_axes("shape", [2, 0, 4]), helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1)], 14)
    assert "attribute allowzero is new in Reshape-14" in _refusal(allowzero, 13).message
    computed = _main([helper.make_node("Shape", ["x"], ["shape"]),
                      helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1)], 14)
    assert "attribute allowzero is new in Reshape-14" in _refusal(computed, 13).message
    pad_axes = _main([pads, _axes("axes", [2]), helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"])], 18)
    assert "input 3 is new in Pad-18" in _refusal(pad_axes, 17).message


def test_refusal_through_the_cli_is_one_line_with_exit_code_7(tmp_path):
    model = _main([helper.make_node("ReduceMean", ["x", "ax"], ["y"], name="mean")], 18,
                  inputs=(("x", F, SHAPE), ("ax", TensorProto.INT64, [1])))
    onnx.save(model, tmp_path / "m.onnx")
    proc = run_cli("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", "--target-opset", "17", check_rc=7)
    (line,) = error_lines(proc.stderr)
    assert "m.onnx" in line and "node 'mean'" in line and "ReduceMean" in line and "not a constant" in line
    assert not (tmp_path / "o.onnx").exists()


def test_a_node_no_adapter_covers_is_converted_by_onnx_on_its_own():
    """Softmax-12 over axis 1 of a 3-D input flattens it to 2-D, Softmax-13 would not: onnx's
    converter, given that node alone (its input typed), adds a Shape, a Flatten and a Reshape;
    the rest (a ReduceMean in an If body) is the adapters'. The values it makes get fresh names."""
    model = _main([helper.make_node("Softmax", ["x"], ["s"], axis=1, name="soft"),
                   helper.make_node("ReduceMean", ["s"], ["y"], axes=[2], keepdims=0)], 12)
    model.graph.value_info.append(helper.make_tensor_value_info("soft_v_5", F, [2, 4]))  # a name onnx would make
    done = opset.convert(onnx.ModelProto.FromString(model.SerializeToString()), 13)
    assert done.fallback == [] and done.by_onnx == ["Softmax 12->13"]
    out, report = rewrite_model(model, target_opset=13, lowering=Lowering.KEEP)
    assert report.conversions == [(12, 13, "adapters; onnx's converter node by node: Softmax 12->13")]
    reference = version_converter.convert_version(model, 13)
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in reference.graph.node if n.op_type != "Constant"]
    assert len({o for n in out.graph.node for o in n.output}) == sum(len(n.output) for n in out.graph.node)
    assert "soft_v_5" not in {o for n in out.graph.node for o in n.output}
    x = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_array_equal(_run(out, x)[0], _run(reference, x)[0])
    np.testing.assert_array_equal(_run(out, x)[0], _run(model, x)[0])


def test_a_node_holding_subgraphs_no_adapter_covers_leaves_the_model_to_onnx():
    """If-11 -> 10 (below 12 going down is onnx's): the If holds subgraphs, so onnx's converter
    does the whole model; it has no adapter either: a RewriteError naming the op."""
    model = _model(_plain("Relu")(11), 11, 1, "if")
    assert opset.convert(onnx.ModelProto.FromString(model.SerializeToString()), 10).fallback == ["If 11->10"]
    with pytest.raises(RewriteError, match="No Adapter From Version \\$11 for If") as info:
        rewrite_model(model, target_opset=10, lowering=Lowering.KEEP)
    assert info.value.op == "ai.onnx::If"


def test_a_node_onnx_cannot_convert_either_is_refused():
    """Resize-11 has no adapter here and none in onnx going down to 10: the node is named."""
    roi = helper.make_node("Constant", [], ["roi"], value=helper.make_tensor("roi", F, [0], []))
    scales = helper.make_node("Constant", [], ["sc"], value=helper.make_tensor("sc", F, [3], [1, 1, 2]))
    model = _main([roi, scales, helper.make_node("Resize", ["x", "roi", "sc"], ["y"], name="up")], 11)
    err = _refusal(model, 10)
    assert err.node == "up" and err.op == "ai.onnx::Resize" and "onnx's version converter refuses it" in err.message


# Every "types" step going to opset 12 or later (those taken going down), by the newer version:
# each reviewed against ONNX's changelog (Mod-28 made fmod=0 legal on floats: _NEW_FOR_FLOATS). An
# onnx upgrade adding one fails test_step_kinds_match_the_schemas until it is reviewed here.
TYPES_STEPS = {
    12: "Clip-11 Max-8 MaxPool-11 Min-8 Pow-7 ReduceMax-11 ReduceMin-11",
    13: "Abs-6 Add-7 ArgMax-12 ArgMin-12 Cast-9 Ceil-6 Clip-12 Concat-11 Constant-12 DepthToSpace-11 Div-7 "
        "Dropout-12 Equal-11 Erf-9 Exp-6 Expand-8 Flatten-11 Floor-6 Gather-11 GatherElements-11 GatherND-12 "
        "Gemm-11 Greater-9 Identity-1 If-11 IsNaN-9 LRN-1 Less-9 Log-6 Loop-11 MatMul-9 Max-12 Mean-8 "
        "MeanVarianceNormalization-9 Min-12 Mod-10 Mul-7 Neg-6 NegativeLogLikelihoodLoss-12 NonZero-9 Pad-11 "
        "Pow-12 Reciprocal-6 ReduceL1-11 ReduceL2-11 ReduceLogSum-11 ReduceLogSumExp-11 ReduceMax-12 "
        "ReduceMean-11 ReduceMin-12 ReduceProd-11 ReduceSumSquare-11 Relu-6 Reshape-5 ScatterElements-11 "
        "ScatterND-11 Shape-1 Sigmoid-6 Sign-9 Size-1 Slice-11 SoftmaxCrossEntropyLoss-12 SpaceToDepth-1 "
        "Sqrt-6 Sub-7 Sum-8 Tanh-6 Tile-6 Transpose-1",
    14: "Add-13 CumSum-11 Div-13 Identity-13 Mul-13 Relu-13 Sub-13",
    15: "BatchNormalization-14 Pow-13",
    16: "GreaterOrEqual-12 Identity-14 If-13 LeakyRelu-6 LessOrEqual-12 Loop-13 PRelu-9 Scan-11 Where-9",
    18: "OptionalGetElement-15 ScatterElements-16 ScatterND-16",
    19: "Constant-13 DequantizeLinear-13 Equal-13 Identity-16 If-16 Loop-16 Pad-18 Reshape-14 Resize-18 "
        "Scan-16 Shape-15 Size-13",
    20: "ConstantOfShape-9 IsInf-10 IsNaN-13 ReduceMax-18 ReduceMin-18",
    21: "Cast-19 CastLike-19 Constant-19 ConstantOfShape-20 Flatten-13 Identity-19 If-19 Loop-19 Pad-19 "
        "QLinearMatMul-10 Reshape-19 Scan-19 Shape-19 Size-19 Squeeze-13 Transpose-13 Unsqueeze-13",
    22: "Acos-7 Acosh-9 Asin-7 Asinh-9 Atan-7 Atanh-9 AveragePool-19 Bernoulli-15 Conv-11 ConvTranspose-11 "
        "Cos-7 Cosh-9 DeformConv-19 Det-11 Dropout-13 Elu-6 EyeLike-9 GRU-14 GlobalAveragePool-1 "
        "GlobalLpPool-2 GlobalMaxPool-1 GridSample-20 HardSigmoid-6 HardSwish-14 InstanceNormalization-6 "
        "LSTM-14 LpNormalization-1 LpPool-18 MaxPool-12 MaxRoiPool-1 MaxUnpool-11 Mish-18 Multinomial-7 "
        "NegativeLogLikelihoodLoss-13 RNN-14 RandomNormal-1 RandomNormalLike-1 RandomUniform-1 "
        "RandomUniformLike-1 RoiAlign-16 Round-11 Selu-6 Sin-7 Sinh-9 Softplus-1 Softsign-1 Tan-7 "
        "ThresholdedRelu-10",
    23: "Cast-21 CastLike-21 Constant-21 ConstantOfShape-21 Flatten-21 Identity-21 If-21 Loop-21 Pad-21 "
        "Reshape-21 Scan-21 Shape-21 Size-21 Squeeze-21 Transpose-21 Unsqueeze-21",
    24: "Constant-23 ConstantOfShape-23 DequantizeLinear-23 Flatten-23 Identity-23 If-23 Loop-23 Pad-23 "
        "QuantizeLinear-23 Reshape-23 Scan-23 Shape-23 Size-23 SplitToSequence-11 Squeeze-23 TopK-11 "
        "Transpose-23 Unsqueeze-23",
    25: "Cast-24 CastLike-24 Constant-24 ConstantOfShape-24 DequantizeLinear-24 Flatten-24 Identity-24 If-24 "
        "Loop-24 Pad-24 QuantizeLinear-24 Reshape-24 Scan-24 Shape-24 Size-24 Squeeze-24 Transpose-24 "
        "Unsqueeze-24",
    28: "BitShift-11 Cast-25 Celu-12 Compress-11 DepthToSpace-13 DequantizeLinear-25 Einsum-12 Mod-13 "
        "OneHot-11 Optional-15 OptionalGetElement-18 OptionalHasElement-18 QuantizeLinear-25 ReduceLogSum-18 "
        "ReduceLogSumExp-18 ReverseSequence-10 Unique-11",
}


def test_step_kinds_match_the_schemas():
    """Each curated step says what changed between the two schemas, and nothing else did."""
    def schema(op, v):
        return onnx.defs.get_schema(op, v, "")

    for (op, new), name in step_tables.TO_INPUT.items():
        old = schema(op, new - 1)
        assert name in old.attributes and name not in schema(op, new).attributes
        assert schema(op, new).inputs[1].name == name and len(old.inputs) == 1
    for (op, new), added in step_tables.ADDED_ATTRIBUTES.items():
        before, after = set(schema(op, new - 1).attributes), set(schema(op, new).attributes)
        assert after - before == set(added) and before <= after, op
        assert [i.name for i in schema(op, new - 1).inputs] == [i.name for i in schema(op, new).inputs], op
    for (op, new), index in step_tables.OPTIONAL_INPUT.items():
        old, cur = schema(op, new - 1), schema(op, new)
        assert len(cur.inputs) == index + 1 == len(old.inputs) + 1
        assert cur.inputs[index].option == onnx.defs.OpSchema.FormalParameterOption.Optional
    for (op, new), (attr, values) in step_tables.NEW_VALUES.items():
        assert [s.kind for s in step_tables.steps(op, new - 1, new)] == ["types"] and attr in schema(op, new).attributes
    assert step_tables.steps("Resize", 10, 11) is None and step_tables.steps("Upsample", 9, 10) is None
    assert step_tables.steps("Relu", 7, 10) == ()  # one schema: nothing to do
    assert step_tables.steps("Concat", 11, 10) is None  # negative axes before 11: onnx's
    found: dict[int, list[str]] = {}
    for op in sorted({s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""}):
        versions = sorted({s.since_version for s in onnx.defs.get_all_schemas_with_history()
                           if s.name == op and s.domain == ""})
        for old, new in zip(versions, versions[1:]):
            if new >= 12 and step_tables._kind(op, schema(op, old), schema(op, new)) == "types":
                found.setdefault(new, []).append(f"{op}-{old}")
    assert {n: sorted(v) for n, v in found.items()} == {n: sorted(v.split()) for n, v in TYPES_STEPS.items()}


def test_mod_fmod_0_on_floats_going_below_28_is_refused():
    """Mod-28 made fmod=0 (floor modulo) legal on floats; Mod-13 takes it on integers only."""
    def mod(elem: int, shape=(3,), **attrs) -> onnx.ModelProto:
        return helper.make_model(helper.make_graph(
            [helper.make_node("Mod", ["a", "b"], ["y"], **attrs)], "g",
            [helper.make_tensor_value_info(n, elem, shape) for n in "ab"], [helper.make_tensor_value_info("y", elem, shape)]),
            opset_imports=[helper.make_opsetid("", 28)], ir_version=13)
    error = _refusal(mod(F), 13)
    assert "fmod=0 on float inputs is new in Mod-28" in str(error) and "at least 28" in error.hint
    assert "fmod=0" in str(_refusal(mod(F, fmod=0), 21))
    undeclared = mod(F)
    del undeclared.graph.input[:]
    undeclared.graph.input.extend([onnx.ValueInfoProto(name="a"), onnx.ValueInfoProto(name="b")])
    assert "not declared" in str(_refusal(undeclared, 13))
    a, b = np.array([-5.0, 5.0, 3.5], np.float32), np.array([3.0, -3.0, 2.0], np.float32)
    out, _ = rewrite_model(mod(F, fmod=1), target_opset=13, lowering=Lowering.KEEP)
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(got[0], np.fmod(a, b))
    out, _ = rewrite_model(mod(TensorProto.INT64), target_opset=13, lowering=Lowering.KEEP)
    ai, bi = np.array([-5, 5, 7], np.int64), np.array([3, -3, 2], np.int64)
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": ai, "b": bi})
    np.testing.assert_array_equal(got[0], np.mod(ai, bi))


def _softmax_bodies(n: int) -> onnx.ModelProto:
    """``n`` chained If nodes at opset 12, each branch a Softmax over axis 0 of a [1, 4] value
    (no adapter: onnx's converter does each node)."""
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))
    nodes, prev = [cond], "x"
    for i in range(n):
        def branch(tag: str) -> onnx.GraphProto:
            return helper.make_graph([helper.make_node("Softmax", [prev], [f"{tag}{i}"], axis=0)], f"{tag}{i}", [],
                                     [helper.make_tensor_value_info(f"{tag}{i}", F, [1, 4])])
        nodes.append(helper.make_node("If", ["c"], [f"o{i}"], then_branch=branch("t"), else_branch=branch("e")))
        prev = f"o{i}"
    return helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4])],
                                               [helper.make_tensor_value_info(prev, F, [1, 4])]),
                             opset_imports=[helper.make_opsetid("", 12)], ir_version=8)


def test_nodes_onnx_converts_cost_grows_linearly():
    """onnx's converter on the nodes no adapter covers, in batches (_BATCH): 8x the If bodies
    cost about 8x (one call per node: 14 ms each; all in one call: 25x per 8x, its IR checking
    each new name against every graph input)."""
    import time

    def seconds(model: onnx.ModelProto) -> float:
        start = time.process_time()
        _, report = rewrite_model(model, target_opset=13, lowering=Lowering.KEEP, check=False)
        assert report.conversions == [(12, 13, "adapters; onnx's converter node by node: Softmax 12->13")]
        return time.process_time() - start

    small, big = _softmax_bodies(150), _softmax_bodies(1200)
    seconds(small)
    ratio = seconds(big) / min(seconds(small), seconds(small))
    assert ratio < 20, f"8x the If bodies took {ratio:.1f}x the time (linear is ~8x)"
    x = np.random.default_rng(3).standard_normal([1, 4]).astype(np.float32)
    out, _ = rewrite_model(small, target_opset=13, lowering=Lowering.KEEP)
    np.testing.assert_allclose(_run(out, x)[0], _run(small, x)[0], rtol=1e-6)


# Conversions no adapter here covers, which onnx's converter does node by node:
# name -> (nodes at the source opset, source, target, outputs)
BY_ONNX = {
    "Clip min/max attributes -> inputs": ([helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.5)], 10, 11, 1),
    "Pad pads attribute -> input": ([helper.make_node("Pad", ["x"], ["y"], pads=[0, 0, 1, 0, 0, 2], mode="edge")],
                                    10, 11, 1),
    "TopK k attribute -> input": ([helper.make_node("TopK", ["x"], ["y", "z"], k=2, axis=2)], 9, 10, 2),
    "Slice attributes -> inputs": ([helper.make_node("Slice", ["x"], ["y"], starts=[1], ends=[3], axes=[2])], 9, 10, 1),
    "Softmax over a middle axis": ([helper.make_node("Softmax", ["x"], ["y"], axis=1)], 12, 13, 1),
    "Resize 10 -> 11": ([_axes("sc", [1]), helper.make_node("Cast", ["sc"], ["scf"], to=TensorProto.FLOAT),
                         helper.make_node("Expand", ["scf", "shape3"], ["scales"]),
                         helper.make_node("Resize", ["x", "scales"], ["y"], mode="nearest")], 10, 11, 1),
}


@pytest.mark.parametrize("where", ["main", "if", "function"])
@pytest.mark.parametrize("name", list(BY_ONNX))
def test_nodes_no_adapter_covers_are_onnx_s_node_by_node(name, where):
    """Clip, Pad, TopK and Slice at 10/11 (attributes became inputs), Resize at 11, Softmax
    over a middle axis at 13: onnx's converter on each node, in place; the model runs as the
    original and as onnx's converter's whole-model result."""
    nodes, source, target, outs = BY_ONNX[name]
    nodes = list(nodes)
    if name.startswith("Resize"):
        nodes.insert(0, _axes("shape3", [3]))
    model = _model(nodes, source, outs, where)
    out, report = rewrite_model(model, target_opset=target, lowering=Lowering.KEEP)
    (conversion,) = report.conversions
    assert conversion[:2] == (source, target) and conversion[2].startswith("adapters; onnx's converter node by node")
    x = np.random.default_rng(4).standard_normal(SHAPE).astype(np.float32)
    want = _run(model, x)
    for got, ref in zip(_run(out, x), want):
        np.testing.assert_allclose(got, ref, rtol=1e-6)
    if where != "function":
        for got, ref in zip(_run(version_converter.convert_version(model, target), x), want):
            np.testing.assert_allclose(got, ref, rtol=1e-6)


def _split_unknown_length(where: str, parts: int = 3) -> onnx.ModelProto:
    """Opset 18; x: float[2, w] (w unknown), Split-18 of x along axis 1 into ``parts`` by
    num_outputs, no sizes: in the main graph, both branches of an If (each of its own
    kind: a Split and a Split of Neg(x)) or a model-local function."""
    outs = [f"y{i}" for i in range(parts)]

    def split(prefix: str, source: str = "x") -> onnx.NodeProto:
        return helper.make_node("Split", [source], [f"{prefix}{o}" for o in outs], axis=1, num_outputs=parts,
                                name=f"{prefix}split")

    def typed(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, F, [2, None])

    imports = [helper.make_opsetid("", 18)]
    functions = []
    if where == "main":
        body = [split("")]
    elif where == "if":
        then = helper.make_graph([split("t_")], "t", [], [typed(f"t_{o}") for o in outs])
        other = helper.make_graph([helper.make_node("Neg", ["x"], ["e_neg"]), split("e_", "e_neg")], "e", [],
                                  [typed(f"e_{o}") for o in outs])
        body = [helper.make_node("If", ["c"], outs, then_branch=then, else_branch=other)]
    else:
        functions = [helper.make_function("local", "f", ["x"], outs, [split("")], imports)]
        imports = [*imports, helper.make_opsetid("local", 1)]
        body = [helper.make_node("f", ["x"], outs, domain="local")]
    inputs = [helper.make_tensor_value_info("x", F, [2, "w"]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    graph = helper.make_graph(body, "g", inputs if where == "if" else inputs[:1], [typed(o) for o in outs])
    return helper.make_model(graph, opset_imports=imports, ir_version=8, functions=functions)


def _torch_split(x: np.ndarray, parts: int) -> list[np.ndarray]:
    """torch.split(x, ceil(w / parts), dim=1): what Split-18's num_outputs defines."""
    chunk = -(-x.shape[1] // parts)
    return [x[:, i:i + chunk] for i in range(0, chunk * parts, chunk)][:parts]


@pytest.mark.parametrize("where", ["main", "if", "function"])
def test_split_18_down_of_unknown_length_takes_its_sizes_from_the_shape(where):
    """Split-18 num_outputs=3 of an axis whose length is not declared, down to 17: the older
    Split splits evenly and ORT refuses an uneven length (7 in 3), so nodes before the Split
    compute opset 18's sizes (3, 3, 1) from the input's shape at run time, in every scope."""
    model = _split_unknown_length(where)
    onnx.checker.check_model(model, full_check=True)
    out, report = rewrite_model(model, target_opset=17, lowering=Lowering.KEEP)
    assert report.conversions == [(18, 17, "adapters")]
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    for length in (7, 6, 5, 2):  # 3,3,1 / 2,2,2 / 2,2,1 / 1,1,0
        x = np.random.default_rng(length).standard_normal([2, length]).astype(np.float32)
        for cond in (True, False) if where == "if" else (None,):
            feeds = {"x": x} if cond is None else {"x": x, "c": np.array(cond)}
            want = _torch_split(x if cond in (None, True) else -x, 3)
            got = session.run(None, feeds)
            assert [g.shape for g in got] == [w.shape for w in want]
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("where", ["main", "if", "function"])
def test_split_18_down_below_13_of_unknown_length_is_refused(where):
    """Below opset 13 the sizes are an attribute, fixed when the model is written: a Split-18
    of unknown length cannot get them; the error names the file, node, op and the fix."""
    err = _refusal(_split_unknown_length(where), 12)
    assert err.node.endswith("split") and err.op == "ai.onnx::Split"
    assert "unknown length into 3 parts" in err.message and "at least 13" in err.hint


def test_nodes_made_in_a_list_and_in_its_subgraphs_are_all_kept():
    """Softmax-12 over a middle axis in the main graph and in an If's branches (onnx's, node
    by node): the bodies' lists are rebuilt before the main graph's (rebuilding a list copies
    the subgraphs its nodes hold; the other order lost the bodies' Flatten and Reshape)."""
    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Softmax", ["x"], [name], axis=1)], name, [],
                                 [helper.make_tensor_value_info(name, F, SHAPE)])

    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))
    model = _main([helper.make_node("Softmax", ["x"], ["s"], axis=1), cond,
                   helper.make_node("If", ["c"], ["y"], then_branch=branch("t"), else_branch=branch("e"))],
                  12, outs=("y", "s"))
    out, report = rewrite_model(model, target_opset=13, lowering=Lowering.KEEP)
    assert report.conversions == [(12, 13, "adapters; onnx's converter node by node: Softmax 12->13")]
    (if_node,) = [n for n in out.graph.node if n.op_type == "If"]
    assert all("Flatten" in [n.op_type for n in a.g.node] for a in if_node.attribute)
    x = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    for got, want in zip(_run(out, x), _run(model, x)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_split_18_down_below_13_writes_the_sizes_as_the_attribute_and_leaves_no_constant():
    """Down to 12 the uneven sizes (3, 3, 1) go straight into the split attribute: no
    initializer is made for them (one nothing read was left before)."""
    outs = ["a", "b", "c"]
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Split", ["x"], outs, axis=1, num_outputs=3, name="s")], "g",
        [helper.make_tensor_value_info("x", F, [2, 7])], [helper.make_tensor_value_info(o, F, [2, None]) for o in outs]),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    out, report = rewrite_model(model, target_opset=12, lowering=Lowering.KEEP)
    assert report.conversions == [(18, 12, "adapters")]
    (split,) = out.graph.node
    assert len(split.input) == 1 and not out.graph.initializer
    assert {a.name: helper.get_attribute_value(a) for a in split.attribute} == {"axis": 1, "split": [3, 3, 1]}
    x = np.arange(14, dtype=np.float32).reshape(2, 7)
    for got, want in zip(_run(out, x), _torch_split(x, 3)):
        np.testing.assert_array_equal(got, want)


def test_reshape_allowzero_on_a_constant_shape_without_zeros_is_dropped_going_down():
    """The dynamo exporter writes allowzero=1 on every Reshape: where the shape is a constant
    with no 0, it changes nothing, and Reshape-13 takes the node without it."""
    model = _main([_axes("shape", [4, 2]), helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1)], 18)
    out, report = rewrite_model(model, target_opset=13, lowering=Lowering.KEEP)
    assert report.conversions == [(18, 13, "adapters")]
    (reshape,) = [n for n in out.graph.node if n.op_type == "Reshape"]
    assert not reshape.attribute
    x = np.random.default_rng(6).standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_array_equal(_run(out, x)[0], _run(model, x)[0])


def _if_of_branches(then: list[onnx.NodeProto], other: list[onnx.NodeProto], opset: int,
                    shape: list[int]) -> onnx.ModelProto:
    """If(c) whose branches are ``then`` and ``other`` (each writing "t_y" / "e_y") over x."""
    def branch(tag: str, nodes: list[onnx.NodeProto]) -> onnx.GraphProto:
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"{tag}_y", F, shape)])
    return helper.make_model(helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch("t", then), else_branch=branch("e", other))], "g",
        [helper.make_tensor_value_info("x", F, [2, 2]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, shape)]), opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def test_sibling_subgraphs_constants_of_one_name_are_each_their_own():
    """Then and else branches may each define a Constant "axes" ([0] / [1]): each ReduceSum
    takes its own branch's axes going down (one map over all graphs gave both the same)."""
    def branch(tag: str, axis: int) -> list[onnx.NodeProto]:
        return [_axes("axes", [axis]), helper.make_node("ReduceSum", ["x", "axes"], [f"{tag}_y"], keepdims=0)]
    model = _if_of_branches(branch("t", 0), branch("e", 1), 13, [2])
    onnx.checker.check_model(model, full_check=True)
    out, report = rewrite_model(model, target_opset=12, lowering=Lowering.KEEP)
    assert report.conversions == [(13, 12, "adapters")]
    x = np.array([[1.0, 2.0], [10.0, 20.0]], np.float32)
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    for cond, axis in ((True, 0), (False, 1)):
        (got,) = session.run(None, {"x": x, "c": np.array(cond)})
        np.testing.assert_array_equal(got, x.sum(axis=axis))


def test_sibling_subgraphs_reshape_shapes_of_one_name_are_each_their_own():
    """allowzero=1 is dropped only where the node's own shape constant has no 0: the else
    branch's [0, 2] refuses the conversion though the then branch's "shape" is [2, 2]."""
    def branch(tag: str, shape: list[int]) -> list[onnx.NodeProto]:
        return [_axes("shape", shape), helper.make_node("Reshape", ["x", "shape"], [f"{tag}_y"], allowzero=1)]
    model = _if_of_branches(branch("t", [2, 2]), branch("e", [0, 2]), 14, [2, 2])
    error = _refusal(model, 13)
    assert "allowzero" in str(error) and error.node == "e_y"


MIDDLE = [(op, axis, target) for op in ("Softmax", "LogSoftmax", "Hardmax") for axis in (0, 1, -2) for target in (12, 11)]


@pytest.mark.parametrize("where", ["main", "if"])
@pytest.mark.parametrize("op, axis, target", MIDDLE, ids=[f"{o}-{a}-{t}" for o, a, t in MIDDLE])
def test_softmax_like_over_a_middle_axis_going_below_13_is_moved_last(op, axis, target, where):
    """Below 13 these ops flatten the input to 2-D at the axis (onnx's converter keeps the
    axis: a wrong result): a Transpose moves the axis last and one moves it back."""
    node = helper.make_node(op, ["x"], ["y"], axis=axis)
    if where == "main":
        model = _main([node], 13, inputs=(("x", F, [2, 3, 4]),))
    else:
        node.output[0] = "t_y"
        model = _if_of_branches([node], [helper.make_node("Identity", ["x"], ["e_y"])], 13, [2, 3, 4])
        model.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", F, [2, 3, 4]))
    out, _ = rewrite_model(model, target_opset=target, lowering=Lowering.KEEP)
    assert out.opset_import[0].version == target
    x = np.random.default_rng(7).standard_normal((2, 3, 4)).astype(np.float32)
    feeds = {"x": x} if where == "main" else {"x": x, "c": np.array(True)}
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(run(out)[0], run(model)[0], rtol=1e-5, atol=1e-6)


def test_softmax_over_a_middle_axis_moved_last_then_converted_by_onnx():
    """Below 11 the node (its axis moved last) is onnx's to convert, node by node."""
    model = _main([helper.make_node("LogSoftmax", ["x"], ["y"], axis=0)], 13, inputs=(("x", F, [2, 3, 4]),))
    out, report = rewrite_model(model, target_opset=10, lowering=Lowering.KEEP)
    assert report.conversions == [(13, 10, "adapters; onnx's converter node by node: LogSoftmax 13->10")]
    x = np.random.default_rng(9).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(_run(out, x)[0], _run(model, x)[0], rtol=1e-5, atol=1e-6)


def test_softmax_over_a_middle_axis_is_refused_where_the_model_goes_to_onnx_whole():
    """An If going below 12 leaves the model to onnx's converter, which keeps the axis."""
    model = _if_of_branches([helper.make_node("Softmax", ["x"], ["t_y"], axis=0)],
                            [helper.make_node("Identity", ["x"], ["e_y"])], 13, [2, 2])
    error = _refusal(model, 10)
    assert "If 13->10" in str(error) and error.node == "t_y"


def test_softmax_over_a_middle_axis_of_unknown_rank_going_below_13_is_refused():
    error = _refusal(_main([helper.make_node("Softmax", ["x"], ["y"], axis=1)], 13, inputs=(("x", F, None),)), 12)
    assert "rank" in str(error) and "axis (1)" in str(error) and error.node == "y" and "13" in error.hint


def test_export_down_moves_a_softmax_middle_axis_last():
    """The export path (convert_down: a torch softmax(dim=1) exported at opset 12)."""
    from graphkit.export._opset_down import convert_down

    model = _main([helper.make_node("Softmax", ["x"], ["y"], axis=1)], 18, inputs=(("x", F, [2, 3, 4]),))
    out = convert_down(model, 12)
    x = np.random.default_rng(8).standard_normal((2, 3, 4)).astype(np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(_run(out, x)[0], e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def _one_node_in(where: str, node: onnx.NodeProto, inputs: list, output: list, opset: int, *,
                 typed_function: bool = False, ir_version: int = 8) -> tuple[onnx.ModelProto, dict]:
    """A model whose one node ``node`` (output "y") is in the main graph, an If's then branch
    ("if") or a local function's body ("function"; its inputs' element types in the body's
    value_info where ``typed_function``), and the feeds the If's condition needs."""
    names = list(node.input)
    imports, functions, feeds, inputs = [helper.make_opsetid("", opset)], [], {}, list(inputs)
    if where == "main":
        nodes = [node]
    elif where == "if":
        node.output[0] = "t_y"
        branches = {tag: helper.make_graph(body, tag, [], [helper.make_tensor_value_info(f"{tag}_y", F, None)])
                    for tag, body in (("t", [node]), ("e", [helper.make_node("Identity", ["x"], ["e_y"])]))}
        nodes = [helper.make_node("If", ["c"], ["y"], then_branch=branches["t"], else_branch=branches["e"])]
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
        feeds["c"] = np.array(True)
    else:
        fn = helper.make_function("local", "f", names, ["y"], [node], imports)
        if typed_function:
            fn.value_info.extend(helper.make_tensor_value_info(n, F, None) for n in names)
        functions, imports = [fn], [*imports, helper.make_opsetid("local", 1)]
        nodes = [helper.make_node("f", names, ["y"], domain="local")]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, output), opset_imports=imports,
                              functions=functions, ir_version=ir_version)
    return model, feeds


# (op, its opset, the target, attributes, input shapes): ops the target lacks (or whose meaning
# changed in between) going down as ONNX's function bodies for them
_BODIES = [
    ("LayerNormalization", 17, 16, dict(axis=-1, epsilon=1e-5), [(2, 3, 4), (4,), (4,)]),
    ("LayerNormalization", 17, 13, dict(axis=-1), [(2, 3, 4), (4,)]),  # no bias; Shape-15 and Mul-14 down too
    ("LayerNormalization", 18, 16, dict(axis=1), [(2, 3, 4), (3, 4), (3, 4)]),
    ("GroupNormalization", 21, 18, dict(num_groups=2, epsilon=1e-5), [(2, 4, 3), (4,), (4,)]),  # its meaning
    ("GroupNormalization", 21, 17, dict(num_groups=2), [(2, 4, 3), (4,), (4,)]),
    ("GroupNormalization", 18, 17, dict(num_groups=2), [(2, 4, 3), (2,), (2,)]),
    ("Gelu", 20, 19, dict(approximate="tanh"), [(2, 5)]),
    ("Gelu", 20, 18, dict(), [(2, 5)]),
    ("RMSNormalization", 23, 18, dict(axis=-1), [(2, 3, 4), (4,)]),
]


@pytest.mark.parametrize("op, source, target, attrs, shapes", _BODIES,
                         ids=[f"{op}-{a}-{b}-{len(sh)}" for op, a, b, _, sh in _BODIES])
@pytest.mark.parametrize("where", ["main", "if", "function"])
def test_ops_the_target_lacks_go_down_as_onnxs_function_bodies(op, source, target, attrs, shapes, where):
    """Going down, a node of an op the target opset lacks (or whose meaning changed in
    between) is replaced by the nodes of ONNX's own function body for it, which the
    conversion takes down like any other; ORT gives the original node's values."""
    names = ["x", "s", "b"][:len(shapes)]
    node = helper.make_node(op, names, ["y"], name="n0", **attrs)
    inputs = [helper.make_tensor_value_info(n, F, list(sh)) for n, sh in zip(names, shapes)]
    # (in a function body the types are the body's value_info's)
    model, feeds = _one_node_in(where, node, inputs, [helper.make_tensor_value_info("y", F, None)], source,
                                typed_function=True, ir_version=10)
    out, report = rewrite_model(model, target_opset=target, lowering=Lowering.KEEP)
    assert report.conversions == [(source, target, f"adapters; ONNX's function bodies for {op} {source}")]
    assert op not in {n.op_type for ns, _ in node_lists(out) for n in ns}
    rng = np.random.default_rng(5)
    feeds.update({n: rng.standard_normal(sh).astype(np.float32) for n, sh in zip(names, shapes)})
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(run(out)[0], run(model)[0], rtol=1e-5, atol=1e-5)


def test_function_bodies_in_a_graph_and_in_a_branch_below_it_are_both_kept():
    """A LayerNormalization in the main graph and one in an If branch under it: rebuilding the
    main graph's node list copies the If's branches, so the branch is expanded first (it was
    expanded on a copy the model no longer held, and the conversion then refused it)."""
    ln = lambda x, y: helper.make_node("LayerNormalization", [x, "s"], [y], name=f"ln_{y}", epsilon=1e-3)
    vi = lambda name: helper.make_tensor_value_info(name, F, None)
    branches = [helper.make_graph([ln("x", "t_y")], "t", [], [vi("t_y")]),
                helper.make_graph([helper.make_node("Identity", ["x"], ["e_y"])], "e", [], [vi("e_y")])]
    nodes = [ln("x", "a"), helper.make_node("If", ["c"], ["y"], then_branch=branches[0], else_branch=branches[1])]
    model = _main(nodes, 17, inputs=(("x", F, [2, 4]), ("s", F, [4]), ("c", TensorProto.BOOL, [])), outs=("a", "y"))
    out, report = rewrite_model(model, target_opset=16, lowering=Lowering.KEEP)
    assert "LayerNormalization" not in {n.op_type for ns, _ in node_lists(out) for n in ns}
    rng = np.random.default_rng(9)
    feeds = {"x": rng.standard_normal((2, 4)).astype(np.float32), "s": rng.standard_normal(4).astype(np.float32),
             "c": np.array(True)}
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for got, want in zip(run(out), run(model)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_layer_normalization_float16_down_computes_in_float32_as_the_op_does():
    """stash_type=1: the body computes the mean and variance in float32 and casts back."""
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=-1)
    model = _main([node], 17, inputs=(("x", TensorProto.FLOAT16, [2, 64]), ("s", TensorProto.FLOAT16, [64])))
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    out, _ = rewrite_model(model, target_opset=15, lowering=Lowering.KEEP)
    rng = np.random.default_rng(6)
    feeds = {"x": (rng.standard_normal((2, 64)) * 30 + 100).astype(np.float16),
             "s": rng.standard_normal(64).astype(np.float16)}
    x = feeds["x"].astype(np.float32)
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * feeds["s"].astype(np.float32)
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_a_function_body_the_target_cannot_hold_either_is_refused_naming_the_opset():
    """GroupNormalization's body reads Shape with start (Shape-15): below 15 it is refused,
    naming the node made from it and the opset that works."""
    model = _main([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2, name="gn")], 21,
                  inputs=(("x", F, [1, 4, 3]), ("s", F, [4]), ("b", F, [4])))
    error = _refusal(model, 13)
    assert error.node.startswith("gn/") and "at least 15" in error.hint


def test_an_op_the_target_lacks_of_undeclared_type_is_refused():
    """The body is made for its inputs' element types (LayerNormalization casts to float32 and back)."""
    model = _main([helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln")], 17,
                  inputs=(("x", F, [2, 4]), ("s", F, [4])))
    del model.graph.input[1]
    model.graph.input.append(onnx.ValueInfoProto(name="s"))
    error = _refusal(model, 16)
    assert error.node == "ln" and "element type of its input 's'" in error.message and "declare" in error.hint


def test_an_op_the_target_lacks_reading_a_function_attribute_is_refused():
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln")
    node.attribute.append(helper.make_attribute_ref("epsilon", onnx.AttributeProto.FLOAT))
    fn = helper.make_function("local", "f", ["x", "s"], ["y"], [node], [helper.make_opsetid("", 17)],
                              attributes=["epsilon"])
    fn.value_info.extend(helper.make_tensor_value_info(n, F, None) for n in ("x", "s"))
    model = _main([helper.make_node("f", ["x", "s"], ["y"], domain="local", epsilon=1e-5)], 17,
                  inputs=(("x", F, [2, 4]), ("s", F, [4])))
    model.functions.append(fn)
    model.opset_import.append(helper.make_opsetid("local", 1))
    error = _refusal(model, 16)
    assert error.node == "ln" and "function's attribute epsilon" in error.message and "inline" in error.hint


def test_the_byte_writer_leaves_function_bodies_to_the_objects_writer():
    from graphkit.rewrite.files import rewrite_bytes

    model = _main([helper.make_node("LayerNormalization", ["x", "s"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
                  17, inputs=(("x", F, [2, 4]), ("s", F, [4])))
    data, report = rewrite_bytes(model.SerializeToString(), target_opset=16)
    assert report.writer == "objects" and "LayerNormalization" in report.writer_reason
    assert data == rewrite_model(model, target_opset=16)[0].SerializeToString()


@pytest.mark.parametrize("where", ["main", "if", "function"])
@pytest.mark.parametrize("channels", [4, None])
def test_group_normalization_up_across_21_repeats_scale_and_bias_per_channel(where, channels):
    """Up to 21 each group's scale and bias are repeated over its channels (the count from the
    input's shape at run time where it is not declared); ORT gives GroupNormalization-18's values."""
    gn = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2, epsilon=1e-5)
    inputs = [helper.make_tensor_value_info("x", F, [2, channels, 3]), helper.make_tensor_value_info("s", F, [2]),
              helper.make_tensor_value_info("b", F, [2])]
    output = [helper.make_tensor_value_info("y", F, [2, channels, 3])]
    model, feeds = _one_node_in(where, gn, inputs, output, 18)
    out, report = rewrite_model(model, target_opset=21, lowering=Lowering.KEEP)
    assert report.conversions == [(18, 21, "adapters")]
    rng = np.random.default_rng(11)
    feeds.update(x=rng.standard_normal((2, 4, 3)).astype(np.float32), s=np.array([1.0, -2.0], np.float32),
                 b=np.array([0.5, 3.0], np.float32))
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(run(out)[0], run(model)[0], rtol=1e-5, atol=1e-5)


def _softmax_up_by_onnx() -> onnx.ModelProto:
    """Softmax-12 over axis 1 of an input of unknown rank: onnx's to convert to 13."""
    return _main([helper.make_node("Softmax", ["x"], ["y"], axis=1, name="sm")], 12, inputs=(("x", F, None),))


def _with_tail(nodes_after: Callable[[str, str], list[onnx.NodeProto]]):
    """onnx's convert_version, whose result's first output is made through ``nodes_after(tmp, out)``."""
    real = version_converter.convert_version

    def convert_version(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
        out = real(model, target)
        (last,) = [n for n in out.graph.node if out.graph.output[0].name in n.output]
        name = last.output[0]
        last.output[0] = "tmp"
        out.graph.node.extend(nodes_after("tmp", name))
        return out
    return convert_version


def test_nodes_onnx_makes_are_placed_through_chains_of_any_length(monkeypatch):
    """A Constant three nodes before the node that makes the item's output is the item's
    (ownership was looked for two steps back only)."""
    monkeypatch.setattr(version_converter, "convert_version", _with_tail(lambda tmp, out: [
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", F, [], [0.0])),
        helper.make_node("Identity", ["zero"], ["z1"]), helper.make_node("Identity", ["z1"], ["z2"]),
        helper.make_node("Identity", ["z2"], ["z3"]), helper.make_node("Add", [tmp, "z3"], [out])]))
    model = _softmax_up_by_onnx()
    out, report = rewrite_model(model, target_opset=13, lowering=Lowering.KEEP)
    assert report.conversions == [(12, 13, "adapters; onnx's converter node by node: Softmax 12->13")]
    assert [n.op_type for n in out.graph.node][-5:] == ["Constant", "Identity", "Identity", "Identity", "Add"]
    x = np.random.default_rng(10).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(_run(out, x)[0], _run(model, x)[0], rtol=1e-6)


def test_a_node_onnx_makes_that_nothing_reads_is_refused(monkeypatch):
    monkeypatch.setattr(version_converter, "convert_version", _with_tail(lambda tmp, out: [
        helper.make_node("Identity", [tmp], [out]),
        helper.make_node("Constant", [], ["stray"], value=helper.make_tensor("stray", F, [], [0.0]))]))
    error = _refusal(_softmax_up_by_onnx(), 13)
    assert "made nodes graphkit cannot place (converting Softmax to opset 13)" in str(error)


@pytest.mark.parametrize("source, target, message", [
    (12, 13, "onnx's converter cannot see the function attribute"),
    (13, 12, "its axis is the function's attribute ax")])
def test_softmax_axis_from_a_function_attribute_is_refused(source, target, message):
    """No adapter covers axis = @ax over a middle axis, and onnx's converter cannot read it."""
    body = [helper.make_node("Softmax", ["x"], ["y"])]
    body[0].attribute.append(onnx.AttributeProto(name="axis", ref_attr_name="ax", type=onnx.AttributeProto.INT))
    fn = helper.make_function("local", "f", ["x"], ["y"], body, [helper.make_opsetid("", source)], attributes=["ax"])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("f", ["x"], ["y"], domain="local", ax=1)], "g",
        [helper.make_tensor_value_info("x", F, SHAPE)], [helper.make_tensor_value_info("y", F, SHAPE)]),
        functions=[fn], ir_version=8, opset_imports=[helper.make_opsetid("", source), helper.make_opsetid("local", 1)])
    error = _refusal(model, target)
    assert message in str(error) and "inline the function" in error.hint


@pytest.mark.parametrize("ir", [3, 10])
def test_down_an_initializer_that_is_also_an_input_is_a_constant_only_below_ir_4(ir):
    """From IR 4 on a graph input's initializer is a default a value fed replaces (ONNX
    Runtime's rule): baking it into the attribute would ignore what is fed, so the adapters
    refuse; below IR 4 every initializer is a graph input and none is replaced."""
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    graph = helper.make_graph([helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)], "g",
                              [helper.make_tensor_value_info("x", F, [2, 3]),
                               helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", F, None)], initializer=[axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=ir)
    if ir >= 4:
        with pytest.raises(RewriteError, match=r"its axes \(axes\) are not a constant"):
            rewrite_model(model, target_opset=17, lowering=Lowering.KEEP)
        return
    out, _ = rewrite_model(model, target_opset=17, lowering=Lowering.KEEP)
    reduce = next(n for n in out.graph.node if n.op_type == "ReduceMean")
    assert list(reduce.input) == ["x"] and helper.get_attribute_value(reduce.attribute[-1]) == [1]


@pytest.mark.parametrize("ir", [3, 10])
@pytest.mark.parametrize("rules", [False, True], ids=["lowering", "rule"])
def test_up_the_op_counts_after_include_the_constant_nodes_below_ir_4(ir, rules):
    """Below IR 4 the adapters going up put the axes in a Constant node of the main graph
    (an initializer would have to be a graph input): the report's counts see it."""
    from graphkit.rewrite import Rule
    from graphkit.rewrite.graph.walk import count_ops

    graph = helper.make_graph([helper.make_node("my_add", ["x", "x"], ["a"], domain="custom"),
                               helper.make_node("ReduceMean", ["a"], ["r"], axes=[0], keepdims=1),
                               helper.make_node("Relu", ["r"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F, [1, 1])],
                              [helper.make_tensor_value_info("y", F, [1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=ir)
    for lowering in (Lowering.KEEP, Lowering.DECOMPOSE):
        out, report = rewrite_model(model, target_opset=18, lowering=lowering,
                                    rules=[Rule.node("r", "Relu", lambda op, x0: op.Neg(x0))] if rules else None)
        assert report.conversions == [(17, 18, "adapters")]
        assert sum(n.op_type == "Constant" for n in out.graph.node) == (ir < 4) + (lowering == Lowering.DECOMPOSE)
        assert report.ops_after == count_ops(out)
