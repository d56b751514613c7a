"""GAP_FILLERS: symbolics for ATen ops torch 2.13's TorchScript exporter cannot export.

Every row is a real gap at opsets 17-20 (``python -m graphkit.export.gaps`` finds them by
exporting small models; the tests check each row's examples against torch in ONNX
Runtime). A row is: the ATen op, the first opset holding every ONNX op it writes, the
symbolic, what it writes, and examples. Symbolics take the ATen op's arguments in the
order of ``torch/_C/_VariableFunctions.pyi`` (the tutorial's recipe for ``asinh``).

Dtypes and exactness (tests/test_edges.py checks every row on a grid of hard values in
float16, float32, float64, int64 and float32 with float64, against torch eager):

- the result has torch's dtype: integer inputs promote to float32 (``exp2(arange(8))``),
  float32 with float64 to float64, a 0-dim constant counts as a Python scalar
  (``xlogy(2.0, float32)`` is float32); integer-valued ops stay integer (``l1_loss``,
  ``fmax``, ``heaviside`` of int64);
- float16 is computed in float32 and rounded once, as torch's CPU kernels do (``sinc``);
  compositions whose float32 steps would each round (``hypot``, ``expm1``, ``logaddexp``,
  ``xlogy``, ``ldexp``, ``erfc``...) run in float64 and are rounded once;
- range: ``hypot`` has no overflow or underflow, ``ldexp`` covers every exponent,
  ``log1p`` is exact (``xlog1py``, ``logaddexp``), ``erfc`` has its tail (``erfc(4)`` is
  1.54e-8 in float32);
- signed zeros survive: ONNX Runtime's Where returns +0.0 for a -0.0 from its true branch,
  so signs are set by multiplication (:func:`_with_sign`, :func:`_select`).

A row's ``tolerance`` says how close it is where the default (two ulps) is not met, its
``semantics`` where it departs from torch on purpose (``copysign(1, -nan)``: a NaN's sign
bit is invisible to ONNX before opset 26), and ``unsupported`` the dtypes ONNX Runtime's CPU
provider cannot run. Asinh, Acosh, Atanh, Sinh, Cosh and Erf exist there for float and
float16 only: their rows write float64 with ops that have double kernels (Log, Exp, Sqrt,
Div...), without overflow or cancellation (:func:`_asinh_double` and its neighbours;
erf and erfc as fdlibm computes them, within a few ulps: :mod:`graphkit.export._erf_double`).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch.onnx import symbolic_helper, symbolic_opset9, symbolic_opset20

from graphkit.export._erf_double import erf_double, erfc_double, gelu_double
from graphkit.export.aten import Example, GapFiller, GapFillerTable

__all__ = ["GAP_FILLERS"]

_DTYPES = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16,
           "BFloat16": torch.bfloat16, "Long": torch.int64, "Int": torch.int32,
           "Short": torch.int16, "Char": torch.int8, "Byte": torch.uint8, "Bool": torch.bool}
_ONNX_TYPES = {torch.float32: 1, torch.float64: 11, torch.float16: 10, torch.bfloat16: 16}
_INT64_MIN = -(2**63)


# --------------------------------------------------------------------------- helpers


def _dtype(v) -> torch.dtype | None:
    try:
        return _DTYPES.get(v.type().scalarType())
    except (AttributeError, RuntimeError):
        return None


def _rank(v) -> int | None:
    try:
        return v.type().dim()
    except (AttributeError, RuntimeError):
        return None


def _is_float(v) -> bool:
    return _dtype(v) in _ONNX_TYPES


def _const(g, value, like):
    """A constant holding ``value`` with ``like``'s element type."""
    dtype = _dtype(like)
    if dtype is None and g.opset >= 15:
        return g.op("CastLike", g.op("Constant", value_t=torch.tensor(value, dtype=torch.float32)), like)
    return g.op("Constant", value_t=torch.tensor(value, dtype=dtype or torch.float32))


def _result_dtype(g, values, *, floating: bool = True) -> torch.dtype | None:
    """torch's type promotion over ``values`` (the ATen op's tensor arguments), made
    floating (integers and bool promote to the default float dtype, as torch's float ops
    do). A 0-dim constant argument counts as a Python scalar, like torch's wrapped numbers:
    ``xlogy(2.0, float32 y)`` is float32."""
    node = getattr(g, "original_node", None)
    kinds = []
    if node is not None:
        kinds = [i.node().kind() for i in node.inputs()]
    dummies = []
    for i, v in enumerate(values):
        dtype = _dtype(v)
        if dtype is None:
            return None
        rank = _rank(v)
        if rank == 0 and i < len(kinds) and kinds[i] == "prim::Constant":
            dummies.append(True if dtype == torch.bool else (1.0 if dtype.is_floating_point else 1))
        else:
            dummies.append(torch.empty((1,) * (1 if rank is None else rank), dtype=dtype))
    result = dummies[0] if isinstance(dummies[0], torch.Tensor) else torch.tensor(dummies[0])
    dtype = result.dtype
    for other in dummies[1:]:
        dtype = torch.result_type(torch.empty(result.shape, dtype=dtype), other)
    return dtype if dtype.is_floating_point or not floating else torch.get_default_dtype()


_SMALL_INTEGERS = (torch.int8, torch.uint8, torch.int16)


def _floating(fn, *, tensors: int = 1, promote: int | None = None, exact_float32: bool = False,
              integers: bool = False, result: int | None = None):
    """``fn`` computed in the floating dtype torch gives (promoting the first ``promote``
    arguments, default ``tensors``; the first ``tensors`` are cast to it), the way torch's
    CPU kernels compute it: float16 and bfloat16 in float32, rounded once at the end.
    ``exact_float32``: float16/bfloat16/float32 computed in float64 (correctly rounded on
    the way back; for compositions whose float32 steps each round). ``integers``: integer
    arguments give an integer result (as torch's l1_loss), computed as they are.
    ``result``: the result takes the promoted type of only the first ``result`` arguments
    (torch's huber_loss: float32 input, float64 target -> computed in float64, float32 out)."""
    promote = tensors if promote is None else promote

    @functools.wraps(fn)
    def symbolic(g, *args):
        out = _result_dtype(g, args[:promote], floating=not integers)
        if out in _SMALL_INTEGERS:  # ONNX Runtime lacks most 8- and 16-bit integer kernels
            cast = [_cast(g, a, torch.int64) for a in args[:tensors]]
            return _cast(g, fn(g, *cast, *args[tensors:]), out)
        if out is None or not out.is_floating_point:  # unknown types (scripted code): as written
            return fn(g, *args)
        work = torch.float32 if out in (torch.float16, torch.bfloat16) else out
        if result is not None:
            out = _result_dtype(g, args[:result], floating=not integers) or out
        if exact_float32 and work == torch.float32:
            work = torch.float64
        cast = [_cast(g, a, work) for a in args[:tensors]]
        return _cast(g, fn(g, *cast, *args[tensors:]), out)

    return symbolic


