"""Real architectures through graphkit's export (bench/zoo.py), the gaps they found, and the
ONNX Runtime load check every export ends with.

The default suite runs BERT and GPT-2 with both exporters at opset 18 (tiny configs);
``GRAPHKIT_ZOO=1`` runs the whole grid: every architecture x exporter x opset 17, 18, 20.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import onnxruntime as ort  # noqa: E402
from conftest import REPO, error_lines, run_cli  # noqa: E402

from graphkit.errors import ExportError  # noqa: E402
from graphkit.export import GAP_FILLERS, TorchOps, export  # noqa: E402
from graphkit.export._runtime_check import check_loads  # noqa: E402
from graphkit.ops import default_registry  # noqa: E402
from graphkit.verify import compare_arrays  # noqa: E402
from torch_call import Call  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")


def _load_bench():
    spec = importlib.util.spec_from_file_location("zoo_bench", REPO / "bench" / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


zoo = _load_bench()
FULL = os.environ.get("GRAPHKIT_ZOO") == "1"
DEFAULT_CELLS = [("bert", "torchscript", 18), ("bert", "dynamo", 18),
                 ("gpt2", "torchscript", 18), ("gpt2", "dynamo", 18)]
ALL_CELLS = [(m, e, o) for m in zoo.ZOO for e in zoo.EXPORTERS for o in zoo.OPSETS]
TRANSFORMERS = {"bert", "gpt2", "t5", "vit", "whisper", "llama"}


def _run(path, *args) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {s.name: a.numpy() for s, a in zip(sess.get_inputs(), args)})[0]


def _bool_cumsum(x):
    """What transformers' find_packed_sequence_indices computes (torch writes a bool CumSum)."""
    return (x > 0).cumsum(-1)


# --------------------------------------------------------------------------- the zoo


@pytest.mark.parametrize("model,exporter,opset", ALL_CELLS if FULL else DEFAULT_CELLS,
                         ids=lambda v: str(v))
def test_zoo_cell_exports_runs_and_matches_torch(model, exporter, opset, tmp_path):
    if model in TRANSFORMERS:
        pytest.importorskip("transformers")
    cell = zoo.run_cell(zoo.ZOO[model], exporter, opset, tmp_path)
    known = zoo.known_failure(model, exporter, opset)
    if known is not None:  # strict: a cell that starts working must leave KNOWN_FAILURES
        assert not cell.matched and known in cell.reason, (cell.status, cell.reason)
        return
    assert cell.matched, (cell.status, cell.reason)
    assert cell.max_abs <= zoo.ZOO[model].atol
    if model == "gpt2" and exporter == "torchscript":
        assert {"aten::diff", "aten::cumsum"} <= set(cell.gap_fillers)


def test_gpt2_torchscript_needs_diff_and_cumsum(tmp_path):
    """Without the diff filler torch cannot export GPT-2; without the cumsum row it exports a
    bool CumSum that ONNX Runtime refuses, and graphkit's export fails naming it."""
    pytest.importorskip("transformers")
    gpt2 = zoo.ZOO["gpt2"]
    cell = zoo.run_cell(gpt2, "torchscript", 18, tmp_path, gap_fillers=GAP_FILLERS.without("diff"))
    assert not cell.exported and "aten::diff" in cell.reason
    cell = zoo.run_cell(gpt2, "torchscript", 18, tmp_path, gap_fillers=GAP_FILLERS.without("cumsum"))
    assert not cell.exported
    assert "CumSum" in cell.reason and "tensor(bool)" in cell.reason, cell.reason
    assert not list(tmp_path.iterdir())  # nothing written


def test_table_formats_every_cell_and_reason(monkeypatch):
    monkeypatch.setattr(zoo, "KNOWN_FAILURES", {("t5", "dynamo", None): ("Cannot view", "an example")})
    cells = [zoo.Cell("bert", "dynamo", 18, True, True, True, 1e-7, 2.0, 0.01),
             zoo.Cell("gpt2", "torchscript", 17, reason="ExportError: aten::diff"),
             zoo.Cell("t5", "dynamo", 18, reason="ExportError: ... Cannot view a tensor with shape ..."),
             zoo.Cell("t5", "torchscript", 17, True, True, False, 0.5, 1.0, 0.01, reason="output 0")]
    text = zoo.format_table(cells)
    lines = text.splitlines()
    head = lines.index("| model | dynamo 18 | torchscript 17 |")
    assert lines[head + 1:head + 5] == ["|---|---|---|", "| bert | ok 1.0e-07 | - |",
                                        "| gpt2 | - | EXPORT FAILED |", "| t5 | EXPORT FAILED | MISMATCH 5.0e-01 |"]
    assert "1 of 4 cells" in text
    assert "- gpt2 torchscript opset 17: ExportError: aten::diff" in text
    assert "- t5 dynamo opset 18 (known)" in text
    assert "load check: at most 1% of an export's time" in text


