"""Double-precision erf and erfc written with ONNX ops ONNX Runtime has double kernels for.

ONNX Runtime's CPU provider has no double Erf, so the float64 gap fillers (``aten::erfc``,
``aten::special_ndtr``) write W. J. Cody's rational approximations as fdlibm's ``s_erf.c``
(Sun Microsystems, 1993; glibc, FreeBSD msun and musl carry the same code and coefficients)
evaluates them, within about an ulp of libm: every region is computed for every element and
Where picks each element's one (Where selects, so a NaN or inf of a region an element is not
in never reaches it):

- |x| < 0.84375: erf = x + x R(x^2) / S(x^2);
- 0.84375 <= |x| < 1.25: erf = erx + P(|x| - 1) / Q(|x| - 1), erx = 0.845062911510467529297;
- 1.25 <= |x| < 28 (erfc; erf to 1 - erfc): erfc = exp(-z^2 - 0.5625) exp((z - |x|)(z + |x|)
  + R(1 / x^2) / S(1 / x^2)) / |x|, two fits split at 1 / 0.35. z is |x| with a shorter
  significand, so that -z^2 - 0.5625 is exact and exp(-x^2) has no rounding error magnified
  by x^2: fdlibm clears the low 32 bits; ONNX has no bit cast before opset 26, and a Cast to
  float32 and back rounds to 24 bits, short enough (z^2 has 48 bits, 0.5625 fits beside them);
- |x| >= 28: erfc is 0 or 2, erf +-1; NaN stays NaN.

Ops: Abs, Mul, Add, Sub, Div, Exp, Less, Where, IsNaN, Cast, Constant (and Or, Tanh for
:func:`gelu_double`): all opset <= 9, all with double kernels in ONNX Runtime.

``g`` is anything with TorchScript's ``g.op(name, *inputs, **attrs)`` (attributes suffixed
``_i``, ``_t``...): the gap fillers pass the exporter's graph context, the dynamo translations
(:mod:`graphkit.export._translation_fixes`) an adapter over onnxscript's opset.
"""

from __future__ import annotations

import torch

__all__ = ["erf_double", "erfc_double", "gelu_double"]

_ERX = 8.45062911510467529297e-01
_EFX8 = 1.02703333676410069053e+00
# erf on [0, 0.84375]: x + x PP(x^2) / QQ(x^2)
_PP = (1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
       -5.77027029648944159157e-03, -2.37630166566501626084e-05)
_QQ = (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02, 5.08130628187576562776e-03,
       1.32494738004321644526e-04, -3.96022827877536812320e-06)
# erf on [0.84375, 1.25]: erx + PA(s) / QA(s), s = |x| - 1
_PA = (-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
       3.18346619901161753674e-01, -1.10894694282396677476e-01, 3.54783043256182359371e-02,
       -2.16637559486879084300e-03)
_QA = (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01, 7.18286544141962662868e-02,
       1.26171219808761642112e-01, 1.36370839120290507362e-02, 1.19844998467991074170e-02)
# erfc on [1.25, 1 / 0.35]: RA(s) / SA(s), s = 1 / x^2
_RA = (-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e+01,
       -6.23753324503260060396e+01, -1.62396669462573470355e+02, -1.84605092906711035994e+02,
       -8.12874355063065934246e+01, -9.81432934416914548592e+00)
_SA = (1.0, 1.96512716674392571292e+01, 1.37657754143519042600e+02, 4.34565877475229228821e+02,
       6.45387271733267880336e+02, 4.29008140027567833386e+02, 1.08635005541779435134e+02,
       6.57024977031928170135e+00, -6.04244152148580987438e-02)
# erfc on [1 / 0.35, 28]: RB(s) / SB(s)
_RB = (-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e+01,
       -1.60636384855821916062e+02, -6.37566443368389627722e+02, -1.02509513161107724954e+03,
       -4.83519191608651397019e+02)
_SB = (1.0, 3.03380607434824582924e+01, 3.25792512996573918826e+02, 1.53672958608443695994e+03,
       3.19985821950859553908e+03, 2.55305040643316442583e+03, 4.74528541206955367215e+02,
       -2.24409524465858183362e+01)
# region bounds, as fdlibm compares the high word: 1 / 0.35 is 0x4006DB6E_00000000
_SMALL, _MIDDLE, _SPLIT, _LARGE = 0.84375, 1.25, 2.8571434020996094, 28.0
_TINY = 2.0**-28  # erf: x + efx x, scaled by 8 so that a subnormal x keeps its digits


def _c(g, value: float):
    return g.op("Constant", value_t=torch.tensor(value, dtype=torch.float64))


