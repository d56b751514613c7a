"""Decomposition and kernel binding of custom:: nodes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import NP_TYPES, my_add_model, run_ort
from graphkit.errors import RewriteError, UnsupportedOpError
from graphkit.ops import Attr, AttrType, Decomposition, OpDef, OpRegistry, Param, default_registry
from graphkit.rewrite import Lowering, rewrite_model


@pytest.mark.parametrize("dtype", list(NP_TYPES))
@pytest.mark.parametrize("opset", [13, 17, 21])
def test_decompose_my_add_matches_reference(dtype, opset, rng):
    model = my_add_model(dtype, opset)
    out, report = rewrite_model(model)
    assert [n.op_type for n in out.graph.node] == ["Constant", "Mul", "Add", "Relu"]
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
    assert "m.onnx" in msg and "node 'add0'" in msg and "custom::mystery" in msg and "custom_ops/" in msg


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
                 decompositions=(Decomposition("mul", build, min_opset=13, max_opset=15),), **kw)


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
        rewrite_model(_scale_model(opset=17), registry=reg)


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
    assert attrs["scale"] == pytest.approx(2.0)
    assert isinstance(attrs["axes"], bytes)


def test_default_registry_is_explicit_and_fresh():
    a, b = default_registry(), default_registry()
    assert a is not b and [op.name for op in a] == ["my_add"]
