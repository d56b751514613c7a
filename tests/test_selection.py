"""Lowering choice by dtype and ONNX Runtime's kernels (graphkit/rewrite/lowering/selection.py).

The selection's verdict ("ORT can run this lowering for this dtype at this opset") is
measured here against ONNX Runtime itself: a tiny model of every op of graphkit's
package, lowered by each decomposition at each opset, in each dtype the op takes, is
loaded and run in an InferenceSession.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphkit
from conftest import error_lines, run_cli
from graphkit.errors import RewriteError, UnsupportedOpError
from graphkit.ops import Attr, AttrType, Decomposition, OpDef, OpRegistry, Param, default_registry
from graphkit.ops.tensor_types import elem_type
from graphkit.rewrite import Lowering, rewrite_model
from graphkit.rewrite.lowering.selection import MIN_OPSET, max_opset, ort_kernels
from graphkit.rewrite.lowering.builder import Builder, NameGenerator, TypeTable
from graphkit.rewrite.lowering.plan import LoweringPlan, LoweringScope, node_attrs

ort = pytest.importorskip("onnxruntime")

NP = {TensorProto.FLOAT16: np.float16, TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64}


# --------------------------------------------------------------------------- tiny models


def deform_model(dtype: int, opset: int, *, mask: bool = True, bias: bool = True, seed: int = 0,
                 standard: bool = False, stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups: int = 1,
                 og: int = 1, n: int = 1, c: int = 4, h: int = 6, w: int = 5, m: int = 4,
                 k: tuple = (3, 3)) -> tuple[onnx.ModelProto, dict, dict]:
    """
        input  offset  [bias]  [mask]     weight (initializer)
            \\     |     |       /          /
     custom::deform_conv2d (or ai.onnx DeformConv with ``standard``)
                      |
                    output
    Returns the model, its feeds and the attributes in deform_conv2d's terms.
    """
    rng = np.random.default_rng(seed)
    kh, kw = k
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    np_t = NP[dtype]
    arrays = {"input": rng.standard_normal((n, c, h, w)),
              "weight": rng.standard_normal((m, c // groups, kh, kw)) / np.sqrt(c // groups * kh * kw),
              "offset": rng.standard_normal((n, 2 * og * kh * kw, ho, wo)) * 2.0}
    if bias:
        arrays["bias"] = rng.standard_normal(m)
    if mask:
        arrays["mask"] = rng.random((n, og * kh * kw, ho, wo))
    arrays = {key: v.astype(np_t) for key, v in arrays.items()}
    attrs = {"stride": list(stride), "padding": list(padding), "dilation": list(dilation), "groups": groups,
             "offset_groups": og}
    names = ["input", "weight", "offset", "bias" if bias else "", "mask" if mask else ""]
    while not names[-1]:
        names.pop()
    if standard:
        node = helper.make_node("DeformConv", names, ["output"], name="dcn0", strides=list(stride),
                                pads=[padding[0], padding[1], padding[0], padding[1]], dilations=list(dilation),
                                group=groups, offset_group=og, kernel_shape=[kh, kw])
    else:
        node = helper.make_node("deform_conv2d", names, ["output"], domain="custom", name="dcn0", **attrs)
    inputs = [helper.make_tensor_value_info(key, dtype, list(arrays[key].shape))
              for key in ("input", "offset", "bias", "mask") if key in arrays]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("output", dtype, None)],
                              initializer=[numpy_helper.from_array(arrays["weight"], "weight")])
    imports = [helper.make_opsetid("", opset)] + ([] if standard else [helper.make_opsetid("custom", 1)])
    model = helper.make_model(graph, ir_version=10, opset_imports=imports)
    return model, {key: v for key, v in arrays.items() if key != "weight"}, dict(attrs, _weight=arrays["weight"])


def deform_reference(feeds: dict, attrs: dict) -> np.ndarray:
    import torch

    from graphkit_ops.deform_conv2d import reference

    args = [torch.from_numpy(feeds["input"]), torch.from_numpy(attrs["_weight"]), torch.from_numpy(feeds["offset"]),
            None if "bias" not in feeds else torch.from_numpy(feeds["bias"]),
            None if "mask" not in feeds else torch.from_numpy(feeds["mask"])]
    return reference(*args, **{k: v for k, v in attrs.items() if not k.startswith("_")}).numpy()


def elementwise_model(op: OpDef, dtype: int, opset: int) -> tuple[onnx.ModelProto, dict]:
    """One ``custom::<op>`` node over (2, 3) inputs (my_add, asinh, and other elementwise ops)."""
    names = [p.name for p in op.inputs]
    node = helper.make_node(op.name, names, ["y"], domain=op.domain, name="n0")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, dtype, [2, 3]) for n in names],
                              [helper.make_tensor_value_info("y", dtype, None)])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", opset),
                                                                   helper.make_opsetid(op.domain, 1)])
    rng = np.random.default_rng(0)
    return model, {n: rng.uniform(-3, 3, (2, 3)).astype(NP[dtype]) for n in names}


def example(op: OpDef, dtype: int, opset: int) -> tuple[onnx.ModelProto, dict]:
    if op.name == "deform_conv2d":
        model, feeds, _ = deform_model(dtype, opset)
        return model, feeds
    assert op.name in ("my_add", "asinh"), f"give {op.qualified_name} an example model here"
    return elementwise_model(op, dtype, opset)


def lowered_by(model: onnx.ModelProto, registry: OpRegistry, dec: Decomposition,
               opset: int) -> tuple[onnx.ModelProto, str | None]:
    """``model``'s one node lowered by ``dec`` at ``opset`` (whatever ORT says), and the
    selection's verdict on it."""
    node = model.graph.node[0]
    op = registry.lookup(node.domain, node.op_type)
    plan = LoweringPlan(registry, (Lowering.DECOMPOSE,), opset)
    scope = LoweringScope(TypeTable(model, registry))
    attrs = node_attrs(op, node, None)
    in_types = tuple(scope.types.elem_type(i) if i else None for i in node.input)
    verdict = plan.selection.problem(op, node, attrs, in_types, dec, opset, plan._probe(op, node, attrs, scope))
    inputs = list(node.input) + [""] * (len(op.inputs) - len(node.input))
    builder = Builder(opset=opset, prefix="n", names=NameGenerator([*inputs, *node.output, "weight"]),
                      types=scope.types)
    nodes = builder.finish(list(dec.build(builder, inputs, attrs)), list(node.output))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    del out.opset_import[:]
    out.opset_import.append(helper.make_opsetid("", opset))
    return out, verdict


