"""Every op graphkit defines and every ATen gap filler, in every lowering, agrees with torch
eager on a grid of hard values in float16, float32, float64 and the integer dtypes torch
takes: torch's dtype, NaNs, sign bits of zeros and infinities, and the declared tolerance
(tests/edge_harness.py says how). Ops and fillers are enumerated from the registry and the
gap-filler table, so new ones are covered without touching this file.

    python -m pytest tests/test_edges.py -s          # prints the cases / worst-error table
    GRAPHKIT_EDGE_EXAMPLES=2000 python -m pytest tests/test_edges.py   # nightly: every
                                                     # opset, every example, all int dtypes

Disagreements that belong to other parts of graphkit are listed in KNOWN and reproduced by
test_known_disagreement_still_there (strict xfail: it fails once fixed, so the entry goes).
Deliberate differences (a row's ``semantics``) are left out of the comparison and checked to
be real differences by test_deliberate_differences_are_documented_and_real.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import edge_harness as h  # noqa: E402

from graphkit.export import GAP_FILLERS, Example, GapFiller, GapFillerTable  # noqa: E402
from graphkit.ops import discover  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]

REGISTRY = discover(entry_points=False, environment=False)

# (op, lowering without its opset, dtype) -> why it disagrees with torch, and whose it is.
KNOWN: dict[tuple[str, str, str], str] = {
    ("my_add", "mul_add", "float16"):
        "ONNX Runtime runs float16 Mul and Add in float32 between the casts it inserts (no float16 "
        "kernels), so 2a is not rounded to float16: my_add(65504, -inf) is -inf, torch NaN (2a "
        "overflows first). Not fixable in the decomposition: ORT removes any Cast pair put there",
}

_RESULTS: dict[str, list[h.Outcome]] = {}


def _outcomes(kind: str, name: str) -> list[h.Outcome]:
    key = f"{kind}:{name}"
    if key not in _RESULTS:
        if kind == "op":
            _RESULTS[key] = h.check_op(REGISTRY.get(name))
        else:
            _RESULTS[key] = h.check_gap_filler(GAP_FILLERS.get(name))
    return _RESULTS[key]


@pytest.fixture(scope="module", autouse=True)
def table():
    """Prints the cases / worst-error table after the module (shown with -s)."""
    yield
    rows = h.collapse(o for outs in _RESULTS.values() for o in outs)
    if rows:
        print(f"\n\nedge-value harness ({h.ENV_EXAMPLES}={h.budget()}):\n" + h.format_table(rows))


def _known(o: h.Outcome) -> str | None:
    return KNOWN.get((o.op, o.lowering.partition("@")[0], o.dtype))


def _assert_agrees(outcomes: list[h.Outcome]) -> None:
    assert outcomes, "nothing was compared"
    failed = [f"{o.op} {o.lowering} {o.dtype}: {o.failures}" for o in outcomes
              if o.status == "failed" and _known(o) is None]
    assert not failed, "\n".join(failed)
    assert sum(o.cases for o in outcomes) > 0


@pytest.mark.parametrize("name", [op.name for op in REGISTRY])
def test_op_agrees_with_torch_on_edge_values(name):
    outcomes = _outcomes("op", name)
    _assert_agrees(outcomes)
    op = REGISTRY.get(name)
    labels = {o.lowering.partition("@")[0] for o in outcomes}
    assert {d.name for d in op.decompositions} <= labels  # every decomposition was tried
    assert ("native" in labels) == op.native and ("python" in labels) == (op.python_kernel is not None)
    # each declared float dtype ran in some lowering (graphkit may refuse a decomposition for
    # a dtype ONNX Runtime has no kernel for: tests/test_selection.py checks those verdicts)
    declared = {h._np_name(t) for ts in op.type_constraints.values() for t in ts}
    assert {o.dtype for o in outcomes if o.status in ("ok", "failed") and o.cases} == declared


@pytest.mark.parametrize("name", [f.name for f in GAP_FILLERS])
def test_gap_filler_agrees_with_torch_on_edge_values(name):
    outcomes = _outcomes("filler", name)
    _assert_agrees(outcomes)
    dtypes = {o.dtype for o in outcomes}
    filler = GAP_FILLERS.get(name)
    ran = {o.dtype for o in outcomes if o.cases}
    assert dtypes, f"{name}: no dtype variant ran"
    # a dtype declared unsupported must really be refused (status unsupported), never run
    for d in filler.unsupported:
        assert all(o.status == "unsupported" for o in outcomes if o.dtype == d), (name, d)
    assert ran - set(filler.unsupported), f"{name}: nothing ran"


def _known_params():
    for (op, lowering, dtype), why in KNOWN.items():
        yield pytest.param(op, lowering, dtype, id=f"{op}-{lowering}-{dtype}",
                           marks=pytest.mark.xfail(strict=True, reason=why))


@pytest.mark.parametrize("op,lowering,dtype", list(_known_params()))
def test_known_disagreement_still_there(op, lowering, dtype):
    rows = [o for o in _outcomes("op", op) if o.lowering.partition("@")[0] == lowering and o.dtype == dtype]
    assert rows, f"{op} has no lowering {lowering} in {dtype} any more"
    assert all(o.status != "failed" for o in rows), [o.failures for o in rows if o.failures]


@pytest.mark.parametrize("name", sorted(h.DELIBERATE))
def test_deliberate_differences_are_documented_and_real(name):
    """A case left out of the comparison is one where the row documents its choice and
    torch really gives something else."""
    filler = GAP_FILLERS.get(name)
    assert filler.semantics, f"{name}: a deliberate difference must be in the row's semantics"
    outcomes = _outcomes("filler", name)
    assert sum(o.deliberate for o in outcomes) > 0
    assert sum(o.deliberate_differs for o in outcomes) > 0


def test_grid_holds_the_hard_values():
    for dtype in h.FLOAT_DTYPES:
        v = h.special_values(dtype)
        info = np.finfo(dtype)
        assert {0.0, 1.0, -1.0, float(info.max), -float(info.max), float(info.tiny)} <= set(v.tolist())
        assert float(info.smallest_subnormal) in v.tolist() and np.isposinf(v).any() and np.isneginf(v).any()
        nans = v[np.isnan(v)]
        assert sorted(np.signbit(nans).tolist()) == [False, True]  # NaN of both signs
        assert np.signbit(v[v == 0]).tolist().count(True) == 1  # -0.0
    for dtype in h.INT_DTYPES:
        info = np.iinfo(dtype)
        assert {info.min, info.max, 0, 1} <= set(h.special_values(dtype).tolist())


def test_compare_checks_dtype_sign_and_nan():
    out = h.Outcome("x", "y", "float32")
    h.compare(out, np.array([0.0], np.float32), np.array([-0.0], np.float32), (0.0, 0.0))
    assert out.status == "failed" and "got" in out.failures[0]
    out = h.Outcome("x", "y", "float32")
    h.compare(out, np.array([1.0], np.float64), np.array([1.0], np.float32), (0.0, 0.0))
    assert out.failures == ["dtype float64, torch float32"]
    out = h.Outcome("x", "y", "float32")
    h.compare(out, np.array([np.nan, 1.0], np.float32), np.array([np.nan, 1.0000001], np.float32), (2.4e-7, 0.0))
    assert out.status == "ok" and out.cases == 2
    h.compare(out, np.array([1.0], np.float32), np.array([np.nan], np.float32), (1.0, 1.0))
    assert out.status == "failed"


def test_harness_catches_a_wrong_filler():
    """The textbook hypot (Sqrt(x*x + y*y) in the input's dtype) fails on the grid:
    overflow above sqrt(max), underflow below sqrt(tiny)."""
    def naive(g, x, y):
        return g.op("Sqrt", g.op("Add", g.op("Mul", x, x), g.op("Mul", y, y)))

    row = GapFiller("aten::hypot", 9, naive, "Sqrt(x*x + y*y)",
                    (Example(torch.hypot, lambda gen: (torch.randn(4, 3, generator=gen), torch.randn(4, 3, generator=gen))),))
    table = GapFillerTable([row])
    outcomes = h.check_gap_filler(row, table=table, examples=8)
    f32 = [o for o in outcomes if o.dtype == "float32"]
    assert f32 and all(o.status == "failed" for o in f32)
    assert any("torch" in f for o in f32 for f in o.failures)


def test_bench_script_prints_the_table(capsys, monkeypatch):
    import importlib.util

    monkeypatch.setenv(h.ENV_EXAMPLES, "8")  # main sets it: put back after the test
    from conftest import REPO

    spec = importlib.util.spec_from_file_location("bench_edges", REPO / "bench" / "edges.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--only", "hypot", "--examples", "8"]) == 0
    out = capsys.readouterr().out
    assert "hypot                filler@" in out and "cases checked per op:" in out
    assert "worst rel err" in out and "float32+float64" in out
