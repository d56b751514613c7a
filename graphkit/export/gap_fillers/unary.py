"""Gap fillers of one-input ops: inverse and hyperbolic trigonometry (float64 written with
ops ONNX Runtime has double kernels for), rounding, exponentials, logs and error functions,
scaling, sign, identity and shape (:data:`ROWS`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.onnx import symbolic_helper, symbolic_opset9, symbolic_opset20

from graphkit.export._erf_double import erf_double, erfc_double, gelu_double
from graphkit.export.aten import GapFiller
from graphkit.export.gap_fillers.blocks import exact_log1p, select, where_equal, with_sign
from graphkit.export.gap_fillers.dtypes import const, dtype_of, floating, is_float, result_dtype
from graphkit.export.gap_fillers.examples import INF, NAN, edges, example, randn, unary_inputs

__all__ = ["ROWS"]


_INT64_MIN = -(2**63)


def _trunc(g, x):
    if not is_float(x) and dtype_of(x) is not None:
        return g.op("Identity", x)  # integers are already whole
    # floor(|x|) with x's sign: trunc(-0.5) is -0.0
    return with_sign(g, g.op("Floor", g.op("Abs", x)), x)


def _flip(axis: int):
    def symbolic(g, x):
        return g.op("Slice", x, g.op("Constant", value_t=torch.tensor([-1])),
                    g.op("Constant", value_t=torch.tensor([_INT64_MIN])),
                    g.op("Constant", value_t=torch.tensor([axis])),
                    g.op("Constant", value_t=torch.tensor([-1])))

    return symbolic


def _or_double(standard: str, double):
    """The standard op ``standard`` (float32; float16 arrives computed in float32), and
    ``double(g, x)`` for float64: ONNX Runtime's CPU provider has no double kernel of
    ``standard``, so float64 is written with ops it has double kernels for."""
    def symbolic(g, x):
        return double(g, x) if dtype_of(x) == torch.float64 else g.op(standard, x)

    symbolic.__name__ = f"{standard.lower()}_symbolic"
    return symbolic


def _asinh_double(g, x):
    # as graphkit_ops.asinh's log_sqrt: |x| < 1: log1p(a + a^2 / (1 + sqrt(1 + a^2))) (no
    # cancellation near 0); |x| >= 1: log a + log(1 + sqrt(1 + 1/a^2)) (no overflow in a^2)
    one = const(g, 1.0, x)
    a = g.op("Abs", x)
    a2 = g.op("Mul", a, a)
    small = exact_log1p(g, g.op("Add", a, g.op("Div", a2, g.op("Add", one, g.op("Sqrt", g.op("Add", one, a2))))))
    inv = g.op("Div", one, a)
    tail = g.op("Sqrt", g.op("Add", one, g.op("Mul", inv, inv)))
    large = g.op("Add", g.op("Log", a), g.op("Log", g.op("Add", one, tail)))
    return with_sign(g, g.op("Where", g.op("Less", a, one), small, large), x)


def _acosh_double(g, x):
    # 1 <= x < 2: log1p(t + sqrt(2t + t^2)), t = x - 1 exact (no cancellation near 1);
    # x >= 2: log x + log(1 + sqrt(1 - 1/x^2)) (no overflow); x < 1: NaN
    one, two = const(g, 1.0, x), const(g, 2.0, x)
    t = g.op("Sub", x, one)
    small = exact_log1p(g, g.op("Add", t, g.op("Sqrt", g.op("Mul", t, g.op("Add", two, t)))))
    inv = g.op("Div", one, x)
    large = g.op("Add", g.op("Log", x), g.op("Log", g.op("Add", one, g.op("Sqrt", g.op("Sub", one, g.op("Mul", inv, inv))))))
    value = g.op("Where", g.op("Less", x, two), small, large)
    return g.op("Where", g.op("Less", x, one), const(g, math.nan, x), value)


def _atanh_double(g, x):
    # log1p(2a / (1 - a)) / 2 with x's sign: no cancellation near 0; 1 - a is exact near 1;
    # a == 1 gives inf, a > 1 NaN (log of a negative)
    one = const(g, 1.0, x)
    a = g.op("Abs", x)
    u = g.op("Div", g.op("Mul", const(g, 2.0, x), a), g.op("Sub", one, a))
    return with_sign(g, g.op("Mul", const(g, 0.5, x), exact_log1p(g, u)), x)


# e^a / 2 overflows past a = 709.78 though cosh and sinh are finite up to 710.47: there they
# are (e^(a/2) / 2) e^(a/2) (a / 2 is exact).
_EXP_LIMIT = 709.0


def _half_exp(g, a):
    """(e^a + e^-a) / 2's large part e^a / 2 without overflow below cosh's own, and e^a."""
    half = const(g, 0.5, a)
    h = g.op("Exp", g.op("Mul", half, a))
    return g.op("Mul", g.op("Mul", half, h), h), g.op("Exp", a)


def _sinh_double(g, x):
    # |x| < 1: (E + E / (E + 1)) / 2 with E = expm1|x| (no cancellation near 0); else
    # (e^a - e^-a) / 2, then e^a / 2 past _EXP_LIMIT; x's sign
    one, half = const(g, 1.0, x), const(g, 0.5, x)
    a = g.op("Abs", x)
    e = _expm1(g, a)
    small = g.op("Mul", half, g.op("Add", e, g.op("Div", e, g.op("Add", one, e))))
    large, ex = _half_exp(g, a)
    mid = g.op("Mul", half, g.op("Sub", ex, g.op("Div", one, ex)))
    value = g.op("Where", g.op("Less", a, one), small,
                 g.op("Where", g.op("Less", a, const(g, _EXP_LIMIT, x)), mid, large))
    return with_sign(g, value, x)


def _cosh_double(g, x):
    # (e^a + e^-a) / 2 (a sum: no cancellation), e^a / 2 past _EXP_LIMIT
    a = g.op("Abs", x)
    large, ex = _half_exp(g, a)
    mid = g.op("Mul", const(g, 0.5, x), g.op("Add", ex, g.op("Div", const(g, 1.0, x), ex)))
    return g.op("Where", g.op("Less", a, const(g, _EXP_LIMIT, x)), mid, large)


def _frac(g, x):
    return g.op("Sub", x, _trunc(g, x))


def _expm1(g, x):
    u = g.op("Exp", x)
    d = g.op("Sub", u, const(g, 1.0, x))
    # Near 0, e^x - 1 cancels: Kahan's (e^x - 1) * x / log(e^x) cancels the rounding error
    # of e^x (x itself where e^x rounds to 1). Elsewhere e^x - 1 is accurate as it is (and
    # Kahan's form is not where e^x is denormal). expm1(-0.0) is -0.0: select.
    kahan = select(g, where_equal(g, u, 1.0), x, g.op("Div", g.op("Mul", d, x), g.op("Log", u)))
    return select(g, g.op("Less", g.op("Abs", x), const(g, 1.0, x)), kahan, d)


def _exp2(g, x):
    return g.op("Pow", const(g, 2.0, x), x)


def _scale(factor: float):
    def symbolic(g, x):
        return g.op("Mul", x, const(g, factor, x))

    return symbolic


# float32 (float16, integers): erfc(|x|) = t exp(-x^2 + P(t)), t = 1 / (1 + |x| / 2):
# Numerical Recipes' erfcc (Chebyshev fit, relative error < 1.2e-7, no cancellation in the
# tail: erfc(4) = 1.54e-8 where 1 - erf(4) is 0 in float32), computed in float64 and rounded
# once. float64: fdlibm's erfc (graphkit.export._erf_double; ONNX Runtime has no double Erf).
_ERFC_COEFFS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
                -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def _erfcc(g, x):
    a = g.op("Abs", x)
    t = g.op("Div", const(g, 1.0, x), g.op("Add", const(g, 1.0, x), g.op("Mul", const(g, 0.5, x), a)))
    poly = const(g, _ERFC_COEFFS[-1], x)
    for c in reversed(_ERFC_COEFFS[:-1]):
        poly = g.op("Add", const(g, c, x), g.op("Mul", t, poly))
    tail = g.op("Mul", t, g.op("Exp", g.op("Sub", poly, g.op("Mul", a, a))))
    # erfc(-x) = 2 - erfc(x); the NaN of x goes through tail
    return g.op("Where", g.op("Less", x, const(g, 0.0, x)), g.op("Sub", const(g, 2.0, x), tail), tail)


_erfc_single = floating(_erfcc, exact_float32=True)
_erfc_double = floating(erfc_double)


def _erfc(g, x):
    double = result_dtype(g, (x,)) == torch.float64
    return (_erfc_double if double else _erfc_single)(g, x)


def _erf(g, x):
    """float64: fdlibm's erf (ONNX Runtime has no double Erf), its sign set by x's sign bit
    (erf(-0.0) is -0.0; Where drops it); integers: Erf of float32, torch's result type (torch
    writes Erf of int64, which ONNX Runtime has no kernel for either); float32 and float16:
    torch's own Erf."""
    dtype = dtype_of(x)
    if dtype == torch.float64:
        return erf_double(g, x, signed_zero=True)
    if dtype is not None and not dtype.is_floating_point:
        return floating(symbolic_opset9.erf)(g, x)
    return symbolic_opset9.erf(g, x)


