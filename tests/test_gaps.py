"""Gap fillers: every row is a real TorchScript-exporter gap, and with graphkit's symbolic
each row's examples match torch in ONNX Runtime (at its min opset, 17 and 20)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import onnxruntime as ort  # noqa: E402

from graphkit.errors import ExportError, OpDefinitionError  # noqa: E402
from graphkit.export import GAP_FILLERS, export  # noqa: E402
from graphkit.export.aten import Example, GapFiller, GapFillerTable  # noqa: E402
from graphkit.export import gaps  # noqa: E402
from graphkit.export.aten import scoped_gap_fillers, torch_symbolic_exists  # noqa: E402
from graphkit.verify import compare_arrays  # noqa: E402
from torch_call import Call  # noqa: E402

# torch's loss functions compare shapes in Python while tracing: not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")

# Rows for ATen ops torch has no symbolic for (the others replace a wrong one of torch's).
GAPS = [f for f in GAP_FILLERS if not f.replaces]


def _ort(path, args) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})[0]


@pytest.mark.parametrize("filler", list(GAP_FILLERS), ids=lambda f: f.name)
def test_filler_matches_torch_in_onnxruntime(filler, tmp_path):
    assert filler.examples, "every row carries an example"
    for i, ex in enumerate(filler.examples):
        args = ex.inputs(torch.Generator().manual_seed(i))
        want = ex.fn(*args).numpy()
        for opset in sorted({filler.min_opset, 17, 20}):
            path = tmp_path / f"{i}_{opset}.onnx"
            report = export(Call(ex.fn), args, path, dynamo=False, opset=opset)
            assert report.gap_fillers  # F.smooth_l1_loss(beta=0) calls aten::l1_loss
            got = _ort(path, args)
            assert got.dtype == want.dtype and got.shape == want.shape
            diff = compare_arrays("y", want, got, atol=1e-5, rtol=1e-5)
            assert diff.passed, (filler.aten, ex.label, opset, diff)


def test_rows_are_real_gaps_and_the_scan_finds_them():
    """The scan, restricted to torch.special for time, also probes every row's examples
    without graphkit's symbolics: a row torch exports itself shows up in not_gaps."""
    result = gaps.scan(opsets=(17, 18, 19, 20), namespaces=("torch.special",))
    assert result.not_gaps == []
    assert {f.aten for f in GAPS} <= set(result.gaps)
    assert all(g.opsets == [17, 18, 19, 20] for g in result.gaps.values() if g.filler)
    assert len(result.covered) == len(GAPS) >= 10
    assert all(g.filled_ok and g.max_abs_err <= 1e-5 for g in result.covered)
    assert "torch.special.ndtr" in result.gaps["aten::special_ndtr"].reached_from
    uncovered = [g.aten for g in result.gaps.values() if g.filler is None]
    assert "aten::special_bessel_j0" in uncovered  # found by trying, not listed anywhere
    text = gaps.format_scan(result)
    assert f"filled by graphkit ({len(GAPS)})" in text and "not filled (" in text


def test_export_page_counts_the_table():
    from doc_pages import DOCS

    assert f"graphkit registers symbolics for {len(GAPS)} of them" in \
        " ".join((DOCS / "export.md").read_text().split())


def test_gaps_command_line(capsys):
    assert gaps.main(["--namespace", "torch.fft", "--opsets", "17", "--no-check", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["opsets"] == [17] and out["candidates"] > 0
    assert any(g["aten"] == "aten::fft_irfft" for g in out["gaps"])
    assert {g["aten"] for g in out["gaps"] if g["filler"]} == {f.aten for f in GAPS}
    with pytest.raises(SystemExit):
        gaps.main(["--opsets", "5-30"])
    assert "outside" in capsys.readouterr().err


def test_scoped_registration_skips_and_restores():
    relu = GapFiller("aten::relu", 9, lambda g, x: g.op("Neg", x), "Neg",
                     (Example(torch.relu, lambda gen: (torch.randn(3),)),))
    table = GapFillerTable([relu, GAP_FILLERS.get("asinh"), GAP_FILLERS.get("expm1")])
    with scoped_gap_fillers(table, 10, skip={"aten::asinh"}) as scope:
        assert scope.registered == [] and torch_symbolic_exists("aten::relu", 10)
        assert scope.skipped == {"aten::relu": "torch exports it at opset 10",
                                 "aten::asinh": "exported as a placeholder instead",
                                 "aten::expm1": "needs opset >= 11"}
    with scoped_gap_fillers(GAP_FILLERS, 17) as scope:
        assert len(scope.registered) == len(GAP_FILLERS)
        assert torch_symbolic_exists("aten::hypot", 17)
    assert not torch_symbolic_exists("aten::hypot", 17)
    with pytest.raises(RuntimeError, match="inside"):
        with scoped_gap_fillers(GAP_FILLERS, 17):
            raise RuntimeError("inside")
    assert not any(torch_symbolic_exists(f.aten, 17) for f in GAPS)


def test_gap_filler_table_errors():
    row = GAP_FILLERS.get("aten::hypot")
    with pytest.raises(OpDefinitionError, match="defined twice"):
        GapFillerTable([row, row])
    with pytest.raises(OpDefinitionError, match="not 'aten::<op>'"):
        GapFiller("hypot", 9, row.symbolic, "x")
    with pytest.raises(OpDefinitionError, match="min_opset 21"):
        GapFiller("aten::hypot", 21, row.symbolic, "x")
    smaller = GAP_FILLERS.without("hypot", "aten::sinh")
    assert len(smaller) == len(GAP_FILLERS) - 2 and "aten::hypot" not in smaller


def test_export_without_fillers_names_the_op(tmp_path):
    x = torch.randn(3, 4)
    with pytest.raises(ExportError, match="aten::hypot"):
        export(Call(torch.hypot), (x, x), tmp_path / "m.onnx", dynamo=False, opset=17,
               gap_fillers=GAP_FILLERS.without("hypot"))
    report = export(Call(torch.hypot), (x, x), tmp_path / "m.onnx", dynamo=False, opset=17)
    assert report.gap_fillers == ("aten::hypot",)
    ops = [n.op_type for n in onnx.load(tmp_path / "m.onnx").graph.node]
    assert {"Sqrt", "IsInf"} <= set(ops) and ops[-1] == "Cast"  # computed in float64, rounded once