def _sign_bit(g, x):
    """Bool: x < 0, or x is -0.0 (1 / -0.0 is -inf). A NaN's sign is not visible to ONNX
    ops before opset 26's BitCast: NaNs count as positive."""
    zero = _const(g, 0.0, x)
    return g.op("Or", g.op("Less", x, zero), g.op("Less", g.op("Div", _const(g, 1.0, x), x), zero))


def _unit_sign(g, x):
    """+1 or -1 by ``x``'s sign bit, in ``x``'s type (never 0, so it carries -0.0 safely)."""
    negative = g.op("Cast", _sign_bit(g, x), to_i=_ONNX_TYPES[_dtype(x)])
    return g.op("Sub", _const(g, 1.0, x), g.op("Mul", _const(g, 2.0, x), negative))


def _with_sign(g, magnitude, sign_source):
    """|magnitude| with ``sign_source``'s sign bit, by a multiplication: ONNX Runtime's
    Where returns +0.0 for a -0.0 taken from its true branch (and its optimizer swaps the
    branches of Where(Not(c), ...)), so Where cannot carry signs."""
    return g.op("Mul", g.op("Abs", magnitude), _unit_sign(g, sign_source))


def _select(g, cond, a, b):
    """Where(cond, a, b) that keeps the sign of a zero taken from either branch."""
    signs = g.op("Where", cond, _unit_sign(g, a), _unit_sign(g, b))
    return g.op("Mul", g.op("Abs", g.op("Where", cond, a, b)), signs)


def _where_equal(g, x, value):
    c = _const(g, value, x)
    if g.opset < 11:  # no floating Equal before opset 11: neither less nor greater, nor NaN
        differs = g.op("Or", g.op("Less", x, c), g.op("Greater", x, c))
        return g.op("Not", g.op("Or", differs, g.op("IsNaN", x)))
    return g.op("Equal", x, c)


def _log1p(g, u):
    """log(1 + u) to within an ulp of libm's log1p: log(w) + c / w with w = 1 + u rounded
    and c = u - (w - 1) the rounding error of that sum (exact), the first term of
    log(1 + c / w) (Goldberg's u * log(w) / (w - 1) is up to 3 ulps off in float64). c == 0
    (w exact, u = -1 included): log(w) alone; w - 1 == 0 (tiny u, keeps -0.0): u."""
    one = _const(g, 1.0, u)
    w = g.op("Add", one, u)
    d = g.op("Sub", w, one)
    c = g.op("Sub", u, d)
    log = g.op("Log", w)
    corrected = g.op("Add", log, g.op("Div", c, w))
    value = g.op("Where", _where_equal(g, c, 0.0), log, corrected)
    value = _select(g, _where_equal(g, d, 0.0), u, value)
    return g.op("Where", _where_equal(g, u, math.inf), u, value)  # inf - inf


def _trunc(g, x):
    if not _is_float(x) and _dtype(x) is not None:
        return g.op("Identity", x)  # integers are already whole
    # floor(|x|) with x's sign: trunc(-0.5) is -0.0
    return _with_sign(g, g.op("Floor", g.op("Abs", x)), x)


def _reduce(g, x, reduction: int):
    """torch's loss reduction: 0 none, 1 mean, 2 sum (over every element, to a scalar)."""
    if reduction == 0:
        return x
    if _dtype(x) in (torch.int32, *_SMALL_INTEGERS):  # torch sums integers in int64
        x = _cast(g, x, torch.int64)
    if reduction == 2 and _dtype(x) == torch.int64:
        return _integer_sum(g, x)
    return g.op("ReduceMean" if reduction == 1 else "ReduceSum", x, keepdims_i=0)


def _integer_sum(g, x):
    """The sum of every element of an int64 tensor, wrapping around as torch's does (ONNX
    Runtime's int64 ReduceSum accumulates in double: inexact past 2^53, saturating past
    2^63). From opset 11 the last element of a CumSum (exact for any size); before it the
    sums of the high and low 32-bit halves (exact in double below 2^21 elements, the
    documented limit), recombined in int64."""
    flat = g.op("Reshape", x, g.op("Constant", value_t=torch.tensor([-1])))
    if g.opset >= 11:
        zero = g.op("Constant", value_t=torch.tensor([0]))
        sums = g.op("CumSum", g.op("Concat", zero, flat, axis_i=0), g.op("Constant", value_t=torch.tensor(0)))
        return g.op("Gather", sums, g.op("Constant", value_t=torch.tensor(-1)), axis_i=0)
    two32 = g.op("Constant", value_t=torch.tensor(2**32))
    high = g.op("Div", flat, two32)  # truncates: |low| < 2^32
    low = g.op("Sub", flat, g.op("Mul", high, two32))
    return g.op("Add", g.op("Mul", g.op("ReduceSum", high, keepdims_i=0), two32),
                g.op("ReduceSum", low, keepdims_i=0))


def _flip(axis: int):
    def symbolic(g, x):
        return g.op("Slice", x, g.op("Constant", value_t=torch.tensor([-1])),
                    g.op("Constant", value_t=torch.tensor([_INT64_MIN])),
                    g.op("Constant", value_t=torch.tensor([axis])),
                    g.op("Constant", value_t=torch.tensor([-1])))

    return symbolic


def _unary(onnx_op: str):
    def symbolic(g, x):
        return g.op(onnx_op, x)

    symbolic.__name__ = f"{onnx_op.lower()}_symbolic"
    return symbolic


# --------------------------------------------------------------------------- symbolics


def _or_double(standard: str, double):
    """The standard op ``standard`` (float32; float16 arrives computed in float32), and
    ``double(g, x)`` for float64: ONNX Runtime's CPU provider has no double kernel of
    ``standard``, so float64 is written with ops it has double kernels for."""
    def symbolic(g, x):
        return double(g, x) if _dtype(x) == torch.float64 else g.op(standard, x)

    symbolic.__name__ = f"{standard.lower()}_symbolic"
    return symbolic


def _asinh_double(g, x):
    # as graphkit_ops.asinh's log_sqrt: |x| < 1: log1p(a + a^2 / (1 + sqrt(1 + a^2))) (no
    # cancellation near 0); |x| >= 1: log a + log(1 + sqrt(1 + 1/a^2)) (no overflow in a^2)
    one = _const(g, 1.0, x)
    a = g.op("Abs", x)
    a2 = g.op("Mul", a, a)
    small = _log1p(g, g.op("Add", a, g.op("Div", a2, g.op("Add", one, g.op("Sqrt", g.op("Add", one, a2))))))
    inv = g.op("Div", one, a)
    tail = g.op("Sqrt", g.op("Add", one, g.op("Mul", inv, inv)))
    large = g.op("Add", g.op("Log", a), g.op("Log", g.op("Add", one, tail)))
    return _with_sign(g, g.op("Where", g.op("Less", a, one), small, large), x)


