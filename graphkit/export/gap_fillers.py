"""GAP_FILLERS: symbolics for ATen ops torch 2.13's TorchScript exporter cannot export.

Every row is a real gap at opsets 17-20 (``python -m graphkit.export.gaps`` finds them by
exporting small models; the tests check each row's examples against torch in ONNX
Runtime). A row is: the ATen op, the first opset holding every ONNX op it writes, the
symbolic, what it writes, and examples. Symbolics take the ATen op's arguments in the
order of ``torch/_C/_VariableFunctions.pyi`` (the tutorial's recipe for ``asinh``).

Precision notes (float32; tests compare at 1e-5 absolute, 1e-5 relative unless noted):
``expm1`` uses Kahan's ``(e^x - 1) * x / log(e^x)``, accurate near 0; ``erfc``, ``ndtr``
and ``xlog1py`` lose relative (not absolute) precision where the result underflows toward 0
(``erfc(5)`` is 1.5e-12, ``1 - erf(5)`` is 0); ``hypot`` overflows for |x| > ~1.8e19.
The standard ops written are valid ONNX for every float type, but ONNX Runtime's CPU
provider implements Asinh, Acosh, Atanh, Sinh, Cosh and Erf for float and float16 only
(as for torch's own Erf symbolic): a float64 model with them does not run there.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.onnx import symbolic_helper

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


def _is_float(v) -> bool:
    return _dtype(v) in _ONNX_TYPES


def _const(g, value, like):
    """A constant holding ``value`` with ``like``'s element type."""
    dtype = _dtype(like)
    if dtype is None and g.opset >= 15:
        return g.op("CastLike", g.op("Constant", value_t=torch.tensor(value, dtype=torch.float32)), like)
    return g.op("Constant", value_t=torch.tensor(value, dtype=dtype or torch.float32))


def _like(g, v, like):
    """``v`` cast to ``like``'s floating type when they differ (ONNX ops do not promote)."""
    want, have = _dtype(like), _dtype(v)
    if want in _ONNX_TYPES and have != want:
        return g.op("Cast", v, to_i=_ONNX_TYPES[want])
    return v


def _where_equal(g, x, value):
    return g.op("Equal", x, _const(g, value, x))


def _trunc(g, x):
    if not _is_float(x) and _dtype(x) is not None:
        return g.op("Identity", x)  # integers are already whole
    return g.op("Where", g.op("Less", x, _const(g, 0.0, x)), g.op("Ceil", x), g.op("Floor", x))


def _reduce(g, x, reduction: int):
    """torch's loss reduction: 0 none, 1 mean, 2 sum (over every element, to a scalar)."""
    if reduction == 0:
        return x
    return g.op("ReduceMean" if reduction == 1 else "ReduceSum", x, keepdims_i=0)


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


def _frac(g, x):
    return g.op("Sub", x, _trunc(g, x))


def _expm1(g, x):
    u = g.op("Exp", x)
    d = g.op("Sub", u, _const(g, 1.0, x))
    # Near 0, e^x - 1 cancels: Kahan's (e^x - 1) * x / log(e^x) cancels the rounding error
    # of e^x (x itself where e^x rounds to 1). Elsewhere e^x - 1 is accurate as it is (and
    # Kahan's form is not where e^x is denormal).
    kahan = g.op("Where", _where_equal(g, u, 1.0), x, g.op("Div", g.op("Mul", d, x), g.op("Log", u)))
    return g.op("Where", g.op("Less", g.op("Abs", x), _const(g, 1.0, x)), kahan, d)


def _exp2(g, x):
    return g.op("Pow", _const(g, 2.0, x), x)


def _scale(factor: float):
    def symbolic(g, x):
        return g.op("Mul", x, _const(g, factor, x))

    return symbolic


def _erfc(g, x):
    return g.op("Sub", _const(g, 1.0, x), g.op("Erf", x))