# --------------------------------------------------------------------------- new gap fillers


@pytest.mark.parametrize("aten", ["aten::diff", "aten::cumsum"])
def test_model_gap_fillers_are_exact(aten, tmp_path):
    """Every example (edge values, int8 wrap-around, float16, bool, promotion) equals torch
    bit for bit, dtype included, at opsets 11 and 20 (float32 cumsum: ORT's summation order,
    test_gaps checks every row at 17 too)."""
    filler = GAP_FILLERS.get(aten)
    for i, ex in enumerate(filler.examples):
        args = ex.inputs(torch.Generator().manual_seed(i))
        want = ex.fn(*args).numpy()
        for opset in (11, 20):
            path = tmp_path / f"{i}_{opset}.onnx"
            report = export(Call(ex.fn), args, path, dynamo=False, opset=opset)
            assert aten in report.gap_fillers
            got = _run(path, *args)
            assert got.dtype == want.dtype and got.shape == want.shape, (ex.label, opset)
            tol = 1e-6 if ex.label == "float32" else 0.0
            diff = compare_arrays("y", want, got, atol=tol, rtol=tol)
            assert diff.passed, (aten, ex.label, opset, diff)
            assert np.array_equal(np.signbit(got), np.signbit(want)) or want.dtype.kind == "b"


def test_cumsum_row_replaces_torchs_symbolic(tmp_path):
    """torch's own aten::cumsum symbolic sums int32 in int32 (torch returns int64, so
    2**30 + 2**30 overflows) and int8 in int8, which ONNX Runtime has no kernel for (the
    load check refuses it); graphkit's row sums both in int64."""
    x = torch.tensor([[2**30, 2**30, 5]], dtype=torch.int32)
    cases = [(lambda t: torch.cumsum(t, -1), x, np.int64)]
    without = GAP_FILLERS.without("cumsum")
    for fn, arg, dtype in cases:
        want = fn(arg).numpy()
        assert want.dtype == dtype
        torch_path, ours = tmp_path / "torch.onnx", tmp_path / "ours.onnx"
        export(Call(fn), (arg,), torch_path, dynamo=False, gap_fillers=without)
        export(Call(fn), (arg,), ours, dynamo=False)
        got_torch, got_ours = (_run(p, arg) for p in (torch_path, ours))
        assert got_torch.dtype != dtype  # torch's symbolic
        assert got_ours.dtype == dtype and np.array_equal(got_ours, want)
    int8 = torch.tensor([[100, 100, -7]], dtype=torch.int8)
    with pytest.raises(ExportError, match="CumSum"):
        export(Call(lambda t: torch.cumsum(t, -1)), (int8,), tmp_path / "i8.onnx", dynamo=False, gap_fillers=without)
    export(Call(lambda t: torch.cumsum(t, -1)), (int8,), tmp_path / "i8.onnx", dynamo=False)
    assert _run(tmp_path / "i8.onnx", int8).tolist() == [[100, 200, 193]]


# --------------------------------------------------------------------------- the ORT load check


def test_export_onnxruntime_refuses_fails_naming_node_op_and_fix(tmp_path):
    path = tmp_path / "out.onnx"
    path.write_bytes(b"previous")
    with pytest.raises(ExportError) as info:
        export(Call(_bool_cumsum), (torch.randn(2, 5),), path, dynamo=False,
               gap_fillers=GAP_FILLERS.without("cumsum"))
    err = info.value
    assert err.exit_code == 11 and err.node == "/CumSum" and err.op == "CumSum"
    assert "cannot export Call (dynamo=False): ONNX Runtime" in err.message
    assert "tensor(bool)" in err.message and "cast before it" in err.hint and "dynamo=True" in err.hint
    assert path.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]  # no temporaries left
    report = export(Call(_bool_cumsum), (torch.randn(2, 5),), path, dynamo=False)
    assert report.runtime_check.checked and report.gap_fillers == ("aten::cumsum",)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_load_check_binds_placeholders_to_python_kernels(tmp_path, dynamo):
    """custom::my_add is checked bound to its Python kernel (registered through
    onnxruntime-extensions; no kernel library is built), and the nodes after it too."""
    ops = TorchOps(default_registry())

    class M(torch.nn.Module):
        def forward(self, a, b):
            return _bool_cumsum(ops.my_add(a, b))

    args = (torch.randn(2, 3), torch.randn(2, 3))
    report = export(M(), args, tmp_path / "ok.onnx", dynamo=dynamo)
    assert report.count("my_add") == 1
    check = report.runtime_check
    assert check.checked and check.stand_ins == 0 and check.reason == ""
    assert check.lowerings == {"custom::my_add": "python"}
    if not dynamo:
        with pytest.raises(ExportError, match="CumSum") as info:
            export(M(), args, tmp_path / "bad.onnx", dynamo=False, gap_fillers=GAP_FILLERS.without("cumsum"))
        assert info.value.op == "CumSum" and not (tmp_path / "bad.onnx").exists()
        assert "custom::my_add: python" in info.value.hint
    ops.close()