def _acosh_double(g, x):
    # 1 <= x < 2: log1p(t + sqrt(2t + t^2)), t = x - 1 exact (no cancellation near 1);
    # x >= 2: log x + log(1 + sqrt(1 - 1/x^2)) (no overflow); x < 1: NaN
    one, two = _const(g, 1.0, x), _const(g, 2.0, x)
    t = g.op("Sub", x, one)
    small = _log1p(g, g.op("Add", t, g.op("Sqrt", g.op("Mul", t, g.op("Add", two, t)))))
    inv = g.op("Div", one, x)
    large = g.op("Add", g.op("Log", x), g.op("Log", g.op("Add", one, g.op("Sqrt", g.op("Sub", one, g.op("Mul", inv, inv))))))
    value = g.op("Where", g.op("Less", x, two), small, large)
    return g.op("Where", g.op("Less", x, one), _const(g, math.nan, x), value)


def _atanh_double(g, x):
    # log1p(2a / (1 - a)) / 2 with x's sign: no cancellation near 0; 1 - a is exact near 1;
    # a == 1 gives inf, a > 1 NaN (log of a negative)
    one = _const(g, 1.0, x)
    a = g.op("Abs", x)
    u = g.op("Div", g.op("Mul", _const(g, 2.0, x), a), g.op("Sub", one, a))
    return _with_sign(g, g.op("Mul", _const(g, 0.5, x), _log1p(g, u)), x)


# e^a / 2 overflows past a = 709.78 though cosh and sinh are finite up to 710.47: there they
# are (e^(a/2) / 2) e^(a/2) (a / 2 is exact).
_EXP_LIMIT = 709.0


def _half_exp(g, a):
    """(e^a + e^-a) / 2's large part e^a / 2 without overflow below cosh's own, and e^a."""
    half = _const(g, 0.5, a)
    h = g.op("Exp", g.op("Mul", half, a))
    return g.op("Mul", g.op("Mul", half, h), h), g.op("Exp", a)


def _sinh_double(g, x):
    # |x| < 1: (E + E / (E + 1)) / 2 with E = expm1|x| (no cancellation near 0); else
    # (e^a - e^-a) / 2, then e^a / 2 past _EXP_LIMIT; x's sign
    one, half = _const(g, 1.0, x), _const(g, 0.5, x)
    a = g.op("Abs", x)
    e = _expm1(g, a)
    small = g.op("Mul", half, g.op("Add", e, g.op("Div", e, g.op("Add", one, e))))
    large, ex = _half_exp(g, a)
    mid = g.op("Mul", half, g.op("Sub", ex, g.op("Div", one, ex)))
    value = g.op("Where", g.op("Less", a, one), small,
                 g.op("Where", g.op("Less", a, _const(g, _EXP_LIMIT, x)), mid, large))
    return _with_sign(g, value, x)


def _cosh_double(g, x):
    # (e^a + e^-a) / 2 (a sum: no cancellation), e^a / 2 past _EXP_LIMIT
    a = g.op("Abs", x)
    large, ex = _half_exp(g, a)
    mid = g.op("Mul", _const(g, 0.5, x), g.op("Add", ex, g.op("Div", _const(g, 1.0, x), ex)))
    return g.op("Where", g.op("Less", a, _const(g, _EXP_LIMIT, x)), mid, large)


def _frac(g, x):
    return g.op("Sub", x, _trunc(g, x))


def _expm1(g, x):
    u = g.op("Exp", x)
    d = g.op("Sub", u, _const(g, 1.0, x))
    # Near 0, e^x - 1 cancels: Kahan's (e^x - 1) * x / log(e^x) cancels the rounding error
    # of e^x (x itself where e^x rounds to 1). Elsewhere e^x - 1 is accurate as it is (and
    # Kahan's form is not where e^x is denormal). expm1(-0.0) is -0.0: _select.
    kahan = _select(g, _where_equal(g, u, 1.0), x, g.op("Div", g.op("Mul", d, x), g.op("Log", u)))
    return _select(g, g.op("Less", g.op("Abs", x), _const(g, 1.0, x)), kahan, d)


def _exp2(g, x):
    return g.op("Pow", _const(g, 2.0, x), x)


def _scale(factor: float):
    def symbolic(g, x):
        return g.op("Mul", x, _const(g, factor, x))

    return symbolic


# float32 (float16, integers): erfc(|x|) = t exp(-x^2 + P(t)), t = 1 / (1 + |x| / 2):
# Numerical Recipes' erfcc (Chebyshev fit, relative error < 1.2e-7, no cancellation in the
# tail: erfc(4) = 1.54e-8 where 1 - erf(4) is 0 in float32), computed in float64 and rounded
# once. float64: fdlibm's erfc (graphkit.export._erf_double; ONNX Runtime has no double Erf).
_ERFC_COEFFS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
                -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def _erfcc(g, x):
    a = g.op("Abs", x)
    t = g.op("Div", _const(g, 1.0, x), g.op("Add", _const(g, 1.0, x), g.op("Mul", _const(g, 0.5, x), a)))
    poly = _const(g, _ERFC_COEFFS[-1], x)
    for c in reversed(_ERFC_COEFFS[:-1]):
        poly = g.op("Add", _const(g, c, x), g.op("Mul", t, poly))
    tail = g.op("Mul", t, g.op("Exp", g.op("Sub", poly, g.op("Mul", a, a))))
    # erfc(-x) = 2 - erfc(x); the NaN of x goes through tail
    return g.op("Where", g.op("Less", x, _const(g, 0.0, x)), g.op("Sub", _const(g, 2.0, x), tail), tail)


_erfc_single = _floating(_erfcc, exact_float32=True)
_erfc_double = _floating(erfc_double)


def _erfc(g, x):
    double = _result_dtype(g, (x,)) == torch.float64
    return (_erfc_double if double else _erfc_single)(g, x)


def _erf(g, x):
    """float64: fdlibm's erf (ONNX Runtime has no double Erf), its sign set by x's sign bit
    (erf(-0.0) is -0.0; Where drops it); integers: Erf of float32, torch's result type (torch
    writes Erf of int64, which ONNX Runtime has no kernel for either); float32 and float16:
    torch's own Erf."""
    dtype = _dtype(x)
    if dtype == torch.float64:
        return erf_double(g, x, signed_zero=True)
    if dtype is not None and not dtype.is_floating_point:
        return _floating(symbolic_opset9.erf)(g, x)
    return symbolic_opset9.erf(g, x)


@symbolic_helper.parse_args("v", "s")
def _gelu(g, x, approximate: str = "none"):
    """float64 as torch's CPU kernel computes it: x / 2 (1 + erf(x sqrt(1/2))) with fdlibm's
    erf (ONNX Runtime has no double Erf), x / 2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): x / 2
    first, so x near the largest double does not overflow, and Tanh, not Gelu-20 (its function
    body rounds sqrt(2/pi) to float: 5e-9 off). Other types: torch's own symbolic (the Erf or
    Tanh composition before opset 20, Gelu from 20)."""
    if _dtype(x) != torch.float64:
        return (symbolic_opset20 if g.opset >= 20 else symbolic_opset9).gelu(g, x, approximate)
    return gelu_double(g, x, approximate)