def _sinc(g, x):
    pix = g.op("Mul", x, _const(g, math.pi, x))
    return g.op("Where", _where_equal(g, x, 0.0), _const(g, 1.0, x),
                g.op("Div", g.op("Sin", pix), pix))


def _ndtr(g, x):
    half = _const(g, 0.5, x)
    erf = g.op("Erf", g.op("Mul", x, _const(g, math.sqrt(0.5), x)))
    return g.op("Mul", half, g.op("Add", _const(g, 1.0, x), erf))


def _entr(g, x):
    value = g.op("Neg", g.op("Mul", x, g.op("Log", x)))
    nonpositive = g.op("Where", _where_equal(g, x, 0.0), _const(g, 0.0, x), _const(g, -math.inf, x))
    out = g.op("Where", g.op("Greater", x, _const(g, 0.0, x)), value, nonpositive)
    return g.op("Where", g.op("IsNaN", x), x, out)


def _hypot(g, x, y):
    y = _like(g, y, x)
    return g.op("Sqrt", g.op("Add", g.op("Mul", x, x), g.op("Mul", y, y)))


def _logaddexp_base(base2: bool):
    def symbolic(g, x, y):
        y = _like(g, y, x)
        d = g.op("Abs", g.op("Sub", x, y))
        if base2:
            tail = g.op("Div", g.op("Log", g.op("Add", _const(g, 1.0, x),
                                                g.op("Pow", _const(g, 2.0, x), g.op("Neg", d)))),
                        _const(g, math.log(2.0), x))
            same = g.op("Add", x, _const(g, 1.0, x))
        else:
            tail = g.op("Log", g.op("Add", _const(g, 1.0, x), g.op("Exp", g.op("Neg", d))))
            same = g.op("Add", x, _const(g, math.log(2.0), x))
        # x == y: the formula's x - y is NaN for infinities of the same sign.
        return g.op("Where", g.op("Equal", x, y), same, g.op("Add", g.op("Max", x, y), tail))

    return symbolic


def _xlogy_base(log1p: bool):
    def symbolic(g, x, y):
        y = _like(g, y, x)
        arg = g.op("Add", y, _const(g, 1.0, y)) if log1p else y
        zero_case = g.op("Where", g.op("IsNaN", y), y, _const(g, 0.0, x))
        return g.op("Where", _where_equal(g, x, 0.0), zero_case, g.op("Mul", x, g.op("Log", arg)))

    return symbolic


def _copysign(g, x, y):
    y = _like(g, y, x)
    # The sign bit of y: y < 0, or y is -0.0 (1 / -0.0 is -inf).
    zero = _const(g, 0.0, y)
    negative = g.op("Or", g.op("Less", y, zero), g.op("Less", g.op("Div", _const(g, 1.0, y), y), zero))
    magnitude = g.op("Abs", x)
    return g.op("Where", negative, g.op("Neg", magnitude), magnitude)


def _nan_ignoring(onnx_op: str):
    def symbolic(g, x, y):
        y = _like(g, y, x)
        both = g.op(onnx_op, x, y)
        return g.op("Where", g.op("IsNaN", x), y, g.op("Where", g.op("IsNaN", y), x, both))

    return symbolic


def _heaviside(g, x, values):
    values = _like(g, values, x)
    step = g.op("Where", g.op("Greater", x, _const(g, 0.0, x)), _const(g, 1.0, x), _const(g, 0.0, x))
    return g.op("Where", _where_equal(g, x, 0.0), values, step)


def _ldexp(g, x, other):
    return g.op("Mul", x, g.op("Pow", _const(g, 2.0, x), _like(g, other, x)))


def _positive(g, x):
    return g.op("Identity", x)


def _ravel(g, x):
    return g.op("Reshape", x, g.op("Constant", value_t=torch.tensor([-1])))


@symbolic_helper.parse_args("v", "v", "i")
def _l1_loss(g, x, target, reduction):
    return _reduce(g, g.op("Abs", g.op("Sub", x, _like(g, target, x))), reduction)


