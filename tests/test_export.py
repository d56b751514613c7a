"""graphkit.export.export with both torch exporters: custom:: nodes, opset imports,
dynamic dims, attributes, atomic writes and errors. (Running in ORT is tested elsewhere.)"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import onnx  # noqa: E402

import graphkit_ops  # noqa: E402
from graphkit.errors import ExportError  # noqa: E402
from graphkit.export import ExportReport, TorchOps, autograd_function, export  # noqa: E402
from graphkit.export import torch_ops  # noqa: E402
from graphkit.ops import Attr, AttrType, OpDef, OpRegistry, Param, default_registry  # noqa: E402

MY_ADD = graphkit_ops.MY_ADD
BOTH = pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])


def _attr_ref(x, k, alpha, mode, axes, scales):
    return x * alpha + k


ATTR_OP = OpDef(
    name="gk_export_attrs", doc="x * alpha + k", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
    type_constraints={"T": ("tensor(float)",)}, reference=_attr_ref,
    infer_shapes=lambda shapes, attrs: [shapes[0]],
    attributes=(Attr("k", AttrType.INT, 3), Attr("alpha", AttrType.FLOAT, 0.5),
                Attr("mode", AttrType.STRING, "lin"), Attr("axes", AttrType.INTS, [0, 1]),
                Attr("scales", AttrType.FLOATS, [1.0])),
)
REGISTRY = default_registry().with_ops(ATTR_OP)


@pytest.fixture(scope="module")
def ops():
    with TorchOps(REGISTRY) as o:
        yield o


@pytest.fixture
def inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, generator=gen), torch.randn(2, 3, generator=gen)


class FunctionModel(torch.nn.Module):
    """The tutorial's way: an autograd.Function with a symbolic."""

    def __init__(self):
        super().__init__()
        self.fn = autograd_function(MY_ADD)

    def forward(self, a, b):
        return torch.relu(self.fn.apply(a, b))


class LibraryModel(torch.nn.Module):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def forward(self, a, b):
        return torch.relu(self.ops.my_add(a, b))


def _custom_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == "custom"]


def _check(path, report: ExportReport, *, n_my_add: int = 1) -> onnx.ModelProto:
    model = onnx.load(path)
    assert [n.op_type for n in _custom_nodes(model)] == ["my_add"] * n_my_add
    imports = {i.domain: i.version for i in model.opset_import}
    assert imports["custom"] == 1 and imports[""] == 18
    assert model.ir_version <= 10
    assert report.count("my_add") == n_my_add and report.unknown_ops == ()
    assert [n.op for n in report.custom_nodes] == ["custom::my_add"] * n_my_add
    with REGISTRY.onnx_schemas():
        onnx.checker.check_model(model, full_check=True)
    return model


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_autograd_function_export_torchscript(tmp_path, inputs):
    path = tmp_path / "fn.onnx"
    report = export(FunctionModel(), inputs, path, dynamo=False)
    model = _check(path, report)
    assert report.exporter == "torchscript" and report.inputs == ("a", "b")
    assert _dims(model.graph.output[0]) == [2, 3]  # the symbolic typed its output


def test_autograd_function_export_dynamo_records_the_library_op(tmp_path, inputs):
    """torch.export ignores `symbolic`; the Function records graphkit::my_add instead."""
    path = tmp_path / "fn.onnx"
    _check(path, export(FunctionModel(), inputs, path, dynamo=True))


@BOTH
def test_library_op_export(tmp_path, ops, inputs, dynamo):
    path = tmp_path / "lib.onnx"
    report = export(LibraryModel(ops), inputs, path, dynamo=dynamo, output_names=["z"])
    model = _check(path, report)
    assert [n.op_type for n in model.graph.node] == ["my_add", "Relu"]
    assert report.outputs == ("z",) and report.path == path
    assert not torch_ops.symbolic_registered("my_add")  # scoped to the call


