"""Decomposition and kernel binding of custom:: nodes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from conftest import NP_TYPES, my_add_model, run_ort
from graphkit.errors import RewriteError, UnsupportedOpError
from graphkit.ops import Attr, AttrType, Decomposition, OpDef, OpRegistry, Param, default_registry
from graphkit.rewrite import Lowering, rewrite_model
from graphkit.rewrite.graph.walk import count_ops


@pytest.mark.parametrize("dtype", list(NP_TYPES))
@pytest.mark.parametrize("opset", [13, 17, 21])
def test_decompose_my_add_matches_reference(dtype, opset, rng):
    model = my_add_model(dtype, opset)
    out, report = rewrite_model(model)
    # float16: 2a overflows to inf first, as in torch (ONNX Runtime computes float16 in float32)
    guard = ["Abs", "Constant", "Greater", "Constant", "Cast", "Sub", "Div"] if dtype == TensorProto.FLOAT16 else []
    assert [n.op_type for n in out.graph.node] == guard + ["Constant", "Mul", "Add", "Relu"]
    assert {i.domain for i in out.opset_import} == {""}
    assert report.actions == {("custom::my_add", "decompose:mul_add"): 1}
    np_t = NP_TYPES[dtype]
    a = rng.standard_normal((5, 3)).astype(np_t)
    b = rng.standard_normal((5, 3)).astype(np_t)
    (z,) = run_ort(out, {"a": a, "b": b})
    assert z.dtype == np_t
    np.testing.assert_allclose(z, np.maximum(2 * a + b, 0), rtol=1e-3 if np_t is np.float16 else 1e-6)


def test_decompose_keeps_names_ir_version_and_metadata():
    model = my_add_model(ir_version=8)
    helper.set_model_props(model, {"author": "me"})
    model.doc_string = "doc"
    model.graph.node[1].doc_string = "relu doc"
    out, _ = rewrite_model(model)
    assert out.ir_version == 8
    assert [(p.key, p.value) for p in out.metadata_props] == [("author", "me")]
    assert out.doc_string == "doc"
    assert [i.name for i in out.graph.input] == ["a", "b"]
    assert [o.name for o in out.graph.output] == ["z"]
    relu = out.graph.node[-1]
    assert (relu.name, relu.doc_string, list(relu.input)) == ("relu0", "relu doc", ["y"])


def test_input_model_is_not_modified():
    model = my_add_model()
    before = model.SerializeToString()
    rewrite_model(model)
    rewrite_model(model, lowering=Lowering.NATIVE)
    assert model.SerializeToString() == before


def test_model_without_custom_nodes_round_trips_unchanged():
    model = my_add_model()
    plain, _ = rewrite_model(model)
    again, report = rewrite_model(plain)
    assert again.SerializeToString() == plain.SerializeToString()
    assert not report.changed


def test_new_names_do_not_clash_with_existing_ones(rng):
    model = my_add_model()
    # Occupy the names the builder would pick first.
    model.graph.node.insert(0, helper.make_node("Identity", ["a"], ["add0/Mul_out"], name="add0/Mul"))
    model.graph.node[-1].input[0] = "y"
    out, _ = rewrite_model(model)
    names = [n.name for n in out.graph.node]
    assert len(names) == len(set(names))
    a = rng.standard_normal((2, 3)).astype(np.float32)
    (z,) = run_ort(out, {"a": a, "b": a})
    np.testing.assert_allclose(z, np.maximum(3 * a, 0), rtol=1e-6)


@pytest.mark.parametrize("bind,domain", [(Lowering.NATIVE, "graphkit.native"),
                                         (Lowering.PYTHON, "graphkit.python")])
def test_bind_retargets_domain_and_imports(bind, domain):
    out, report = rewrite_model(my_add_model(), lowering=bind)
    node = out.graph.node[0]
    assert (node.domain, node.op_type, node.name) == (domain, "my_add", "add0")
    assert {i.domain: i.version for i in out.opset_import} == {"": 17, domain: 1}
    assert report.actions == {("custom::my_add", f"bind:{bind.value}"): 1}


def test_decompose_inside_if_branch(rng):
    """
    cond -> If ( then: my_add(a, b) | else: Identity(a) ) -> z
    """
    then_g = helper.make_graph([helper.make_node("my_add", ["a", "b"], ["t"], domain="custom", name="inner")],
                               "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Identity", ["a"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["z"], then_branch=then_g, else_branch=else_g)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("custom", 1)], ir_version=10)
    out, _ = rewrite_model(model)
    a, b = np.float32([1, 2]), np.float32([10, 20])
    (z,) = run_ort(out, {"c": np.array(True), "a": a, "b": b})
    np.testing.assert_allclose(z, 2 * a + b)


def test_unknown_custom_op_names_node_and_fix():
    model = my_add_model()
    model.graph.node[0].op_type = "mystery"
    with pytest.raises(UnsupportedOpError) as err:
        rewrite_model(model, path="m.onnx")
    msg = str(err.value)
    assert "m.onnx" in msg and "node 'add0'" in msg and "custom::mystery" in msg and "registry=graphkit.ops.discover" in msg


def test_wrong_arity_is_reported():
    model = my_add_model()
    model.graph.node[0].input.append("a")
    with pytest.raises(RewriteError, match="has 3 inputs"):
        rewrite_model(model)


def _attr_op(**kw) -> OpDef:
    def build(b, inputs, attrs):
        return [b.op("Mul", inputs[0], b.constant(attrs["scale"], dtype=b.dtype(inputs[0])))]

    return OpDef(name="scale", doc="x * scale", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
                 type_constraints={"T": ("tensor(float)",)}, reference=lambda x, scale=2.0: x * scale,
                 infer_shapes=lambda s, a: [s[0]],
                 attributes=(Attr("scale", AttrType.FLOAT, 2.0), Attr("axes", AttrType.INTS, [0])),
                 python_kernel=lambda x, scale, axes: x * scale,
                 **{"decompositions": (Decomposition("mul", build, min_opset=13, max_opset=15),), **kw})


def _scale_model(opset=13, **attrs):
    node = helper.make_node("scale", ["x"], ["y"], domain="custom", name="s0", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("custom", 1)], ir_version=10)


def test_user_op_decomposes_with_default_attribute():
    reg = OpRegistry([_attr_op()])
    out, _ = rewrite_model(_scale_model(), registry=reg)
    x = np.float32([1, 2, 3])
    np.testing.assert_allclose(run_ort(out, {"x": x})[0], 2 * x)
    out, _ = rewrite_model(_scale_model(scale=0.5), registry=reg)
    np.testing.assert_allclose(run_ort(out, {"x": x})[0], 0.5 * x)


def test_decomposition_outside_its_opset_range_fails_with_reason():
    reg = OpRegistry([_attr_op()])
    with pytest.raises(UnsupportedOpError, match=r"no decomposition valid at opset 17 \(has mul: opset 13..15\)"):
        rewrite_model(_scale_model(opset=17), registry=reg, lowering=Lowering.DECOMPOSE)
    with pytest.raises(UnsupportedOpError, match="opset 17.*; has no native kernel") as err:
        rewrite_model(_scale_model(opset=17), registry=reg, lowering=[Lowering.DECOMPOSE, Lowering.NATIVE])
    assert "--prefer" in str(err.value)


def test_default_preference_falls_back_to_a_kernel_and_records_it():
    reg = OpRegistry([_attr_op()])
    out, report = rewrite_model(_scale_model(opset=14), registry=reg)
    assert report.actions == {("custom::scale", "decompose:mul"): 1}
    out, report = rewrite_model(_scale_model(opset=17), registry=reg)
    assert report.actions == {("custom::scale", "bind:python"): 1}
    out, report = rewrite_model(my_add_model(), lowering=[Lowering.NATIVE, Lowering.DECOMPOSE])
    assert report.actions == {("custom::my_add", "bind:native"): 1}


def test_target_opset_converts_and_picks_the_decomposition(rng):
    reg = OpRegistry([_attr_op()])
    out, report = rewrite_model(_scale_model(opset=17), registry=reg, target_opset=15,
                                lowering=Lowering.DECOMPOSE)
    assert {i.domain: i.version for i in out.opset_import} == {"": 15}
    x = np.float32([1, 2, 3])
    np.testing.assert_allclose(run_ort(out, {"x": x})[0], 2 * x)
    out, _ = rewrite_model(my_add_model(opset=13), target_opset=19)
    assert {i.domain: i.version for i in out.opset_import} == {"": 19}
    a = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(run_ort(out, {"a": a, "b": a})[0], np.maximum(3 * a, 0), rtol=1e-6)


def test_as_functions_keeps_placeholders_and_runs_the_body(rng):
    out, report = rewrite_model(my_add_model(), as_functions=True)
    assert [(n.domain, n.op_type) for n in out.graph.node] == [("custom", "my_add"), ("", "Relu")]
    assert [(f.domain, f.name) for f in out.functions] == [("custom", "my_add")]
    assert "CastLike" in [n.op_type for n in out.functions[0].node]
    assert report.actions == {("custom::my_add", "function:mul_add"): 1}
    for dtype in (TensorProto.FLOAT, TensorProto.DOUBLE):
        out, _ = rewrite_model(my_add_model(dtype), as_functions=True)
        a = rng.standard_normal((2, 3)).astype(NP_TYPES[dtype])
        np.testing.assert_allclose(run_ort(out, {"a": a, "b": a})[0], np.maximum(3 * a, 0), rtol=1e-6)


def test_as_functions_refuses_differing_attributes():
    reg = OpRegistry([_attr_op()])
    model = _scale_model(scale=3.0)
    model.graph.node.append(helper.make_node("scale", ["y"], ["y2"], domain="custom", name="s1", scale=4.0))
    model.graph.output[0].name = "y2"
    with pytest.raises(UnsupportedOpError, match="same attributes"):
        rewrite_model(model, registry=reg, as_functions=True)


def _scales_in_bodies(*scales):
    """scale nodes (None: no attribute) in the main graph, an If's branches and a function."""
    def node(i, scale):
        kw = {} if scale is None else {"scale": scale}
        return helper.make_node("scale", ["x"], [f"y{i}"], domain="custom", name=f"s{i}", **kw)

    nodes = [node(i, s) for i, s in enumerate(scales)]
    out = lambda name: [helper.make_tensor_value_info(name, TensorProto.FLOAT, [3])]
    then = helper.make_graph(nodes[1:2], "then", [], out("y1"))
    orelse = helper.make_graph([helper.make_node("Identity", ["x"], ["y1"])], "else", [], out("y1"))
    main = [nodes[0], helper.make_node("If", ["c"], ["z"], name="if0", then_branch=then, else_branch=orelse),
            helper.make_node("f", ["x"], ["w"], domain="local")]
    fn = helper.make_function("local", "f", ["x"], ["y2"], nodes[2:3], [helper.make_opsetid("custom", 1),
                                                                        helper.make_opsetid("", 15)])
    graph = helper.make_graph(main, "g", [*out("x"), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [*out("y0"), *out("z"), *out("w")])
    return helper.make_model(graph, functions=[fn], ir_version=10, opset_imports=[
        helper.make_opsetid("", 15), helper.make_opsetid("custom", 1), helper.make_opsetid("local", 1)])


@pytest.mark.parametrize("scales", [(None, None, None), (2.0, None, 2.0), (None, 3.0, 3.0), (3.0, None, 3.0),
                                    (None, 2.5, None), (3.0, 3.0, 4.0)])
def test_as_functions_reads_attributes_from_the_index_as_the_walk_does(scales):
    """The index keeps only the placeholder nodes with attributes: what it tells (the
    attributes, or the error naming its node) is what walking every scope tells."""
    from graphkit.rewrite.graph.walk import ModelIndex
    from graphkit.rewrite.passes.functions import function_attrs

    def build(b, inputs, attrs):  # (like=: a function body does not know x's type)
        return [b.op("Mul", inputs[0], b.constant(attrs["scale"], like=inputs[0]))]

    reg = OpRegistry([_attr_op(decompositions=(Decomposition("mul", build, min_opset=15),))])
    model = _scales_in_bodies(*scales)
    index = ModelIndex(model, collect=frozenset({"custom"}))
    assert [n.name for n in index.found] == [f"s{i}" for i, s in enumerate(scales) if s is not None]
    same = len({2.0 if s is None else s for s in scales}) == 1
    if same:
        assert function_attrs(model, reg, "m.onnx", index) == function_attrs(model, reg, "m.onnx")
        out, report = rewrite_model(model, registry=reg, as_functions=True)
        assert [(f.domain, f.name) for f in out.functions] == [("local", "f"), ("custom", "scale")]
        assert report.ops_after == count_ops(out)  # derived from the functions attached, not counted
        return
    errors = []
    for given in (index, None):
        with pytest.raises(UnsupportedOpError, match="same attributes") as err:
            function_attrs(model, reg, "m.onnx", given)
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "m.onnx" in errors[0]
    first = 2.0 if scales[0] is None else scales[0]
    assert f"s{next(i for i, s in enumerate(scales) if (2.0 if s is None else s) != first)}" in errors[0]


@pytest.mark.parametrize("rule", ["relu", "my_add", "graph_pass"])
def test_as_functions_after_rules_counts_the_ops(rule, rng):
    """Rules, then functions: the report's op counts are the output's whether the rules
    counted what they changed or not, and the functions cover the placeholders left."""
    from graphkit.rewrite import GraphPass, Rule, RuleSet

    def drop_relu(scope):  # a graph pass: the op counts are counted again
        relus = [node for node in scope.nodes if node.op_type == "Relu"]
        for node in relus:
            node.op_type = "Abs"
        return len(relus)

    rules = {"relu": Rule.node("relu_abs", "Relu", lambda op, x0: op.Abs(x0)),
             "my_add": Rule.node("my_add_add", "my_add", lambda op, x0, x1: op.Add(x0, x1), domain="custom", inputs=2),
             "graph_pass": GraphPass("relu_abs", drop_relu)}[rule]
    model = my_add_model()
    model.graph.node.insert(1, helper.make_node("my_add", ["a", "b"], ["c2"], domain="custom", name="add9"))
    model.graph.node.append(helper.make_node("Relu", ["c2"], ["d2"]))
    model.graph.output.append(helper.make_tensor_value_info("d2", TensorProto.FLOAT, [2, 3]))
    out, report = rewrite_model(model, rules=RuleSet([rules]), as_functions=True)
    assert report.ops_after == count_ops(out)
    assert [f.name for f in out.functions] == ([] if rule == "my_add" else ["my_add"])
    a = rng.standard_normal((2, 3)).astype(np.float32)
    want = np.maximum(2 * a, 0) if rule == "my_add" else np.abs(3 * a)
    np.testing.assert_allclose(run_ort(out, {"a": a, "b": a})[1], want, rtol=1e-6)


def test_bad_attributes_are_reported():
    reg = OpRegistry([_attr_op()])
    with pytest.raises(RewriteError, match="unknown attribute"):
        rewrite_model(_scale_model(bogus=1), registry=reg)
    with pytest.raises(RewriteError, match="attribute 'scale' must be FLOAT"):
        rewrite_model(_scale_model(scale="x"), registry=reg)


def test_bind_native_without_native_kernel_fails():
    reg = OpRegistry([_attr_op()])
    with pytest.raises(UnsupportedOpError, match="has no native kernel"):
        rewrite_model(_scale_model(), registry=reg, lowering=Lowering.NATIVE)


def test_bind_python_writes_every_attribute_and_encodes_lists():
    reg = OpRegistry([_attr_op()])
    out, _ = rewrite_model(_scale_model(), registry=reg, lowering=Lowering.PYTHON)
    attrs = {a.name: helper.get_attribute_value(a) for a in out.graph.node[0].attribute}
    assert float(attrs["scale"]) == pytest.approx(2.0)
    assert isinstance(attrs["axes"], bytes) and isinstance(attrs["scale"], bytes)  # exact, as strings


def test_default_registry_is_discovered_not_global(monkeypatch):
    import graphkit_ops

    a = default_registry()
    assert a.packages[0] is graphkit_ops.PACKAGE  # built-ins first, then whatever is installed
    assert [op.name for op in a][:3] == [op.name for op in graphkit_ops.ALL_OPS]
    assert "my_add" in a and a.package_of(a.get("my_add")) is graphkit_ops.PACKAGE
    # registries are immutable: discovery may share one, and a changed environment is seen
    monkeypatch.setenv("GRAPHKIT_OPS", "graphkit_ops")
    assert default_registry() is not a and len(default_registry()) == len(a)


def test_decompose_inside_local_function_fixes_its_imports(rng):
    """
    graph: x, y -> local::twice_add (a model-local function whose body holds custom::my_add) -> z
    """
    body = [helper.make_node("my_add", ["p", "q"], ["r"], domain="custom", name="fn_add")]
    fn = helper.make_function("local", "twice_add", ["p", "q"], ["r"], body, [helper.make_opsetid("custom", 1)])
    graph = helper.make_graph([helper.make_node("twice_add", ["x", "y"], ["z"], domain="local", name="call")], "g",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in "xy"],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, functions=[fn], ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("local", 1), helper.make_opsetid("custom", 1)])
    out, report = rewrite_model(model)
    assert report.actions == {("custom::my_add", "decompose:mul_add"): 1}
    assert {i.domain: i.version for i in out.functions[0].opset_import} == {"": 17}
    assert {i.domain for i in out.opset_import} == {"", "local"}
    x, y = np.float32([1, 2, 3]), np.float32([1, 1, 1])
    np.testing.assert_allclose(run_ort(out, {"x": x, "y": y})[0], 2 * x + y)