@symbolic_helper.parse_args("v", "v", "i", "f")
def _smooth_l1_loss(g, x, target, reduction, beta):
    d = g.op("Abs", g.op("Sub", x, _like(g, target, x)))
    if beta == 0.0:
        return _reduce(g, d, reduction)
    quadratic = g.op("Div", g.op("Mul", _const(g, 0.5, x), g.op("Mul", d, d)), _const(g, beta, x))
    linear = g.op("Sub", d, _const(g, 0.5 * beta, x))
    return _reduce(g, g.op("Where", g.op("Less", d, _const(g, beta, x)), quadratic, linear), reduction)


@symbolic_helper.parse_args("v", "v", "i", "f")
def _huber_loss(g, x, target, reduction, delta):
    d = g.op("Abs", g.op("Sub", x, _like(g, target, x)))
    quadratic = g.op("Mul", _const(g, 0.5, x), g.op("Mul", d, d))
    linear = g.op("Mul", _const(g, delta, x), g.op("Sub", d, _const(g, 0.5 * delta, x)))
    return _reduce(g, g.op("Where", g.op("Less", d, _const(g, delta, x)), quadratic, linear), reduction)


@symbolic_helper.parse_args("v", "v", "i")
def _soft_margin_loss(g, x, target, reduction):
    return _reduce(g, g.op("Softplus", g.op("Neg", g.op("Mul", x, _like(g, target, x)))), reduction)


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
    for _ in range(n):
        upper = g.op("Slice", x, starts[0], ends[0], axes)
        lower = g.op("Slice", x, starts[1], ends[1], axes)
        x = g.op("Xor" if dtype == torch.bool else "Sub", upper, lower)
    return x if work == dtype else g.op("Cast", x, to_i=_ELEMENT_TYPES[dtype])


@symbolic_helper.parse_args("v", "i", "none")
def _cumsum(g, x, dim, dtype=None):
    """torch.cumsum: bool and integer inputs sum in int64 as torch's do (torch's symbolic
    writes a bool or int8 CumSum, which ONNX Runtime has no kernel for, and sums int32 in
    int32), ``dtype=`` is honoured, float16 accumulates in float32."""
    have = _dtype(x)
    if dtype is not None and not symbolic_helper._is_none(dtype):
        want = _SCALAR_TYPES.get(symbolic_helper._get_const(dtype, "i", "dtype"))
    elif have is not None and not have.is_floating_point:
        want = torch.int64
    else:
        want = have
    work = _compute_type(want)
    axis = g.op("Constant", value_t=torch.tensor(dim, dtype=torch.int64))
    y = g.op("CumSum", _cast(g, x, work), axis)
    return y if work == want else g.op("Cast", y, to_i=_ELEMENT_TYPES[want])


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


def _loss_examples(fn, **kwargs):
    return tuple(_ex(lambda x, t, r=r: fn(x, t, reduction=r, **kwargs), _binary_inputs(1.5), r)
                 for r in _LOSS_REDUCTIONS)


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