@BOTH
@pytest.mark.parametrize("model_kind", ["function", "library"])
def test_dynamic_batch(tmp_path, ops, dynamo, model_kind):
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(4, 3, generator=gen), torch.randn(4, 3, generator=gen)
    model = FunctionModel() if model_kind == "function" else LibraryModel(ops)
    path = tmp_path / "dyn.onnx"
    report = export(model, (a, b), path, dynamo=dynamo, input_names=["x", "y"],
                    dynamic_dims={"x": {0: "batch"}, "y": {0: "batch"}})
    proto = _check(path, report)
    assert [_dims(i) for i in proto.graph.input] == [["batch", 3], ["batch", 3]]
    assert report.inputs == ("x", "y")
    first = proto.graph.output[0].type.tensor_type.shape.dim[0]
    assert not first.HasField("dim_value")  # symbolic, not baked in


@BOTH
def test_attributes_have_their_types(tmp_path, ops, dynamo):
    class M(torch.nn.Module):
        def forward(self, x):
            return ops.gk_export_attrs(x, 7, 2, "abc", [2, 3], [0.5, 1])  # int 2 for a FLOAT

    class MDefaults(torch.nn.Module):
        def forward(self, x):
            return ops.gk_export_attrs(x)

    AT = onnx.AttributeProto
    for model, want in [
        (M(), {"k": (AT.INT, 7), "alpha": (AT.FLOAT, 2.0), "mode": (AT.STRING, b"abc"),
               "axes": (AT.INTS, [2, 3]), "scales": (AT.FLOATS, [0.5, 1.0])}),
        (MDefaults(), {"k": (AT.INT, 3), "alpha": (AT.FLOAT, 0.5), "mode": (AT.STRING, b"lin"),
                       "axes": (AT.INTS, [0, 1]), "scales": (AT.FLOATS, [1.0])}),
    ]:
        path = tmp_path / "attrs.onnx"
        report = export(model, (torch.ones(2, 3),), path, dynamo=dynamo, registry=REGISTRY)
        proto = onnx.load(path)
        (node,) = _custom_nodes(proto)
        assert node.op_type == "gk_export_attrs" and report.count("gk_export_attrs") == 1
        got = {a.name: (a.type, onnx.helper.get_attribute_value(a)) for a in node.attribute}
        assert got == want
        with REGISTRY.onnx_schemas():
            onnx.checker.check_model(proto, full_check=True)


def test_attributes_through_autograd_function_torchscript(tmp_path):
    fn = autograd_function(ATTR_OP)

    class M(torch.nn.Module):
        def forward(self, x):
            return fn.apply(x, 7, 2.0, "abc", [2, 3], [0.5, 1.0])

    path = tmp_path / "fa.onnx"
    export(M(), (torch.ones(2, 3),), path, dynamo=False, registry=REGISTRY)
    (node,) = _custom_nodes(onnx.load(path))
    AT = onnx.AttributeProto
    assert {a.name: a.type for a in node.attribute} == {
        "k": AT.INT, "alpha": AT.FLOAT, "mode": AT.STRING, "axes": AT.INTS, "scales": AT.FLOATS}


class DataDependent(torch.nn.Module):
    def forward(self, a, b):
        return a.nonzero() if (a.sum() > 0).item() else b


@BOTH
def test_failing_export_raises_export_error_and_writes_nothing(tmp_path, ops, dynamo):
    class Mixed(torch.nn.Module):  # int32 into a float-only op
        def forward(self, a, b):
            return ops.my_add(a, b.to(torch.int32))

    path = tmp_path / "out.onnx"
    path.write_bytes(b"previous")
    model = Mixed()
    with pytest.raises(ExportError) as info:
        export(model, (torch.ones(2), torch.ones(2)), path, dynamo=dynamo)
    err = info.value
    assert "Mixed" in err.message and "[my_add]" in err.message and err.exit_code == 11
    assert path.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]


def test_untraceable_model_names_model_and_cause(tmp_path):
    with pytest.raises(ExportError, match=r"cannot export DataDependent \(dynamo=True\)") as info:
        export(DataDependent(), (torch.ones(2), torch.ones(2)), tmp_path / "x.onnx", dynamo=True)
    assert info.value.hint and "dynamo=False" in info.value.hint
    assert not list(tmp_path.iterdir())


def test_bad_arguments_are_export_errors(tmp_path, inputs):
    with pytest.raises(ExportError, match=r"unknown input\(s\) \['c'\]"):
        export(FunctionModel(), inputs, tmp_path / "x.onnx", dynamic_dims={"c": {0: "n"}})
    assert not list(tmp_path.iterdir())


