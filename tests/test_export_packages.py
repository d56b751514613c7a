"""A user's op package (outside graphkit) through both torch exporters.

The sample package samples/rms_norm_ops defines ``custom::rms_norm(x, weight?, epsilon)
-> (y, inv_rms)`` with ``torch_namespace="acme"``: its torch op is
``torch.ops.acme.rms_norm``. No torch C++ extension is built (the op has no
torch_forward: the reference is its forward).
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import onnx  # noqa: E402

from graphkit.errors import ExportError  # noqa: E402
from graphkit.export import TorchOps, autograd_function, export, torch_ops  # noqa: E402
from graphkit.ops import OpPackage, OpRegistry, default_registry  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "rms_norm_ops"
if str(SAMPLE) not in sys.path:
    sys.path.insert(0, str(SAMPLE))

import rms_norm_ops  # noqa: E402

RMS_NORM = rms_norm_ops.RMS_NORM
REGISTRY = default_registry().with_ops(rms_norm_ops.PACKAGE)
EPS = 1e-5
BOTH = pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
WEIGHT = pytest.mark.parametrize("weight", [True, False], ids=["weight", "no_weight"])


@pytest.fixture(scope="module")
def ops():
    with TorchOps(OpRegistry([rms_norm_ops.PACKAGE])) as o:
        yield o


class Norm(torch.nn.Module):
    """rms_norm through TorchOps (torch.ops.acme.rms_norm), with or without weight."""

    def __init__(self, ops, weight: bool):
        super().__init__()
        self.ops = ops
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8)) if weight else None

    def forward(self, x):
        y, inv_rms = self.ops.rms_norm(x, self.weight, EPS)
        return torch.relu(y), inv_rms


def _x() -> torch.Tensor:
    return torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))


def _placeholders(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain not in ("", "ai.onnx")]


def _check_node(path, *, weight: bool, eps: float = EPS) -> onnx.ModelProto:
    """One custom::rms_norm node, two outputs, weight given or omitted, epsilon written."""
    model = onnx.load(path)
    (node,) = _placeholders(model)
    assert (node.domain, node.op_type) == ("custom", "rms_norm")
    assert len(node.output) == 2 and all(node.output)
    given = [name for name in node.input if name]
    assert given[0] == model.graph.input[0].name
    assert len(given) == (2 if weight else 1)
    (attr,) = node.attribute
    assert attr.name == "epsilon" and attr.type == onnx.AttributeProto.FLOAT
    assert attr.f == pytest.approx(eps)
    imports = {i.domain: i.version for i in model.opset_import}
    assert imports["custom"] == 1 and imports[""] == 18
    with REGISTRY.onnx_schemas():
        onnx.checker.check_model(model, full_check=True)
    return model


def _reference(x: torch.Tensor, weight) -> list[np.ndarray]:
    with torch.no_grad():
        y, inv_rms = RMS_NORM.reference(x, weight, EPS)
    return [torch.relu(y).numpy(), inv_rms.numpy()]


def _run_decomposed(model: onnx.ModelProto, registry, x: torch.Tensor) -> list[np.ndarray]:
    """Decompose the placeholders into standard ops (opset 18) and run them in plain ORT."""
    import onnxruntime as ort

    from graphkit.rewrite import Lowering, rewrite_model

    lowered, _ = rewrite_model(model, registry=registry, lowering=Lowering.DECOMPOSE)
    assert not _placeholders(lowered)
    session = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})


# --------------------------------------------------------------------------- both exporters


@BOTH
@WEIGHT
def test_rms_norm_exports_as_one_placeholder(tmp_path, ops, dynamo, weight):
    model = Norm(ops, weight)
    path = tmp_path / "norm.onnx"
    report = export(model, (_x(),), path, dynamo=dynamo, registry=REGISTRY)
    proto = _check_node(path, weight=weight)
    assert [n.op for n in report.custom_nodes] == ["custom::rms_norm"]
    assert report.custom_nodes[0].known and report.unknown_ops == ()
    assert report.count("rms_norm") == report.count("custom::rms_norm") == 1
    assert "decompose:reduce_mean" in report.lowerings["custom::rms_norm"]
    assert report.opset_imports["custom"] == 1
    # torch's side: the op lives in the package's namespace, never in graphkit's
    assert "acme::rms_norm" in torch_ops.defined_ops()
    assert "graphkit::rms_norm" not in torch_ops.defined_ops()
    assert not torch_ops.symbolic_registered(RMS_NORM)  # scoped to the call
    # values: the decomposition (opset 18) in ONNX Runtime against the torch reference
    x = _x()
    got = _run_decomposed(proto, report.registry, x)
    want = _reference(x, model.weight.detach() if weight else None)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@BOTH
def test_package_torch_op_called_directly(tmp_path, ops, dynamo):
    """A model calling torch.ops.acme.rms_norm itself (defined by the package's TorchOps)."""
    ops.define("rms_norm")

    class Direct(torch.nn.Module):
        def forward(self, x, w):
            return torch.ops.acme.rms_norm(x, w, 1e-3)

    path = tmp_path / "direct.onnx"
    export(Direct(), (_x(), torch.ones(8)), path, dynamo=dynamo)  # default registry
    _check_node(path, weight=True, eps=1e-3)


@BOTH
def test_autograd_function_of_the_package_op(tmp_path, dynamo):
    fn = autograd_function(RMS_NORM)

    class Fn(torch.nn.Module):
        def forward(self, x):
            return fn.apply(x, None, EPS)

    path = tmp_path / "fn.onnx"
    report = export(Fn(), (_x(),), path, dynamo=dynamo)  # the Function brings the op
    _check_node(path, weight=False)
    assert report.count("custom::rms_norm") == 1 and report.unknown_ops == ()


def test_placeholder_domain_and_torch_namespace_come_from_the_opdef(tmp_path):
    op = dataclasses.replace(RMS_NORM, domain="acme.nn", torch_namespace="acme_nn")
    package = OpPackage("acme_nn_ops", (dataclasses.replace(op, native=False),))
    with TorchOps(OpRegistry([package])) as mine:
        for dynamo in (True, False):
            path = tmp_path / f"d{dynamo}.onnx"
            report = export(Norm(mine, True), (_x(),), path, dynamo=dynamo)
            proto = onnx.load(path)
            (node,) = _placeholders(proto)
            assert (node.domain, node.op_type) == ("acme.nn", "rms_norm")
            assert {i.domain: i.version for i in proto.opset_import}["acme.nn"] == 1
            assert [n.op for n in report.custom_nodes] == ["acme.nn::rms_norm"]
            assert "acme_nn::rms_norm" in torch_ops.defined_ops()


# --------------------------------------------------------------------------- clashes


def test_two_packages_with_one_torch_name_are_an_export_error(tmp_path):
    """Same torch namespace and name, different domains: one torch op cannot stand for both."""
    other = OpPackage("other_norm_ops", (dataclasses.replace(RMS_NORM, domain="other", native=False),))
    registry = OpRegistry([rms_norm_ops.PACKAGE, other])
    with pytest.raises(ExportError) as info:
        TorchOps(registry)
    message = info.value.message
    assert "acme::rms_norm" in message and "rms_norm_ops" in message and "other_norm_ops" in message

    class Plain(torch.nn.Module):
        def forward(self, x):
            return x + 1

    with pytest.raises(ExportError) as info:
        export(Plain(), (_x(),), tmp_path / "c.onnx", registry=registry)
    assert "Plain" in info.value.message and "other::rms_norm" in info.value.message
    assert info.value.exit_code == 11 and not list(tmp_path.iterdir())


def test_torch_name_taken_by_another_package_is_an_export_error(ops):
    ops.define("rms_norm")
    other = OpPackage("other_norm_ops", (dataclasses.replace(RMS_NORM, domain="other", native=False),))
    with TorchOps(OpRegistry([other])) as clash, pytest.raises(ExportError) as info:
        clash.rms_norm  # noqa: B018
    message = info.value.message
    assert "acme::rms_norm is already defined" in message
    assert "rms_norm_ops" in message and "other_norm_ops" in message


# --------------------------------------------------------------------------- the CLI


FACTORY = textwrap.dedent("""
    import torch


    class Norm(torch.nn.Module):
        def __init__(self, ops, weight):
            super().__init__()
            self.ops = ops
            self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8)) if weight else None

        def forward(self, x):
            return self.ops.rms_norm(x, self.weight, {eps!r})


    def build_weight():
        import rms_norm_ops  # imported lazily, inside the factory
        from graphkit.export import TorchOps
        from graphkit.ops import OpRegistry

        return Norm(TorchOps(OpRegistry([rms_norm_ops.PACKAGE])), True)


    def build_plain():
        import rms_norm_ops
        from graphkit.export import TorchOps
        from graphkit.ops import OpRegistry

        ops = TorchOps(OpRegistry([rms_norm_ops.PACKAGE]))

        class Hidden(torch.nn.Module):  # the TorchOps only in forward's closure
            def forward(self, x):
                return ops.rms_norm(x, None, {eps!r})

        return Hidden()


    _OPS = []


    def _norm(x):
        return _OPS[0].rms_norm(x, None, {eps!r})


    def build_deep():
        import rms_norm_ops
        from graphkit.export import TorchOps
        from graphkit.ops import OpRegistry

        _OPS.append(TorchOps(OpRegistry([rms_norm_ops.PACKAGE])))

        class Deep(torch.nn.Module):  # nothing graphkit can see holds the ops: the export
            def forward(self, x):     # finds them defined after a first trace, and retries
                return _norm(x)

        return Deep()
""")


@pytest.mark.parametrize("dynamo", ["--dynamo", "--no-dynamo"])
@pytest.mark.parametrize("factory, weight", [("build_weight", True), ("build_plain", False)])
def test_cli_export_of_a_lazy_factory(tmp_path, monkeypatch, capsys, dynamo, factory, weight):
    from graphkit.cli import main

    monkeypatch.syspath_prepend(str(SAMPLE))
    source = tmp_path / "models.py"
    source.write_text(FACTORY.format(eps=EPS))
    out = tmp_path / "out.onnx"
    rc = main(["export", f"{source}:{factory}", str(out), "--input", "x=2x3x8", dynamo,
               "--ops", "rms_norm_ops", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    _check_node(out, weight=weight)
    assert '"op": "custom::rms_norm"' in captured.out and '"known": true' in captured.out


@pytest.mark.parametrize("dynamo", ["--dynamo", "--no-dynamo"])
def test_cli_export_when_only_tracing_defines_the_op(tmp_path, dynamo):
    """A fresh process (so no earlier test defined acme::rms_norm): the model's TorchOps is
    out of graphkit's sight and defines the op during the first trace; export runs again."""
    import os
    import subprocess

    source = tmp_path / "models.py"
    source.write_text(FACTORY.format(eps=EPS))
    out = tmp_path / "out.onnx"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SAMPLE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "graphkit", "export", f"{source}:build_deep", str(out),
                           "--input", "x=2x3x8", dynamo, "--ops", "rms_norm_ops"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    _check_node(out, weight=False)
