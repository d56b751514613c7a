"""Gap fillers of two-input ops, with torch's type promotion (float32 with float64 is
float64): hypot, logaddexp, xlogy, copysign, fmax/fmin, heaviside, ldexp (:data:`ROWS`)."""

from __future__ import annotations

import math

import torch

from graphkit.export.aten import GapFiller
from graphkit.export.gap_fillers.blocks import exact_log1p, select, where_equal, with_sign
from graphkit.export.gap_fillers.dtypes import ELEMENT_TYPES, cast_to, const, dtype_of, floating, is_float, result_dtype
from graphkit.export.gap_fillers.examples import INF, NAN, binary_inputs, example

__all__ = ["ROWS"]


def _hypot(g, x, y):
    ax, ay = g.op("Abs", x), g.op("Abs", y)
    if dtype_of(x) == torch.float64:
        # m * sqrt(1 + (n / m)^2): no overflow or underflow in the squares
        m, n = g.op("Max", ax, ay), g.op("Min", ax, ay)
        q = g.op("Div", n, m)
        value = g.op("Mul", m, g.op("Sqrt", g.op("Add", const(g, 1.0, x), g.op("Mul", q, q))))
        value = g.op("Where", g.op("Greater", m, const(g, 0.0, m)), value, m)  # 0 / 0
        nan = g.op("Or", g.op("IsNaN", x), g.op("IsNaN", y))
        value = g.op("Where", nan, g.op("Add", x, y), value)
    else:  # float32 and float16 inputs arrive as float64 (floating): the squares fit
        value = g.op("Sqrt", g.op("Add", g.op("Mul", x, x), g.op("Mul", y, y)))
    # hypot(inf, nan) is inf
    infinite = g.op("Or", g.op("IsInf", x), g.op("IsInf", y))
    return g.op("Where", infinite, const(g, math.inf, x), value)


def _logaddexp_base(base2: bool):
    def symbolic(g, x, y):
        d = g.op("Abs", g.op("Sub", x, y))
        if base2:
            tail = g.op("Div", exact_log1p(g, g.op("Pow", const(g, 2.0, x), g.op("Neg", d))),
                        const(g, math.log(2.0), x))
            same = g.op("Add", x, const(g, 1.0, x))
        else:
            tail = exact_log1p(g, g.op("Exp", g.op("Neg", d)))
            same = g.op("Add", x, const(g, math.log(2.0), x))
        # x == y: the formula's x - y is NaN for infinities of the same sign.
        return g.op("Where", g.op("Equal", x, y), same, g.op("Add", g.op("Max", x, y), tail))

    return symbolic


def _xlogy_base(log1p: bool):
    def symbolic(g, x, y):
        log = exact_log1p(g, y) if log1p else g.op("Log", y)
        zero_case = g.op("Where", g.op("IsNaN", y), y, const(g, 0.0, x))
        # x * log(y) may be -0.0 (xlogy(-2, 1)): select
        return select(g, where_equal(g, x, 0.0), zero_case, g.op("Mul", x, log))

    return symbolic


def _copysign(g, x, y):
    return with_sign(g, x, y)


def _nan_ignoring(larger: bool):
    def symbolic(g, x, y):
        if not is_float(x) and dtype_of(x) is not None:  # integers: no NaN (no integer Max before 12)
            return g.op("Where", g.op("Less", x, y) if larger else g.op("Less", y, x), y, x)
        # torch keeps x when x and y compare equal: fmax(0.0, -0.0) is 0.0, fmax(-0.0, 0.0) -0.0
        both = select(g, g.op("Less", x, y) if larger else g.op("Less", y, x), y, x)
        return select(g, g.op("IsNaN", x), y, select(g, g.op("IsNaN", y), x, both))

    return symbolic


def _heaviside(g, x, values):
    if not is_float(x):
        return g.op("Where", where_equal(g, x, 0), values,
                    g.op("Cast", g.op("Greater", x, const(g, 0, x)), to_i=ELEMENT_TYPES[dtype_of(x)]))
    step = g.op("Cast", g.op("Greater", x, const(g, 0, x)), to_i=ELEMENT_TYPES[dtype_of(x)])
    return select(g, where_equal(g, x, 0.0), values, step)  # values may be -0.0


def _ldexp(g, x, other):
    """x * 2^other, correctly rounded over the whole range: float16/float32 arrive as
    float64 (floating) where one product is exact; float64 splits 2^other in three factors
    (each in range). The exponent is clipped first: 0 * 2^5000 is 0, not NaN."""
    double = torch.float64
    e = cast_to(g, other, double)
    limit = 2200.0 if dtype_of(x) == torch.float64 else 400.0
    e = g.op("Min", g.op("Max", e, g.op("Constant", value_t=torch.tensor(-limit, dtype=double))),
             g.op("Constant", value_t=torch.tensor(limit, dtype=double)))
    two = g.op("Constant", value_t=torch.tensor(2.0, dtype=double))
    if dtype_of(x) != torch.float64:
        return g.op("Mul", x, g.op("Pow", two, e))
    third = g.op("Floor", g.op("Div", e, g.op("Constant", value_t=torch.tensor(3.0, dtype=double))))
    rest = g.op("Sub", e, third)
    half = g.op("Floor", g.op("Div", rest, g.op("Constant", value_t=torch.tensor(2.0, dtype=double))))
    out = x
    for part in (third, half, g.op("Sub", rest, half)):
        out = g.op("Mul", out, g.op("Pow", two, part))
    return out


