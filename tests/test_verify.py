"""Verification: torch vs ORT, model vs model, bounded-memory bisect; the export, verify and
compare commands with their error paths and exit codes."""

from __future__ import annotations

import json
import math
import re
import shlex
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import run_cli
from graphkit import verify
from graphkit.cli import main as cli_main
from graphkit.errors import UsageError, VerificationError
from graphkit.verify import bisect_models, compare_arrays, compare_models

N_CHAIN = 150


def chain_model(diverge_at: int | None = None, custom_at: int = 20) -> onnx.ModelProto:
    """
        x -> Sin -> Sin -> ... -> my_add(t, t) (custom, node custom_at) -> Sin ... -> y
    150 nodes, tensors t0..t148 then y; ``diverge_at`` turns that node's Sin into a Cos.
    """
    nodes, prev = [], "x"
    for i in range(N_CHAIN):
        out = "y" if i == N_CHAIN - 1 else f"t{i}"
        if i == custom_at:
            nodes.append(helper.make_node("my_add", [prev, prev], [out], domain="custom", name=f"n{i}"))
        else:
            op = "Cos" if i == diverge_at else "Sin"
            nodes.append(helper.make_node(op, [prev], [out], name=f"n{i}"))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=8)


# --------------------------------------------------------------------------- arrays


def test_compare_arrays_semantics():
    d = compare_arrays("y", np.array([1.0, np.nan, np.inf, 0.0]), np.array([1.0, np.nan, np.inf, 0.0]))
    assert d.passed and d.max_abs == 0 and d.max_rel == 0
    d = compare_arrays("y", np.array([1.0, 0.0, 2.0], np.float32), np.array([1.0, 1e-7, np.nan], np.float32))
    assert not d.passed and d.mismatched == 1 and d.max_abs == math.inf and d.max_rel == math.inf
    d = compare_arrays("y", np.array([0.0, 100.0]), np.array([5e-6, 100.0009]), atol=1e-5, rtol=1e-5)
    assert d.passed and d.max_rel == math.inf  # 0 expected: relative error is unbounded, allclose passes
    d = compare_arrays("y", np.zeros((2, 3)), np.zeros((3, 2)))
    assert not d.passed and "shape [3, 2] vs [2, 3]" in d.note
    d = compare_arrays("y", np.array([1, 2], np.int64), np.array([1, 2], np.int32))
    assert d.passed and d.note == "dtype int32 vs int64"
    d = compare_arrays("s", np.array(["a", "b"], object), np.array(["a", "c"], object))
    assert not d.passed and d.mismatched == 1
    assert compare_arrays("y", np.array([np.inf]), np.array([-np.inf])).max_abs == math.inf


# --------------------------------------------------------------------------- model vs model


def test_compare_models_with_custom_nodes_and_the_report(tmp_path):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(chain_model(), a)
    onnx.save(chain_model(diverge_at=100), b)
    same = compare_models(a, a, bind="python", dims={"N": 2})
    assert same.passed and same.inputs == {"x": (2, 4)} and same.seed == 0
    report = compare_models(a, b, bind="python", seed=3)
    assert not report.passed and report.failed[0].name == "y"
    text = report.format()
    assert "a.onnx vs " in text and "MISMATCH" in text and "1 of 1 output(s) differ" in text
    with pytest.raises(VerificationError, match="'y' max abs") as info:
        report.raise_for_mismatch()
    assert info.value.exit_code == 12
    assert json.loads(json.dumps(report.to_dict()))["passed"] is False


def test_bisect_finds_the_first_diverging_node_in_bounded_chunks(tmp_path, monkeypatch):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(chain_model(), a)
    onnx.save(chain_model(diverge_at=100), b)
    exposed: list[int] = []
    real = verify._run_with_outputs

    def spy(work, names, *args):
        values = real(work, names, *args)
        exposed.append(len(work.graph.output))  # what the session was asked for
        assert len(values) == len(names)
        return values

    monkeypatch.setattr(verify, "_run_with_outputs", spy)
    report = bisect_models(a, b, bind="python", chunk=64)
    assert report.first.name == "t100" and report.node_a.op == "Sin" and report.node_b.op == "Cos"
    assert report.node_b.name == "n100" and report.node_b.inputs == ("t99",)
    assert report.shared == N_CHAIN and report.compared == 101  # t0..t100, then it stops
    assert report.runs == 2 and report.max_per_run == 64
    assert exposed == [64, 64, 64, 64]  # 2 runs of each model, never more than 64 outputs
    assert "first diverging tensor: t100" in report.format() and "node 'n100' (Cos" in report.format()
    with pytest.raises(VerificationError, match="'t100' is the first to diverge") as info:
        report.raise_for_mismatch()
    assert info.value.node == "n100"