GAP_FILLERS = GapFillerTable([
    # inverse and hyperbolic trigonometry: one standard op each
    GapFiller("aten::asinh", 9, _unary("Asinh"), "Asinh",
              (_ex(torch.asinh, _unary_inputs(-50, 50, (0.0, -1e4, 1e4))),)),
    GapFiller("aten::acosh", 9, _unary("Acosh"), "Acosh", (_ex(torch.acosh, _unary_inputs(1, 20, (1.0,))),)),
    GapFiller("aten::atanh", 9, _unary("Atanh"), "Atanh",
              (_ex(torch.atanh, _unary_inputs(-0.99, 0.99, (0.0,))),)),
    GapFiller("aten::sinh", 9, _unary("Sinh"), "Sinh", (_ex(torch.sinh, _unary_inputs(-5, 5)),)),
    GapFiller("aten::cosh", 9, _unary("Cosh"), "Cosh", (_ex(torch.cosh, _unary_inputs(-5, 5)),)),
    # rounding
    GapFiller("aten::trunc", 9, _trunc, "Where(x < 0, Ceil, Floor)",
              (_ex(torch.trunc, _edges([-2.5, -0.5, 0.5, 2.5, -0.0, _INF, -_INF, _NAN])),
               _ex(torch.fix, _unary_inputs(-9, 9), "torch.fix"))),
    GapFiller("aten::frac", 9, _frac, "x - trunc(x)", (_ex(torch.frac, _edges([-2.5, -0.5, 0.5, 3.0, _NAN])),)),
    # exponentials, logs, error functions
    GapFiller("aten::expm1", 11, _expm1, "Kahan near 0: (Exp - 1) * x / Log(Exp)",
              (_ex(torch.expm1, _edges([0.0, 1e-8, -1e-8, 1e-4, -100.0, 100.0, -_INF, _INF])),)),
    GapFiller("aten::exp2", 7, _exp2, "Pow(2, x)", (_ex(torch.exp2, _unary_inputs(-10, 10)),)),
    GapFiller("aten::erfc", 9, _erfc, "1 - Erf", (_ex(torch.erfc, _unary_inputs(-4, 4)),)),
    GapFiller("aten::special_ndtr", 9, _ndtr, "0.5 * (1 + Erf(x / sqrt 2))",
              (_ex(torch.special.ndtr, _unary_inputs(-6, 6)),)),
    GapFiller("aten::special_entr", 11, _entr, "Where(x > 0, -x Log x, 0 or -inf)",
              (_ex(torch.special.entr, _edges([0.0, -1.0, 1.0, _NAN, 1e-30])),)),
    GapFiller("aten::sinc", 11, _sinc, "Where(x == 0, 1, Sin(pi x) / (pi x))",
              (_ex(torch.sinc, _edges([0.0, -0.0, 1.0, -2.0, 0.5])),)),
    # scaling, sign, identity, shape
    GapFiller("aten::deg2rad", 7, _scale(math.pi / 180.0), "Mul(pi / 180)",
              (_ex(torch.deg2rad, _unary_inputs(-720, 720)),)),
    GapFiller("aten::rad2deg", 7, _scale(180.0 / math.pi), "Mul(180 / pi)",
              (_ex(torch.rad2deg, _unary_inputs(-7, 7)),)),
    GapFiller("aten::sgn", 9, _unary("Sign"), "Sign", (_ex(torch.sgn, _edges([0.0, -0.0, -3.0, _INF])),)),
    GapFiller("aten::positive", 7, _positive, "Identity", (_ex(torch.positive, _randn(2, 3)),)),
    GapFiller("aten::ravel", 7, _ravel, "Reshape(-1)", (_ex(torch.ravel, lambda gen: (torch.randn(2, 3, 4, generator=gen),)),)),
    GapFiller("aten::fliplr", 10, _flip(1), "Slice(axis 1, step -1)",
              (_ex(torch.fliplr, lambda gen: (torch.randn(3, 4, 2, generator=gen),)),)),
    GapFiller("aten::flipud", 10, _flip(0), "Slice(axis 0, step -1)",
              (_ex(torch.flipud, lambda gen: (torch.randn(3, 4, generator=gen),)),)),
    # binary
    GapFiller("aten::hypot", 7, _hypot, "Sqrt(x*x + y*y)", (_ex(torch.hypot, _binary_inputs()),)),
    GapFiller("aten::logaddexp", 11, _logaddexp_base(False), "Max + Log(1 + Exp(-|x - y|))",
              (_ex(torch.logaddexp, _binary_inputs(30, ((_INF, _INF), (-_INF, -_INF), (0.0, -_INF)))),)),
    GapFiller("aten::logaddexp2", 11, _logaddexp_base(True), "Max + Log2(1 + 2^-|x - y|)",
              (_ex(torch.logaddexp2, _binary_inputs(30, ((-_INF, -_INF), (1.0, 1.0)))),)),
    GapFiller("aten::xlogy", 11, _xlogy_base(False), "Where(x == 0, 0, x Log y)",
              (_ex(torch.xlogy, lambda gen: (torch.tensor([0.0, 0.0, 1.0, 2.5, -1.0, 0.0]),
                                             torch.tensor([0.0, _NAN, 3.0, 0.5, 2.0, 7.0]))),
               _ex(torch.xlogy, lambda gen: (torch.randn(4, 5, generator=gen),
                                             torch.rand(4, 5, generator=gen) + 0.1), "random"))),
    GapFiller("aten::special_xlog1py", 11, _xlogy_base(True), "Where(x == 0, 0, x Log(1 + y))",
              (_ex(torch.special.xlog1py, lambda gen: (torch.tensor([0.0, 0.0, 1.0, 2.5, -1.0]),
                                                       torch.tensor([-1.0, _NAN, 3.0, 0.5, 2.0]))),)),
    GapFiller("aten::copysign", 9, _copysign, "Where(y < 0 or y is -0.0, -|x|, |x|)",
              (_ex(torch.copysign, _binary_inputs(3, ((1.0, -0.0), (2.0, 0.0), (-1.0, _INF), (-3.0, -_INF)))),)),
    GapFiller("aten::fmax", 9, _nan_ignoring("Max"), "Max ignoring NaN",
              (_ex(torch.fmax, _binary_inputs(3, ((_NAN, 1.0), (2.0, _NAN), (_NAN, _NAN)))),)),
    GapFiller("aten::fmin", 9, _nan_ignoring("Min"), "Min ignoring NaN",
              (_ex(torch.fmin, _binary_inputs(3, ((_NAN, 1.0), (2.0, _NAN), (_NAN, _NAN)))),)),
    GapFiller("aten::heaviside", 11, _heaviside, "Where(x == 0, values, x > 0)",
              (_ex(torch.heaviside, _binary_inputs(3, ((0.0, 0.5), (-0.0, 7.0), (1e-30, 3.0)))),)),
    GapFiller("aten::ldexp", 7, _ldexp, "x * Pow(2, other)",
              (_ex(torch.ldexp, lambda gen: (torch.randn(3, 4, generator=gen),
                                             torch.randint(-8, 8, (3, 4), generator=gen))),)),
    # losses (reduction none, mean, sum)
    GapFiller("aten::l1_loss", 9, _l1_loss, "Abs(x - t), reduced", _loss_examples(F.l1_loss)),
    GapFiller("aten::smooth_l1_loss", 9, _smooth_l1_loss, "Where(|d| < beta, d^2 / 2 beta, |d| - beta / 2)",
              _loss_examples(F.smooth_l1_loss, beta=0.7)
              + (_ex(lambda x, t: F.smooth_l1_loss(x, t, beta=0.0), _binary_inputs(1.5), "beta=0"),)),
    GapFiller("aten::huber_loss", 9, _huber_loss, "Where(|d| < delta, d^2 / 2, delta (|d| - delta / 2))",
              _loss_examples(F.huber_loss, delta=0.8)),
    GapFiller("aten::soft_margin_loss", 9, _soft_margin_loss, "Softplus(-x t), reduced",
              tuple(_ex(lambda x, t, r=r: F.soft_margin_loss(x, torch.sign(t), reduction=r),
                        _binary_inputs(1.5), r) for r in _LOSS_REDUCTIONS)),
    # found by exporting real architectures (bench/zoo.py): transformers' masking code looks
    # for packed sequences with torch.diff and a cumsum of bool (GPT-2, Llama, Whisper)
    GapFiller("aten::diff", 11, _diff, "Concat(prepend, x, append), n x (Slice(1:) - Slice(:-1))",
              _diff_examples()),
    GapFiller("aten::cumsum", 11, _cumsum, "CumSum(Cast(x)) in int64 for bool and integers",
              _cumsum_examples(),
              replaces="torch writes CumSum of bool and int8 (ONNX Runtime has no kernel for "
                       "them) and of int32 (torch returns int64)"),
])