class _GridSample(torch.nn.Module):
    def forward(self, x, grid):
        return torch.nn.functional.grid_sample(x, grid, align_corners=False)


def test_dynamo_below_opset_18_converts_or_fails_naming_the_converter(tmp_path, inputs):
    """torch builds opset 18 and runs onnx's version converter below it; torch keeps opset 18
    silently when that fails: graphkit's export converts it, or fails with the reason. An op
    the older opset lacks becomes ONNX's function body for it (LayerNormalization at 14,
    matching torch); one with none (GridSample, from 16) fails."""
    import numpy as np
    import onnxruntime as ort

    report = export(FunctionModel(), inputs, tmp_path / "f17.onnx", dynamo=True, opset=17)
    assert report.opset == 17 and report.count("my_add") == 1
    norm = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    export(norm, (x,), tmp_path / "n14.onnx", dynamo=True, opset=14)
    model = onnx.load(tmp_path / "n14.onnx")
    assert [(i.domain, i.version) for i in model.opset_import if i.domain in ("", "ai.onnx")] == [("", 14)]
    assert "LayerNormalization" not in {n.op_type for n in model.graph.node}
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {model.graph.input[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, norm(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    grid = torch.rand(1, 3, 3, 2, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with pytest.raises(ExportError, match=r"could not convert it to opset 14: .*GridSample") as info:
        export(_GridSample(), (torch.randn(1, 2, 4, 4), grid), tmp_path / "g14.onnx", dynamo=True, opset=14)
    assert "dynamo=False" in info.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f17.onnx", "n14.onnx"]


def test_dynamo_at_opset_12_softmax_over_a_middle_axis_matches_torch(tmp_path):
    """torch.softmax(dim=1), built at 18 and converted down to 12, where Softmax flattens to
    2-D at its axis: the axis is moved last between two Transposes (it was kept: wrong values)."""
    import numpy as np
    import onnxruntime as ort

    class Softmax(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=1)

    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    export(Softmax(), (x,), tmp_path / "s12.onnx", dynamo=True, opset=12)
    model = onnx.load(tmp_path / "s12.onnx")
    assert [(i.domain, i.version) for i in model.opset_import if i.domain in ("", "ai.onnx")] == [("", 12)]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {model.graph.input[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, Softmax()(x).numpy(), rtol=1e-5, atol=1e-6)


def test_torchscript_opset_17_and_no_deprecation_warnings_leak(tmp_path, inputs):
    filters = list(warnings.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = export(FunctionModel(), inputs, tmp_path / "o17.onnx", dynamo=False, opset=17)
    assert not [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert warnings.filters == filters
    assert report.opset == 17 and report.opset_imports["custom"] == 1


def test_symbolics_unregistered_after_failed_torchscript_export(tmp_path, ops):
    class Boom(torch.nn.Module):
        def forward(self, a):
            raise RuntimeError("model exploded")

    ops.my_add  # noqa: B018 - defined, so export registers its symbolic
    with pytest.raises(ExportError, match="model exploded"):
        export(Boom(), (torch.ones(1),), tmp_path / "b.onnx", dynamo=False)
    assert not torch_ops.symbolic_registered("my_add")


def test_export_registry_ops_are_released(tmp_path, inputs):
    """export defines the registry's ops for the call only (FunctionModel holds none)."""
    before = set(torch_ops.defined_ops())
    export(FunctionModel(), inputs, tmp_path / "r.onnx", dynamo=True, registry=OpRegistry([MY_ADD]))
    assert set(torch_ops.defined_ops()) == before


def test_build_failure_keeps_its_class(tmp_path, inputs):
    import dataclasses

    from graphkit.errors import NativeBuildError

    def no_compiler():
        raise NativeBuildError("no C++ compiler", hint="install g++")

    op = dataclasses.replace(MY_ADD, name="gk_export_unbuildable", torch_forward=no_compiler)
    fn = autograd_function(op)

    class M(torch.nn.Module):
        def forward(self, a, b):
            return fn.apply(a, b)

    with pytest.raises(NativeBuildError, match="no C\\+\\+ compiler"):
        export(M(), inputs, tmp_path / "n.onnx", dynamo=False, registry=OpRegistry([op]))
    assert not list(tmp_path.iterdir())


@BOTH
def test_kwargs_and_model_mode_restored(tmp_path, ops, inputs, dynamo):
    class K(torch.nn.Module):
        def forward(self, a, *, b):
            return ops.my_add(a, b)

    model = K().train()
    report = export(model, inputs[:1], tmp_path / "k.onnx", dynamo=dynamo, kwargs={"b": inputs[1]},
                    dynamic_dims={"b": {0: "n"}, "a": {0: "n"}})
    assert model.training and report.inputs == ("a", "b") and report.count("my_add") == 1
    assert [_dims(i)[0] for i in onnx.load(report.path).graph.input] == ["n", "n"]


def test_top_level_export_model_is_the_export_function(tmp_path, inputs):
    import graphkit
    import graphkit.export as subpackage

    assert graphkit.export_model is subpackage.export
    report = graphkit.export_model(FunctionModel(), inputs, tmp_path / "c.onnx", dynamo=False)
    assert report.count("my_add") == 1


@BOTH
def test_the_models_ops_join_the_registry(tmp_path, ops, inputs, dynamo):
    """A registry without my_add: the op the model's TorchOps holds still exports, known."""
    path = tmp_path / "m.onnx"
    report = export(LibraryModel(ops), inputs, path, dynamo=dynamo, registry=OpRegistry([]))
    _check(path, report)
    assert MY_ADD in report.registry and report.custom_nodes[0].known


# ---------------------------------------------- `graphkit export` usage errors before torch

_USAGE_PROBE = r"""
import contextlib, io, json, sys
from graphkit.cli import main

results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code
    results.append([code, err.getvalue().strip(), "torch" in sys.modules])
print(json.dumps(results))
"""


def test_cli_export_usage_errors_come_before_torch(tmp_path):
    import json
    import subprocess
    import sys

    model = tmp_path / "model.py"
    model.write_text("import torch\n\ndef build():\n    return torch.nn.Identity()\n")
    out = str(tmp_path / "m.onnx")
    ok = [f"{model}:build", out, "--input", "x=2x3"]
    cases = [  # (argv, exit code, words of the message)
        ([f"{model}:build", out, "--input", "x=2xq"], 2, "NAME=SHAPE"),
        ([f"{model}:build", out, "--input", "x=2x3:complex"], 2, "unknown dtype"),
        ([f"{model}:build", out, "--input", "x=2x3", "--input", "x=3"], 2, "names repeat"),
        ([*ok, "--dynamic", "x0=b"], 2, "NAME:AXIS=DIM"),
        ([*ok, "--dynamic", "y:0=b"], 2, "names no --input"),
        ([*ok, "--dynamic", "x:2=b"], 2, "has rank 2"),
        ([*ok, "--opset", "0"], 2, "positive number"),
        ([*ok, "--atol", "-1"], 2, "--atol"),
        ([*ok, "--bind", "python"], 2, "--verify"),
        ([*ok, "--rewrites", "nocolon"], 2, "MODULE:NAME"),
        ([*ok, "--rewrites", f"{tmp_path / 'none.py'}:R"], 2, "no such file"),
        ([f"{tmp_path / 'none.py'}:build", out, "--input", "x=2x3"], 2, "no such file"),
        ([str(model), out, "--input", "x=2x3"], 2, "MODULE:NAME"),
        (["graphkit_no_such_module:build", out, "--input", "x=2x3"], 2, "no module named"),
        ([f"{model}:build", str(tmp_path / "no" / "m.onnx"), "--input", "x=2x3"], 4, "does not exist"),
        ([f"{model}:build", str(tmp_path), "--input", "x=2x3"], 4, "is a directory"),
        ([f"{model}:build", out], 2, "--input"),  # argparse: required
    ]
    r = subprocess.run([sys.executable, "-c", _USAGE_PROBE, json.dumps([["export", *a] for a, _, _ in cases])],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)
    for (argv, code, words), (got, err, torch_imported) in zip(cases, results):
        assert (got, torch_imported) == (code, False), (argv, got, err)
        assert words in err, (argv, err)
        assert len(err.splitlines()) == 1 or got == 2 and "usage:" in err, (argv, err)
    assert not (tmp_path / "m.onnx").exists()