def runs_in_ort(model: onnx.ModelProto, feeds: dict) -> bool:
    """True if ORT loads and runs ``model``; False if it has no kernel for a node."""
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - ORT raises its own types
        if "NOT_IMPLEMENTED" in str(exc):
            return False
        raise
    return True


# Opsets at which the op sets ORT implements change; every opset for the cheap ops.
DEFORM_OPSETS = (11, 12, 13, 15, 16, 17, 18, 19, 20, 21, 22, 24, 28)


def _grid():
    for op in default_registry():
        if default_registry().package_of(op).name != "graphkit_ops":
            continue
        for type_str in op.type_constraints[op.inputs[0].type]:
            dtype = elem_type(type_str)
            for dec in op.decompositions:
                opsets = DEFORM_OPSETS if op.name == "deform_conv2d" else range(MIN_OPSET, max_opset() + 1)
                for opset in opsets:
                    if dec.supports(opset):
                        yield pytest.param(op, dtype, dec, opset,
                                           id=f"{op.name}-{dec.name}-{type_str[7:-1]}-{opset}")


@pytest.mark.parametrize("op, dtype, dec, opset", list(_grid()))
def test_verdict_matches_an_onnxruntime_session(op, dtype, dec, opset):
    """For every op, decomposition, opset and dtype: executable as predicted iff ORT runs it."""
    model, feeds = example(op, dtype, opset)
    lowered, verdict = lowered_by(model, default_registry(), dec, opset)
    assert runs_in_ort(lowered, feeds) == (verdict is None), verdict


def _kernel_grid():
    registry = default_registry()
    for op in registry:
        if registry.package_of(op).name != "graphkit_ops":
            continue
        for type_str in op.type_constraints[op.inputs[0].type]:
            for how in (Lowering.NATIVE, Lowering.PYTHON):
                if (how is Lowering.NATIVE and registry.has_native(op)) or (
                        how is Lowering.PYTHON and op.python_kernel is not None):
                    yield pytest.param(op, elem_type(type_str), how, id=f"{op.name}-{how.value}-{type_str[7:-1]}")