def _sinc(g, x):
    pix = g.op("Mul", x, _const(g, math.pi, x))
    return _select(g, _where_equal(g, x, 0.0), _const(g, 1.0, x), g.op("Div", g.op("Sin", pix), pix))


def _ndtr(g, x):
    # torch's own formula, (1 + erf(x / sqrt 2)) / 2, its cancellation included:
    # torch.special.ndtr(-6.0) is 0 in float32, ndtr(-10.0) 0 in float64
    t = g.op("Mul", x, _const(g, math.sqrt(0.5), x))
    erf = erf_double(g, t) if _dtype(x) == torch.float64 else g.op("Erf", t)  # no double Erf in ORT
    return g.op("Mul", g.op("Add", _const(g, 1.0, x), erf), _const(g, 0.5, x))


def _entr(g, x):
    value = g.op("Neg", g.op("Mul", x, g.op("Log", x)))  # entr(1) is -0.0: _select
    nonpositive = g.op("Where", _where_equal(g, x, 0.0), _const(g, 0.0, x), _const(g, -math.inf, x))
    out = _select(g, g.op("Greater", x, _const(g, 0.0, x)), value, nonpositive)
    return g.op("Where", g.op("IsNaN", x), x, out)


def _hypot(g, x, y):
    ax, ay = g.op("Abs", x), g.op("Abs", y)
    if _dtype(x) == torch.float64:
        # m * sqrt(1 + (n / m)^2): no overflow or underflow in the squares
        m, n = g.op("Max", ax, ay), g.op("Min", ax, ay)
        q = g.op("Div", n, m)
        value = g.op("Mul", m, g.op("Sqrt", g.op("Add", _const(g, 1.0, x), g.op("Mul", q, q))))
        value = g.op("Where", g.op("Greater", m, _const(g, 0.0, m)), value, m)  # 0 / 0
        nan = g.op("Or", g.op("IsNaN", x), g.op("IsNaN", y))
        value = g.op("Where", nan, g.op("Add", x, y), value)
    else:  # float32 and float16 inputs arrive as float64 (_floating): the squares fit
        value = g.op("Sqrt", g.op("Add", g.op("Mul", x, x), g.op("Mul", y, y)))
    # hypot(inf, nan) is inf
    infinite = g.op("Or", g.op("IsInf", x), g.op("IsInf", y))
    return g.op("Where", infinite, _const(g, math.inf, x), value)


def _logaddexp_base(base2: bool):
    def symbolic(g, x, y):
        d = g.op("Abs", g.op("Sub", x, y))
        if base2:
            tail = g.op("Div", _log1p(g, g.op("Pow", _const(g, 2.0, x), g.op("Neg", d))),
                        _const(g, math.log(2.0), x))
            same = g.op("Add", x, _const(g, 1.0, x))
        else:
            tail = _log1p(g, g.op("Exp", g.op("Neg", d)))
            same = g.op("Add", x, _const(g, math.log(2.0), x))
        # x == y: the formula's x - y is NaN for infinities of the same sign.
        return g.op("Where", g.op("Equal", x, y), same, g.op("Add", g.op("Max", x, y), tail))

    return symbolic


def _xlogy_base(log1p: bool):
    def symbolic(g, x, y):
        log = _log1p(g, y) if log1p else g.op("Log", y)
        zero_case = g.op("Where", g.op("IsNaN", y), y, _const(g, 0.0, x))
        # x * log(y) may be -0.0 (xlogy(-2, 1)): _select
        return _select(g, _where_equal(g, x, 0.0), zero_case, g.op("Mul", x, log))

    return symbolic


def _copysign(g, x, y):
    return _with_sign(g, x, y)


def _sgn(g, x):
    if not _is_float(x) and _dtype(x) is not None:
        return g.op("Sign", x)
    return g.op("Where", g.op("IsNaN", x), _const(g, 0.0, x), g.op("Sign", x))  # sgn(nan) is 0


def _nan_ignoring(larger: bool):
    def symbolic(g, x, y):
        if not _is_float(x) and _dtype(x) is not None:  # integers: no NaN (no integer Max before 12)
            return g.op("Where", g.op("Less", x, y) if larger else g.op("Less", y, x), y, x)
        # torch keeps x when x and y compare equal: fmax(0.0, -0.0) is 0.0, fmax(-0.0, 0.0) -0.0
        both = _select(g, g.op("Less", x, y) if larger else g.op("Less", y, x), y, x)
        return _select(g, g.op("IsNaN", x), y, _select(g, g.op("IsNaN", y), x, both))

    return symbolic


def _heaviside(g, x, values):
    if not _is_float(x):
        return g.op("Where", _where_equal(g, x, 0), values,
                    g.op("Cast", g.op("Greater", x, _const(g, 0, x)), to_i=_ELEMENT_TYPES[_dtype(x)]))
    step = g.op("Cast", g.op("Greater", x, _const(g, 0, x)), to_i=_ELEMENT_TYPES[_dtype(x)])
    return _select(g, _where_equal(g, x, 0.0), values, step)  # values may be -0.0


def _ldexp(g, x, other):
    """x * 2^other, correctly rounded over the whole range: float16/float32 arrive as
    float64 (_floating) where one product is exact; float64 splits 2^other in three factors
    (each in range). The exponent is clipped first: 0 * 2^5000 is 0, not NaN."""
    double = torch.float64
    e = _cast(g, other, double)
    limit = 2200.0 if _dtype(x) == torch.float64 else 400.0
    e = g.op("Min", g.op("Max", e, g.op("Constant", value_t=torch.tensor(-limit, dtype=double))),
             g.op("Constant", value_t=torch.tensor(limit, dtype=double)))
    two = g.op("Constant", value_t=torch.tensor(2.0, dtype=double))
    if _dtype(x) != torch.float64:
        return g.op("Mul", x, g.op("Pow", two, e))
    third = g.op("Floor", g.op("Div", e, g.op("Constant", value_t=torch.tensor(3.0, dtype=double))))
    rest = g.op("Sub", e, third)
    half = g.op("Floor", g.op("Div", rest, g.op("Constant", value_t=torch.tensor(2.0, dtype=double))))
    out = x
    for part in (third, half, g.op("Sub", rest, half)):
        out = g.op("Mul", out, g.op("Pow", two, part))
    return out


_ldexp_float = _floating(_ldexp, promote=2, exact_float32=True)


def _ldexp_torch(g, x, other):
    """torch's two paths: a float x takes the exponent as a C int (int64 exponents wrap to
    32 bits: ldexp(1.0, 2**32 + 3) is 8.0) and is exact over the whole range; an integer x
    is promoted and multiplied by 2.0 ** other in float32 (ldexp(0, 200) is NaN)."""
    if _is_float(x) or _dtype(x) is None:
        if _dtype(other) == torch.int64:
            other = g.op("Cast", other, to_i=_ELEMENT_TYPES[torch.int32])
        return _ldexp_float(g, x, other)
    out = _result_dtype(g, (x, other))
    x, other = _cast(g, x, out), _cast(g, other, out)
    return g.op("Mul", x, g.op("Pow", _const(g, 2.0, x), other))


