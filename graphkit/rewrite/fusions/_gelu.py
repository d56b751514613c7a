"""GELU written with elementary ops -> Gelu (opset >= 20).

erf form:  x * 0.5 * (1 + erf(x / sqrt(2)))  (or x * 0.7071...)    -> Gelu(x)
tanh form: x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))  -> Gelu(x, approximate="tanh")

Both in the orders torch's exporters and hand-written GELUs produce (the 0.5 applied to
the product, the factor or x; x^3 as Pow(x, 3) or x * (x * x)); the constants are compared
at the model's precision.
"""

from __future__ import annotations

import math

from graphkit.rewrite import MatchContext, MatchResult, Rule, either
from graphkit.rewrite.fusions._common import float_tensor, needs_opset

SQRT_2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _erf_factor(op, x):
    return op.Add(op.Erf(either(op.Div(x, SQRT_2), op.Mul(x, 1.0 / SQRT_2))), 1.0)


def _tanh_factor(op, x):
    cube = either(op.Pow(x, 3.0), op.Mul(x, op.Mul(x, x)))
    return op.Add(op.Tanh(op.Mul(op.Add(x, op.Mul(cube, 0.044715)), SQRT_2_OVER_PI)), 1.0)


# 0.5 * x * factor: the 0.5 applied last (TorchScript's nn.GELU), to the factor first
# (torch.export's nn.GELU) or to x first (hand-written: GPT-2's gelu_new, BERT's gelu)
def erf_half_last(op, x):
    return op.Mul(op.Mul(x, _erf_factor(op, x)), 0.5)


def erf_half_first(op, x):
    return op.Mul(x, op.Mul(_erf_factor(op, x), 0.5))


def erf_half_x(op, x):
    return op.Mul(op.Mul(x, 0.5), _erf_factor(op, x))


def tanh_half_last(op, x):
    return op.Mul(op.Mul(x, _tanh_factor(op, x)), 0.5)


def tanh_half_first(op, x):
    return op.Mul(x, op.Mul(_tanh_factor(op, x), 0.5))


def tanh_half_x(op, x):
    return op.Mul(op.Mul(x, 0.5), _tanh_factor(op, x))


def check(ctx: MatchContext, x) -> MatchResult:
    if not (ok := needs_opset(ctx, 20, "Gelu")):
        return ok
    return float_tensor(ctx, x, "input")


def rewrite_erf(op, x):
    return op.Gelu(x)


def rewrite_tanh(op, x):
    return op.Gelu(x, approximate="tanh")


RULES = (Rule("gelu_erf", [erf_half_last, erf_half_first, erf_half_x], rewrite_erf, check=check, commute=True),
         Rule("gelu_tanh", [tanh_half_last, tanh_half_first, tanh_half_x], rewrite_tanh, check=check, commute=True))
