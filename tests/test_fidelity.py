"""A rewrite that matches nothing writes back the same model, byte for byte."""

from __future__ import annotations

import glob
import os

import onnx
import pytest

from conftest import my_add_model, run_cli
from graphkit.modelio import load_model
from graphkit.rewrite import Lowering, Rule, rewrite_model

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
WHEEL_MODELS = sorted(glob.glob(os.path.join(DATA, "**", "*.onnx"), recursive=True))
NEVER_MATCHES = Rule("never", lambda op, x, y: op.Add(op.Mul(x, 1234.5), y), lambda op, x, y: op.Sub(x, y))


def test_the_onnx_wheel_ships_models():
    assert len(WHEEL_MODELS) > 100


def test_every_wheel_model_round_trips_unchanged():
    for path in WHEEL_MODELS:
        data = open(path, "rb").read()
        out, report = rewrite_model(load_model(path), rules=[NEVER_MATCHES])
        assert not report.changed and not report.rules.applied, path
        assert out.SerializeToString() == data, path


@pytest.mark.parametrize("name", ["light/light_resnet50.onnx", "simple/test_gradient_of_add/model.onnx"])
def test_cli_no_op_rewrite_is_byte_identical(tmp_path, name):
    src = os.path.join(DATA, name)
    if not os.path.exists(src):
        pytest.skip(f"{name} not in this onnx wheel")
    run_cli("rewrite", src, tmp_path / "out.onnx", check_rc=0)
    assert (tmp_path / "out.onnx").read_bytes() == open(src, "rb").read()


def test_rewrite_keeps_everything_it_does_not_touch():
    model = my_add_model(ir_version=9)
    model.producer_name, model.producer_version, model.model_version = "me", "1.2", 7
    model.graph.doc_string = "graph doc"
    model.graph.value_info.append(onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3]))
    onnx.helper.set_model_props(model, {"k": "v"})
    model.opset_import.append(onnx.helper.make_opsetid("com.example", 3))
    out, _ = rewrite_model(model, lowering=Lowering.DECOMPOSE, check=False)
    for field in ("ir_version", "producer_name", "producer_version", "model_version", "doc_string"):
        assert getattr(out, field) == getattr(model, field)
    assert out.graph.doc_string == "graph doc"
    assert [(vi.name, vi.type) for vi in out.graph.value_info] == [(vi.name, vi.type) for vi in model.graph.value_info]
    assert {(i.domain, i.version) for i in out.opset_import} == {("", 17), ("com.example", 3)}
    assert out.graph.node[-1] == model.graph.node[-1]