@pytest.mark.parametrize("op, dtype, how", list(_kernel_grid()))
def test_kernels_run_every_type_their_op_declares(op, dtype, how):
    """What the selection assumes of native and Python kernels: every declared type runs."""
    model, feeds = example(op, dtype, 17)
    out, report = rewrite_model(model, lowering=how)
    assert report.actions == {(op.qualified_name, f"bind:{how.value}"): 1}
    (got,) = graphkit.open_session(out).run(feeds).values()
    assert got.dtype == NP[dtype]


def test_the_grid_covers_every_op_of_graphkits_package():
    covered = {p.values[0].name for p in _grid()}
    assert covered == {"my_add", "asinh", "deform_conv2d"}


# --------------------------------------------------------------------------- the choice


@pytest.mark.parametrize("opset", [11, 13, 16, 17, 18, 19, 20, 22])
def test_double_deform_conv2d_gets_a_lowering_ort_runs_at_every_opset(opset):
    """Issue 14.7: float64 at opsets 11-18 used to get decompositions ORT cannot run (Conv and
    GridSample-16 have no double kernel). Now: the native kernel there, DeformConv from 19."""
    model, feeds, attrs = deform_model(TensorProto.DOUBLE, opset, og=2, c=4, stride=(2, 1), dilation=(1, 2))
    out, report = rewrite_model(model)
    want = "decompose:onnx_deform_conv" if opset >= 19 else "bind:native"
    assert report.actions == {("custom::deform_conv2d", want): 1}
    (got,) = graphkit.open_session(out).run(feeds).values()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, deform_reference(feeds, attrs), rtol=0, atol=1e-12)


@pytest.mark.parametrize("opset", [11, 16, 18])
def test_float_deform_conv2d_keeps_its_decomposition(opset):
    model, feeds, attrs = deform_model(TensorProto.FLOAT, opset, mask=False)
    out, report = rewrite_model(model)
    want = "decompose:grid_sample" if opset >= 16 else "decompose:gather"
    assert report.actions == {("custom::deform_conv2d", want): 1}
    (got,) = graphkit.open_session(out).run(feeds).values()
    np.testing.assert_allclose(got, deform_reference(feeds, attrs), rtol=0, atol=1e-4)


def test_python_first_for_double_at_opset_16():
    model, feeds, attrs = deform_model(TensorProto.DOUBLE, 16)
    out, report = rewrite_model(model, lowering=[Lowering.DECOMPOSE, Lowering.PYTHON])
    assert report.actions == {("custom::deform_conv2d", "bind:python"): 1}
    (got,) = graphkit.open_session(out).run(feeds).values()
    np.testing.assert_allclose(got, deform_reference(feeds, attrs), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE])
@pytest.mark.parametrize("opset", [7, 8, 9, 13, 18, 20, 22, 28])
def test_asinh_default_lowering_runs_in_every_dtype_and_opset(dtype, opset):
    """ORT has Asinh for float only (float16 is cast around it); double gets a composition."""
    from graphkit_ops.asinh import ASINH

    model, _ = elementwise_model(ASINH, dtype, opset)
    x = np.array([[-50.0, -1.5, -0.25], [0.0, 0.75, 30.0]], NP[dtype])
    out, report = rewrite_model(model)
    (how,) = {h for _, h in report.actions}
    assert how.startswith("decompose:")
    (got,) = graphkit.open_session(out).run({"x": x}).values()
    assert got.dtype == x.dtype
    rtol = {TensorProto.FLOAT16: 2e-3, TensorProto.FLOAT: 1e-6, TensorProto.DOUBLE: 1e-13}[dtype]
    np.testing.assert_allclose(got, np.arcsinh(x.astype(np.float64)), rtol=rtol, atol=0)


def _asinh_only_op() -> OpDef:
    """A user op whose one decomposition is a standard op ORT has no double kernel for."""
    return OpDef(name="arsinh", doc="asinh through the standard op only", inputs=(Param("x", "T"),),
                 outputs=(Param("y", "T"),), type_constraints={"T": ("tensor(float)", "tensor(double)")},
                 reference=lambda x: x, infer_shapes=lambda shapes, attrs: [shapes[0]],
                 python_kernel=lambda x: np.arcsinh(x),
                 decompositions=(Decomposition("standard", lambda b, i, a: [b.Asinh(i[0])], min_opset=9),))


