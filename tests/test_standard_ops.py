"""ai.onnx DeformConv is deform_conv2d (OpDef.standard_ops): `graphkit rewrite` repairs it under
opset 19, keeps it where it is the chosen lowering, and applies --bind / --prefer to it.

Every case compares ONNX Runtime's output with graphkit's torch reference
(custom_ops/deform_conv2d/_reference.py)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphkit
from conftest import error_lines, run_cli
from graphkit.errors import OpDefinitionError, OpPackageError, RewriteError, UnsupportedOpError
from graphkit.ops import OpRegistry, StandardOp, default_registry
from graphkit.rewrite import Lowering, rewrite_model
from test_selection import deform_model, deform_reference

pytest.importorskip("torch")

# (geometry, with mask, with bias): offset groups, stride, dilation, padding and groups vary
SHAPES = {
    "dcnv2": dict(),
    "og2_stride21_nomask": dict(og=2, stride=(2, 1), mask=False),
    "dil2_pad0_nobias_groups2": dict(dilation=(2, 2), padding=(0, 0), bias=False, groups=2, h=7, w=7),
    "og4_k2_plain": dict(og=4, k=(2, 2), padding=(1, 0), mask=False, bias=False, c=8, m=2),
}
LOWERINGS = {
    "default": None,
    "native": Lowering.NATIVE,
    "python": Lowering.PYTHON,
    "prefer_python_decompose": [Lowering.PYTHON, Lowering.DECOMPOSE],
    "prefer_native_python": [Lowering.NATIVE, Lowering.PYTHON],
}


def _expected_action(lowering, opset: int, dtype: int) -> str | None:
    """The action the report must show (None: the node is kept as DeformConv)."""
    if lowering is None:
        if opset >= 19:
            return None
        return "decompose:grid_sample" if dtype == TensorProto.FLOAT else "bind:native"
    first = lowering if isinstance(lowering, Lowering) else lowering[0]
    return f"bind:{first.value}"


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("lowering", list(LOWERINGS))
@pytest.mark.parametrize("opset", [18, 19])
def test_deform_conv_nodes_lower_like_the_placeholder(shape, lowering, opset):
    dtype = TensorProto.FLOAT
    model, feeds, attrs = deform_model(dtype, opset, standard=True, seed=3, **SHAPES[shape])
    how = LOWERINGS[lowering]
    out, report = rewrite_model(model) if how is None else rewrite_model(model, lowering=how)
    want = _expected_action(how, opset, dtype)
    if want is None:
        assert report.actions == {} and out == model  # DeformConv-19 is the choice: untouched
    else:
        assert report.actions == {("DeformConv as custom::deform_conv2d", want): 1}
        assert "DeformConv" not in [n.op_type for n in out.graph.node]
    (got,) = graphkit.open_session(out).run(feeds).values()
    np.testing.assert_allclose(got, deform_reference(feeds, attrs), rtol=0, atol=1e-5)


@pytest.mark.parametrize("opset", [11, 13, 16, 18, 19, 20])
def test_double_deform_conv_runs_at_every_opset_by_default(opset):
    model, feeds, attrs = deform_model(TensorProto.DOUBLE, opset, standard=True, og=2, stride=(1, 2))
    out, report = rewrite_model(model)
    assert report.actions == ({} if opset >= 19 else {("DeformConv as custom::deform_conv2d", "bind:native"): 1})
    (got,) = graphkit.open_session(out).run(feeds).values()
    np.testing.assert_allclose(got, deform_reference(feeds, attrs), rtol=0, atol=1e-12)


def test_opset_18_model_is_invalid_before_and_valid_after():
    """What torch's dynamo exporter writes at opset 18: DeformConv, which needs 19."""
    import onnxruntime as ort

    model, feeds, attrs = deform_model(TensorProto.FLOAT, 18, standard=True, og=2)
    with pytest.raises(Exception, match="DeformConv"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out, _ = rewrite_model(model, lowering=Lowering.DECOMPOSE)
    assert {i.domain: i.version for i in out.opset_import} == {"": 18}
    (got,) = graphkit.open_session(out).run(feeds).values()
    np.testing.assert_allclose(got, deform_reference(feeds, attrs), rtol=0, atol=1e-5)


def test_running_an_opset_18_deform_conv_names_the_rewrite_that_fixes_it(tmp_path):
    """`graphkit run` says which command repairs the model instead of ONNX Runtime's INVALID_GRAPH."""
    from conftest import run_cli

    from graphkit.errors import UnsupportedOpError

    model, _, _ = deform_model(TensorProto.FLOAT, 18, standard=True)
    with pytest.raises(UnsupportedOpError) as info:
        graphkit.open_session(model)
    assert "does not exist at ai.onnx opset 18 (it came in opset 19)" in str(info.value)
    onnx.save(model, tmp_path / "dcn18.onnx")
    proc = run_cli("run", "dcn18.onnx", cwd=tmp_path, check_rc=6)
    (line,) = error_lines(proc.stderr)
    assert "node 'dcn0'" in line and "opset 18" in line
    assert "graphkit rewrite dcn18.onnx OUT.onnx" in line and "custom::deform_conv2d" in line
    fixed, _ = rewrite_model(model)
    graphkit.open_session(fixed)  # the rewritten model opens


@pytest.mark.parametrize("source, target, want", [
    (18, 19, ("custom::deform_conv2d", "decompose:onnx_deform_conv")),   # raise the opset: DeformConv again
    (19, 18, ("custom::deform_conv2d", "decompose:grid_sample")),        # lower it: below DeformConv's opset
    (19, 13, ("custom::deform_conv2d", "decompose:gather")),
    (17, 22, ("custom::deform_conv2d", "decompose:onnx_deform_conv")),
])
def test_target_opset_across_19(source, target, want):
    """The version converter has no DeformConv adapter under or across 19: graphkit turns
    the nodes into placeholders first (pass recognise-standard-ops), then lowers them."""
    model, feeds, attrs = deform_model(TensorProto.FLOAT, source, standard=True, mask=False)
    out, report = rewrite_model(model, target_opset=target)
    assert report.actions == {want: 1}
    assert ("recognise-standard-ops", "1 DeformConv as custom::deform_conv2d") in report.passes
    assert report.conversions == [(source, target, "imports only")]  # the placeholder is all there is
    assert {i.domain: i.version for i in out.opset_import} == {"": target}
    (got,) = graphkit.open_session(out).run(feeds).values()
    np.testing.assert_allclose(got, deform_reference(feeds, attrs), rtol=0, atol=1e-5)


def test_cli_report_names_what_it_did(tmp_path):
    model, feeds, attrs = deform_model(TensorProto.FLOAT, 18, standard=True)
    onnx.save(model, tmp_path / "m.onnx")
    text = run_cli("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", "--bind", "native", check_rc=0).stdout
    assert "    DeformConv as custom::deform_conv2d: bind:native x1" in text.splitlines()
    data = json.loads(run_cli("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", "--json", check_rc=0).stdout)
    assert data["actions"] == [{"op": "DeformConv as custom::deform_conv2d", "lowering": "decompose:grid_sample",
                                "nodes": 1}]
    assert data["ops_before"] == {"DeformConv": 1} and "DeformConv" not in data["ops_after"]
    (got,) = graphkit.open_session(str(tmp_path / "o.onnx")).run(feeds).values()
    np.testing.assert_allclose(got, deform_reference(feeds, attrs), rtol=0, atol=1e-5)
    # at opset 19 the default keeps DeformConv: nothing to rewrite
    onnx.save(deform_model(TensorProto.FLOAT, 19, standard=True)[0], tmp_path / "m19.onnx")
    text = run_cli("rewrite", tmp_path / "m19.onnx", tmp_path / "o19.onnx", check_rc=0).stdout
    assert "nothing to rewrite: model written unchanged" in text
    assert (tmp_path / "m19.onnx").read_bytes() == (tmp_path / "o19.onnx").read_bytes()


def _asymmetric(opset: int) -> onnx.ModelProto:
    model, _, _ = deform_model(TensorProto.FLOAT, opset, standard=True, padding=(1, 1))
    pads = next(a for a in model.graph.node[0].attribute if a.name == "pads")
    pads.ints[:] = [1, 1, 0, 0]
    model.graph.output[0].type.tensor_type.ClearField("shape")
    return model


def test_asymmetric_pads_have_no_deform_conv2d_form():
    with pytest.raises(RewriteError) as info:
        rewrite_model(_asymmetric(18))
    err = info.value
    assert err.exit_code == 7 and err.node == "dcn0" and err.op == "ai.onnx::DeformConv"
    assert "pads [1, 1, 0, 0] differ between the two sides" in err.message
    assert err.hint == "keep it as DeformConv (opset 19 or later, default lowering)"
    with pytest.raises(RewriteError, match="pads"):
        rewrite_model(_asymmetric(19), lowering=Lowering.NATIVE)
    model = _asymmetric(19)  # valid as it is, and the default lowering keeps it
    out, report = rewrite_model(model)
    assert report.actions == {} and out == model
    # ... also when converting to a newer opset that still has DeformConv
    out, report = rewrite_model(_asymmetric(19), target_opset=20)
    assert report.actions == {} and [n.op_type for n in out.graph.node] == ["DeformConv"]
    assert out.opset_import[0].version == 20 or any(i.version == 20 for i in out.opset_import if i.domain == "")


def test_double_deform_conv_decompose_only_at_18_names_what_works():
    model, _, _ = deform_model(TensorProto.DOUBLE, 18, standard=True)
    with pytest.raises(UnsupportedOpError) as info:
        rewrite_model(model, lowering=Lowering.DECOMPOSE)
    assert info.value.node == "dcn0" and "for double" in info.value.message
    assert info.value.op == "DeformConv as custom::deform_conv2d"
    assert info.value.hint.startswith("would work: --target-opset 19 (decomposition 'onnx_deform_conv'), "
                                      "--bind native, --bind python")


def test_keep_custom_leaves_deform_conv_alone():
    model, _, _ = deform_model(TensorProto.FLOAT, 18, standard=True)
    out, report = rewrite_model(model, lowering=Lowering.KEEP)
    assert report.actions == {} and out == model


def test_the_standard_op_is_declared_once_in_the_op_definition():
    from graphkit_ops.deform_conv2d import DEFORM_CONV2D

    (std,) = DEFORM_CONV2D.standard_ops
    assert (std.op_type, std.since_opset, std.decomposition) == ("DeformConv", 19, "onnx_deform_conv")
    reg = default_registry()
    assert reg.standard_op("", "DeformConv") == (DEFORM_CONV2D, std)
    assert reg.standard_op("ai.onnx", "DeformConv") == (DEFORM_CONV2D, std)
    assert reg.standard_op("", "Conv") is None


def _relu_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


def test_a_users_op_can_claim_a_standard_op():
    """A user package's op computing a standard op gets its nodes: Softsign as custom::soft."""
    from graphkit.ops import Decomposition, OpDef, Param

    soft = OpDef(name="soft", doc="x / (1 + |x|)", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
                 type_constraints={"T": ("tensor(float)",)}, reference=lambda x: x / (1 + x.abs()),
                 infer_shapes=lambda shapes, attrs: [shapes[0]], python_kernel=lambda x: x / (1 + np.abs(x)),
                 decompositions=(Decomposition("div", lambda b, i, a: [b.Div(i[0], b.Add(b.Abs(i[0]), b.constant(
                     1, like=i[0])))], min_opset=7),),
                 standard_ops=(StandardOp("Softsign", 1, lambda attrs: {}),))
    graph = helper.make_graph([helper.make_node("Softsign", ["x"], ["y"], name="s0")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    out, report = rewrite_model(model, registry=OpRegistry([soft]))
    assert report.actions == {("Softsign as custom::soft", "decompose:div"): 1}
    x = np.float32([-2, 0, 3])
    np.testing.assert_allclose(graphkit.open_session(out, registry=OpRegistry([soft])).run({"x": x})["y"],
                               x / (1 + np.abs(x)), rtol=1e-6)
    out, report = rewrite_model(model, registry=OpRegistry([soft]), lowering=Lowering.PYTHON)
    assert report.actions == {("Softsign as custom::soft", "bind:python"): 1}
    assert [(n.domain, n.op_type) for n in out.graph.node] == [("graphkit.python", "soft")]
    # two ops claiming one standard op: an error where a model has such a node
    twins = OpRegistry([soft, dataclasses.replace(soft, name="soft2")])
    with pytest.raises(OpPackageError, match="standard op Softsign is claimed by two ops: custom::soft and "
                                             "custom::soft2") as info:
        rewrite_model(model, registry=twins)
    assert info.value.exit_code == 13
    rewrite_model(my_add_like := _relu_model(), registry=twins)  # models without it are fine
    assert my_add_like.graph.node[0].op_type == "Relu"


def test_bad_standard_op_declarations_are_definition_errors():
    from graphkit_ops.deform_conv2d import DEFORM_CONV2D

    with pytest.raises(OpDefinitionError, match="domain 'acme' is not a standard one"):
        dataclasses.replace(DEFORM_CONV2D, standard_ops=(StandardOp("X", 1, dict, domain="acme"),))
    with pytest.raises(OpDefinitionError, match="inputs \\(0, 0\\) is not an order"):
        dataclasses.replace(DEFORM_CONV2D, standard_ops=(StandardOp("X", 1, dict, inputs=(0, 0)),))
    with pytest.raises(OpDefinitionError, match="listed twice"):
        dataclasses.replace(DEFORM_CONV2D, standard_ops=(StandardOp("X", 1, dict), StandardOp("X", 2, dict)))


def test_inspect_names_deform_conv_nodes_and_whether_the_opset_has_them(tmp_path):
    for opset, state in ((18, "INVALID at this opset (needs 19): `graphkit rewrite` lowers it"), (19, "valid here")):
        onnx.save(deform_model(TensorProto.FLOAT, opset, standard=True)[0], tmp_path / "m.onnx")
        text = run_cli("inspect", tmp_path / "m.onnx", check_rc=0).stdout
        assert f"DeformConv x1 (dcn0) is custom::deform_conv2d: {state}" in text.splitlines()
        (entry,) = json.loads(run_cli("inspect", tmp_path / "m.onnx", "--json", check_rc=0).stdout)[
            "standard_ops_of_graphkit_ops"]
        assert (entry["op"], entry["as"], entry["valid"], entry["nodes"]) == (
            "DeformConv", "custom::deform_conv2d", opset >= 19, ["dcn0"])
        assert entry["lowerings"][-2:] == ["native", "python"]
