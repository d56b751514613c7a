"""Every op graphkit defines and every ATen gap filler, in every lowering, agrees with torch
eager on a grid of hard values in float16, float32, float64 and the integer dtypes torch
takes: torch's dtype, NaNs, sign bits of zeros and infinities, and the declared tolerance
(tests/edge_harness.py says how). Ops and fillers are enumerated from the registry and the
gap-filler table, so new ones are covered without touching this file.

    python -m pytest tests/test_edges.py -s          # prints the cases / worst-error table
    GRAPHKIT_EDGE_EXAMPLES=2000 python -m pytest tests/test_edges.py   # nightly: every
                                                     # opset, every example, all int dtypes

Where torch and a lowering disagree on purpose, the op's or gap filler's documentation says
what the lowering does, and the harness compares those cases with that documented result
instead of torch's (edge_harness.DOCUMENTED, OP_DOCUMENTED); the tests below check that each
documented result really differs from torch somewhere, so none is a blanket exemption.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import edge_harness as h  # noqa: E402

from graphkit.export import GAP_FILLERS  # noqa: E402
from graphkit.export.aten import Example, GapFiller, GapFillerTable  # noqa: E402
from graphkit.ops import discover  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]

REGISTRY = discover(entry_points=False, environment=False)

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


def _assert_agrees(outcomes: list[h.Outcome]) -> None:
    assert outcomes, "nothing was compared"
    failed = [f"{o.op} {o.lowering} {o.dtype}: {o.failures}" for o in outcomes if o.status == "failed"]
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
    # graphkit refuses a lowering only for want of an ONNX Runtime kernel for the dtype
    # (tests/test_selection.py checks those verdicts), never because the lowering broke
    broken = [f"{o.lowering} {o.dtype}: {o.failures}" for o in outcomes
              if o.status == "refused" and o.refused_by != "UnsupportedOpError"]
    assert not broken, broken
    # each declared float dtype ran in some lowering
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


@pytest.mark.parametrize("name", sorted(h.DOCUMENTED))
def test_documented_semantics_are_in_the_row_and_differ_from_torch(name):
    """A case compared with a documented result (not torch's) is one where the row's
    ``semantics`` states the choice and torch really gives something else."""
    filler = GAP_FILLERS.get(name)
    assert filler.semantics, f"{name}: a deliberate difference must be in the row's semantics"
    outcomes = _outcomes("filler", name)
    assert sum(o.documented for o in outcomes) > 0
    assert sum(o.documented_differs for o in outcomes) > 0


def _deform_case(seed: int, image=None) -> h.OpCase:
    rng = np.random.default_rng(seed)
    feeds = {"input": rng.standard_normal((1, 2, 5, 5)).astype(np.float32) if image is None else image,
             "weight": rng.standard_normal((3, 2, 3, 3)).astype(np.float32),
             "offset": (rng.standard_normal((1, 18, 3, 3)) * 1.5).astype(np.float32),
             "bias": rng.standard_normal(3).astype(np.float32),
             "mask": rng.uniform(0.1, 1, (1, 9, 3, 3)).astype(np.float32)}
    return h.OpCase(feeds, {})


def _lowered_session(op_name: str, lowering: str, case: h.OpCase, dtype: str = "float32"):
    import graphkit
    from graphkit.rewrite import rewrite_model

    op = REGISTRY.get(op_name)
    label, how, opset, registry = next(x for x in h.lowerings(op) if x[0].partition("@")[0] == lowering)
    lowered, _ = rewrite_model(h._model(op, case, dtype, opset), registry=registry, lowering=how)
    return graphkit.open_session(lowered, registry=REGISTRY)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_onnx_deform_conv_nan_rule_is_documented_and_real():
    """ONNX Runtime's DeformConv (deform_conv2d's docstring): a point with a corner outside
    the image (the last row and column included) reads pixel (0, 0) with weight 0, so a NaN
    there reaches every output with such a point. The harness's model of it (OP_DOCUMENTED)
    is what ORT gives, and differs from torch."""
    op = REGISTRY.get("deform_conv2d")
    case = _deform_case(3)
    case.feeds["input"][0, 0, 0, 0] = np.nan
    offset = case.feeds["offset"]
    offset[0, :, 1, 1] = 0.25  # output (1, 1): every point within [1.25, 3.25]^2, corners inside
    offset[0, :, 2, 2] = 0.0  # output (2, 2): points on [2, 4]^2, some on the last row (y = 4)
    offset[0, :, 0, 1] = 0.25
    offset[0, 2:4, 0, 1] = [-0.5, 0.0]  # output (0, 1): one point in the border strip (y = -0.5)
    torch_out = h._torch_reference(op, case)[0]
    where, documented = h.OP_DOCUMENTED[("deform_conv2d", "onnx_deform_conv")](op, case, torch_out)
    got = _lowered_session("deform_conv2d", "onnx_deform_conv", case).run(case.feeds)["output_out"]
    np.testing.assert_allclose(got, documented, rtol=1e-5, atol=1e-5, equal_nan=True)
    for oh, ow in ((0, 1), (2, 2)):
        assert np.isfinite(torch_out[0, :, oh, ow]).all() and np.isnan(got[0, :, oh, ow]).all()
        assert where[0, :, oh, ow].all()
    assert np.isfinite(got[0, :, 1, 1]).all()


def test_grid_sample_position_error_is_what_its_docstring_says():
    """grid_sample normalizes the points to GridSample's [-1, 1] grid in float32, which moves
    a sample by about size * 2^-24 pixel: with 1e7-sized pixels that is more than the op's
    tolerance relative to the sum of the terms (a huge pixel with a small bilinear weight),
    and within the allowance the harness gives it (edge_harness.OP_PRECISION)."""
    from graphkit.ops._opdef import tolerance_for

    op = REGISTRY.get("deform_conv2d")
    rtol, atol = tolerance_for(op.tolerance, "float32")
    within, worst = True, 0.0
    for seed in range(6):
        rng = np.random.default_rng(100 + seed)
        image = (rng.standard_normal((1, 2, 5, 5)) * 10.0 ** rng.integers(0, 8, (1, 2, 5, 5))).astype(np.float32)
        case = _deform_case(seed, image)
        want = h._torch_reference(op, case)[0]
        scale = np.maximum(np.abs(want), h._torch_reference(op, case, magnitudes=True)[0])
        got = _lowered_session("deform_conv2d", "grid_sample", case).run(case.feeds)["output_out"]
        err = np.abs(got.astype(np.float64) - want)
        plain = atol + rtol * scale
        allowance = h._grid_sample_position(op, case, want)
        worst = max(worst, float(((err - plain) / (allowance / h.GRID_SAMPLE_POSITION_ULPS)).max()))
        within &= bool((err <= plain + allowance).all())
    assert within and worst > 0, worst  # beyond the plain tolerance somewhere, within the allowance


def test_my_add_float16_rounds_2a_first_in_every_lowering():
    """torch computes my_add(a, b) = 2 * a + b in float16 as 2a rounded (inf for |a| > 32752),
    then the sum: my_add(65504, -inf) is NaN, my_add(32768, -65504) inf. ONNX Runtime runs
    float16 Mul and Add in float32; the decomposition overflows 2a by hand (my_add's doc)."""
    a = np.array([65504, -65504, 32768, 32752, 32760, -32768, 1.5, -0.0, 65504], np.float16)
    b = np.array([-np.inf, np.inf, -65504, -0.0, 1, 65504, 2e-3, -0.0, np.nan], np.float16)
    want = (2 * torch.from_numpy(a) + torch.from_numpy(b)).numpy()
    assert np.isnan(want[0]) and np.isinf(want[2])
    op = REGISTRY.get("my_add")
    case = h.OpCase({"a": a, "b": b}, {})
    for label, how, opset, registry in h.lowerings(op):
        import graphkit
        from graphkit.rewrite import rewrite_model

        lowered, _ = rewrite_model(h._model(op, case, "float16", opset), registry=registry, lowering=how)
        got = graphkit.open_session(lowered, registry=REGISTRY).run(case.feeds)["y_out"]
        out = h.Outcome("my_add", label, "float16")
        h.compare(out, got, want, (0.0, 0.0), inputs=[a, b])
        assert out.status == "ok", (label, out.failures)


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
    assert "| hypot | filler@" in out and "| op / gap filler | cases checked |" in out
    assert "| worst rel |" in out and "float32+float64" in out