def test_bisect_across_a_rewrite_on_the_native_kernel(tmp_path):
    """Before vs after `graphkit rewrite`: shared names survive the decomposition; the
    placeholder runs on the native library (no bind)."""
    import graphkit

    before = chain_model()
    after, _ = graphkit.rewrite_model(before)
    assert "my_add" not in [n.op_type for n in after.graph.node]
    report = bisect_models(before, after, chunk=50)
    assert report.passed and report.compared == N_CHAIN and report.runs == 3
    assert report.max_per_run == 50
    assert "no shared tensor diverges" in report.format()


def test_bisect_and_compare_errors(tmp_path):
    with pytest.raises(UsageError, match="chunk must be a positive int"):
        bisect_models(chain_model(), chain_model(), chunk=0)
    other = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["z"], ["y"])], "g",
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(UsageError, match="inputs differ"):
        compare_models(chain_model(), other, bind="python")
    with pytest.raises(UsageError, match="bind must be one of"):
        compare_models(chain_model(), chain_model(), bind="gpu")


# --------------------------------------------------------------------------- torch vs ORT

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

NET = textwrap.dedent('''
    import torch
    from graphkit.export import RewriteRegistry

    class Net(torch.nn.Module):
        def __init__(self, seed=0):
            super().__init__()
            torch.manual_seed(seed)
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return torch.asinh(self.conv(x)).repeat(1, 2, 1, 1)

    def build():
        return Net()

    def build_other():
        return Net(seed=1)

    def broken():
        raise RuntimeError("no weights here")

    def not_a_model():
        return 42

    REWRITES = RewriteRegistry("net")

    @REWRITES.function("torch.Tensor.repeat")
    def repeat_as_concat(ctx, self, *sizes):
        return torch.cat([self, self], dim=1) if list(sizes) == [1, 2, 1, 1] else ctx.origin(self, *sizes)
''')


@pytest.fixture
def net(tmp_path, monkeypatch):
    (tmp_path / "net.py").write_text(NET)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def cli(*argv: str) -> int:
    return cli_main([str(a) for a in argv])


def test_verify_export_api(net):
    from graphkit.export import export
    from graphkit.export._loading import load_model_factory

    model = load_model_factory("net.py:build")
    export(model, (torch.randn(1, 3, 8, 8),), "m.onnx", dynamo=False, opset=17,
           dynamic_dims={"x": {0: "batch"}})
    ok = verify.verify_export(model, "m.onnx", dims={"batch": 3}, seed=1)
    assert ok.passed and ok.reference == "torch" and ok.inputs == {"x": (3, 3, 8, 8)}
    bad = verify.verify_export(load_model_factory("net.py:build_other"), "m.onnx")
    assert not bad.passed and bad.failed[0].max_abs > 1e-3
    assert model.training  # verify ran it in eval mode and restored the mode