def test_user_op_falls_back_to_its_python_kernel_for_double():
    registry = OpRegistry([_asinh_only_op()])
    model, _ = elementwise_model(registry.get("arsinh"), TensorProto.DOUBLE, 13)
    _, report = rewrite_model(model, registry=registry)
    assert report.actions == {("custom::arsinh", "bind:python"): 1}
    model32, _ = elementwise_model(registry.get("arsinh"), TensorProto.FLOAT, 13)
    _, report = rewrite_model(model32, registry=registry)
    assert report.actions == {("custom::arsinh", "decompose:standard"): 1}


def _scaled_op(error: type[Exception]) -> OpDef:
    """y = scale * x: its decomposition writes Neg for scale -1 only and raises ``error`` for any
    other scale; its Python kernel takes every scale."""
    def build(b, inputs, attrs):
        if attrs["scale"] != -1:
            raise error(f"scale {attrs['scale']} has no standard form here")
        return [b.Neg(inputs[0])]

    return OpDef(name="scaled", doc="scale * x", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
                 type_constraints={"T": ("tensor(float)",)}, attributes=(Attr("scale", AttrType.INT, -1),),
                 reference=lambda x, scale=-1: scale * x, infer_shapes=lambda shapes, attrs: [shapes[0]],
                 python_kernel=lambda x, scale=-1: (scale * x).astype(x.dtype),
                 decompositions=(Decomposition("negate", build, min_opset=9),))


def _scaled_model(op: OpDef, scale: int) -> tuple[onnx.ModelProto, dict]:
    model, feeds = elementwise_model(op, TensorProto.FLOAT, 13)
    model.graph.node[0].attribute.append(helper.make_attribute("scale", scale))
    return model, feeds


def test_a_decomposition_that_refuses_a_node_falls_through_to_the_kernel(tmp_path):
    registry = OpRegistry([_scaled_op(RewriteError)])
    op = registry.get("scaled")
    model, feeds = _scaled_model(op, -1)
    _, report = rewrite_model(model, registry=registry)
    assert report.actions == {("custom::scaled", "decompose:negate"): 1} and report.passed_over == {}
    model, feeds = _scaled_model(op, 3)
    out, report = rewrite_model(model, registry=registry)
    assert report.actions == {("custom::scaled", "bind:python"): 1}
    why = "decomposition 'negate' at opset 13: cannot be built: scale 3 has no standard form here"
    assert report.passed_over == {"custom::scaled": [why]}
    assert report.to_dict()["passed_over"] == {"custom::scaled": [why]}
    got = graphkit.open_session(out, registry=registry).run(feeds)["y"]
    np.testing.assert_array_equal(got, 3 * feeds["x"])
    # Decomposing only: the refusal itself, naming the node, with a hint that fits a refusal.
    with pytest.raises(RewriteError) as info:
        rewrite_model(model, registry=registry, lowering=Lowering.DECOMPOSE)
    err = info.value
    assert type(err) is RewriteError and err.node == "n0" and err.op == "custom::scaled"
    assert err.message == "decomposition 'negate': scale 3 has no standard form here"
    assert "--bind" in err.hint and "fix the decomposition" not in err.hint


@pytest.mark.parametrize("error", [ValueError, NameError, TypeError])
def test_a_decomposition_that_raises_anything_else_is_a_bug_not_a_fallback(error):
    registry = OpRegistry([_scaled_op(error)])
    model, _ = _scaled_model(registry.get("scaled"), 3)
    for lowering in (None, Lowering.DECOMPOSE):  # the kernel must not hide it
        with pytest.raises(RewriteError) as info:
            rewrite_model(model, registry=registry, **({"lowering": lowering} if lowering else {}))
        err = info.value
        assert type(err) is RewriteError and err.node == "n0" and err.op == "custom::scaled"
        assert err.message == (f"decomposition 'negate' raised {error.__name__}: scale 3 has no standard form here: "
                               "a bug in the op's decomposition (a decomposition refuses a node by raising "
                               "graphkit's RewriteError)")
        assert type(err.__cause__) is error and err.hint.startswith("fix the decomposition")


def test_cli_report_says_why_a_lowering_was_passed_over(tmp_path):
    from graphkit.cli.rewrite import format_report

    registry = OpRegistry([_scaled_op(RewriteError)])
    _, report = rewrite_model(_scaled_model(registry.get("scaled"), 3)[0], registry=registry)
    text = format_report(report, "in.onnx", "out.onnx")
    assert text.endswith("  lowerings passed over:\n    custom::scaled: decomposition 'negate' at opset 13: "
                         "cannot be built: scale 3 has no standard form here"), text