@symbolic_helper.parse_args("v", "s")
def _gelu(g, x, approximate: str = "none"):
    """float64 as torch's CPU kernel computes it: x / 2 (1 + erf(x sqrt(1/2))) with fdlibm's
    erf (ONNX Runtime has no double Erf), x / 2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): x / 2
    first, so x near the largest double does not overflow, and Tanh, not Gelu-20 (its function
    body rounds sqrt(2/pi) to float: 5e-9 off). Other types: torch's own symbolic (the Erf or
    Tanh composition before opset 20, Gelu from 20)."""
    if dtype_of(x) != torch.float64:
        return (symbolic_opset20 if g.opset >= 20 else symbolic_opset9).gelu(g, x, approximate)
    return gelu_double(g, x, approximate)


def _sinc(g, x):
    pix = g.op("Mul", x, const(g, math.pi, x))
    return select(g, where_equal(g, x, 0.0), const(g, 1.0, x), g.op("Div", g.op("Sin", pix), pix))


def _ndtr(g, x):
    # torch's own formula, (1 + erf(x / sqrt 2)) / 2, its cancellation included:
    # torch.special.ndtr(-6.0) is 0 in float32, ndtr(-10.0) 0 in float64
    t = g.op("Mul", x, const(g, math.sqrt(0.5), x))
    erf = erf_double(g, t) if dtype_of(x) == torch.float64 else g.op("Erf", t)  # no double Erf in ORT
    return g.op("Mul", g.op("Add", const(g, 1.0, x), erf), const(g, 0.5, x))