def test_export_verify_compare_commands(net, capsys):
    assert cli("export", "net.py:build", "m.onnx", "--input", "x=1x3x8x8", "--no-dynamo", "--opset", "17",
               "--dynamic", "x:0=batch", "--rewrites", "net.py:REWRITES", "--verify") == 0
    out = capsys.readouterr().out
    assert "gap fillers used: aten::asinh" in out and "rewrite net/repeat_as_concat: 1 call(s)" in out
    assert "all outputs match" in out
    assert "Tile" not in [n.op_type for n in onnx.load("m.onnx").graph.node]
    assert cli("export", "net.py:build", "p.onnx", "--input", "x=1x3x8x8", "--placeholder", "asinh",
               "--verify", "--bind", "python", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["exporter"] == "dynamo" and report["verify"]["passed"]
    assert report["lowerings"]["custom::asinh"][0] == "decompose:asinh"
    assert cli("verify", "net.py:build", "m.onnx", "--dim", "batch=2") == 0
    assert "x 2x3x8x8" in capsys.readouterr().out
    assert cli("rewrite", "p.onnx", "p.std.onnx") == 0
    capsys.readouterr()
    assert cli("compare", "p.onnx", "p.std.onnx", "--bind", "python", "--bisect", "--chunk", "2") == 0
    assert "no shared tensor diverges" in capsys.readouterr().out


def test_mismatches_exit_12(net, capsys):
    assert cli("export", "net.py:build", "m.onnx", "--input", "x=1x3x8x8", "--no-dynamo", "--opset", "17") == 0
    assert cli("export", "net.py:build_other", "o.onnx", "--input", "x=1x3x8x8", "--no-dynamo", "--opset", "17") == 0
    capsys.readouterr()
    assert cli("verify", "net.py:build_other", "m.onnx") == 12
    err = capsys.readouterr().err
    assert re.search(r"m\.onnx: 1 of 1 output\(s\) differ from torch", err)
    assert cli("compare", "m.onnx", "o.onnx", "--bisect", "--json") == 12
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is False and out["bisect"]["passed"] is False
    assert out["bisect"]["node_a"]["op"] == "Conv"  # the first computed tensor already differs
    np.savez(net / "x.npz", x=np.zeros((1, 3, 8, 8), np.float32))
    assert cli("compare", "m.onnx", "m.onnx", "--inputs", "x.npz") == 0


@pytest.mark.parametrize("argv, code, message", [
    (["export", "nosuch_mod:build", "o.onnx", "--input", "x=1x3x8x8"], 2, "no module named 'nosuch_mod'"),
    (["export", "net.py:nothing", "o.onnx", "--input", "x=1x3x8x8"], 2, "net.py has no 'nothing'"),
    (["export", "net.py", "o.onnx", "--input", "x=1x3x8x8"], 2, "is not MODULE:NAME or FILE.py:NAME"),
    (["export", "missing.py:build", "o.onnx", "--input", "x=1x3x8x8"], 2, "no such file"),
    (["export", "net.py:broken", "o.onnx", "--input", "x=1x3x8x8"], 11, "raised RuntimeError: no weights here"),
    (["export", "net.py:not_a_model", "o.onnx", "--input", "x=1x3x8x8"], 2, "returned a int, not a torch.nn.Module"),
    (["export", "net.py:build", "o.onnx", "--input", "x=1x3xx8"], 2, "is not NAME=SHAPE[:DTYPE]"),
    (["export", "net.py:build", "o.onnx", "--input", "x=1x3x8x8:float128"], 2, "unknown dtype 'float128'"),
    (["export", "net.py:build", "o.onnx", "--input", "x=1x3x8x8", "--dynamic", "y:0=b"], 2, "names no --input"),
    (["export", "net.py:build", "o.onnx", "--input", "x=1x3x8x8", "--dynamic", "x0=b"], 2, "is not NAME:AXIS=DIM"),
    (["export", "net.py:build", "o.onnx", "--input", "x=1x3x8x8", "--rewrites", "net.py:build"], 2,
     "is a function, not a RewriteRegistry"),
    (["export", "net.py:build", "o.onnx", "--input", "x=1x3x8x8", "--no-dynamo", "--no-gap-fillers"], 11,
     "aten::asinh"),
    (["verify", "net.py:build", "nothing.onnx"], 3, "no such file"),
    (["verify", "net.py:build", "nothing.onnx", "--atol", "-1"], 2, "--atol -1.0 must be a non-negative"),
    (["compare", "a.onnx", "a.onnx", "--bisect", "--chunk", "0"], 2, "--chunk 0 must be a positive"),
])
def test_command_errors_are_one_line(net, capsys, argv, code, message):
    onnx.save(chain_model(), net / "a.onnx")
    assert cli(*argv) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("graphkit: error: ")
    assert not (net / "o.onnx").exists()


def test_compare_mismatch_from_the_shell(tmp_path):
    onnx.save(chain_model(), tmp_path / "a.onnx")
    onnx.save(chain_model(diverge_at=140), tmp_path / "b.onnx")
    proc = run_cli("compare", "a.onnx", "b.onnx", "--bind", "python", "--bisect", cwd=tmp_path)
    assert proc.returncode == 12
    assert "first diverging tensor: t140" in proc.stdout
    assert proc.stderr.count("\n") == 1 and "b.onnx" in proc.stderr


def _export_page_commands() -> list[str]:
    """The commands of docs/export.md's "From the command line"."""
    from doc_pages import DOCS, section

    block = re.search(r"```sh\n(.*?)```", section(DOCS / "export.md", "## From the command line"), re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_export_page_commands_run(net):
    (net / "model.py").write_text(NET.replace("def build():", "def build():  # noqa") + "\n")
    commands = _export_page_commands()
    assert commands and all(c.startswith("graphkit ") for c in commands)
    for command in commands:
        assert cli(*shlex.split(command)[1:]) == 0, command