def test_no_executable_lowering_names_node_dtype_reason_and_what_works():
    registry = OpRegistry([_asinh_only_op()])
    model, _ = elementwise_model(registry.get("arsinh"), TensorProto.DOUBLE, 13)
    with pytest.raises(UnsupportedOpError) as info:
        rewrite_model(model, registry=registry, lowering=Lowering.DECOMPOSE)
    err = info.value
    assert err.exit_code == 6 and err.node == "n0" and err.op == "custom::arsinh"
    assert err.message == ("no lowering ONNX Runtime can execute for double: decomposition 'standard' at "
                           f"opset 13: Asinh-9 has no double kernel in ONNX Runtime {ort.__version__} (takes float)")
    assert err.hint == "would work: --bind python; allow another lowering (native, python) with --prefer"


def test_double_deform_conv2d_decompose_only_names_the_opset_and_kernels_that_work():
    model, _, _ = deform_model(TensorProto.DOUBLE, 16)
    with pytest.raises(UnsupportedOpError) as info:
        rewrite_model(model, lowering=Lowering.DECOMPOSE)
    err = info.value
    assert err.node == "dcn0" and "for double" in err.message
    assert "decomposition 'grid_sample' at opset 16: GridSample-16 has no double kernel" in err.message
    assert "decomposition 'gather' at opset 16: Conv-11 has no double kernel" in err.message
    assert err.hint.startswith("would work: --target-opset 19 (decomposition 'onnx_deform_conv'), "
                               "--bind native, --bind python")


def test_nothing_works_at_all_says_so():
    op = dataclasses.replace(_asinh_only_op(), python_kernel=None)
    model, _ = elementwise_model(op, TensorProto.DOUBLE, 13)
    with pytest.raises(UnsupportedOpError) as info:
        rewrite_model(model, registry=OpRegistry([op]))
    assert info.value.hint == "no lowering of arsinh runs in ONNX Runtime for double: add one to its definition"


def test_cli_reports_the_unexecutable_choice_in_one_line(tmp_path):
    model, _, _ = deform_model(TensorProto.DOUBLE, 18)
    onnx.save(model, tmp_path / "m.onnx")
    proc = run_cli("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", "--prefer", "decompose", check_rc=6)
    (line,) = error_lines(proc.stderr)
    assert "node 'dcn0'" in line and "double" in line and "--target-opset 19" in line and "--bind native" in line
    assert not (tmp_path / "o.onnx").exists()
    run_cli("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", check_rc=0)  # the default picks native


# --------------------------------------------------------------------------- the kernel table


def test_kernel_table_knows_float16_is_cast_and_double_is_not():
    table = ort_kernels()
    node = helper.make_node("Asinh", ["x"], ["y"])
    assert table.problem(node, 13, {"x": TensorProto.FLOAT, "y": TensorProto.FLOAT}) is None
    assert table.problem(node, 13, {"x": TensorProto.FLOAT16, "y": TensorProto.FLOAT16}) is None
    assert "Asinh-9 has no double kernel" in table.problem(node, 13, {"x": TensorProto.DOUBLE})
    gs = helper.make_node("GridSample", ["x", "g"], ["y"])
    assert table.problem(gs, 19, {"x": TensorProto.DOUBLE, "g": TensorProto.DOUBLE}).startswith(
        "GridSample-16 has no double kernel")
    assert table.problem(gs, 20, {"x": TensorProto.DOUBLE, "g": TensorProto.DOUBLE}) is None
    constant = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float64(1)))
    assert table.problem(constant, 13, {"c": TensorProto.DOUBLE}) is None  # folded at load time
    cast_like = helper.make_node("CastLike", ["x", "t"], ["y"])
    assert table.problem(cast_like, 17, {"x": TensorProto.DOUBLE, "t": TensorProto.FLOAT}) is None  # a function
    assert table.problem(helper.make_node("mine", ["x"], ["y"], domain="acme"), 17, {}) is None


# --------------------------------------------------------------------------- --target-opset


@pytest.mark.parametrize("bad", [99, 6, 0, -1, max_opset() + 1, True, "19", 19.0])
def test_target_opset_outside_the_supported_range_is_a_usage_error(bad):
    from conftest import my_add_model
    from graphkit.errors import UsageError

    with pytest.raises(UsageError) as info:
        rewrite_model(my_add_model(), target_opset=bad)
    assert info.value.exit_code == 2
    assert f"({MIN_OPSET}..{max_opset()})" in info.value.message and repr(bad) in info.value.message