def test_decompose_inside_scan_body(rng):
    """
    Scan over rows of xs: state s -> my_add(s, x_row) -> s'   (a running 2s + x)
    """
    body = helper.make_graph(
        [helper.make_node("my_add", ["s_in", "x_row"], ["s_out"], domain="custom", name="scan_add"),
         helper.make_node("Identity", ["s_out"], ["y_row"])],
        "body", [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [3]),
                 helper.make_tensor_value_info("x_row", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("y_row", TensorProto.FLOAT, [3])])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["s0", "xs"], ["s_final", "ys"], body=body, num_scan_inputs=1, name="scan")],
        "g", [helper.make_tensor_value_info("s0", TensorProto.FLOAT, [3]),
              helper.make_tensor_value_info("xs", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("s_final", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("ys", TensorProto.FLOAT, [4, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    out, report = rewrite_model(model)
    assert report.actions == {("custom::my_add", "decompose:mul_add"): 1}
    s0 = np.zeros(3, np.float32)
    xs = rng.standard_normal((4, 3)).astype(np.float32)
    s_final, _ = run_ort(out, {"s0": s0, "xs": xs})
    expect = s0
    for row in xs:
        expect = 2 * expect + row
    np.testing.assert_allclose(s_final, expect, rtol=1e-5)


def test_invalid_replacement_names_the_node_and_the_rule():
    """A decomposition producing ill-typed ONNX (Add of float and int64) is caught by the check."""
    from graphkit.errors import ValidationError

    def bad(b, inputs, attrs):
        return [b.op("Add", inputs[0], b.constant(1, dtype=TensorProto.INT64))]

    import dataclasses

    op = dataclasses.replace(_attr_op(), decompositions=(Decomposition("broken", bad, min_opset=13),))
    with pytest.raises(ValidationError) as err:
        rewrite_model(_scale_model(), registry=OpRegistry([op]), lowering=Lowering.DECOMPOSE)
    msg = str(err.value)
    assert "node 's0'" in msg and "decomposition 'broken' of custom::scale" in msg
    out, _ = rewrite_model(_scale_model(), registry=OpRegistry([op]), lowering=Lowering.DECOMPOSE, check=False)
    assert [n.op_type for n in out.graph.node] == ["Constant", "Add"]


def test_bind_python_fills_omitted_optional_inputs_with_empty_tensors(rng):
    """deform_conv2d without bias and mask: the Python kernel gets empty arrays, reads them as absent."""
    from graphkit.runtime import open_session

    graph = helper.make_graph(
        [helper.make_node("deform_conv2d", ["x", "w", "off"], ["y"], domain="custom", name="dc")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 2, 3, 3]),
         helper.make_tensor_value_info("off", TensorProto.FLOAT, [1, 18, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 3, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    feeds = {"x": rng.standard_normal((1, 2, 5, 5), np.float32), "w": rng.standard_normal((3, 2, 3, 3), np.float32),
             "off": rng.standard_normal((1, 18, 3, 3), np.float32)}
    py, _ = rewrite_model(model, lowering=Lowering.PYTHON)
    assert [n.op_type for n in py.graph.node] == ["Constant", "deform_conv2d"]
    std, _ = rewrite_model(model, lowering=Lowering.DECOMPOSE)
    np.testing.assert_allclose(open_session(py).run(feeds)["y"], open_session(std).run(feeds)["y"], atol=1e-4)


def test_generated_names_avoid_sparse_initializers():
    from onnx import numpy_helper

    model = my_add_model()
    values = numpy_helper.from_array(np.float32([1.0]), "add0/Mul_out")
    indices = numpy_helper.from_array(np.int64([0]), "idx")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [3]))
    out, _ = rewrite_model(model, check=False)
    assert "add0/Mul_out" not in {o for n in out.graph.node for o in n.output}


def _if_model(shapeless: bool = False, bad_attribute: bool = False):
    """x -> If(then: my_add(x, x), else: my_add(x, x)) -> Relu; body outputs without a shape
    when ``shapeless``; the Relu has an attribute Relu does not take when ``bad_attribute``."""
    import onnx

    def body(tag: str) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(tag, TensorProto.FLOAT, None if shapeless else [2])
        return helper.make_graph([helper.make_node("my_add", ["x", "x"], [tag], domain="custom")], tag, [], [out])

    nodes = [helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True])),
             helper.make_node("If", ["c"], ["o"], then_branch=body("t"), else_branch=body("e")),
             helper.make_node("Relu", ["o"], ["y"], **({"alpha": 1.0} if bad_attribute else {}))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=10)


def test_objects_writer_checks_the_serialized_result(monkeypatch):
    """Through rewrite_bytes (the CLI's path) the objects writer runs the ONNX checker on the
    serialized output, once the model objects are gone: it still refuses an invalid model and
    still accepts graph outputs without a shape (the checker sees an empty one)."""
    import onnx

    from graphkit.errors import ValidationError
    from graphkit.rewrite import engine
    from graphkit.rewrite.files import rewrite_bytes

    monkeypatch.setattr(engine, "FULL_CHECK_NODES", 0)  # no whole-model inference: the checker alone
    for fast, writer in ((False, "objects"), (True, "bytes")):  # the bytes writer for bodies alike
        data, report = rewrite_bytes(_if_model(shapeless=True).SerializeToString(), fast=fast)
        assert report.writer == writer and report.actions
        out = onnx.load_model_from_string(data)
        assert not out.graph.node[1].attribute[0].g.output[0].type.tensor_type.HasField("shape")  # left as it was
        x = np.float32([1, -2])
        (y,) = run_ort(out, {"x": x})
        np.testing.assert_allclose(y, np.maximum(3 * x, 0))  # my_add(a, b) = 2a + b
        with pytest.raises(ValidationError, match="invalid model after rewrite"):
            rewrite_bytes(_if_model(bad_attribute=True).SerializeToString(), fast=fast)
        rewrite_bytes(_if_model(bad_attribute=True).SerializeToString(), check=False, fast=fast)  # the check it was