def _halve_op(name: str, out_types: tuple[str, ...], **fields):
    """x / 2 in float; its output-only type variable U makes the Python kernel declare
    ``out_types[0]`` as its output type (onnxruntime-extensions picks kernels by inputs)."""
    from graphkit.ops import OpDef, Param

    fields.setdefault("python_kernel", lambda x: x / 2)
    return OpDef(name=name, doc="x / 2", domain="gkcheck", torch_namespace="gkcheck",
                 inputs=(Param("x", "T"),), outputs=(Param("y", "U"),),
                 type_constraints={"T": ("tensor(float)",), "U": out_types},
                 reference=lambda x: x / 2, infer_shapes=lambda s, a: [s[0]], **fields)


def _export_halve(op, path):
    registry = default_registry().with_ops(op)
    ops = TorchOps(registry)

    class M(torch.nn.Module):
        def forward(self, a):
            return getattr(ops, op.name)(a) + a

    try:
        return export(M(), (torch.randn(2, 3),), path, dynamo=False, registry=registry)
    finally:
        ops.close()


def test_load_check_sees_the_types_a_python_kernel_declares(tmp_path):
    """The check runs with the Python kernel registered: a kernel declaring int64 where
    the exported graph (and torch) has float fails the export, naming the node, the op
    and the fix in one line. With the placeholder cut out instead, the exported float
    type would have been all ORT saw, and the export would have passed."""
    good = _export_halve(_halve_op("gkcheck_halve_ok", ("tensor(float)", "tensor(int64)")), tmp_path / "ok.onnx")
    assert good.runtime_check.checked and good.runtime_check.lowerings == {"gkcheck::gkcheck_halve_ok": "python"}
    path = tmp_path / "bad.onnx"
    with pytest.raises(ExportError) as info:
        _export_halve(_halve_op("gkcheck_halve_int", ("tensor(int64)", "tensor(float)")), path)
    err = info.value
    assert err.exit_code == 11 and err.node == "/gkcheck_halve_int" and err.op == "gkcheck::gkcheck_halve_int"
    assert "bound to its python kernel" in err.message and "tensor(int64)" in err.message
    assert "type_constraints" in err.hint
    assert "\n" not in str(err) and not path.exists()


def test_load_check_falls_back_to_decomposition_then_stands_in(tmp_path):
    """No Python kernel: the decomposition is checked; no lowering at all: the node is cut
    out and the report says which op was not checked and why."""
    from graphkit.ops import Decomposition

    halve = Decomposition("div", lambda b, i, a: [b.op("Div", i[0], b.constant(np.float32(2), like=i[0]))], min_opset=7)
    report = _export_halve(_halve_op("gkcheck_halve_dec", ("tensor(float)",), python_kernel=None,
                                     decompositions=(halve,)), tmp_path / "dec.onnx")
    assert report.runtime_check.lowerings == {"gkcheck::gkcheck_halve_dec": "decompose:div"}
    assert report.runtime_check.stand_ins == 0 and report.runtime_check.reason == ""
    report = _export_halve(_halve_op("gkcheck_halve_none", ("tensor(float)",), python_kernel=None),
                           tmp_path / "none.onnx")
    check = report.runtime_check
    assert check.checked and check.stand_ins == 1 and check.lowerings == {"gkcheck::gkcheck_halve_none": "stand-in"}
    assert check.reason == ("gkcheck::gkcheck_halve_none not checked: it has no Python kernel, decomposition "
                            "or native kernel")
    late = Decomposition("div20", halve.build, min_opset=20)  # the export writes opset 18
    report = _export_halve(_halve_op("gkcheck_halve_late", ("tensor(float)",), python_kernel=None,
                                     decompositions=(late,)), tmp_path / "late.onnx")
    check = report.runtime_check
    assert check.checked and check.stand_ins == 1 and check.lowerings == {"gkcheck::gkcheck_halve_late": "stand-in"}
    assert check.reason.startswith("gkcheck::gkcheck_halve_late not checked: ") and "opset 18" in check.reason


