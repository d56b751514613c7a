"""An op package from outside graphkit, installed like any distribution, through everything.

samples/rms_norm_ops is pip-installed (with its entry point) into a temporary site folder
that subprocesses see on PYTHONPATH, as an installed distribution would be found. It goes
through export (both exporters) -> rewrite (decompose, --bind native, --bind python) ->
run / verify / compare -> ops / inspect, by the CLI and by the Python API, with values
checked against its torch reference. A second package, written here, shares a model with
it and with graphkit's own my_add.

    x ──► rms_norm (rms_norm_ops) ──► y ──► my_add (graphkit_ops) ──► z
      w ─┘                        └─► inv_rms ──► demo::twice (second package) ──► t
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import REPO, error_lines, run_cli

torch = pytest.importorskip("torch")

SAMPLE = REPO / "samples" / "rms_norm_ops"

SECOND_PACKAGE = '''
from graphkit.ops import Decomposition, OpDef, OpPackage, Param


def decompose(builder, inputs, attrs):
    return [builder.op("Add", inputs[0], inputs[0])]


TWICE = OpDef(
    name="twice", doc="2 * x", domain="demo", torch_namespace="demo",
    inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
    type_constraints={"T": ("tensor(float)", "tensor(double)")},
    reference=lambda x: 2 * x, infer_shapes=lambda shapes, attrs: [shapes[0]],
    python_kernel=lambda x: x + x,
    decompositions=(Decomposition("add", decompose, min_opset=7),))

PACKAGE = OpPackage("demo_ops", (TWICE,))
'''

FACTORY = '''
import torch


class Block(torch.nn.Module):
    """Linear -> rms_norm (the installed package's op, defined when the factory runs)."""

    def __init__(self, ops, with_weight):
        super().__init__()
        self.ops = ops
        self.linear = torch.nn.Linear(8, 8)
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8)) if with_weight else None

    def forward(self, x):
        y, inv_rms = self.ops.rms_norm(self.linear(x), self.weight, epsilon=1e-5)
        return y, inv_rms


def build(with_weight=True):
    from graphkit.export import TorchOps   # the user's ops are defined lazily, here

    torch.manual_seed(0)
    return Block(TorchOps(), with_weight).eval()


def build_plain():
    return build(with_weight=False)
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """samples/rms_norm_ops installed (entry point included) into a folder of its own."""
    target = tmp_path_factory.mktemp("site")
    source = tmp_path_factory.mktemp("src") / "rms_norm_ops"  # the build writes egg-info beside it
    shutil.copytree(SAMPLE, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-build-isolation", "--target", str(target), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(target.glob("rms_norm_ops-*.dist-info/entry_points.txt"))
    return target


@pytest.fixture(scope="module")
def work(site, tmp_path_factory):
    """A project folder: the factory, the second package, inputs; and the env to run in."""
    d = tmp_path_factory.mktemp("project")
    (d / "factory.py").write_text(FACTORY)
    (d / "demo_ops.py").write_text(SECOND_PACKAGE)
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    np.savez(d / "x.npz", x=x)
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(d)]), "GRAPHKIT_OPS": ""}
    return d, env, x


def _reference(x: np.ndarray, with_weight: bool = True):
    import importlib

    sys.path.insert(0, str(SAMPLE))
    try:
        rms = importlib.import_module("rms_norm_ops")
    finally:
        sys.path.remove(str(SAMPLE))
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8)
    weight = torch.linspace(0.5, 1.5, 8) if with_weight else None
    with torch.no_grad():
        y, inv = rms.reference(linear(torch.from_numpy(x)), weight, 1e-5)
    return y.numpy(), inv.numpy()


def _cli(work, *args, rc=0):
    d, env, _ = work
    return run_cli(*args, cwd=d, env=env, check_rc=rc)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_cli_export_rewrite_run_verify(work, dynamo):
    d, env, x = work
    flag = "--dynamo" if dynamo else "--no-dynamo"
    model = f"m_{flag[2:]}.onnx"
    _cli(work, "export", "factory.py:build", model, "--input", "x=2x3x8", flag,
         "--output-name", "y", "--output-name", "inv_rms")
    proto = onnx.load(d / model)
    custom = [n for n in proto.graph.node if n.domain == "custom"]
    assert [(n.op_type, len(n.output)) for n in custom] == [("rms_norm", 2)]
    y_ref, inv_ref = _reference(x)
    for how in ("decompose", "native", "python"):
        out = f"{model}.{how}.onnx"
        args = [] if how == "decompose" else ["--bind", how]
        _cli(work, "rewrite", model, out, *args)
        domains = {n.domain for n in onnx.load(d / out).graph.node}
        assert ("custom" in domains) is False
        _cli(work, "run", out, "--inputs", "x.npz", "--output", f"{out}.npz")
        got = np.load(d / f"{out}.npz")
        np.testing.assert_allclose(got["y"], y_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["inv_rms"], inv_ref, rtol=1e-5, atol=1e-5)
        _cli(work, "compare", model, out, "--inputs", "x.npz", "--bind", "native")
    _cli(work, "verify", "factory.py:build", model, "--inputs", "x.npz")
    _cli(work, "verify", "factory.py:build", model, "--inputs", "x.npz", "--bind", "python")