def _positive(g, x):
    return g.op("Identity", x)


def _ravel(g, x):
    return g.op("Reshape", x, g.op("Constant", value_t=torch.tensor([-1])))


def _broadcast_tensors(g, tensors):
    """torch.broadcast_tensors: each tensor Expanded to the broadcast shape, the Shape of a
    sum of int64 zeros shaped like the tensors (torch sums zeros of the tensors' own type:
    an 8- or 16-bit integer Add before opset 14, or a bool Add, which ONNX Runtime has no
    kernel for; ``F.l1_loss`` of int8 calls it)."""
    values = symbolic_helper._unpack_list(tensors)

    def zeros(v):
        return g.op("ConstantOfShape", g.op("Shape", v), value_t=torch.tensor([0], dtype=torch.int64))

    total = zeros(values[0])
    for v in values[1:]:
        total = g.op("Add", total, zeros(v))
    shape = g.op("Shape", total)
    return g.op("prim::ListConstruct", *[g.op("Expand", v, shape) for v in values])


@symbolic_helper.parse_args("v", "v", "i")
def _l1_loss(g, x, target, reduction):
    return _reduce(g, g.op("Abs", g.op("Sub", x, target)), reduction)


def _l1_loss_any(g, x, target, reduction):
    """l1_loss; 8- and 16-bit integers computed in int64 with torch's wrap-around after the
    subtraction and the absolute value (ONNX Runtime has no such Sub or Abs kernels)."""
    out = _result_dtype(g, (x, target), floating=False)
    if out not in _SMALL_INTEGERS:
        return _floating(_l1_loss, tensors=2, integers=True)(g, x, target, reduction)

    def wrapped(v):
        return _cast(g, g.op("Cast", v, to_i=_ELEMENT_TYPES[out]), torch.int64)

    d = wrapped(g.op("Sub", _cast(g, x, torch.int64), _cast(g, target, torch.int64)))
    value = _reduce(g, wrapped(g.op("Abs", d)), symbolic_helper._maybe_get_const(reduction, "i"))
    return value if _dtype(value) != torch.int64 or symbolic_helper._maybe_get_const(reduction, "i") \
        else g.op("Cast", value, to_i=_ELEMENT_TYPES[out])


@symbolic_helper.parse_args("v", "v", "i", "f")
def _smooth_l1_loss(g, x, target, reduction, beta):
    d = g.op("Abs", g.op("Sub", x, target))
    if beta == 0.0:
        return _reduce(g, d, reduction)
    quadratic = g.op("Div", g.op("Mul", _const(g, 0.5, x), g.op("Mul", d, d)), _const(g, beta, x))
    linear = g.op("Sub", d, _const(g, 0.5 * beta, x))
    return _reduce(g, g.op("Where", g.op("Less", d, _const(g, beta, x)), quadratic, linear), reduction)


@symbolic_helper.parse_args("v", "v", "i", "f")
def _huber_loss(g, x, target, reduction, delta):
    d = g.op("Abs", g.op("Sub", x, target))
    quadratic = g.op("Mul", _const(g, 0.5, x), g.op("Mul", d, d))
    linear = g.op("Mul", _const(g, delta, x), g.op("Sub", d, _const(g, 0.5 * delta, x)))
    return _reduce(g, g.op("Where", g.op("Less", d, _const(g, delta, x)), quadratic, linear), reduction)


@symbolic_helper.parse_args("v", "v", "i")
def _soft_margin_loss(g, x, target, reduction):
    # torch's log1p(exp(-x t)), overflow included (ONNX Runtime has no double Softplus)
    return _reduce(g, _log1p(g, g.op("Exp", g.op("Neg", g.op("Mul", x, target)))), reduction)


# ---------------------------------------------- found by exporting real architectures (bench/zoo.py)

# torch's ScalarType numbering (a `dtype=` argument reaches a symbolic as this int) and the
# ONNX element type of each dtype.
_SCALAR_TYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64,
                 5: torch.float16, 6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16}
_ELEMENT_TYPES = {torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 5, torch.int32: 6,
                  torch.int64: 7, torch.bool: 9, torch.float16: 10, torch.float64: 11, torch.bfloat16: 16}


def _cast(g, v, dtype: torch.dtype | None):
    """``v`` as ``dtype`` (no node when it already is, or when either type is unknown)."""
    if dtype is None or _dtype(v) in (None, dtype):
        return v
    return g.op("Cast", v, to_i=_ELEMENT_TYPES[dtype])