def _entr(g, x):
    value = g.op("Neg", g.op("Mul", x, g.op("Log", x)))  # entr(1) is -0.0: select
    nonpositive = g.op("Where", where_equal(g, x, 0.0), const(g, 0.0, x), const(g, -math.inf, x))
    out = select(g, g.op("Greater", x, const(g, 0.0, x)), value, nonpositive)
    return g.op("Where", g.op("IsNaN", x), x, out)


def _sgn(g, x):
    if not is_float(x) and dtype_of(x) is not None:
        return g.op("Sign", x)
    return g.op("Where", g.op("IsNaN", x), const(g, 0.0, x), g.op("Sign", x))  # sgn(nan) is 0


def _positive(g, x):
    return g.op("Identity", x)


def _ravel(g, x):
    return g.op("Reshape", x, g.op("Constant", value_t=torch.tensor([-1])))


# float64 erfc: fdlibm's (graphkit.export._erf_double) against torch's (Sleef's, 1.5 ulp):
# 3 ulps measured on [-30, 30] and hard values, 2 subnormal ulps where erfc(x > 26.5) underflows
_ERFC_TOLERANCE = {"float64": (6.7e-16, 1.5e-323)}
# float16 erf is torch's Erf: ONNX Runtime's is up to 4 subnormal ulps off below 6.1e-5
_ERF_TOLERANCE = {"float16": (9.8e-4, 2.4e-7)}
# gelu, relative to max(|gelu(x)|, |x|): 1 + erf cancels for x < 0 in torch's graph and kernel
# alike (an ulp of erf is |x| ulp(1) / 2 of gelu); float64 3 ulps (fdlibm's erf against Sleef's)
_GELU_TOLERANCE = {"float32": (3.6e-7, 2.9e-45), "float64": (6.7e-16, 1e-323)}
_GELU_SINGLE = ("float32 is torch's own graph, x (1 + erf) / 2 or x (1 + tanh) / 2: gelu(inf) is inf "
                "(torch's float32 kernel: NaN without approximation) and x > max / 2 overflows to inf "
                "(torch: inf without approximation, x in tanh mode); in every dtype gelu(inf) is inf (torch's "
                "vectorized CPU kernel gives NaN for a tensor of two or more elements)")


