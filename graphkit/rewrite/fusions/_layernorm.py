"""LayerNorm written with elementary ops -> LayerNormalization (opset >= 17).

    y = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * scale + bias

over the last axis, the way torch's exporters decompose ``nn.LayerNorm`` below opset 17
and the way hand-written LayerNorms (the original BERT code) always export. The mean's
axes come from an attribute (opset < 18) or a constant input (opset >= 18); the square
from Pow(d, 2) or Mul(d, d); eps may be absent (epsilon 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphkit.rewrite import MatchContext, MatchResult, Rule, const, either
from graphkit.rewrite.fusions._common import float_tensor, needs_opset, scalar


def pattern_axes_attribute(op, x, axes, var_axes, eps, scale, bias):
    d = op.Sub(x, op.ReduceMean(x, axes=axes, keepdims=1))
    var = op.ReduceMean(either(op.Pow(d, 2.0), op.Mul(d, d)), axes=var_axes, keepdims=1)
    std = op.Sqrt(either(op.Add(var, const(eps)), var))
    return op.Add(op.Mul(op.Div(d, std), scale), bias)


def pattern_axes_input(op, x, axes, var_axes, eps, scale, bias):
    d = op.Sub(x, op.ReduceMean(x, const(axes), keepdims=1))
    var = op.ReduceMean(either(op.Pow(d, 2.0), op.Mul(d, d)), const(var_axes), keepdims=1)
    std = op.Sqrt(either(op.Add(var, const(eps)), var))
    return op.Add(op.Mul(op.Div(d, std), scale), bias)


def _last_axis(axes: Any, rank: int | None) -> bool:
    if axes is None:
        return False
    values = [int(a) for a in np.asarray(axes).reshape(-1)]
    return len(values) == 1 and (values[0] == -1 or (rank is not None and values[0] == rank - 1))


def check(ctx: MatchContext, x, axes, var_axes, eps, scale, bias) -> MatchResult:
    if not (ok := needs_opset(ctx, 17, "LayerNormalization")):
        return ok
    if not (ok := float_tensor(ctx, x, "input")):
        return ok
    rank = ctx.rank(x)
    for what, value in (("mean", axes), ("variance", var_axes)):
        if not _last_axis(value, rank):
            shown = None if value is None else np.asarray(value).reshape(-1).tolist()
            return MatchResult().fail(f"the {what} reduces over axes {shown}, not the last axis only")
    if eps is not None and scalar(eps) is None:
        return MatchResult().fail(f"epsilon is not a single value (shape {list(np.shape(eps))})")
    shape = ctx.shape(x)
    last = shape[-1] if shape else None
    for what, name in (("scale", scale), ("bias", bias)):
        if ctx.dtype(name) != ctx.dtype(x):
            return MatchResult().fail(f"{what} '{name}' has another element type than the input")
        s = ctx.shape(name)
        if s is None or len(s) != 1 or not isinstance(last, int) or s[0] != last:
            return MatchResult().fail(f"{what} '{name}' has shape {s}, LayerNormalization needs [{last}] "
                                      "(the input's last dimension)")
    return MatchResult()


def rewrite(op, x, axes, var_axes, eps, scale, bias):
    return op.LayerNormalization(x, scale, bias, axis=-1, epsilon=scalar(eps) or 0.0)


RULES = (Rule("layernorm", [pattern_axes_attribute, pattern_axes_input], rewrite, check=check, commute=True),)