def _compute_type(dtype: torch.dtype | None) -> torch.dtype | None:
    """The type ONNX Runtime's CPU kernels for Sub and CumSum compute ``dtype`` in: float16
    and bfloat16 in float32 (one rounding at the end, as torch's CPU kernels), 8- and 16-bit
    integers in int64 (the final Cast wraps around as torch does)."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if dtype in (torch.uint8, torch.int8, torch.int16):
        return torch.int64
    return dtype


@symbolic_helper.parse_args("v", "i", "i", "v", "v")
def _diff(g, x, n, dim, prepend, append):
    """torch.diff: ``prepend``/``append`` concatenated along ``dim`` (all promoted to one
    type, as torch.cat does), then ``n`` times ``x[1:] - x[:-1]`` (logical xor for bool)."""
    parts = [v for v in (prepend, x, append) if not symbolic_helper._is_none(v)]
    dtype = _dtype(x)
    for v in parts:
        other = _dtype(v)
        dtype = None if dtype is None or other is None else torch.promote_types(dtype, other)
    if len(parts) > 1:
        x = g.op("Concat", *[_cast(g, v, dtype) for v in parts], axis_i=dim)
    if n == 0:
        return x
    work = _compute_type(dtype)
    x = _cast(g, x, work)
    starts = [g.op("Constant", value_t=torch.tensor([v])) for v in (1, 0)]
    ends = [g.op("Constant", value_t=torch.tensor([v])) for v in (2**63 - 1, -1)]
    axes = g.op("Constant", value_t=torch.tensor([dim]))
    for k in range(n):
        upper = g.op("Slice", x, starts[0], ends[0], axes)
        lower = g.op("Slice", x, starts[1], ends[1], axes)
        x = g.op("Xor" if dtype == torch.bool else "Sub", upper, lower)
        if work != dtype and dtype is not None and dtype.is_floating_point and k < n - 1:
            # torch rounds each difference to float16 (found by tests/test_edges.py, n = 2)
            x = g.op("Cast", g.op("Cast", x, to_i=_ELEMENT_TYPES[dtype]), to_i=_ELEMENT_TYPES[work])
    return x if work == dtype else g.op("Cast", x, to_i=_ELEMENT_TYPES[dtype])


@symbolic_helper.parse_args("v", "i", "none")
def _cumsum(g, x, dim, dtype=None):
    """torch.cumsum: bool and integer inputs sum in int64 as torch's do (torch's symbolic
    writes a bool or int8 CumSum, which ONNX Runtime has no kernel for, and sums int32 in
    int32), ``dtype=`` is honoured, float16 accumulates in float32 and float32 in float64
    (torch's CPU accumulation types)."""
    have = _dtype(x)
    if dtype is not None and not symbolic_helper._is_none(dtype):
        want = _SCALAR_TYPES.get(symbolic_helper._get_const(dtype, "i", "dtype"))
    elif have is not None and not have.is_floating_point:
        want = torch.int64
    else:
        want = have
    # torch's CPU cumsum accumulates float32 in double (its acc_type) and rounds each sum
    work = torch.float64 if want == torch.float32 else _compute_type(want)
    axis = g.op("Constant", value_t=torch.tensor(dim, dtype=torch.int64))
    y = g.op("CumSum", _cast(g, x, work), axis)
    if work != want:
        y = g.op("Cast", y, to_i=_ELEMENT_TYPES[want])
    if want is not None and want.is_floating_point:
        # torch sums from +0.0: cumsum(-0.0) is 0.0 (after the Cast: ONNX Runtime's
        # optimizer drops a double Add of 0)
        y = g.op("Add", y, g.op("Constant", value_t=torch.tensor(0.0, dtype=want)))
    return y


# --------------------------------------------------------------------------- examples


def _randn(*shape, scale=1.0):
    def make(gen: torch.Generator):
        return (torch.randn(*shape, generator=gen) * scale,)

    return make


def _edges(values):
    """Random values with ``values`` appended (zeros, signed zeros, infinities, NaN...)."""
    def make(gen: torch.Generator):
        return (torch.cat([torch.randn(2, 8, generator=gen).flatten() * 3,
                           torch.tensor(values, dtype=torch.float32)]),)

    return make


def _unary_inputs(low: float = -3.0, high: float = 3.0, extra=()):
    def make(gen: torch.Generator):
        x = torch.rand(2, 3, 8, generator=gen) * (high - low) + low
        if extra:
            x = torch.cat([x.flatten(), torch.tensor(extra, dtype=torch.float32)])
        return (x,)

    return make


def _binary_inputs(scale=3.0, extra=()):
    def make(gen: torch.Generator):
        x = torch.randn(2, 3, 8, generator=gen) * scale
        y = torch.randn(2, 3, 8, generator=gen) * scale
        if extra:
            x = torch.cat([x.flatten(), torch.tensor([a for a, _ in extra], dtype=torch.float32)])
            y = torch.cat([y.flatten(), torch.tensor([b for _, b in extra], dtype=torch.float32)])
        return x, y

    return make


def _ex(fn, inputs, label=""):
    return Example(fn, inputs, label)


_INF, _NAN = math.inf, math.nan
_LOSS_REDUCTIONS = ("mean", "sum", "none")


def _plus_minus_one(t):
    """soft_margin_loss's targets: -1 where t < 0, else 1."""
    return torch.where(t < 0, -torch.ones_like(t), torch.ones_like(t))


def _loss_examples(fn, **kwargs):
    return tuple(_ex(lambda x, t, r=r: fn(x, t, reduction=r, **kwargs), _binary_inputs(1.5), r)
                 for r in _LOSS_REDUCTIONS)


def _broadcast_inputs(gen: torch.Generator):
    return torch.randn(3, 1, generator=gen) * 3, torch.randn(1, 4, generator=gen) * 3


def _diff_examples() -> tuple[Example, ...]:
    def positions(gen):  # transformers' find_packed_sequence_indices
        ids = torch.tensor([[0, 1, 2, 0, 1, 5, 6], [3, 4, 5, 6, 7, 8, 9]])
        return (ids,)

    def packed(ids):
        return torch.diff(ids, prepend=ids[:, :1] - 1, dim=-1)

    return (
        _ex(packed, positions, "int64 prepend"),
        _ex(lambda x: torch.diff(x, n=2, dim=0), lambda gen: (torch.randn(5, 3, generator=gen),), "n=2 dim=0"),
        _ex(lambda x: torch.diff(x.view(3, -1), append=x.view(3, -1)[:, -2:] * 2),
            lambda gen: (torch.tensor([0.0, -0.0, _INF, -_INF, _NAN, 1e38, -1e38, 3.5, 1e-40, 2.0, 7.0, -4.0]),),
            "append, edge values"),
        _ex(lambda x: torch.diff(x > 0), lambda gen: (torch.randn(2, 9, generator=gen),), "bool"),
        _ex(lambda x: torch.diff(x), lambda gen: (torch.tensor([[100, -100, 127, -128, 0]], dtype=torch.int8),),
            "int8 wraps"),
        _ex(lambda x: torch.diff(x), lambda gen: (torch.tensor([65504.0, -65504.0, 1e-3, 1.0], dtype=torch.float16),),
            "float16"),
        _ex(lambda x: torch.diff(x, prepend=torch.full((2, 1), 0.5)),
            lambda gen: (torch.tensor([[1, 4, 9], [2, 2, 2]]),), "int64 x, float prepend"),
        _ex(lambda x: torch.diff(x, n=4), lambda gen: (torch.randn(2, 3, generator=gen),), "n > length"),
    )


def _cumsum_examples() -> tuple[Example, ...]:
    def ids(gen):
        return (torch.tensor([[0, 1, 2, 0, 1, 5, 6], [3, 4, 5, 6, 7, 8, 9]]),)

    return (
        _ex(lambda x: (torch.diff(x, prepend=x[:, :1] - 1) != 1).cumsum(-1), ids, "bool (transformers)"),
        _ex(lambda x: torch.cumsum(x, 0), lambda gen: (torch.randn(4, 3, generator=gen),), "float32"),
        _ex(lambda x: torch.cumsum(x.to(torch.int32), 1), ids, "int32 -> int64"),
        _ex(lambda x: torch.cumsum(x.to(torch.int8) * 60, 1, dtype=torch.int8), ids, "dtype=int8 wraps"),
        _ex(lambda x: torch.cumsum(x, 1, dtype=torch.float64), lambda gen: (torch.randn(2, 5, generator=gen),),
            "dtype=float64"),
        _ex(lambda x: torch.cumsum(x, -1), lambda gen: (torch.tensor([[60000.0, 5000.0, 1e-4, -65504.0]],
                                                                     dtype=torch.float16),), "float16"),
    )


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
# torch computes m + log1p(1) / ln 2 for x == y and rounds it; x + 1 is the exact value
_EQUAL_LOGADDEXP2 = ("logaddexp2(x, x) is x + 1 exactly; torch rounds max + log1p(1) / ln 2: "
                     "logaddexp2(-1, -1) is -1.06e-8 in float32 and -0.0 in float16, graphkit 0.0")
_NAN_SIGN = ("a NaN's sign bit is invisible to ONNX ops before opset 26 (BitCast): a NaN y "
             "counts as positive, copysign(1, -nan) is 1 (torch -1)")

GAP_FILLERS = GapFillerTable([
    # inverse and hyperbolic trigonometry: one standard op each (integers promote to float)
    GapFiller("aten::asinh", 9, _floating(_or_double("Asinh", _asinh_double)),
              "Asinh (float64: Log, Sqrt, log1p)",
              (_ex(torch.asinh, _unary_inputs(-50, 50, (0.0, -1e4, 1e4))),)),
    GapFiller("aten::acosh", 9, _floating(_or_double("Acosh", _acosh_double)),
              "Acosh (float64: Log, Sqrt, log1p)", (_ex(torch.acosh, _unary_inputs(1, 20, (1.0,))),)),
    GapFiller("aten::atanh", 9, _floating(_or_double("Atanh", _atanh_double)),
              "Atanh (float64: log1p(2|x| / (1 - |x|)) / 2)",
              (_ex(torch.atanh, _unary_inputs(-0.99, 0.99, (0.0,))),)),
    GapFiller("aten::sinh", 9, _floating(_or_double("Sinh", _sinh_double)), "Sinh (float64: Exp, expm1)",
              (_ex(torch.sinh, _unary_inputs(-5, 5)),)),
    GapFiller("aten::cosh", 9, _floating(_or_double("Cosh", _cosh_double)), "Cosh (float64: Exp)",
              (_ex(torch.cosh, _unary_inputs(-5, 5)),)),
    # rounding
    GapFiller("aten::trunc", 9, _trunc, "Floor(|x|) with x's sign",
              (_ex(torch.trunc, _edges([-2.5, -0.5, 0.5, 2.5, -0.0, _INF, -_INF, _NAN])),
               _ex(torch.fix, _unary_inputs(-9, 9, (-0.5, -0.0)), "torch.fix"))),
    GapFiller("aten::frac", 9, _frac, "x - trunc(x)", (_ex(torch.frac, _edges([-2.5, -0.5, 0.5, 3.0, _NAN])),)),
    # exponentials, logs, error functions
    GapFiller("aten::expm1", 11, _floating(_expm1, exact_float32=True), "Kahan near 0: (Exp - 1) * x / Log(Exp)",
              (_ex(torch.expm1, _edges([0.0, -0.0, 1e-8, -1e-8, 1e-4, -100.0, 100.0, -_INF, _INF])),)),
    GapFiller("aten::exp2", 7, _floating(_exp2, exact_float32=True), "Pow(2, x)",
              (_ex(torch.exp2, _unary_inputs(-10, 10)),)),
    GapFiller("aten::erfc", 9, _erfc, "t Exp(-x^2 + P(t)), t = 1 / (1 + |x| / 2) (float64: fdlibm's erfc)",
              (_ex(torch.erfc, _unary_inputs(-4, 4, (4.0, 9.0, -_INF, _INF))),), tolerance=_ERFC_TOLERANCE),
    GapFiller("aten::special_ndtr", 9, _floating(_ndtr), "(1 + Erf(x / sqrt 2)) / 2 (float64: fdlibm's erf)",
              (_ex(torch.special.ndtr, _unary_inputs(-6, 6, (-6.0, -12.0))),),
              # 1 + erf(x) cancels for x < 0 in torch and here alike: the error is ~ulp(1) absolute;
              # float64 erf is fdlibm's (no double Erf in ONNX Runtime): an ulp of 1 + erf, that is
              # 1 ulp, or 2^-54 absolute where torch's own 1 + erf cancels (ndtr(-10) is 0 in both)
              tolerance={"float32": (2.4e-7, 6e-8), "float16": (2e-3, 1e-3), "float64": (4.5e-16, 5.6e-17)},
              semantics="torch's formula: 1 + erf cancels below x ~ -5.5 in float32 (0, as torch); in "
                        "float16 torch computes it in float16 (ndtr(-3) = 0.001465, graphkit 0.001349)"),
    GapFiller("aten::erf", 9, _erf, "Erf (float64: fdlibm's erf; integers: Erf of float32)",
              (_ex(torch.erf, _unary_inputs(-7, 7, (-0.0, 0.84375, 1.25, 2.857, 6.0, -6.0, 28.0, -28.0))),),
              tolerance=_ERF_TOLERANCE,
              replaces="torch writes Erf, which ONNX Runtime has no double (or integer) kernel for"),
    GapFiller("aten::gelu", 9, _gelu, "torch's (float64: x / 2 (1 + fdlibm's erf(x / sqrt 2)), "
              "x / 2 (1 + Tanh(...)))",
              (_ex(F.gelu, _unary_inputs(-10, 10, (-0.0, -6.0, 6.0, -28.0))),
               _ex(lambda x: F.gelu(x, approximate="tanh"), _unary_inputs(-10, 10, (-0.0, -6.0, 6.0)), "tanh")),
              tolerance=_GELU_TOLERANCE, tolerance_scale="inputs",
              replaces="float64: torch writes Erf (opset 20: Gelu, whose function body uses Erf), which "
                       "ONNX Runtime has no double kernel for; tanh: x (1 + tanh) / 2 overflows for "
                       "|x| > max / 2, and Gelu-20 rounds sqrt(2 / pi) to float",
              semantics=_GELU_SINGLE),
    GapFiller("aten::special_entr", 11, _floating(_entr), "Where(x > 0, -x Log x, 0 or -inf)",
              (_ex(torch.special.entr, _edges([0.0, -1.0, 1.0, _NAN, 1e-30])),)),
    GapFiller("aten::sinc", 11, _floating(_sinc), "Where(x == 0, 1, Sin(pi x) / (pi x))",
              (_ex(torch.sinc, _edges([0.0, -0.0, 1.0, -2.0, 0.5])),),
              # ONNX Runtime's double Sin is 0 at float64(pi) (libm: 1.2e-16): sinc(1) is 0, torch 3.9e-17
              tolerance={"float64": (4.5e-16, 1e-16)}),
    # scaling, sign, identity, shape
    GapFiller("aten::deg2rad", 7, _floating(_scale(math.pi / 180.0)), "Mul(pi / 180)",
              (_ex(torch.deg2rad, _unary_inputs(-720, 720)),)),
    GapFiller("aten::rad2deg", 7, _floating(_scale(180.0 / math.pi)), "Mul(180 / pi)",
              (_ex(torch.rad2deg, _unary_inputs(-7, 7)),)),
    GapFiller("aten::sgn", 9, _sgn, "Where(IsNaN, 0, Sign)", (_ex(torch.sgn, _edges([0.0, -0.0, -3.0, _INF, _NAN])),)),
    GapFiller("aten::positive", 7, _positive, "Identity", (_ex(torch.positive, _randn(2, 3)),)),
    GapFiller("aten::ravel", 7, _ravel, "Reshape(-1)", (_ex(torch.ravel, lambda gen: (torch.randn(2, 3, 4, generator=gen),)),)),
    GapFiller("aten::fliplr", 10, _flip(1), "Slice(axis 1, step -1)",
              (_ex(torch.fliplr, lambda gen: (torch.randn(3, 4, 2, generator=gen),)),)),
    GapFiller("aten::flipud", 10, _flip(0), "Slice(axis 0, step -1)",
              (_ex(torch.flipud, lambda gen: (torch.randn(3, 4, generator=gen),)),)),
    # binary (torch's type promotion: float32 with float64 is float64)
    GapFiller("aten::hypot", 10, _floating(_hypot, tensors=2, exact_float32=True),
              "Sqrt(x*x + y*y) in float64; float64: m Sqrt(1 + (n/m)^2)",
              (_ex(torch.hypot, _binary_inputs(3, ((1e30, 1e30), (1e-30, 0.0), (_INF, _NAN)))),)),
    GapFiller("aten::logaddexp", 11, _floating(_logaddexp_base(False), tensors=2, exact_float32=True),
              "Max + Log1p(Exp(-|x - y|))",
              (_ex(torch.logaddexp, _binary_inputs(30, ((_INF, _INF), (-_INF, -_INF), (0.0, -_INF), (0.0, -20.0)))),),
              tolerance_scale="inputs"),
    GapFiller("aten::logaddexp2", 11, _floating(_logaddexp_base(True), tensors=2, exact_float32=True),
              "Max + Log1p(2^-|x - y|) / Log 2",
              (_ex(torch.logaddexp2, _binary_inputs(30, ((-_INF, -_INF), (1.0, 1.0), (0.0, -100.0)))),),
              tolerance_scale="inputs", semantics=_EQUAL_LOGADDEXP2),
    GapFiller("aten::xlogy", 11, _floating(_xlogy_base(False), tensors=2, exact_float32=True),
              "Where(x == 0, 0, x Log y)",
              (_ex(torch.xlogy, lambda gen: (torch.tensor([0.0, 0.0, 1.0, 2.5, -1.0, 0.0, -2.0]),
                                             torch.tensor([0.0, _NAN, 3.0, 0.5, 2.0, 7.0, 1.0]))),
               _ex(torch.xlogy, lambda gen: (torch.randn(4, 5, generator=gen),
                                             torch.rand(4, 5, generator=gen) + 0.1), "random"))),
    GapFiller("aten::special_xlog1py", 11, _floating(_xlogy_base(True), tensors=2, exact_float32=True),
              "Where(x == 0, 0, x Log1p(y))",
              (_ex(torch.special.xlog1py, lambda gen: (torch.tensor([0.0, 0.0, 1.0, 2.5, -1.0, 1.0, _INF]),
                                                       torch.tensor([-1.0, _NAN, 3.0, 0.5, 2.0, 1e-8, 1e-8]))),)),
    GapFiller("aten::copysign", 9, _floating(_copysign, tensors=2), "|x| * (+-1 by y's sign bit)",
              (_ex(torch.copysign, _binary_inputs(3, ((1.0, -0.0), (2.0, 0.0), (-1.0, _INF), (-3.0, -_INF),
                                                      (0.0, -1.0)))),), semantics=_NAN_SIGN),
    GapFiller("aten::fmax", 9, _floating(_nan_ignoring(True), tensors=2, integers=True),
              "Where(x < y, y, x) ignoring NaN",
              (_ex(torch.fmax, _binary_inputs(3, ((_NAN, 1.0), (2.0, _NAN), (_NAN, _NAN)))),)),
    GapFiller("aten::fmin", 9, _floating(_nan_ignoring(False), tensors=2, integers=True),
              "Where(y < x, y, x) ignoring NaN",
              (_ex(torch.fmin, _binary_inputs(3, ((_NAN, 1.0), (2.0, _NAN), (_NAN, _NAN)))),)),
    GapFiller("aten::heaviside", 11, _floating(_heaviside, tensors=2, integers=True), "Where(x != 0, x > 0, values)",
              (_ex(torch.heaviside, _binary_inputs(3, ((0.0, 0.5), (-0.0, 7.0), (1e-30, 3.0), (0.0, -0.0)))),)),
    GapFiller("aten::ldexp", 8, _ldexp_torch, "x * Pow(2, other) in float64 (exponent split for float64)",
              (_ex(torch.ldexp, lambda gen: (torch.randn(3, 4, generator=gen),
                                             torch.randint(-8, 8, (3, 4), generator=gen))),
               _ex(torch.ldexp, lambda gen: (torch.tensor([0.0, 0.1, 1e38, 1.0, -3.0]),
                                             torch.tensor([128, 128, -150, -149, 300])), "range"))),
    # losses (reduction none, mean, sum)
    GapFiller("aten::broadcast_tensors", 9, _broadcast_tensors, "Expand(t, Shape(sum of int64 zeros))",
              (_ex(lambda x, y: torch.broadcast_tensors(x, y)[1], _binary_inputs(3), "same shapes"),
               _ex(lambda x, y: torch.cat(torch.broadcast_tensors(x, y)), _broadcast_inputs),
               _ex(lambda x, y: torch.cat(torch.broadcast_tensors(x > 0, y > 0)), _broadcast_inputs, "bool")),
              replaces="torch finds the shape by adding zeros of the tensors' type: an int8, "
                       "int16 or uint8 Add before opset 14 and a bool Add (no ONNX Runtime kernel)"),
    GapFiller("aten::l1_loss", 9, _l1_loss_any, "Abs(x - t), reduced", _loss_examples(F.l1_loss),
              semantics="integer sums wrap around as torch's (ONNX Runtime's int64 ReduceSum "
                        "saturates); before opset 11 exactly so for fewer than 2^21 elements"),
    GapFiller("aten::smooth_l1_loss", 9, _floating(_smooth_l1_loss, tensors=2),
              "Where(|d| < beta, d^2 / 2 beta, |d| - beta / 2)",
              _loss_examples(F.smooth_l1_loss, beta=0.7)
              + (_ex(lambda x, t: F.smooth_l1_loss(x, t, beta=0.0), _binary_inputs(1.5), "beta=0"),)),
    GapFiller("aten::huber_loss", 9, _floating(_huber_loss, tensors=2, result=1),
              "Where(|d| < delta, d^2 / 2, delta (|d| - delta / 2))", _loss_examples(F.huber_loss, delta=0.8)),
    GapFiller("aten::soft_margin_loss", 11, _floating(_soft_margin_loss, tensors=2, result=1), "Log1p(Exp(-x t)), reduced",
              tuple(_ex(lambda x, t, r=r: F.soft_margin_loss(x, _plus_minus_one(t), reduction=r),
                        _binary_inputs(1.5), r) for r in _LOSS_REDUCTIONS),
              # the mean and sum reductions add in another order than torch
              tolerance={"float32": (1e-6, 2.9e-45), "float64": (2e-15, 1e-323)}),
    # found by exporting real architectures (bench/zoo.py): transformers' masking code looks
    # for packed sequences with torch.diff and a cumsum of bool (GPT-2, Llama, Whisper)
    GapFiller("aten::diff", 11, _diff, "Concat(prepend, x, append), n x (Slice(1:) - Slice(:-1))",
              _diff_examples()),
    GapFiller("aten::cumsum", 11, _cumsum, "CumSum(Cast(x)) in int64 for bool and integers",
              _cumsum_examples(),
              replaces="torch writes CumSum of bool and int8 (ONNX Runtime has no kernel for "
                       "them) and of int32 (torch returns int64)"),
])