def test_supported_range_is_what_the_converter_and_onnxruntime_both_take():
    assert MIN_OPSET == 7 and max_opset() == min(onnx.defs.onnx_opset_version(), ort_kernels().max_opset())
    from conftest import my_add_model

    x = np.float32([[1, -2, 3]])
    for target in (MIN_OPSET, max_opset()):  # down and up
        out, report = rewrite_model(my_add_model(opset=9), target_opset=target)
        # Relu is Relu-6 at 7 and 9: only the import moves; up to the newest graphkit's adapters convert it
        assert report.conversions == [(9, target, "imports only" if target == MIN_OPSET else "adapters")]
        np.testing.assert_allclose(graphkit.open_session(out).run({"a": x, "b": x})["z"], np.maximum(3 * x, 0))


def test_cli_refuses_target_opset_99_before_reading_the_model(tmp_path):
    proc = run_cli("rewrite", tmp_path / "missing.onnx", tmp_path / "o.onnx", "--target-opset", "99", check_rc=2)
    (line,) = error_lines(proc.stderr)
    assert "--target-opset 99 is outside the ai.onnx opsets" in line and f"({MIN_OPSET}..{max_opset()})" in line


def test_report_says_which_version_conversions_ran(tmp_path):
    import json

    from conftest import my_add_model
    from graphkit_ops.my_add import MY_ADD

    onnx.save(my_add_model(opset=13), tmp_path / "m.onnx")
    text = run_cli("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", "--target-opset", "19", check_rc=0).stdout
    assert "  converted: ai.onnx opset 13 -> 19 (adapters)" in text.splitlines()
    data = json.loads(run_cli("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", "--target-opset", "21",
                              "--json", check_rc=0).stdout)
    assert data["conversions"] == [{"domain": "ai.onnx", "from": 13, "to": 21, "how": "adapters"}]
    assert {"pass": "convert-opset", "changed": "ai.onnx opset 13 -> 21"} in data["passes"]
    # the same opset: nothing converted, nothing said
    data = json.loads(run_cli("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", "--target-opset", "13",
                              "--json", check_rc=0).stdout)
    assert data["conversions"] == []
    # only placeholders: the import moves, no standard op to convert
    model, _ = elementwise_model(MY_ADD, TensorProto.FLOAT, 17)
    _, report = rewrite_model(model, target_opset=20, lowering=Lowering.KEEP)
    assert report.conversions == [(17, 20, "imports only")]
    onnx.save(model, tmp_path / "p.onnx")
    text = run_cli("rewrite", tmp_path / "p.onnx", tmp_path / "q.onnx", "--target-opset", "20", "--keep-custom",
                   check_rc=0).stdout
    assert "converted: ai.onnx opset 17 -> 20 (imports only)" in text
    assert "nothing to rewrite" not in text


def test_kernel_table_is_cached_per_ort_version_and_rebuilt_when_bad(tmp_path, monkeypatch):
    """The table is read from ORT once and kept as JSON in graphkit's cache: the same table,
    without importing ORT; a corrupt file or another version's is replaced."""
    import subprocess
    import sys

    from graphkit.rewrite.lowering import selection

    monkeypatch.setenv("GRAPHKIT_CACHE_DIR", str(tmp_path))
    selection.ort_kernels.cache_clear()
    try:
        live = selection._live_table()
        first = selection.ort_kernels()
        (cached,) = (tmp_path / "ort-kernels").iterdir()
        assert first.kernels == live.kernels and first.version == ort.__version__
        code = ("import sys; from graphkit.rewrite.lowering.selection import ort_kernels; t = ort_kernels(); "
                "print('onnxruntime' in sys.modules, len(t.kernels))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**__import__("os").environ, "GRAPHKIT_CACHE_DIR": str(tmp_path)}).stdout.split()
        assert out == ["False", str(len(live.kernels))]
        for bad in ("{not json", '{"format": 1, "version": "0.0.1", "kernels": []}', '{"format": 1}'):
            cached.write_text(bad)
            selection.ort_kernels.cache_clear()
            assert selection.ort_kernels().kernels == live.kernels
            assert selection._read_table(cached, ort.__version__).kernels == live.kernels  # rewritten
    finally:
        selection.ort_kernels.cache_clear()
