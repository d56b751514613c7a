"""Export-time rewrites: selected by conditions, active only while exporting, restored on
exit and on error, conflicts are errors; with both exporters."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import torch.nn.functional as F  # noqa: E402

import graphkit  # noqa: E402
from graphkit.errors import ExportError, UsageError  # noqa: E402
from graphkit.export import Backend, Exporter, Opset, RewriteRegistry, export  # noqa: E402
from graphkit.export.rewrites import ExportTarget, activate_rewrites  # noqa: E402

BOTH = pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
TS17 = ExportTarget("torchscript", 17, "onnxruntime")


class Tiled(torch.nn.Module):
    def forward(self, x):
        return F.interpolate(x.repeat(1, 2, 1, 1), scale_factor=2.0, mode="nearest") + 1


class Block(torch.nn.Module):
    def forward(self, x):
        return x * 3


class SubBlock(Block):
    """Inherits forward: a rewrite of SubBlock.forward must not touch Block.forward."""


class WithStatic(torch.nn.Module):
    @staticmethod
    def scale(x):
        return x * 2

    def forward(self, x):
        return self.scale(x)


def _ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(path).graph.node if n.op_type != "Constant"]


def _run(path, x) -> np.ndarray:
    (y,) = graphkit.open_session(path).run({"x": x.numpy()}).values()
    return y


def _pristine():
    return ("repeat" not in torch.Tensor.__dict__ and F.interpolate.__module__ == "torch.nn.functional"
            and not hasattr(F.interpolate, "__graphkit_rewrite__")
            and "forward" not in SubBlock.__dict__ and Block.forward.__qualname__ == "Block.forward")


def repeat_registry() -> RewriteRegistry:
    reg = RewriteRegistry("deploy")

    @reg.function("torch.Tensor.repeat", when=Backend("onnxruntime"))
    def repeat_as_concat(ctx, self, *sizes):
        """An export-friendly repeat along dim 1 (any other call goes to the original)."""
        if list(sizes) == [1, 2, 1, 1]:
            return torch.cat([self, self], dim=1)
        return ctx.origin(self, *sizes)

    @reg.function("torch.nn.functional.interpolate", when=(Opset(min=11),))
    def interpolate_with_size(ctx, x, size=None, scale_factor=None, **kwargs):
        if scale_factor is not None:
            size = [int(d * scale_factor) for d in x.shape[2:]]
        return ctx.origin(x, size=size, **kwargs)

    return reg


@BOTH
def test_function_rewrites_apply_while_exporting_only(tmp_path, dynamo):
    x = torch.rand(1, 2, 3, 4)
    path = tmp_path / "m.onnx"
    report = export(Tiled(), (x,), path, dynamo=dynamo, opset=18, rewrites=repeat_registry())
    assert report.rewrites["deploy/repeat_as_concat"] >= 1
    assert report.rewrites["deploy/interpolate_with_size"] >= 1
    assert "Tile" not in _ops(path) and "Concat" in _ops(path)
    np.testing.assert_allclose(_run(path, x), Tiled()(x).numpy(), atol=1e-6)
    assert _pristine()
    assert "rewrite deploy/repeat_as_concat" in report.details()


@BOTH
def test_forward_rewrite_of_a_subclass_leaves_the_base_alone(tmp_path, dynamo):
    reg = RewriteRegistry("r")

    @reg.forward(SubBlock)
    def plus_one(ctx, self, x):
        assert isinstance(self, SubBlock) and ctx.target.exporter == ("dynamo" if dynamo else "torchscript")
        return ctx.origin(self, x) + 1

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Block(), SubBlock()

        def forward(self, x):
            return self.b(self.a(x))

    x = torch.rand(2, 3)
    export(Net(), (x,), tmp_path / "m.onnx", dynamo=dynamo, opset=18, rewrites=reg)
    np.testing.assert_allclose(_run(tmp_path / "m.onnx", x), (x * 9 + 1).numpy(), rtol=1e-6)
    assert _pristine()


def test_conditions_select_and_explain():
    reg = RewriteRegistry("r")
    reg.forward(Block, when=Opset(max=11), name="old")(lambda ctx, self, x: x)
    reg.forward(Block, when=(Opset(min=12), Exporter("dynamo")), name="new")(lambda ctx, self, x: x)
    reg.forward(SubBlock, when=Backend("tensorrt", "openvino"), name="trt")(lambda ctx, self, x: x)
    assert [r.name for _, r in reg.select(ExportTarget("torchscript", 11))] == ["old"]
    assert [r.name for _, r in reg.select(ExportTarget("dynamo", 18, "tensorrt"))] == ["new", "trt"]
    assert reg.select(TS17) == []
    text = reg.explain(TS17)
    assert "r/old (test_export_rewrites.Block.forward): skipped: opset 17 > 11" in text
    assert "r/new" in text and "exporter is torchscript, not dynamo" in text
    assert "backend is 'onnxruntime', not 'tensorrt' or 'openvino'" in text


def test_two_rewrites_of_one_target_at_once_are_an_error():
    reg = RewriteRegistry("a")
    reg.forward(Block, when=Opset(max=17), name="one")(lambda ctx, self, x: x)
    reg.forward(Block, name="two")(lambda ctx, self, x: x)
    with pytest.raises(ExportError, match="'a/one' and 'a/two' both replace .*Block.forward"):
        with reg.activate(TS17):
            pass
    with reg.activate(ExportTarget("torchscript", 18)) as active:  # disjoint: only "two"
        assert active.names == ["a/two"]
    other = RewriteRegistry("b")
    other.forward(Block, name="three")(lambda ctx, self, x: x)
    with pytest.raises(ExportError, match="'a/two' and 'b/three' both replace"):
        with activate_rewrites([reg, other], ExportTarget("torchscript", 18)):
            pass
    with other.activate(TS17):  # nested activations of one target, from any registry
        with pytest.raises(ExportError, match="'b/three' and 'a/two' both replace"):
            with reg.activate(ExportTarget("torchscript", 18)):
                pass
        assert hasattr(Block.forward, "__graphkit_rewrite__")
    assert _pristine()


def test_everything_is_restored_on_error(tmp_path):
    class Broken(torch.nn.Module):
        def forward(self, x):
            y = x.repeat(1, 2, 1, 1)
            raise RuntimeError("model bug")

    with pytest.raises(ExportError, match="model bug"):
        export(Broken(), (torch.rand(1, 2, 3, 4),), tmp_path / "m.onnx", dynamo=False, opset=17,
               rewrites=repeat_registry())
    assert _pristine() and not (tmp_path / "m.onnx").exists()
    reg = repeat_registry()
    reg.function("torch.nn.functional.no_such_function")(lambda ctx, x: x)
    with pytest.raises(ExportError, match="no_such_function does not exist"):
        with reg.activate(TS17):
            pass
    assert _pristine()  # the two rewrites patched before the failing one are back


def test_staticmethod_targets_keep_their_kind(tmp_path):
    reg = RewriteRegistry("s")
    reg.function(f"{__name__}.WithStatic.scale")(lambda ctx, x: ctx.origin(x) + 1)
    raw = WithStatic.__dict__["scale"]
    with reg.activate(TS17):
        assert isinstance(WithStatic.__dict__["scale"], staticmethod)
        assert WithStatic()(torch.ones(1)).item() == 3
    assert WithStatic.__dict__["scale"] is raw and WithStatic()(torch.ones(1)).item() == 2


def test_registry_mistakes_are_usage_errors():
    reg = RewriteRegistry("m")
    reg.forward(Block, name="x")(lambda ctx, self, x: x)
    with pytest.raises(UsageError, match="already has a rewrite named 'x'"):
        reg.forward(Block, name="x")(lambda ctx, self, x: x)
    with pytest.raises(UsageError, match="dotted path"):
        reg.function("repeat")
    with pytest.raises(UsageError, match="must be a class"):
        reg.forward(Block())
    with pytest.raises(UsageError, match="is not a condition"):
        reg.forward(Block, when="tensorrt", name="y")(lambda ctx, self, x: x)
    with pytest.raises(UsageError, match="is empty"):
        Opset(min=12, max=11)
    with pytest.raises(UsageError):
        Exporter("onnx")
    with pytest.raises(UsageError):
        Backend()
    with pytest.raises(UsageError, match="RewriteRegistry objects"):
        with activate_rewrites(["not a registry"], TS17):
            pass
    bad = RewriteRegistry("c")
    bad.function("torch._C.TensorBase.repeat")(lambda ctx, *a: a[0])
    with pytest.raises(ExportError, match="cannot replace"):
        with bad.activate(TS17):
            pass
    assert "repeat" not in torch.Tensor.__dict__


_REWRITES_FILE = '''
import torch
from graphkit.export import RewriteRegistry


class Block(torch.nn.Module):
    def forward(self, x):
        return x * 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x) - 1


def build():
    return Net()


REWRITES = RewriteRegistry("deploy")


@REWRITES.forward(Block)  # this file's own class: the factory's model must hold the same one
def plus_one(ctx, self, x):
    return ctx.origin(self, x) + 1
'''


@BOTH
def test_cli_rewrites_from_the_factory_file_apply(tmp_path, dynamo):
    """`graphkit export model.py:build ... --rewrites model.py:REWRITES`: the file is imported
    once, so the forward rewrite targets the class the model is built from (it applied 0x
    when the file was imported twice)."""
    import json

    from conftest import run_cli

    (tmp_path / "model.py").write_text(_REWRITES_FILE)
    args = ["export", "model.py:build", "m.onnx", "--input", "x=2x3", "--opset", "18",
            "--rewrites", "model.py:REWRITES", "--json"]
    proc = run_cli(*args, *([] if dynamo else ["--no-dynamo"]), cwd=tmp_path, check_rc=0)
    report = json.loads(proc.stdout)
    assert report["rewrites"].get("deploy/plus_one", 0) >= 1, report["rewrites"]
    x = torch.rand(2, 3, generator=torch.Generator().manual_seed(0))
    # (3x + 1) - 1, not 3x - 1; atol: (3x + 1) - 1 rounds to ulp(1) where 3x is small
    np.testing.assert_allclose(_run(tmp_path / "m.onnx", x), (x * 3).numpy(), rtol=1e-6, atol=2.4e-7)
