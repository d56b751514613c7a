"""What several gap fillers build with: signs set by multiplication (ONNX Runtime's Where
drops a -0.0 taken from its true branch), a Where that keeps signed zeros, a floating Equal
for every opset, and log1p to within an ulp."""

from __future__ import annotations

import math

from graphkit.export.gap_fillers.dtypes import ONNX_TYPES, const, dtype_of

__all__ = ["exact_log1p", "select", "where_equal", "with_sign"]


def _sign_bit(g, x):
    """Bool: x < 0, or x is -0.0 (1 / -0.0 is -inf). A NaN's sign is not visible to ONNX
    ops before opset 26's BitCast: NaNs count as positive."""
    zero = const(g, 0.0, x)
    return g.op("Or", g.op("Less", x, zero), g.op("Less", g.op("Div", const(g, 1.0, x), x), zero))


def _unit_sign(g, x):
    """+1 or -1 by ``x``'s sign bit, in ``x``'s type (never 0, so it carries -0.0 safely)."""
    negative = g.op("Cast", _sign_bit(g, x), to_i=ONNX_TYPES[dtype_of(x)])
    return g.op("Sub", const(g, 1.0, x), g.op("Mul", const(g, 2.0, x), negative))


def with_sign(g, magnitude, sign_source):
    """|magnitude| with ``sign_source``'s sign bit, by a multiplication: ONNX Runtime's
    Where returns +0.0 for a -0.0 taken from its true branch (and its optimizer swaps the
    branches of Where(Not(c), ...)), so Where cannot carry signs."""
    return g.op("Mul", g.op("Abs", magnitude), _unit_sign(g, sign_source))


def select(g, cond, a, b):
    """Where(cond, a, b) that keeps the sign of a zero taken from either branch."""
    signs = g.op("Where", cond, _unit_sign(g, a), _unit_sign(g, b))
    return g.op("Mul", g.op("Abs", g.op("Where", cond, a, b)), signs)


def where_equal(g, x, value):
    c = const(g, value, x)
    if g.opset < 11:  # no floating Equal before opset 11: neither less nor greater, nor NaN
        differs = g.op("Or", g.op("Less", x, c), g.op("Greater", x, c))
        return g.op("Not", g.op("Or", differs, g.op("IsNaN", x)))
    return g.op("Equal", x, c)


def exact_log1p(g, u):
    """log(1 + u) to within an ulp of libm's log1p: log(w) + c / w with w = 1 + u rounded
    and c = u - (w - 1) the rounding error of that sum (exact), the first term of
    log(1 + c / w) (Goldberg's u * log(w) / (w - 1) is up to 3 ulps off in float64). c == 0
    (w exact, u = -1 included): log(w) alone; w - 1 == 0 (tiny u, keeps -0.0): u."""
    one = const(g, 1.0, u)
    w = g.op("Add", one, u)
    d = g.op("Sub", w, one)
    c = g.op("Sub", u, d)
    log = g.op("Log", w)
    corrected = g.op("Add", log, g.op("Div", c, w))
    value = g.op("Where", where_equal(g, c, 0.0), log, corrected)
    value = select(g, where_equal(g, d, 0.0), u, value)
    return g.op("Where", where_equal(g, u, math.inf), u, value)  # inf - inf