def test_load_check_says_when_a_decomposition_raises(tmp_path):
    """An op package whose decomposition raises does not crash the export: the op is stood
    in for, the reason naming the exception (graphkit rewrite raises it as a RewriteError
    naming the node, graphkit/rewrite/lowering/selection.py)."""
    from graphkit.ops import Decomposition

    def broken(builder, inputs, attrs):
        raise TypeError("broken decomposition")

    report = _export_halve(_halve_op("gkcheck_halve_broken", ("tensor(float)",), python_kernel=None,
                                     decompositions=(Decomposition("broken", broken, min_opset=7),)),
                           tmp_path / "broken.onnx")
    check = report.runtime_check
    assert check.checked and check.stand_ins == 1
    assert check.lowerings == {"gkcheck::gkcheck_halve_broken": "stand-in"}
    assert check.reason.startswith("gkcheck::gkcheck_halve_broken not checked: decomposition 'broken' raised "
                                   "TypeError: broken decomposition: a bug in the op's decomposition"), check.reason


def _graph_model(nodes, inputs, outputs, value_info=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs, value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("custom", 1)], ir_version=10)


def test_load_check_on_handmade_models():
    """Unit cases: an invalid standard node named in the error; a placeholder whose output
    type nobody states (and shape inference cannot give) leaves the check undone, saying why."""
    registry = default_registry()
    bad = _graph_model([helper.make_node("CumSum", ["x", "axis"], ["y"], name="my_cumsum")],
                       [helper.make_tensor_value_info("x", TensorProto.BOOL, [3]),
                        helper.make_tensor_value_info("axis", TensorProto.INT64, [])],
                       [helper.make_tensor_value_info("y", TensorProto.BOOL, [3])])
    with pytest.raises(ExportError) as info:
        check_loads(bad, registry, model_name="Handmade", exporter="dynamo=False", path="h.onnx")
    assert (info.value.node, info.value.op, info.value.path) == ("my_cumsum", "CumSum", "h.onnx")
    untyped = _graph_model([helper.make_node("no_such_op", ["x"], ["t"], domain="custom", name="u"),
                            helper.make_node("Relu", ["t"], ["y"])],
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    result = check_loads(untyped, registry, model_name="Handmade", exporter="dynamo=True", path="h.onnx")
    assert not result.checked and "'t' is unknown" in result.reason
    typed = _graph_model(list(untyped.graph.node), list(untyped.graph.input), list(untyped.graph.output),
                         [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
    result = check_loads(typed, registry, model_name="Handmade", exporter="dynamo=True", path="h.onnx")
    assert result.checked and result.stand_ins == 1 and result.lowerings == {"custom::no_such_op": "stand-in"}
    assert result.reason == "custom::no_such_op not checked: no op package defines it"
    assert len(typed.graph.node) == 2  # the caller's model is not modified


def test_load_check_types_stand_ins_in_their_own_subgraph():
    """An unknown op in both branches of an If, each output named "t": a stand-in input
    needs one type for "t", which it has only where the branches agree.

        x (float), h (float16) ─> If(c)    then: no_such_op(x) ─> t (float)   ─ Relu ─> a
                                           else: no_such_op(v) ─> t (?)       ─ Cast(float) ─> b
    """
    def model(else_input: str, else_type: int) -> onnx.ModelProto:
        then = helper.make_graph([helper.make_node("no_such_op", ["x"], ["t"], domain="custom"),
                                  helper.make_node("Relu", ["t"], ["a"])], "then", [],
                                 [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3])],
                                 value_info=[helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
        other = helper.make_graph([helper.make_node("no_such_op", [else_input], ["t"], domain="custom"),
                                   helper.make_node("Cast", ["t"], ["b"], to=TensorProto.FLOAT)], "else", [],
                                  [helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])],
                                  value_info=[helper.make_tensor_value_info("t", else_type, [3])])
        return _graph_model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                             helper.make_tensor_value_info("h", TensorProto.FLOAT16, [3]),
                             helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])

    kw = {"model_name": "Handmade", "exporter": "dynamo=True", "path": "h.onnx"}
    result = check_loads(model("x", TensorProto.FLOAT), default_registry(), **kw)
    assert result.checked and result.stand_ins == 2
    result = check_loads(model("h", TensorProto.FLOAT16), default_registry(), **kw)
    assert not result.checked and "placeholder output 't' has different types in two subgraphs" in result.reason