ROWS = [
    # inverse and hyperbolic trigonometry: one standard op each (integers promote to float)
    GapFiller("aten::asinh", 9, floating(_or_double("Asinh", _asinh_double)),
              "Asinh (float64: Log, Sqrt, log1p)",
              (example(torch.asinh, unary_inputs(-50, 50, (0.0, -1e4, 1e4))),)),
    GapFiller("aten::acosh", 9, floating(_or_double("Acosh", _acosh_double)),
              "Acosh (float64: Log, Sqrt, log1p)", (example(torch.acosh, unary_inputs(1, 20, (1.0,))),)),
    GapFiller("aten::atanh", 9, floating(_or_double("Atanh", _atanh_double)),
              "Atanh (float64: log1p(2|x| / (1 - |x|)) / 2)",
              (example(torch.atanh, unary_inputs(-0.99, 0.99, (0.0,))),)),
    GapFiller("aten::sinh", 9, floating(_or_double("Sinh", _sinh_double)), "Sinh (float64: Exp, expm1)",
              (example(torch.sinh, unary_inputs(-5, 5)),)),
    GapFiller("aten::cosh", 9, floating(_or_double("Cosh", _cosh_double)), "Cosh (float64: Exp)",
              (example(torch.cosh, unary_inputs(-5, 5)),)),
    # rounding
    GapFiller("aten::trunc", 9, _trunc, "Floor(|x|) with x's sign",
              (example(torch.trunc, edges([-2.5, -0.5, 0.5, 2.5, -0.0, INF, -INF, NAN])),
               example(torch.fix, unary_inputs(-9, 9, (-0.5, -0.0)), "torch.fix"))),
    GapFiller("aten::frac", 9, _frac, "x - trunc(x)", (example(torch.frac, edges([-2.5, -0.5, 0.5, 3.0, NAN])),)),
    # exponentials, logs, error functions
    GapFiller("aten::expm1", 11, floating(_expm1, exact_float32=True), "Kahan near 0: (Exp - 1) * x / Log(Exp)",
              (example(torch.expm1, edges([0.0, -0.0, 1e-8, -1e-8, 1e-4, -100.0, 100.0, -INF, INF])),)),
    GapFiller("aten::exp2", 7, floating(_exp2, exact_float32=True), "Pow(2, x)",
              (example(torch.exp2, unary_inputs(-10, 10)),)),
    GapFiller("aten::erfc", 9, _erfc, "t Exp(-x^2 + P(t)), t = 1 / (1 + |x| / 2) (float64: fdlibm's erfc)",
              (example(torch.erfc, unary_inputs(-4, 4, (4.0, 9.0, -INF, INF))),), tolerance=_ERFC_TOLERANCE),
    GapFiller("aten::special_ndtr", 9, floating(_ndtr), "(1 + Erf(x / sqrt 2)) / 2 (float64: fdlibm's erf)",
              (example(torch.special.ndtr, unary_inputs(-6, 6, (-6.0, -12.0))),),
              # 1 + erf(x) cancels for x < 0 in torch and here alike: the error is ~ulp(1) absolute;
              # float64 erf is fdlibm's (no double Erf in ONNX Runtime): an ulp of 1 + erf, that is
              # 1 ulp, or 2^-54 absolute where torch's own 1 + erf cancels (ndtr(-10) is 0 in both)
              tolerance={"float32": (2.4e-7, 6e-8), "float16": (2e-3, 1e-3), "float64": (4.5e-16, 5.6e-17)},
              semantics="torch's formula: 1 + erf cancels below x ~ -5.5 in float32 (0, as torch); in "
                        "float16 torch computes it in float16 (ndtr(-3) = 0.001465, graphkit 0.001349)"),
    GapFiller("aten::erf", 9, _erf, "Erf (float64: fdlibm's erf; integers: Erf of float32)",
              (example(torch.erf, unary_inputs(-7, 7, (-0.0, 0.84375, 1.25, 2.857, 6.0, -6.0, 28.0, -28.0))),),
              tolerance=_ERF_TOLERANCE,
              replaces="torch writes Erf, which ONNX Runtime has no double (or integer) kernel for"),
    GapFiller("aten::gelu", 9, _gelu, "torch's (float64: x / 2 (1 + fdlibm's erf(x / sqrt 2)), "
              "x / 2 (1 + Tanh(...)))",
              (example(F.gelu, unary_inputs(-10, 10, (-0.0, -6.0, 6.0, -28.0))),
               example(lambda x: F.gelu(x, approximate="tanh"), unary_inputs(-10, 10, (-0.0, -6.0, 6.0)), "tanh")),
              tolerance=_GELU_TOLERANCE, tolerance_scale="inputs",
              replaces="float64: torch writes Erf (opset 20: Gelu, whose function body uses Erf), which "
                       "ONNX Runtime has no double kernel for; tanh: x (1 + tanh) / 2 overflows for "
                       "|x| > max / 2, and Gelu-20 rounds sqrt(2 / pi) to float",
              semantics=_GELU_SINGLE),
    GapFiller("aten::special_entr", 11, floating(_entr), "Where(x > 0, -x Log x, 0 or -inf)",
              (example(torch.special.entr, edges([0.0, -1.0, 1.0, NAN, 1e-30])),)),
    GapFiller("aten::sinc", 11, floating(_sinc), "Where(x == 0, 1, Sin(pi x) / (pi x))",
              (example(torch.sinc, edges([0.0, -0.0, 1.0, -2.0, 0.5])),),
              # ONNX Runtime's double Sin is 0 at float64(pi) (libm: 1.2e-16): sinc(1) is 0, torch 3.9e-17
              tolerance={"float64": (4.5e-16, 1e-16)}),
    # scaling, sign, identity, shape
    GapFiller("aten::deg2rad", 7, floating(_scale(math.pi / 180.0)), "Mul(pi / 180)",
              (example(torch.deg2rad, unary_inputs(-720, 720)),)),
    GapFiller("aten::rad2deg", 7, floating(_scale(180.0 / math.pi)), "Mul(180 / pi)",
              (example(torch.rad2deg, unary_inputs(-7, 7)),)),
    GapFiller("aten::sgn", 9, _sgn, "Where(IsNaN, 0, Sign)", (example(torch.sgn, edges([0.0, -0.0, -3.0, INF, NAN])),)),
    GapFiller("aten::positive", 7, _positive, "Identity", (example(torch.positive, randn(2, 3)),)),
    GapFiller("aten::ravel", 7, _ravel, "Reshape(-1)", (example(torch.ravel, lambda gen: (torch.randn(2, 3, 4, generator=gen),)),)),
    GapFiller("aten::fliplr", 10, _flip(1), "Slice(axis 1, step -1)",
              (example(torch.fliplr, lambda gen: (torch.randn(3, 4, 2, generator=gen),)),)),
    GapFiller("aten::flipud", 10, _flip(0), "Slice(axis 0, step -1)",
              (example(torch.flipud, lambda gen: (torch.randn(3, 4, generator=gen),)),)),
]
