"""Every lowering of every op of graphkit's default registry, on models both torch exporters
write (static and dynamic batch), through the default path (``rewrite_file``, the CLI: the
byte writer where its preconditions hold, else the objects writer): the objects writer's
result, field for field, or its error in its words; a result runs in ONNX Runtime as torch
eager does. A writer's preconditions are never the user's error: a byte writer that cannot
serve a model steps aside, it never fails the rewrite (issue 28).

The DCN block (stem Conv, 1x1 Conv+BN, an offset/mask Conv, DCNv2, BN, ReLU, 1x1 Conv+BN)
is the issue's model: exported by TorchScript, its grid_sample decomposition asks the
offset's shape, which only ONNX shape inference knows; the byte writer's type table
raised its "I step aside" signal through the decomposition and the selection took it
for a bug in the op. This module is importable on its own: ``graphkit export
tests/test_writer_equivalence.py:build_dcn`` exports that block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

import graphkit  # noqa: E402
import graphkit_ops  # noqa: E402
from graphkit.errors import GraphkitError  # noqa: E402
from graphkit.ops import OpDef, OpRegistry, default_registry  # noqa: E402
from graphkit.rewrite import Lowering  # noqa: E402
from graphkit.rewrite.engine import DEFAULT_PREFERENCE  # noqa: E402
from graphkit.rewrite.files import FileRewrite, rewrite_file  # noqa: E402

OPSET = 18  # both exporters'


# -- the models -----------------------------------------------------------------------------

class MyAdd(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from graphkit.export import autograd_function

        self.fn = autograd_function(graphkit_ops.MY_ADD)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fn.apply(a, b))


class Asinh(torch.nn.Module):
    """torch.asinh, exported as graphkit's custom::asinh placeholder (``placeholders``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.asinh(x) * 2