def _poly(g, t, coeffs):
    """c0 + t (c1 + t (c2 + ...)), Horner's rule as fdlibm writes it."""
    acc = _c(g, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = g.op("Add", _c(g, c), g.op("Mul", t, acc))
    return acc


def _regions(g, x):
    """The per-region values both functions share: |x|, x < 0, y = R/S of the first
    region, P/Q of the second, and erfc(|x|) of the third (1.25 <= |x| < 28)."""
    a = g.op("Abs", x)
    z = g.op("Mul", x, x)
    y = g.op("Div", _poly(g, z, _PP), _poly(g, z, _QQ))
    s = g.op("Sub", a, _c(g, 1.0))
    pq = g.op("Div", _poly(g, s, _PA), _poly(g, s, _QA))
    inv = g.op("Div", _c(g, 1.0), g.op("Mul", a, a))
    rs = g.op("Where", g.op("Less", a, _c(g, _SPLIT)),
              g.op("Div", _poly(g, inv, _RA), _poly(g, inv, _SA)),
              g.op("Div", _poly(g, inv, _RB), _poly(g, inv, _SB)))
    short = g.op("Cast", g.op("Cast", a, to_i=1), to_i=11)  # |x| rounded to 24 bits
    head = g.op("Exp", g.op("Sub", _c(g, -0.5625), g.op("Mul", short, short)))
    rest = g.op("Exp", g.op("Add", g.op("Mul", g.op("Sub", short, a), g.op("Add", short, a)), rs))
    tail = g.op("Div", g.op("Mul", head, rest), a)
    return a, g.op("Less", x, _c(g, 0.0)), y, pq, tail


def _pick(g, x, a, small, middle, tail, large):
    value = g.op("Where", g.op("Less", a, _c(g, _LARGE)), tail, large)
    value = g.op("Where", g.op("Less", a, _c(g, _MIDDLE)), middle, value)
    value = g.op("Where", g.op("Less", a, _c(g, _SMALL)), small, value)
    return g.op("Where", g.op("IsNaN", x), x, value)


def erfc_double(g, x):
    """erfc(x) of a float64 ``x``, within about an ulp of libm."""
    one, half = _c(g, 1.0), _c(g, 0.5)
    a, negative, y, pq, tail = _regions(g, x)
    xy = g.op("Mul", x, y)
    # x < 1/4 (negative x included): 1 - (x + x y); else 1/2 - (x y + (x - 1/2)): no cancellation
    small = g.op("Where", g.op("Less", x, _c(g, 0.25)), g.op("Sub", one, g.op("Add", x, xy)),
                 g.op("Sub", half, g.op("Add", xy, g.op("Sub", x, half))))
    middle = g.op("Where", negative, g.op("Add", one, g.op("Add", _c(g, _ERX), pq)),
                  g.op("Sub", _c(g, 1.0 - _ERX), pq))
    two = _c(g, 2.0)
    tail = g.op("Where", negative, g.op("Sub", two, tail), tail)
    large = g.op("Where", negative, two, _c(g, 0.0))
    return _pick(g, x, a, small, middle, tail, large)


def erf_double(g, x, *, signed_zero: bool = False):
    """erf(x) of a float64 ``x``, within about an ulp of libm. erf(-0.0) is +0.0 (Where
    drops the sign) unless ``signed_zero``: then the result's sign is set from x's sign bit
    by a multiplication (erf is odd and keeps its argument's sign)."""
    one = _c(g, 1.0)
    a, negative, y, pq, tail = _regions(g, x)
    tiny = g.op("Mul", _c(g, 0.125), g.op("Add", g.op("Mul", _c(g, 8.0), x), g.op("Mul", _c(g, _EFX8), x)))
    small = g.op("Where", g.op("Less", a, _c(g, _TINY)), tiny, g.op("Add", x, g.op("Mul", x, y)))
    erx_pq = g.op("Add", _c(g, _ERX), pq)
    middle = g.op("Where", negative, g.op("Sub", _c(g, 0.0), erx_pq), erx_pq)
    tail = g.op("Where", negative, g.op("Sub", tail, one), g.op("Sub", one, tail))
    large = g.op("Where", negative, _c(g, -1.0), one)
    value = _pick(g, x, a, small, middle, tail, large)
    if not signed_zero:
        return value
    sign_bit = g.op("Or", negative, g.op("Less", g.op("Div", one, x), _c(g, 0.0)))  # 1 / -0.0 is -inf
    return g.op("Mul", g.op("Abs", value), g.op("Where", sign_bit, _c(g, -1.0), one))


def gelu_double(g, x, approximate: str = "none"):
    """torch's gelu of a float64 ``x`` as its CPU kernel computes it: x / 2 (1 + erf(x
    sqrt(1/2))) with :func:`erf_double`, or in ``"tanh"`` mode x / 2 (1 + tanh(sqrt(2 / pi)
    (x + 0.044715 x^3))): x / 2 first, so x near the largest double does not overflow."""
    one, half_x = _c(g, 1.0), g.op("Mul", x, _c(g, 0.5))
    if approximate == "tanh":
        cube = g.op("Mul", g.op("Mul", x, x), x)
        inner = g.op("Mul", _c(g, 0.7978845608028654), g.op("Add", x, g.op("Mul", _c(g, 0.044715), cube)))
        return g.op("Mul", half_x, g.op("Add", one, g.op("Tanh", inner)))
    return g.op("Mul", half_x, g.op("Add", one, erf_double(g, g.op("Mul", x, _c(g, 0.7071067811865476)))))
