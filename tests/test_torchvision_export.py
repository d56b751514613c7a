"""torchvision's ``torchvision::deform_conv2d`` through graphkit's export, both exporters.

torchvision's C++ ops do not load next to the CPU torch here, so the op is declared with
``torch.library`` under torchvision's real name and schema, graphkit's reference as its
kernel and fake kernel. torch's dynamo exporter registers its own torchvision translations
(``DeformConv``, valid only from opset 19) only where ``importlib.util.find_spec
("torchvision")`` finds a module: the ``torchvision_spec`` fixture runs each test without
and with an empty ``torchvision`` package on sys.path, and ``test_torch_alone_*`` shows that
this really switches torch's behaviour.

The mapping lives in one place, the OpDef's ``foreign_ops`` entry
(graphkit_ops/deform_conv2d/__init__.py); a user's op (``acme_lib::scale`` below) uses the
same mechanism.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import onnx  # noqa: E402
from onnx import helper  # noqa: E402

import graphkit  # noqa: E402
from graphkit.errors import ExportError, OpDefinitionError  # noqa: E402
from graphkit.export import export  # noqa: E402
from graphkit.ops import Attr, AttrType, ForeignOp, OpDef, OpRegistry, Param, default_registry  # noqa: E402
from graphkit.rewrite import Lowering  # noqa: E402
from graphkit_ops.deform_conv2d import DEFORM_CONV2D, TORCHVISION_SCHEMA  # noqa: E402

from tv_deform import REAL_SCHEMA, TVBlock, declare  # noqa: E402

ATOL = 1e-4
# torch's own pytree deprecation, raised inside torch.export when torch.onnx.export is called directly
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")
TV_MODEL = Path(__file__).with_name("tv_deform.py")

WANT_ATTRS = {"stride": [2, 2], "padding": [1, 1], "dilation": [1, 1], "groups": 2, "offset_groups": 2}


def test_the_opdef_declares_torchvisions_real_schema(capsys):
    from graphkit.cli import main

    (foreign,) = DEFORM_CONV2D.foreign_ops
    assert foreign.name == "torchvision::deform_conv2d" and foreign.schema == TORCHVISION_SCHEMA == REAL_SCHEMA
    assert main(["ops", "deform_conv2d"]) == 0  # `graphkit ops` says so
    assert "also for:   torchvision::deform_conv2d (exported as this op)" in capsys.readouterr().out


@pytest.fixture
def torchvision_op():
    lib = declare(REAL_SCHEMA)
    try:
        yield torch.ops.torchvision.deform_conv2d
    finally:
        lib._destroy()


def _torchvision_stub(tmp_path, monkeypatch) -> None:
    """An empty ``torchvision`` package on sys.path (for this test only): torch's exporter
    then registers its own torchvision translations."""
    (tmp_path / "stub" / "torchvision").mkdir(parents=True)
    (tmp_path / "stub" / "torchvision" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "stub"))


@pytest.fixture(params=[False, True], ids=["no_torchvision", "torchvision_stub"])
def torchvision_spec(request, tmp_path, monkeypatch):
    """Whether importlib finds a ``torchvision`` module (an empty package on sys.path)."""
    assert "torchvision" not in sys.modules
    if request.param:
        _torchvision_stub(tmp_path, monkeypatch)
    assert (importlib.util.find_spec("torchvision") is not None) == request.param
    return request.param


def _custom(model: onnx.ModelProto) -> list:
    return [n for n in model.graph.node if n.domain == "custom"]


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    (out,) = graphkit.open_session(model).run({"x": x}).values()
    return out


def _eager(model, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(x).numpy()


# --------------------------------------------------------------------------- torch alone


def test_torch_alone_writes_deformconv_invalid_at_opset_18(tmp_path, torchvision_op, monkeypatch):
    """What graphkit fixes: with torchvision importable, torch writes DeformConv at opset 18."""
    _torchvision_stub(tmp_path, monkeypatch)
    torch.manual_seed(0)
    program = torch.onnx.export(TVBlock().eval(), (torch.randn(1, 4, 9, 9),), dynamo=True, opset_version=18,
                                verbose=False, report=False)
    model = program.model_proto
    assert {i.domain: i.version for i in model.opset_import}[""] == 18
    assert "DeformConv" in [n.op_type for n in model.graph.node]
    with pytest.raises(onnx.checker.ValidationError, match="DeformConv"):
        onnx.checker.check_model(model)


def test_torch_alone_without_torchvision_has_no_translation(torchvision_op):
    assert importlib.util.find_spec("torchvision") is None
    with pytest.raises(Exception, match=r"torchvision\.deform_conv2d"):
        torch.onnx.export(TVBlock().eval(), (torch.randn(1, 4, 9, 9),), dynamo=True, opset_version=18,
                          verbose=False, report=False)


# --------------------------------------------------------------------------- graphkit's export

OPSETS = [(True, 18), (True, 16), (False, 7), (False, 11), (False, 20)]  # dynamo 16: via onnx's converter


@pytest.mark.parametrize("dynamo, opset", OPSETS, ids=[f"{'dynamo' if d else 'torchscript'}{o}" for d, o in OPSETS])
def test_export_writes_the_placeholder_at_any_opset(tmp_path, torchvision_op, torchvision_spec, dynamo, opset):
    torch.manual_seed(0)
    model = TVBlock()
    x = torch.randn(2, 4, 9, 9)
    path = tmp_path / "dcn.onnx"
    report = export(model, (x,), path, dynamo=dynamo, opset=opset, dynamic_dims={"x": {0: "batch"}})
    proto = onnx.load(path)
    onnx.checker.check_model(proto)
    assert report.opset == opset and report.count("custom::deform_conv2d") == 1
    (node,) = _custom(proto)
    assert node.op_type == "deform_conv2d" and _attrs(node) == WANT_ATTRS
    assert "DeformConv" not in [n.op_type for n in proto.graph.node]
    assert len(node.input) == 5 and node.input[0] == "x" and node.input[1] == "weight"
    x3 = torch.randn(3, 4, 9, 9)  # a batch the export did not see
    want = _eager(model, x3)
    native, _ = graphkit.rewrite_model(proto, lowering=Lowering.NATIVE)
    np.testing.assert_allclose(_run(native, x3.numpy()), want, rtol=0, atol=ATOL)
    if opset >= 11:  # the first decomposition's opset
        decomposed, _ = graphkit.rewrite_model(proto, lowering=Lowering.DECOMPOSE)  # standard ONNX at the opset
        assert not any(n.domain for n in decomposed.graph.node)
        np.testing.assert_allclose(_run(decomposed, x3.numpy()), want, rtol=0, atol=ATOL)


VARIANTS = [(True, False, True), (False, False, False), (False, True, False)]


@pytest.mark.parametrize("dynamo, use_mask, bias", VARIANTS,
                         ids=["dynamo_dcnv1", "torchscript_dcnv1_nobias", "torchscript_dcnv2_nobias"])
def test_mask_and_bias_variants(tmp_path, torchvision_op, dynamo, use_mask, bias):
    """torchvision passes a dummy mask with use_mask=False (dropped) and zeros for a missing bias."""
    torch.manual_seed(1)
    model = TVBlock(use_mask, bias)
    x = torch.randn(1, 4, 9, 9)
    export(model, (x,), tmp_path / "m.onnx", dynamo=dynamo, opset=20 if dynamo else 18)
    proto = onnx.load(tmp_path / "m.onnx")
    (node,) = _custom(proto)
    assert len(node.input) == (5 if use_mask else 4)
    lowered, _ = graphkit.rewrite_model(proto, lowering=Lowering.NATIVE)
    np.testing.assert_allclose(_run(lowered, x.numpy()), _eager(model, x), rtol=0, atol=ATOL)


def test_verify_compares_with_torch(tmp_path, torchvision_op):
    from graphkit.verify import verify_export

    torch.manual_seed(2)
    model = TVBlock()
    export(model, (torch.randn(1, 4, 9, 9),), tmp_path / "m.onnx", dynamo=False)
    for bind in (None, "native"):
        result = verify_export(model, tmp_path / "m.onnx", seed=3, atol=ATOL, rtol=1e-4, bind=bind)
        result.raise_for_mismatch()
        assert result.passed and result.outputs[0].max_abs < ATOL


def test_direct_torch_export_with_graphkits_hooks(tmp_path, torchvision_op, monkeypatch):
    """Calling torch.onnx.export directly: the same entries from graphkit.export."""
    from graphkit.export._foreign import foreign_translations, scoped_foreign_symbolics

    _torchvision_stub(tmp_path, monkeypatch)
    torch.manual_seed(0)
    model, x = TVBlock().eval(), torch.randn(1, 4, 9, 9)
    program = torch.onnx.export(model, (x,), dynamo=True, opset_version=18, verbose=False, report=False,
                                custom_translation_table=foreign_translations(default_registry()))
    with scoped_foreign_symbolics(default_registry()) as names:
        assert names == ["torchvision::deform_conv2d"]
        path = tmp_path / "ts.onnx"
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=18, input_names=["x"])
    for proto in (program.model_proto, onnx.load(path)):
        assert [n.op_type for n in _custom(proto)] == ["deform_conv2d"]
        lowered, _ = graphkit.rewrite_model(proto, lowering=Lowering.NATIVE)
        np.testing.assert_allclose(_run(lowered, x.numpy()), _eager(model, x), rtol=0, atol=ATOL)


# --------------------------------------------------------------------------- torch's own, on request


def test_torch_translation_on_request_at_opset_19(tmp_path, torchvision_op, monkeypatch):
    _torchvision_stub(tmp_path, monkeypatch)
    torch.manual_seed(0)
    model = TVBlock()
    x = torch.randn(1, 4, 9, 9)
    report = export(model, (x,), tmp_path / "m.onnx", opset=19, torch_translations=["torchvision::deform_conv2d"])
    proto = onnx.load(tmp_path / "m.onnx")
    assert report.count("deform_conv2d") == 0 and "DeformConv" in [n.op_type for n in proto.graph.node]
    np.testing.assert_allclose(_run(proto, x.numpy()), _eager(model, x), rtol=0, atol=ATOL)


def test_torch_translation_at_opset_18_fails_naming_node_and_fix(tmp_path, torchvision_op, monkeypatch):
    _torchvision_stub(tmp_path, monkeypatch)
    path = tmp_path / "m.onnx"
    with pytest.raises(ExportError) as info:
        export(TVBlock(), (torch.randn(1, 4, 9, 9),), path, opset=18,
               torch_translations=["torchvision::deform_conv2d"])
    err = info.value
    assert err.op == "DeformConv" and err.node
    assert "opset 18 does not have" in err.message and "from opset 19" in err.message
    assert "opset >= 19" in err.hint and "torch_translations" in err.hint
    assert not path.exists()  # an invalid model is never written


_REFUSAL = """
import importlib, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
import torch
from graphkit.errors import ExportError
from graphkit.export import export
from graphkit.ops import OpRegistry
if sys.argv[2] == "after":  # a TorchScript export of a model using graphkit's ops first
    from simplify_models import MODELS
    m = MODELS["my_add_resnet"](True)
    export(m.module, m.inputs(1, m.length), os.path.join(sys.argv[3], "first.onnx"), dynamo=False)