_ldexp_float = floating(_ldexp, promote=2, exact_float32=True)


def _ldexp_torch(g, x, other):
    """torch's two paths: a float x takes the exponent as a C int (int64 exponents wrap to
    32 bits: ldexp(1.0, 2**32 + 3) is 8.0) and is exact over the whole range; an integer x
    is promoted and multiplied by 2.0 ** other in float32 (ldexp(0, 200) is NaN)."""
    if is_float(x) or dtype_of(x) is None:
        if dtype_of(other) == torch.int64:
            other = g.op("Cast", other, to_i=ELEMENT_TYPES[torch.int32])
        return _ldexp_float(g, x, other)
    out = result_dtype(g, (x, other))
    x, other = cast_to(g, x, out), cast_to(g, other, out)
    return g.op("Mul", x, g.op("Pow", const(g, 2.0, x), other))


# torch computes m + log1p(1) / ln 2 for x == y and rounds it; x + 1 is the exact value
_EQUAL_LOGADDEXP2 = ("logaddexp2(x, x) is x + 1 exactly; torch rounds max + log1p(1) / ln 2: "
                     "logaddexp2(-1, -1) is -1.06e-8 in float32 and -0.0 in float16, graphkit 0.0")
_NAN_SIGN = ("a NaN's sign bit is invisible to ONNX ops before opset 26 (BitCast): a NaN y "
             "counts as positive, copysign(1, -nan) is 1 (torch -1)")


ROWS = [
    # binary (torch's type promotion: float32 with float64 is float64)
    GapFiller("aten::hypot", 10, floating(_hypot, tensors=2, exact_float32=True),
              "Sqrt(x*x + y*y) in float64; float64: m Sqrt(1 + (n/m)^2)",
              (example(torch.hypot, binary_inputs(3, ((1e30, 1e30), (1e-30, 0.0), (INF, NAN)))),)),
    GapFiller("aten::logaddexp", 11, floating(_logaddexp_base(False), tensors=2, exact_float32=True),
              "Max + Log1p(Exp(-|x - y|))",
              (example(torch.logaddexp, binary_inputs(30, ((INF, INF), (-INF, -INF), (0.0, -INF), (0.0, -20.0)))),),
              tolerance_scale="inputs"),
    GapFiller("aten::logaddexp2", 11, floating(_logaddexp_base(True), tensors=2, exact_float32=True),
              "Max + Log1p(2^-|x - y|) / Log 2",
              (example(torch.logaddexp2, binary_inputs(30, ((-INF, -INF), (1.0, 1.0), (0.0, -100.0)))),),
              tolerance_scale="inputs", semantics=_EQUAL_LOGADDEXP2),
    GapFiller("aten::xlogy", 11, floating(_xlogy_base(False), tensors=2, exact_float32=True),
              "Where(x == 0, 0, x Log y)",
              (example(torch.xlogy, lambda gen: (torch.tensor([0.0, 0.0, 1.0, 2.5, -1.0, 0.0, -2.0]),
                                             torch.tensor([0.0, NAN, 3.0, 0.5, 2.0, 7.0, 1.0]))),
               example(torch.xlogy, lambda gen: (torch.randn(4, 5, generator=gen),
                                             torch.rand(4, 5, generator=gen) + 0.1), "random"))),
    GapFiller("aten::special_xlog1py", 11, floating(_xlogy_base(True), tensors=2, exact_float32=True),
              "Where(x == 0, 0, x Log1p(y))",
              (example(torch.special.xlog1py, lambda gen: (torch.tensor([0.0, 0.0, 1.0, 2.5, -1.0, 1.0, INF]),
                                                       torch.tensor([-1.0, NAN, 3.0, 0.5, 2.0, 1e-8, 1e-8]))),)),
    GapFiller("aten::copysign", 9, floating(_copysign, tensors=2), "|x| * (+-1 by y's sign bit)",
              (example(torch.copysign, binary_inputs(3, ((1.0, -0.0), (2.0, 0.0), (-1.0, INF), (-3.0, -INF),
                                                      (0.0, -1.0)))),), semantics=_NAN_SIGN),
    GapFiller("aten::fmax", 9, floating(_nan_ignoring(True), tensors=2, integers=True),
              "Where(x < y, y, x) ignoring NaN",
              (example(torch.fmax, binary_inputs(3, ((NAN, 1.0), (2.0, NAN), (NAN, NAN)))),)),
    GapFiller("aten::fmin", 9, floating(_nan_ignoring(False), tensors=2, integers=True),
              "Where(y < x, y, x) ignoring NaN",
              (example(torch.fmin, binary_inputs(3, ((NAN, 1.0), (2.0, NAN), (NAN, NAN)))),)),
    GapFiller("aten::heaviside", 11, floating(_heaviside, tensors=2, integers=True), "Where(x != 0, x > 0, values)",
              (example(torch.heaviside, binary_inputs(3, ((0.0, 0.5), (-0.0, 7.0), (1e-30, 3.0), (0.0, -0.0)))),)),
    GapFiller("aten::ldexp", 8, _ldexp_torch, "x * Pow(2, other) in float64 (exponent split for float64)",
              (example(torch.ldexp, lambda gen: (torch.randn(3, 4, generator=gen),
                                             torch.randint(-8, 8, (3, 4), generator=gen))),
               example(torch.ldexp, lambda gen: (torch.tensor([0.0, 0.1, 1e38, 1.0, -3.0]),
                                             torch.tensor([128, 128, -150, -149, 300])), "range"))),
]