def test_load_check_stands_in_for_a_kernel_graphkit_refuses():
    """A Python kernel this process cannot register (an op of that name declared with
    another signature earlier: onnxruntime-extensions' registry is process-wide) is cut out
    of the check, which says so, instead of failing the export."""
    first = _halve_op("gkcheck_dup", ("tensor(float)",))
    second = _halve_op("gkcheck_dup", ("tensor(float)", "tensor(double)"))
    graph = helper.make_graph([helper.make_node("gkcheck_dup", ["x"], ["t"], domain="gkcheck", name="dup"),
                               helper.make_node("Relu", ["t"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                              value_info=[helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("gkcheck", 1)],
                              ir_version=10)
    kw = {"model_name": "Handmade", "exporter": "dynamo=False", "path": "h.onnx"}
    result = check_loads(model, default_registry().with_ops(first), **kw)
    assert result.checked and result.lowerings == {"gkcheck::gkcheck_dup": "python"}
    result = check_loads(model, default_registry().with_ops(second), **kw)
    assert result.checked and result.stand_ins == 1 and result.lowerings == {"gkcheck::gkcheck_dup": "stand-in"}
    assert result.reason.startswith("gkcheck::gkcheck_dup not checked: ") and "already declared" in result.reason


_CLI_MODEL = '''
import torch


class Packed(torch.nn.Module):
    def forward(self, x):
        return (x > 0).cumsum(-1)


def build():
    return Packed()
'''


def test_cli_export_refused_by_onnxruntime(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(_CLI_MODEL)
    out = tmp_path / "m.onnx"
    proc = run_cli("export", f"{model}:build", out, "--input", "x=2x5", "--no-dynamo", "--no-gap-fillers",
                   check_rc=11)
    (line,) = error_lines(proc.stderr)
    assert "node '/CumSum'" in line and "op CumSum" in line and "ONNX Runtime" in line, line
    assert "cast before it" in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model.py"]
    proc = run_cli("export", f"{model}:build", out, "--input", "x=2x5", "--no-dynamo", "--json", check_rc=0)
    assert json.loads(proc.stdout)["runtime_check"] == {"checked": True, "stand_ins": 0, "reason": "",
                                                        "lowerings": {}}
    assert json.loads(proc.stdout)["gap_fillers"] == ["aten::cumsum"]


@pytest.mark.parametrize("length,parts,sizes", [(6, 3, [2, 2, 2]), (7, 3, [3, 3, 1])])
def test_split_num_outputs_dropped_below_opset_18(length, parts, sizes):
    """onnx's version converter leaves Split-18's num_outputs on a Split-13 (GPT-2 with
    dynamo=True at opset 17): graphkit drops it, giving opset 18's sizes where uneven (from
    the input's shape where the length is unknown)."""
    from graphkit.export._opset_down import split_without_num_outputs as _split_without_num_outputs

    outs = [f"y{i}" for i in range(parts)]
    model = _graph_model([helper.make_node("Split", ["x"], outs, axis=1, num_outputs=parts, name="s")],
                         [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, length])],
                         [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], opset=17)
    with pytest.raises(Exception, match="num_outputs"):
        ort.InferenceSession(model.SerializeToString())
    _split_without_num_outputs(model, 17)
    x = np.arange(2 * length, dtype=np.float32).reshape(2, length)
    got = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    assert [g.shape[1] for g in got] == sizes
    assert np.array_equal(np.concatenate(got, axis=1), x)
    unknown = _graph_model([helper.make_node("Split", ["x"], outs, axis=1, num_outputs=parts)],
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "n"])],
                           [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], opset=17)
    _split_without_num_outputs(unknown, 17)  # the sizes computed from the input's shape
    got = ort.InferenceSession(unknown.SerializeToString()).run(None, {"x": x})
    assert [g.shape[1] for g in got] == sizes


def test_noop_with_empty_axes_dropped_below_opset_18():
    """onnx's version converter keeps ReduceMean-18's noop_with_empty_axes=0 on ReduceMean-13
    (Llama, DeepLab with dynamo=True at opset 17); 0 is ReduceMean-13's behaviour, 1 is not."""
    from graphkit.export._opset_down import drop_default_attributes as _drop_default_attributes

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    for value, kept in ((0, []), (1, ["noop_with_empty_axes"])):
        node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1, noop_with_empty_axes=value)
        model = _graph_model([node], [x], [y], opset=17)
        _drop_default_attributes(model, 17)
        assert [a.name for a in model.graph.node[0].attribute if a.name not in ("axes", "keepdims")] == kept
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = ort.InferenceSession(_graph_model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[1])], [x], [y],
                                            opset=17).SerializeToString()).run(None, {"x": data})[0]
    assert np.array_equal(got, data.mean(axis=1, keepdims=True))


