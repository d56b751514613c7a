"""asinh both ways: torch.asinh -> Asinh through a scoped symbolic (every TorchScript opset
from 9), and the custom::asinh placeholder with its lowerings (Asinh, log_sqrt, numpy)."""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import graphkit_ops  # noqa: E402
import graphkit  # noqa: E402
from graphkit_ops.asinh import ASINH  # noqa: E402
from graphkit.errors import ExportError  # noqa: E402
from graphkit.export import TorchOps, export  # noqa: E402
from graphkit.export.aten import forget_empty_group, torch_symbolic_exists  # noqa: E402
from graphkit.rewrite import Lowering  # noqa: E402
from graphkit.rewrite.rules.loader import load_rules  # noqa: E402


class AsinhModel(torch.nn.Module):
    def forward(self, x):
        return torch.asinh(x) * 2


class Failing(torch.nn.Module):
    def forward(self, x):
        y = torch.asinh(x)
        raise RuntimeError("model bug after asinh")


@pytest.fixture(scope="module")
def x():
    gen = torch.Generator().manual_seed(0)
    return (torch.rand(2, 3, 5, generator=gen) - 0.5) * 200  # [-100, 100]


@contextlib.contextmanager
def user_symbolic(fn, opset: int):
    """A symbolic for aten::asinh registered by "someone else" for the block."""
    torch.onnx.register_custom_op_symbolic("aten::asinh", fn, opset)
    try:
        yield
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::asinh", opset)
        forget_empty_group("aten::asinh", existed=False)  # leave torch as the other tests expect


def _ops(path) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in onnx.load(path).graph.node if n.op_type != "Constant"]


def _run(model, feeds) -> np.ndarray:
    (y,) = graphkit.open_session(model).run(feeds).values()
    return y


def test_opdef_is_the_one_definition():
    assert ASINH in graphkit_ops.ALL_OPS and graphkit.ops.default_registry().get("asinh") is ASINH
    assert [(d.name, d.min_opset) for d in ASINH.decompositions] == [("asinh", 9), ("log_sqrt", 7)]
    x = np.array([-3.0, 0.0, 0.5], np.float32)
    np.testing.assert_array_equal(ASINH.python_kernel(x), np.arcsinh(x))
    assert ASINH.python_kernel(x).dtype == np.float32
    torch.testing.assert_close(ASINH.reference(torch.from_numpy(x)), torch.asinh(torch.from_numpy(x)))


def test_torch_asinh_exports_at_every_torchscript_opset_from_9(tmp_path, x):
    want = AsinhModel()(x).numpy()
    for opset in range(9, 21):
        path = tmp_path / f"asinh{opset}.onnx"
        report = export(AsinhModel(), (x,), path, dynamo=False, opset=opset)
        assert report.opset == opset and report.gap_fillers == ("aten::asinh",)
        assert ("", "Asinh") in _ops(path) and not report.custom_nodes
        np.testing.assert_allclose(_run(path, {"x": x.numpy()}), want, rtol=1e-6, atol=1e-6)
        assert not torch_symbolic_exists("aten::asinh", opset)  # registered for the call only


def test_without_graphkit_torch_cannot_export_asinh(tmp_path, x):
    with pytest.raises(ExportError, match=r"aten::asinh.*opset version 17"):
        export(AsinhModel(), (x,), tmp_path / "m.onnx", dynamo=False, opset=17, gap_fillers=None)
    assert not (tmp_path / "m.onnx").exists()


def test_symbolic_is_unregistered_when_the_export_fails(tmp_path, x):
    with pytest.raises(ExportError, match="model bug after asinh"):
        export(Failing(), (x,), tmp_path / "m.onnx", dynamo=False, opset=17)
    assert not torch_symbolic_exists("aten::asinh", 17)
    assert not (tmp_path / "m.onnx").exists()
    # torch's registry is as before: its own error still names the op
    with pytest.raises(ExportError, match=r"aten::asinh.*opset version 17"):
        export(AsinhModel(), (x,), tmp_path / "m.onnx", dynamo=False, opset=17, gap_fillers=None)