import test_torchvision_export as t
lib = t.declare(t.REAL_SCHEMA)
os.makedirs(os.path.join(sys.argv[3], "stub", "torchvision"))
open(os.path.join(sys.argv[3], "stub", "torchvision", "__init__.py"), "w").close()
sys.path.insert(0, os.path.join(sys.argv[3], "stub"))
importlib.invalidate_caches()
path = os.path.join(sys.argv[3], "m.onnx")
try:
    export(t.TVBlock(), (torch.randn(1, 4, 9, 9),), path, opset=18, registry=OpRegistry([]))
except ExportError as exc:
    print("REFUSED", exc.message, "|", exc.hint, "|", os.path.exists(path))
else:
    print("WRITTEN")
"""


def _refusal(tmp_path, when: str) -> str:
    """The export of TVBlock at opset 18 with an empty registry, in a fresh process (``when``
    "first", or "after" a TorchScript export of a model using graphkit's ops)."""
    import subprocess

    proc = subprocess.run([sys.executable, "-c", _REFUSAL, str(Path(__file__).parent), when, str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_without_the_mapping_torchs_deformconv_at_18_is_refused(tmp_path):
    """A registry without deform_conv2d leaves the op to torch: still never an invalid file.
    (In a process of its own: see the xfail below.)"""
    out = _refusal(tmp_path, "first")
    assert "REFUSED" in out and "wrote DeformConv, which opset 18 does not have" in out, out
    assert "opset >= 19" in out and "foreign_ops" in out and out.strip().endswith("False"), out


def test_an_earlier_export_does_not_change_what_a_later_registry_maps(tmp_path):
    """A TorchScript export of a model using graphkit's my_add (default registry) defines
    graphkit::my_add in torch; a later export with an empty registry gets my_add from torch
    but not the rest of its package: no deform_conv2d mapping takes over torchvision's op."""
    out = _refusal(tmp_path, "after")
    assert "REFUSED" in out, out


def test_torch_translation_names_a_foreign_op(tmp_path):
    with pytest.raises(ExportError, match=r"torch_translations names 'torchvision::nms'") as info:
        export(torch.nn.Identity(), (torch.randn(2),), tmp_path / "m.onnx", torch_translations=["torchvision::nms"])
    assert "torchvision::deform_conv2d" in info.value.hint


# --------------------------------------------------------------------------- schema drift


def test_another_schema_under_torchvisions_name_fails_loudly(tmp_path):
    """A library version whose op differs from the declared schema: no silent misuse."""
    changed = REAL_SCHEMA.replace(", bool use_mask", "")
    lib = torch.library.Library("torchvision", "DEF")
    try:
        lib.define(changed)
        for dynamo in (True, False):
            with pytest.raises(ExportError, match=r"torchvision::deform_conv2d is defined in this process as") as info:
                export(torch.nn.Identity(), (torch.randn(2),), tmp_path / "m.onnx", dynamo=dynamo)
            assert info.value.op == "custom::deform_conv2d"
            assert "torch_translations=['torchvision::deform_conv2d']" in info.value.hint
    finally:
        lib._destroy()


# --------------------------------------------------------------------------- a user's op


def _scale_reference(x, alpha=1.0):
    return x * alpha


SCALE = OpDef(
    name="scale", doc="x * alpha", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
    type_constraints={"T": ("tensor(float)",)}, reference=_scale_reference,
    infer_shapes=lambda shapes, attrs: [shapes[0]],
    attributes=(Attr("alpha", AttrType.FLOAT, 1.0),), domain="acme",
    foreign_ops=(ForeignOp("acme_lib::mul_scalar", "mul_scalar(Tensor self, float factor) -> Tensor",
                           lambda a: ([a["self"]], {"alpha": a["factor"]})),))


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_a_users_op_maps_a_foreign_op_the_same_way(tmp_path, dynamo):
    lib = torch.library.Library("acme_lib", "DEF")
    try:
        lib.define("mul_scalar(Tensor self, float factor) -> Tensor")
        lib.impl("mul_scalar", lambda x, f: x * f, "CompositeExplicitAutograd")
        torch.library.register_fake("acme_lib::mul_scalar", lambda x, f: x * f, lib=lib)

        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.ops.acme_lib.mul_scalar(x, 2.5) + 1

        report = export(Model(), (torch.randn(2, 3),), tmp_path / "m.onnx", dynamo=dynamo,
                        registry=OpRegistry([SCALE]))
    finally:
        lib._destroy()
    proto = onnx.load(tmp_path / "m.onnx")
    (node,) = [n for n in proto.graph.node if n.domain == "acme"]
    assert node.op_type == "scale" and _attrs(node) == {"alpha": 2.5}
    assert report.count("acme::scale") == 1


@pytest.mark.parametrize("foreign, words", [
    (ForeignOp("deform_conv2d", REAL_SCHEMA, lambda a: a), "is not a torch name"),
    (ForeignOp("torchvision::deform_conv2d", "conv(Tensor x) -> Tensor", lambda a: a), "does not declare deform_conv2d"),
    (ForeignOp("graphkit::deform_conv2d", REAL_SCHEMA, lambda a: a), "the op's own torch name"),
    (ForeignOp("torchvision::deform_conv2d", REAL_SCHEMA, None), "to_op is not callable"),
], ids=["bare_name", "schema_name", "own_name", "to_op"])
def test_opdef_rejects_a_bad_foreign_op(foreign, words):
    import dataclasses

    with pytest.raises(OpDefinitionError, match=words):
        dataclasses.replace(DEFORM_CONV2D, foreign_ops=(foreign,))


def test_two_ops_claiming_one_foreign_op(tmp_path, torchvision_op):
    import dataclasses

    twin = dataclasses.replace(DEFORM_CONV2D, domain="acme", torch_namespace="acme")
    registry = default_registry().with_ops(twin)
    with pytest.raises(ExportError, match=r"torchvision::deform_conv2d is claimed by two ops"):
        export(TVBlock(), (torch.randn(1, 4, 9, 9),), tmp_path / "m.onnx", registry=registry)


# --------------------------------------------------------------------------- the CLI


def test_cli_export_and_verify(tmp_path, torchvision_op, monkeypatch, capsys):
    """`graphkit export --verify` on a model file calling torchvision's op (in-process: the
    fixture's declaration serves the model file's factory)."""
    from graphkit.cli import main

    for extra in ([], ["--no-dynamo", "--opset", "13"]):
        out = tmp_path / "m.onnx"
        code = main(["export", f"{TV_MODEL}:build", str(out), "--input", "x=1x4x9x9", "--verify",
                     "--atol", "1e-4", "--bind", "native", *extra])
        stdout = capsys.readouterr().out
        assert code == 0 and "custom::deform_conv2d x1" in stdout, stdout
        assert [n.op_type for n in _custom(onnx.load(out))] == ["deform_conv2d"]
    _torchvision_stub(tmp_path, monkeypatch)
    bad = tmp_path / "bad.onnx"
    code = main(["export", f"{TV_MODEL}:build", str(bad), "--input", "x=1x4x9x9",
                 "--torch-translation", "torchvision::deform_conv2d"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and not bad.exists()
    assert len(err.splitlines()) == 1 and "DeformConv" in err and "opset >= 19" in err, err