class _Attention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_sdpa_fully_masked_rows_are_zero_like_torch(tmp_path):
    """torch's dynamo translation of scaled_dot_product_attention gives a query row whose
    bool mask is all False uniform weights; torch eager gives zeros (left-padded GPT-2 and
    Llama differ from torch at their padding positions). graphkit's translation fix agrees
    with torch; float masks and no mask are torch's translation as before."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 4, 8, generator=gen) for _ in range(3))
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    mask[1, :, :2] = False  # two fully masked query rows
    args = (q, k, v, mask)
    want = _Attention()(*args).numpy()
    assert not want[1, :, :2].any()
    plain = torch.onnx.export(_Attention(), args, dynamo=True, verbose=False, report=False).model_proto
    sess = ort.InferenceSession(plain.SerializeToString())
    torch_own = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})[0]
    assert np.abs(torch_own[1, :, :2]).max() > 0.01  # the defect fixed here
    export(_Attention(), args, tmp_path / "a.onnx", dynamo=True)
    got = _run(tmp_path / "a.onnx", *args)
    assert compare_arrays("y", want, got, atol=1e-6, rtol=1e-5).passed
    assert not np.signbit(got[1, :, :2]).any() and not got[1, :, :2].any()
    float_mask = torch.where(mask, 0.0, -1e4)
    export(_Attention(), (q, k, v, float_mask), tmp_path / "f.onnx", dynamo=True)
    got = _run(tmp_path / "f.onnx", q, k, v, float_mask)
    assert compare_arrays("y", _Attention()(q, k, v, float_mask).numpy(), got, atol=1e-6, rtol=1e-5).passed


def test_translation_fixes_step_aside_for_an_onnxscript_without_their_internals(monkeypatch):
    """A torchlib without the symbols the fixes build on: exports go on with torch's own."""
    from graphkit.export import _translation_fixes

    def missing(*args):
        raise ImportError("cannot import name 'TFloat'")

    for name in ("_sdpa", "_clamp_tensor", "_erf", "_gelu"):
        monkeypatch.setattr(_translation_fixes, name, missing)
    with pytest.warns(UserWarning) as caught:
        assert _translation_fixes.translation_fixes() == {}
    assert [str(w.message).split(" with ")[0] for w in caught] == [
        "graphkit: sdpa translation fix off", "graphkit: clamp translation fix off",
        "graphkit: erf/gelu translation fix off"]


# --------------------------------------------------------------------------- trace fixes (dynamo)