def test_a_symbolic_registered_by_the_user_wins_and_stays(tmp_path, x):
    def mine(g, v):
        return g.op("Sinh", v)  # deliberately different, to see whose symbolic ran

    with user_symbolic(mine, 17):
        report = export(AsinhModel(), (x,), tmp_path / "m.onnx", dynamo=False, opset=17)
        assert ("", "Sinh") in _ops(tmp_path / "m.onnx") and report.gap_fillers == ()
        assert torch_symbolic_exists("aten::asinh", 17)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_placeholder_instead_of_asinh_and_its_lowerings(tmp_path, x, dynamo):
    path = tmp_path / "custom.onnx"
    report = export(AsinhModel(), (x,), path, dynamo=dynamo, opset=18, placeholders=["asinh"])
    assert report.count("asinh") == 1 and ("custom", "asinh") in _ops(path)
    assert report.lowerings["custom::asinh"] == ("decompose:asinh", "decompose:log_sqrt", "python")
    assert "custom::asinh: lowerings decompose:asinh" in report.details()
    feeds, want = {"x": x.numpy()}, AsinhModel()(x).numpy()
    model = graphkit.load_model(path)
    std, _ = graphkit.rewrite_model(model)
    assert ("", "Asinh") in [(n.domain, n.op_type) for n in std.graph.node]
    no_asinh, rep = graphkit.rewrite_model(model, rules=load_rules("graphkit_ops.asinh.no_asinh"))
    ops = {n.op_type for n in no_asinh.graph.node}
    assert "Asinh" not in ops and {"Log", "Sqrt"} <= ops and rep.rules.applied
    py, _ = graphkit.rewrite_model(model, lowering=Lowering.PYTHON)
    for lowered in (std, no_asinh, py):
        np.testing.assert_allclose(_run(lowered, feeds), want, rtol=1e-5, atol=1e-5)


def test_graphkit_op_in_the_model_exports_as_placeholder(tmp_path, x):
    with TorchOps() as ops:
        class Model(torch.nn.Module):
            def forward(self, v):
                return ops.asinh(v)

        for dynamo in (True, False):
            report = export(Model(), (x,), tmp_path / "m.onnx", dynamo=dynamo, opset=18)
            assert [n.op for n in report.custom_nodes] == ["custom::asinh"]


def _asinh_node_model(opset: int, domain: str = "custom", op: str = "asinh") -> onnx.ModelProto:
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], domain=domain, name="n0")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7])])
    return helper.make_model(graph, opset_imports=imports, ir_version=8)


WIDE = np.array([-1e4, -100.0, -3.0, -1e-3, 0.0, 0.5, 1e4], np.float32)


def test_log_sqrt_below_opset_9_and_without_cancellation():
    """Opset 8 has no Asinh (nor Sign): the placeholder lowers to log_sqrt with Less + Cast."""
    lowered, report = graphkit.rewrite_model(_asinh_node_model(8))
    ops = [n.op_type for n in lowered.graph.node]
    assert "Asinh" not in ops and "Sign" not in ops and "Cast" in ops
    assert report.actions == {("custom::asinh", "decompose:log_sqrt"): 1}
    got = _run(lowered, {"x": WIDE})
    np.testing.assert_allclose(got, np.arcsinh(WIDE), rtol=2e-6, atol=1e-6)
    # the textbook log(x + sqrt(x*x + 1)) loses digits for negative x in float32
    with np.errstate(divide="ignore"):
        naive = np.log(WIDE + np.sqrt(WIDE * WIDE + np.float32(1)))
    assert np.abs(naive[1] - np.arcsinh(WIDE[1])) > 1e-4


def test_double_inputs_decompose_to_what_onnxruntime_runs():
    """ORT's CPU provider has Asinh for float and float16 only: double gets log_sqrt."""
    model = _asinh_node_model(17)
    for t in (*model.graph.input, *model.graph.output):
        t.type.tensor_type.elem_type = TensorProto.DOUBLE
    lowered, _ = graphkit.rewrite_model(model)
    assert "Asinh" not in [n.op_type for n in lowered.graph.node]
    x = WIDE.astype(np.float64)
    np.testing.assert_allclose(_run(lowered, {"x": x}), np.arcsinh(x), rtol=1e-12)


def test_no_asinh_rules_rewrite_standard_asinh_nodes_too():
    lowered, report = graphkit.rewrite_model(_asinh_node_model(17, domain="", op="Asinh"),
                                             rules=load_rules("graphkit_ops.asinh.no_asinh"))
    assert report.rules.applied == {"asinh_to_log_sqrt": 1}
    assert "Asinh" not in [n.op_type for n in lowered.graph.node]
    np.testing.assert_allclose(_run(lowered, {"x": WIDE}), np.arcsinh(WIDE), rtol=2e-6, atol=1e-6)


def test_placeholder_errors(tmp_path, x):
    with pytest.raises(ExportError, match="no graphkit op 'sinh'"):
        export(AsinhModel(), (x,), tmp_path / "m.onnx", dynamo=False, opset=17, placeholders=["sinh"])
    with pytest.raises(ExportError, match="cannot stand for aten::deform_conv2d"):
        export(AsinhModel(), (x,), tmp_path / "m.onnx", dynamo=False, opset=17,
               placeholders=["deform_conv2d"])
    with user_symbolic(lambda g, v: g.op("Sinh", v), 17):
        with pytest.raises(ExportError, match="already registered at opset 17"):
            export(AsinhModel(), (x,), tmp_path / "m.onnx", dynamo=False, opset=17, placeholders=["asinh"])
    assert not (tmp_path / "m.onnx").exists()
