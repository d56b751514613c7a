"""External data: never loaded, carried to the output's directory, hostile locations refused."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import run_cli
from graphkit.errors import ModelLoadError, OutputError
from graphkit.external_data import check_external_data
from graphkit.modelio import load_model, save_model
from graphkit.rewrite import rewrite_model


def write_model(directory, location="weights.bin", tamper=None):
    """
      x   w (external, 'weights.bin')
       \\ /
      my_add (custom) -> y
    """
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    graph = helper.make_graph([helper.make_node("my_add", ["x", "w"], ["y"], domain="custom", name="add")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(model, directory / "m.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0)
    if location != "weights.bin" or tamper:
        m = onnx.load(directory / "m.onnx", load_external_data=False)
        t = m.graph.initializer[0]
        for e in t.external_data:
            if e.key == "location":
                e.value = location
            if tamper and e.key in tamper:
                e.value = tamper[e.key]
        onnx.save(m, directory / "m.onnx")
    return directory / "m.onnx"


def test_rewrite_into_another_directory_links_weights_and_runs(tmp_path):
    src = write_model(tmp_path / "in")
    (tmp_path / "out").mkdir()
    run_cli("rewrite", src, tmp_path / "out" / "m.onnx", check_rc=0)
    out_w = tmp_path / "out" / "weights.bin"
    assert out_w.exists() and os.path.samefile(out_w, tmp_path / "in" / "weights.bin")  # hard link
    x = np.ones((64, 64), np.float32)
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "out" / "m.onnx"))
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], 2 * x + np.arange(4096, dtype=np.float32).reshape(64, 64))


def test_copy_mode_and_same_directory(tmp_path):
    src = write_model(tmp_path / "in")
    (tmp_path / "out").mkdir()
    run_cli("rewrite", src, tmp_path / "out" / "m.onnx", "--external-data", "copy", check_rc=0)
    out_w = tmp_path / "out" / "weights.bin"
    assert out_w.read_bytes() == (tmp_path / "in" / "weights.bin").read_bytes()
    assert not os.path.samefile(out_w, tmp_path / "in" / "weights.bin")
    run_cli("rewrite", src, tmp_path / "in" / "m2.onnx", check_rc=0)
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == ["m.onnx", "m2.onnx", "weights.bin"]


def test_weights_are_never_loaded(tmp_path):
    src = write_model(tmp_path / "in")
    model = load_model(src)
    assert model.graph.initializer[0].data_location == TensorProto.EXTERNAL
    assert not model.graph.initializer[0].raw_data
    out, _ = rewrite_model(model)
    assert out.graph.initializer[0].data_location == TensorProto.EXTERNAL


@pytest.mark.parametrize("location,why", [("/etc/passwd", "is absolute"), ("../secret.bin", "climbs out"),
                                          ("sub/../../secret.bin", "climbs out")])
def test_hostile_locations_are_refused(tmp_path, location, why):
    (tmp_path / "secret.bin").write_bytes(b"\0" * (1 << 20))
    src = write_model(tmp_path / "in", location=location)
    (tmp_path / "out").mkdir()
    proc = run_cli("rewrite", src, tmp_path / "out" / "m.onnx", check_rc=3)
    assert why in proc.stderr and "tensor 'w'" in proc.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_symlink_out_of_the_directory_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * (1 << 20))
    src = write_model(tmp_path / "in")
    os.remove(tmp_path / "in" / "weights.bin")
    os.symlink(tmp_path / "secret.bin", tmp_path / "in" / "weights.bin")
    with pytest.raises(ModelLoadError, match="through a symlink"):
        check_external_data(load_model(src), src)
    run_cli("inspect", src, check_rc=3)


def test_missing_file_and_offset_past_end(tmp_path):
    src = write_model(tmp_path / "a")
    os.remove(tmp_path / "a" / "weights.bin")
    with pytest.raises(ModelLoadError, match="is missing"):
        check_external_data(load_model(src), src)
    src = write_model(tmp_path / "b", tamper={"offset": "100000000"})
    proc = run_cli("rewrite", src, tmp_path / "b" / "o.onnx", check_rc=3)
    assert "past the end" in proc.stderr
    assert not (tmp_path / "b" / "o.onnx").exists()


def test_existing_different_file_in_output_directory_is_not_overwritten(tmp_path):
    src = write_model(tmp_path / "in")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "weights.bin").write_bytes(b"mine")
    with pytest.raises(OutputError, match="is not the model's weights file"):
        save_model(load_model(src), tmp_path / "out" / "m.onnx", input_path=src)
    assert (tmp_path / "out" / "weights.bin").read_bytes() == b"mine"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["weights.bin"]


def test_inspect_reports_external_data_and_lowerings(tmp_path):
    src = write_model(tmp_path / "in")
    proc = run_cli("inspect", src, check_rc=0)
    assert "custom::my_add x1 (add)" in proc.stdout
    assert "lowerings: decompose:mul_add, native, python" in proc.stdout
    assert "external data: 1 tensors in 1 file(s)" in proc.stdout
    import json

    data = json.loads(run_cli("inspect", src, "--json", check_rc=0).stdout)
    assert data["external_data"]["bytes"] == 4096 * 4 and data["opsets"] == {"": 17, "custom": 1}


def test_external_data_benchmark_small_version():
    """bench/rewrite_external.py at 256 MiB: peak RSS stays under 150 MiB, so the weights are never loaded."""
    import subprocess
    import sys

    from conftest import REPO

    proc = subprocess.run([sys.executable, str(REPO / "bench" / "rewrite_external.py"), "--gib", "0.25",
                           "--layers", "4", "--max-rss-mib", "150", "--max-seconds", "60"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "weights hard-linked: True" in proc.stdout