class _PositionBiasAttention(torch.nn.Module):
    """T5's attention in small: a float mask built from an embedding weight (so it requires
    grad), queries from a transposed projection, ``transpose(1, 2).contiguous()`` and a
    reshape after the attention."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q = torch.nn.Linear(32, 32)
        self.bias = torch.nn.Embedding(8, 4)

    def forward(self, x):
        q = self.q(x).view(2, 9, 4, 8).transpose(1, 2)
        pos = torch.arange(9)
        buckets = (pos[None, :] - pos[:, None]).abs().clamp(max=7)
        mask = self.bias(buckets).permute(2, 0, 1).unsqueeze(0).expand(2, 4, 9, 9).contiguous()
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask, scale=1.0)
        return out.transpose(1, 2).contiguous().reshape(2, 9, -1)


def test_sdpa_with_a_position_bias_exports_like_t5(tmp_path):
    """torch 2.13's dynamo exporter alone fails on T5's attention in its own FX passes
    (grad-dependent sdpa kernel choice: different output strides between its passes);
    graphkit traces without grad and matches torch eager."""
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(1))
    model = _PositionBiasAttention().eval()
    with pytest.raises(Exception, match="Cannot view a tensor with shape"):
        torch.onnx.export(model, (x,), dynamo=True, verbose=False, report=False)
    assert torch.is_grad_enabled()
    export(model, (x,), tmp_path / "t5_attention.onnx", dynamo=True)
    assert torch.is_grad_enabled()  # put back
    with torch.no_grad():
        want = model(x).numpy()
    got = _run(tmp_path / "t5_attention.onnx", x)
    assert compare_arrays("y", want, got, atol=1e-5, rtol=1e-5).passed


class _Clamps(torch.nn.Module):
    """clamp with one integer and one float bound, in each spelling."""

    def forward(self, x):
        y = x * 1
        if y.is_floating_point():
            y.clamp_(-1.5, 2)  # in place keeps x's type: float tensors only, as in torch
        return (x.clamp(min=0, max=2.5), torch.clamp(x, -1.5, 3), torch.clip(x, 1, max=3.5),
                x.clip(min=-2.5, max=1), y)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.float16], ids=str)
def test_clamp_with_float_bounds_matches_torch(dtype, dynamo, tmp_path):
    """torch eager promotes an integer tensor with a float bound to float32. torch 2.13's
    dynamo exporter alone fails on clamp(min=int, max=float) ("Unable to cast 2.5 to
    Tensor"); its TorchScript exporter clamps int64 in int64. graphkit's export gives torch
    eager's values and dtypes with both."""
    x = torch.tensor([-3, -2, -1, 0, 1, 2, 3, 4], dtype=dtype)
    if dtype == torch.int64 and dynamo:
        with pytest.raises(Exception, match="Unable to cast 2.5 to Tensor"):
            torch.onnx.export(_Clamps(), (x,), dynamo=True, verbose=False, report=False)
    if dtype == torch.int64 and not dynamo:
        plain = tmp_path / "plain.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(_Clamps(), (x,), plain, dynamo=False)
        assert _run(plain, x).dtype == np.int64  # torch's own: wrong type, bounds cut to ints
    export(_Clamps(), (x,), tmp_path / "clamp.onnx", dynamo=dynamo)
    sess = ort.InferenceSession(str(tmp_path / "clamp.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    want = [w.numpy() for w in _Clamps()(x)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w), (dtype, g, w)


def test_clamp_with_a_symbolic_int_bound(tmp_path):
    """A bound from a dynamic dimension (a SymInt while tracing) beside a float bound."""

    class M(torch.nn.Module):
        def forward(self, x):
            return x.clamp(min=0.5, max=x.shape[-1])

    export(M(), (torch.arange(6).reshape(1, 6),), tmp_path / "sym.onnx", dynamo=True,
           dynamic_dims={"x": {1: "n"}})
    for n in (4, 9):
        x = torch.arange(n).reshape(1, n) * 2 - 3
        got = _run(tmp_path / "sym.onnx", x)
        want = M()(x).numpy()
        assert got.dtype == want.dtype and np.array_equal(got, want), (n, got, want)


def test_float16_clamps_of_one_tensor_match_torch(tmp_path):
    """torch's exporter alone writes two clamps of one float16 tensor as Clips whose bounds
    its optimizer names alike (``x_min``): one pair is lost and ONNX Runtime refuses the
    model. graphkit's translation fix writes the Clips itself; values match torch eager,
    NaN, infinities and min > max included."""

    class M(torch.nn.Module):
        def forward(self, x):
            return x.clamp(min=0.0, max=2.5), x.clamp(min=-1.5, max=3.0), x.clamp(min=2.0, max=1.0)

    x = torch.tensor([-3, -1, 0, 1, 2, 3, float("nan"), float("inf"), -float("inf")], dtype=torch.float16)
    plain = torch.onnx.export(M(), (x,), dynamo=True, verbose=False, report=False).model_proto
    with pytest.raises(Exception, match="x_min_1"):
        ort.InferenceSession(plain.SerializeToString())
    export(M(), (x,), tmp_path / "f16.onnx", dynamo=True)
    sess = ort.InferenceSession(str(tmp_path / "f16.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    for g, w in zip(got, M()(x)):
        assert g.dtype == np.float16 and np.array_equal(g, w.numpy(), equal_nan=True), (g, w)


# --------------------------------------------------------------------------- load check: functions and bodies

_KW = {"model_name": "Handmade", "exporter": "dynamo=True", "path": "h.onnx"}


def _bool_cumsum_nodes(prefix: str, source: str, out: str) -> list:
    """source > 0 (bool), its CumSum (ONNX Runtime has no bool kernel), cast to float."""
    return [helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.FLOAT, [], [0.0]),
                             name=f"{prefix}zero"),
            helper.make_node("Greater", [source, "zero"], [f"{prefix}b"], name=f"{prefix}gt"),
            helper.make_node("Constant", [], ["axis"], value=helper.make_tensor("a", TensorProto.INT64, [], [0]),
                             name=f"{prefix}axis"),
            helper.make_node("CumSum", [f"{prefix}b", "axis"], [f"{prefix}cb"], name=f"{prefix}cumsum"),
            helper.make_node("Cast", [f"{prefix}cb"], [out], to=TensorProto.FLOAT, name=f"{prefix}cast")]


def _function_model(body, value_info=()):
    """graph: x -> local::twice (called twice: body = ``body``, a -> c) -> y"""
    fn = helper.make_function("local", "twice", ["a"], ["c"], body,
                              [helper.make_opsetid("", 18), helper.make_opsetid("custom", 1)])
    fn.value_info.extend(value_info)
    graph = helper.make_graph([helper.make_node("twice", ["x"], ["h"], domain="local", name="call1"),
                               helper.make_node("twice", ["h"], ["y"], domain="local", name="call2")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(graph, functions=[fn], ir_version=10,
                             opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("custom", 1),
                                            helper.make_opsetid("local", 1)])


def test_load_check_sees_placeholders_inside_model_local_functions():
    """A model-local function's placeholder is lowered (bound to its Python kernel) or stood
    in for like any other; a node ONNX Runtime refuses inside the function fails the check,
    named as the function's node (not onnx's inlined copy)."""
    registry = default_registry()
    add = helper.make_node("my_add", ["a", "a"], ["t"], domain="custom", name="fn_add")
    ok = _function_model([add, helper.make_node("Relu", ["t"], ["c"], name="fn_relu")])
    result = check_loads(ok, registry, **_KW)
    assert result.checked and result.stand_ins == 0 and result.lowerings == {"custom::my_add": "python"}
    assert len(ok.functions) == 1 and ok.graph.node[0].op_type == "twice"  # the caller's model as it was

    bad = _function_model([add, *_bool_cumsum_nodes("fn_", "t", "c")])
    with pytest.raises(ExportError) as info:
        check_loads(bad, registry, **_KW)
    err = info.value
    assert (err.node, err.op, err.exit_code) == ("fn_cumsum", "CumSum", 11)
    assert "node 'fn_cumsum' of model-local function local::twice" in err.message
    assert "tensor(bool)" in err.message and "cast before it" in err.hint and "custom::my_add: python" in err.hint

    unknown = helper.make_node("no_such_op", ["a"], ["t"], domain="custom", name="fn_unknown")
    typed = [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])]
    result = check_loads(_function_model([unknown, helper.make_node("Relu", ["t"], ["c"])], typed), registry, **_KW)
    assert result.checked and result.stand_ins == 2  # one per call
    assert result.reason == "custom::no_such_op not checked: no op package defines it"
    with pytest.raises(ExportError) as info:
        check_loads(_function_model([unknown, *_bool_cumsum_nodes("fn_", "t", "c")], typed), registry, **_KW)
    assert (info.value.node, info.value.op) == ("fn_cumsum", "CumSum")


def test_load_check_reports_a_function_onnx_cannot_inline():
    recursive = helper.make_function("local", "twice", ["a"], ["c"],
                                     [helper.make_node("twice", ["a"], ["c"], domain="local", name="again")],
                                     [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)])
    model = _function_model([helper.make_node("Relu", ["a"], ["c"])])
    model.functions[0].CopyFrom(recursive)
    result = check_loads(model, default_registry(), **_KW)
    assert not result.checked and "inlining its model-local functions failed" in result.reason
    assert "recursive" in result.reason


def _if_model(then_nodes, value_info=()):
    """graph: cond, x -> If(then: ``then_nodes`` reading x, else: x) -> y"""
    then = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info("c", TensorProto.FLOAT, [3])],
                             value_info=list(value_info))
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["c2"])], "else", [],
                              [helper.make_tensor_value_info("c2", TensorProto.FLOAT, [3])])
    graph = helper.make_graph([helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other,
                                                name="branch")], "g",
                              [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return _graph_model(list(graph.node), list(graph.input), list(graph.output))


def test_load_check_sees_placeholders_inside_if_bodies():
    """A placeholder in an If branch is bound or cut out (its output read from the outer
    scope); a refused node in the branch is named."""
    registry = default_registry()
    add = helper.make_node("my_add", ["x", "x"], ["t"], domain="custom", name="br_add")
    result = check_loads(_if_model([add, helper.make_node("Relu", ["t"], ["c"])]), registry, **_KW)
    assert result.checked and result.lowerings == {"custom::my_add": "python"}
    unknown = helper.make_node("no_such_op", ["x"], ["t"], domain="custom", name="br_unknown")
    typed = [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])]
    result = check_loads(_if_model([unknown, helper.make_node("Relu", ["t"], ["c"])], typed), registry, **_KW)
    assert result.checked and result.stand_ins == 1 and result.lowerings == {"custom::no_such_op": "stand-in"}
    with pytest.raises(ExportError) as info:
        check_loads(_if_model([unknown, *_bool_cumsum_nodes("br_", "t", "c")], typed), registry, **_KW)
    assert (info.value.node, info.value.op) == ("br_cumsum", "CumSum")
    with pytest.raises(ExportError) as info:
        check_loads(_if_model([add, *_bool_cumsum_nodes("br_", "t", "c")]), registry, **_KW)
    assert (info.value.node, info.value.op) == ("br_cumsum", "CumSum") and "custom::my_add: python" in info.value.hint