def test_cli_export_without_the_optional_input(work):
    d, _, x = work
    _cli(work, "export", "factory.py:build_plain", "plain.onnx", "--input", "x=2x3x8", "--verify",
         "--output-name", "y", "--output-name", "inv_rms")
    node = next(n for n in onnx.load(d / "plain.onnx").graph.node if n.op_type == "rms_norm")
    assert len([i for i in node.input if i]) == 1
    for args in ([], ["--bind", "native"], ["--bind", "python"]):
        _cli(work, "rewrite", "plain.onnx", "plain.out.onnx", *args)
        _cli(work, "run", "plain.out.onnx", "--inputs", "x.npz", "--output", "plain.npz")
        np.testing.assert_allclose(np.load(d / "plain.npz")["y"], _reference(x, with_weight=False)[0],
                                   rtol=1e-5, atol=1e-5)


def test_cli_ops_and_inspect_name_the_package(work):
    listing = json.loads(_cli(work, "ops", "--json").stdout)
    ops = listing["ops"] if isinstance(listing, dict) else listing
    rms = next(o for o in ops if o["name"] == "rms_norm")
    assert rms["package"]["name"] == "rms_norm_ops" and rms["package"]["version"] == "0.2.0"
    assert "entry point" in rms["package"]["origin"]
    text = _cli(work, "ops").stdout
    assert "rms_norm" in text and "rms_norm_ops" in text and "my_add" in text
    d, _, _ = work
    if not (d / "m_dynamo.onnx").exists():
        _cli(work, "export", "factory.py:build", "m_dynamo.onnx", "--input", "x=2x3x8")
    shown = _cli(work, "inspect", "m_dynamo.onnx").stdout
    assert "custom::rms_norm" in shown and "UNKNOWN" not in shown and "rms_norm_ops" in shown


def _three_package_model(dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    nodes = [
        helper.make_node("rms_norm", ["x", "w"], ["y", "inv_rms"], domain="custom", name="norm",
                         epsilon=1e-5),
        helper.make_node("my_add", ["y", "y"], ["z"], domain="custom", name="add"),
        helper.make_node("twice", ["inv_rms"], ["t"], domain="demo", name="twice"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", dtype, [2, 8]),
                                           helper.make_tensor_value_info("w", dtype, [8])],
                              [helper.make_tensor_value_info("z", dtype, None),
                               helper.make_tensor_value_info("t", dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("custom", 1),
                                                   helper.make_opsetid("demo", 1)], ir_version=10)


def test_three_packages_in_one_model_cli(work):
    d, _, _ = work
    onnx.save(_three_package_model(), d / "three.onnx")
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 8)).astype(np.float32), rng.random(8).astype(np.float32)
    np.savez(d / "xw.npz", x=x, w=w)
    inv = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5)
    want_z, want_t = 2 * (x * inv * w) + x * inv * w, 2 * inv
    # without --ops the second package is unknown: rewrite leaves its node alone (a domain it
    # does not know may be served elsewhere), run names it and says how to make it known
    _cli(work, "rewrite", "three.onnx", "three.out.onnx")
    assert ("demo", "twice") in {(n.domain, n.op_type) for n in onnx.load(d / "three.out.onnx").graph.node}
    err = _cli(work, "run", "three.out.onnx", "--inputs", "xw.npz", rc=6).stderr
    assert "demo::twice" in err and "--ops" in err and len(error_lines(err)) == 1
    # demo::twice has no native kernel: `--bind native` names it; native first, else decompose
    err = _cli(work, "rewrite", "three.onnx", "three.out.onnx", "--ops", "demo_ops.py", "--bind", "native",
               rc=6).stderr
    assert "demo::twice" in err and "has no native kernel" in err
    for args in ([], ["--prefer", "native,decompose"], ["--bind", "python"]):
        _cli(work, "rewrite", "three.onnx", "three.out.onnx", "--ops", "demo_ops.py", *args)
        _cli(work, "run", "three.out.onnx", "--ops", "demo_ops.py", "--inputs", "xw.npz", "--output", "zt.npz")
        got = np.load(d / "zt.npz")
        np.testing.assert_allclose(got["z"], want_z, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["t"], want_t, rtol=1e-5, atol=1e-5)


def test_python_api_end_to_end(work, monkeypatch):
    d, env, _ = work
    for p in env["PYTHONPATH"].split(os.pathsep):
        monkeypatch.syspath_prepend(p)
    from graphkit.ops import discover
    from graphkit.rewrite import Lowering, rewrite_model
    from graphkit.runtime import open_session

    registry = discover(ops=[str(d / "demo_ops.py")])
    assert {op.qualified_name for op in registry} >= {"custom::rms_norm", "custom::my_add", "demo::twice"}
    assert registry.package_of(registry.get("rms_norm")).name == "rms_norm_ops"
    model = _three_package_model(TensorProto.DOUBLE)
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((2, 8)), "w": rng.random(8)}
    inv = 1 / np.sqrt(np.mean(feeds["x"] ** 2, axis=-1, keepdims=True) + 1e-5)
    y = feeds["x"] * inv * feeds["w"]
    results = []
    for lowering in (Lowering.DECOMPOSE, (Lowering.NATIVE, Lowering.DECOMPOSE), Lowering.PYTHON):
        out, report = rewrite_model(model, registry=registry, lowering=lowering)
        got = open_session(out, registry=registry).run(feeds)
        np.testing.assert_allclose(got["z"], 3 * y, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got["t"], 2 * inv, rtol=1e-12, atol=1e-12)
        results.append(report)
    # placeholders run as they are: my_add and rms_norm share the native library's "custom" domain
    native_only = _three_package_model(TensorProto.DOUBLE)
    del native_only.graph.node[2]
    del native_only.graph.output[1]
    got = open_session(native_only, registry=registry).run(feeds)
    np.testing.assert_allclose(got["z"], 3 * y, rtol=1e-12, atol=1e-12)