class DCNBlock(torch.nn.Module):
    """Stem conv, 1x1 conv + BN, DCNv2 (offsets and mask from a 3x3 conv, as
    samples/dcn_resnet.py's DCNv2) + BN + ReLU, 1x1 conv + BN."""

    def __init__(self, channels: int = 4, width: int = 8) -> None:
        super().__init__()
        from torch import nn

        from graphkit_ops.deform_conv2d.nn import DeformConv2d

        self.stem = nn.Conv2d(channels, width, 3, padding=1)
        self.reduce = nn.Sequential(nn.Conv2d(width, width, 1, bias=False), nn.BatchNorm2d(width))
        self.offset_mask = nn.Conv2d(width, 3 * 9, 3, padding=1)
        self.dcn = DeformConv2d(width, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.expand = nn.Sequential(nn.Conv2d(width, width, 1, bias=False), nn.BatchNorm2d(width))
        with torch.no_grad():  # offsets of a few pixels, BatchNorm statistics that are no identity
            self.offset_mask.weight.normal_(0.0, 0.5 / (3 * width) ** 0.5)
            self.offset_mask.bias.uniform_(-1.0, 1.0)
            for bn in (self.reduce[1], self.bn, self.expand[1]):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.reduce(self.stem(x))
        predicted = self.offset_mask(x)
        offset, mask = predicted[:, :18], torch.sigmoid(predicted[:, 18:])
        x = torch.relu(self.bn(self.dcn(x, offset, mask)))
        return self.expand(x)


def build_dcn() -> torch.nn.Module:
    """The DCN block, seeded, in eval mode (``graphkit export`` calls it)."""
    torch.manual_seed(0)
    return DCNBlock().eval()


@dataclass(frozen=True)
class Model:
    op: str  # the registry op it holds
    build: Callable[[], torch.nn.Module]
    inputs: dict[str, tuple[int, ...]]  # exported with these shapes; batch is axis 0
    placeholders: tuple[str, ...] = ()


MODELS = {
    "my_add": Model("my_add", MyAdd, {"a": (2, 3), "b": (2, 3)}),
    "asinh": Model("asinh", Asinh, {"x": (2, 3)}, ("asinh",)),
    "dcn_block": Model("deform_conv2d", build_dcn, {"x": (2, 4, 8, 8)}),  # dynamo specializes a batch of 1
}
EXPORTS = [(name, exporter, batch) for name in MODELS for exporter in ("torchscript", "dynamo")
           for batch in ("static", "dynamic")]


@dataclass(frozen=True)
class Case:
    label: str
    registry: OpRegistry
    lowering: Any
    target_opset: int | None = None

    def options(self) -> dict[str, Any]:
        out: dict[str, Any] = {"registry": self.registry, "lowering": self.lowering}
        if self.target_opset is not None:
            out["target_opset"] = self.target_opset
        return out


def lowerings(op: OpDef) -> list[Case]:
    """The default preference; each decomposition alone (the others left out of the op) at
    the model's opset where it applies and at its first opset (a conversion first); the
    native and the Python kernel (an error where the op has none: the same from both writers)."""
    full = default_registry()
    cases = [Case("default", full, DEFAULT_PREFERENCE)]
    for dec in op.decompositions:
        only = OpRegistry([replace(op, decompositions=(dec,))])
        if dec.supports(OPSET):
            cases.append(Case(f"{dec.name}", only, Lowering.DECOMPOSE))
        if dec.min_opset != OPSET:
            cases.append(Case(f"{dec.name}@{dec.min_opset}", only, Lowering.DECOMPOSE, dec.min_opset))
    cases += [Case("native", full, Lowering.NATIVE), Case("python", full, Lowering.PYTHON)]
    return cases


CASES = [pytest.param(name, exporter, batch, case, id=f"{name}-{exporter}-{batch}-{case.label}")
         for name, exporter, batch in EXPORTS for case in lowerings(default_registry().get(MODELS[name].op))]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Callable[[str, str, str], Path]:
    """(model, exporter, batch) -> its export (made once, on first use)."""
    from graphkit.export import export

    folder = tmp_path_factory.mktemp("writer_equivalence")
    made: dict[tuple[str, str, str], Path] = {}

    def get(name: str, exporter: str, batch: str) -> Path:
        key = (name, exporter, batch)
        if key not in made:
            model = MODELS[name]
            path = folder / f"{name}.{exporter}.{batch}.onnx"
            args = tuple(torch.randn(*shape, generator=torch.Generator().manual_seed(i))
                         for i, shape in enumerate(model.inputs.values()))
            dynamic = {n: {0: "batch"} for n in model.inputs} if batch == "dynamic" else None
            export(model.build(), args, path, dynamo=exporter == "dynamo", opset=OPSET,
                   input_names=list(model.inputs), dynamic_dims=dynamic, placeholders=model.placeholders)
            first = onnx.load(path, load_external_data=False).graph.input[0].type.tensor_type.shape.dim[0]
            assert bool(first.dim_param) == (batch == "dynamic"), first  # the export has the batch asked for
            made[key] = path
        return made[key]

    return get


def _feeds(name: str, batch: str) -> dict[str, np.ndarray]:
    """Inputs of another batch size than the export's where the batch is dynamic."""
    rng = np.random.default_rng(7)
    out = {}
    for input_name, shape in MODELS[name].inputs.items():
        if batch == "dynamic":
            shape = (shape[0] + 1, *shape[1:])
        out[input_name] = rng.standard_normal(shape).astype(np.float32)
    return out


def _eager(name: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        return MODELS[name].build()(*map(torch.from_numpy, feeds.values())).numpy()


def _rewrite(src: Path, **options: Any) -> FileRewrite | GraphkitError:
    try:
        return rewrite_file(src, None, **options)
    except GraphkitError as exc:
        return exc


def _without_writer(result: FileRewrite) -> dict:
    out = result.report.to_dict()
    del out["writer"]
    return out


# -- the tests ------------------------------------------------------------------------------

def test_every_op_of_the_default_registry_has_a_model():
    assert {op.name for op in default_registry()} == {m.op for m in MODELS.values()}


@pytest.mark.parametrize("name, exporter, batch, case", CASES)
def test_default_path_gives_the_objects_writers_result(exported, name, exporter, batch, case):
    """The default path's result is the objects writer's, field for field and report alike,
    or both raise one error (type and message); no error is a writer's precondition."""
    src = exported(name, exporter, batch)
    served = _rewrite(src, **case.options())
    objects = _rewrite(src, fast=False, **case.options())  # the objects writer, forced
    if isinstance(objects, GraphkitError):
        assert type(served) is type(objects) and str(served) == str(objects), (served, objects)
        assert "a bug in the op's decomposition" not in str(objects)
        return
    assert not isinstance(served, GraphkitError), f"the default path failed where the objects writer did not: {served}"
    assert objects.report.writer == "objects"
    assert onnx.ModelProto.FromString(served.output).SerializeToString() == objects.output
    assert _without_writer(served) == _without_writer(objects)
    if case.lowering in (Lowering.NATIVE, Lowering.PYTHON) and case.target_opset is None:
        assert served.report.writer == "bytes", served.report.writer_reason  # kernels ask no shapes
    feeds = _feeds(name, batch)
    want = _eager(name, feeds)
    (got,) = graphkit.open_session(onnx.ModelProto.FromString(served.output)).run(feeds).values()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("batch", ["static", "dynamic"])
def test_torchscript_dcn_block_default_rewrite(exported, batch):
    """The issue's case: the byte writer cannot type the offset's shape without inference,
    so it steps aside and says why; grid_sample (the default at opset 18) lowers it."""
    result = rewrite_file(exported("dcn_block", "torchscript", batch), None)
    assert result.report.writer == "objects" and "shape inference" in result.report.writer_reason
    assert dict(result.report.actions) == {("custom::deform_conv2d", "decompose:grid_sample"): 1}


def test_cli_exports_and_rewrites_the_torchscript_dcn_block(tmp_path):
    """``graphkit export FILE.py:build ... --no-dynamo --dynamic x:0=batch`` then a plain
    ``graphkit rewrite``: exit 0, the objects writer's model, torch eager's output."""
    from conftest import run_cli

    src, out = tmp_path / "dcn.onnx", tmp_path / "dcn.lowered.onnx"
    run_cli("export", f"{Path(__file__).resolve()}:build_dcn", src, "--input", "x=1x4x8x8", "--no-dynamo",
            "--dynamic", "x:0=batch", check_rc=0)
    proc = run_cli("rewrite", src, out)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == rewrite_file(src, None, fast=False).output
    feeds = {"x": np.random.default_rng(3).standard_normal((3, 4, 8, 8)).astype(np.float32)}
    want = _eager("dcn_block", feeds)
    (got,) = graphkit.open_session(out).run(feeds).values()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
