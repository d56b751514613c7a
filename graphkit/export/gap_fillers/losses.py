"""Gap fillers of losses (reduction none, mean, sum; integer sums wrapping around as
torch's) and of broadcast_tensors, which ``F.l1_loss`` calls (:data:`ROWS`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.onnx import symbolic_helper

from graphkit.export.aten import GapFiller
from graphkit.export.gap_fillers.blocks import exact_log1p
from graphkit.export.gap_fillers.dtypes import (ELEMENT_TYPES, SMALL_INTEGERS, cast_to, const, dtype_of, floating,
                                               result_dtype)
from graphkit.export.gap_fillers.examples import binary_inputs, example

__all__ = ["ROWS"]


def _reduce(g, x, reduction: int):
    """torch's loss reduction: 0 none, 1 mean, 2 sum (over every element, to a scalar)."""
    if reduction == 0:
        return x
    if dtype_of(x) in (torch.int32, *SMALL_INTEGERS):  # torch sums integers in int64
        x = cast_to(g, x, torch.int64)
    if reduction == 2 and dtype_of(x) == torch.int64:
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
    out = result_dtype(g, (x, target), floating=False)
    if out not in SMALL_INTEGERS:
        return floating(_l1_loss, tensors=2, integers=True)(g, x, target, reduction)

    def wrapped(v):
        return cast_to(g, g.op("Cast", v, to_i=ELEMENT_TYPES[out]), torch.int64)

    d = wrapped(g.op("Sub", cast_to(g, x, torch.int64), cast_to(g, target, torch.int64)))
    value = _reduce(g, wrapped(g.op("Abs", d)), symbolic_helper._maybe_get_const(reduction, "i"))
    return value if dtype_of(value) != torch.int64 or symbolic_helper._maybe_get_const(reduction, "i") \
        else g.op("Cast", value, to_i=ELEMENT_TYPES[out])


@symbolic_helper.parse_args("v", "v", "i", "f")
def _smooth_l1_loss(g, x, target, reduction, beta):
    d = g.op("Abs", g.op("Sub", x, target))
    if beta == 0.0:
        return _reduce(g, d, reduction)
    quadratic = g.op("Div", g.op("Mul", const(g, 0.5, x), g.op("Mul", d, d)), const(g, beta, x))
    linear = g.op("Sub", d, const(g, 0.5 * beta, x))
    return _reduce(g, g.op("Where", g.op("Less", d, const(g, beta, x)), quadratic, linear), reduction)


@symbolic_helper.parse_args("v", "v", "i", "f")
def _huber_loss(g, x, target, reduction, delta):
    d = g.op("Abs", g.op("Sub", x, target))
    quadratic = g.op("Mul", const(g, 0.5, x), g.op("Mul", d, d))
    linear = g.op("Mul", const(g, delta, x), g.op("Sub", d, const(g, 0.5 * delta, x)))
    return _reduce(g, g.op("Where", g.op("Less", d, const(g, delta, x)), quadratic, linear), reduction)


@symbolic_helper.parse_args("v", "v", "i")
def _soft_margin_loss(g, x, target, reduction):
    # torch's log1p(exp(-x t)), overflow included (ONNX Runtime has no double Softplus)
    return _reduce(g, exact_log1p(g, g.op("Exp", g.op("Neg", g.op("Mul", x, target)))), reduction)


_LOSS_REDUCTIONS = ("mean", "sum", "none")


def _plus_minus_one(t):
    """soft_margin_loss's targets: -1 where t < 0, else 1."""
    return torch.where(t < 0, -torch.ones_like(t), torch.ones_like(t))


def _loss_examples(fn, **kwargs):
    return tuple(example(lambda x, t, r=r: fn(x, t, reduction=r, **kwargs), binary_inputs(1.5), r)
                 for r in _LOSS_REDUCTIONS)


def _broadcast_inputs(gen: torch.Generator):
    return torch.randn(3, 1, generator=gen) * 3, torch.randn(1, 4, generator=gen) * 3


ROWS = [
    # losses (reduction none, mean, sum)
    GapFiller("aten::broadcast_tensors", 9, _broadcast_tensors, "Expand(t, Shape(sum of int64 zeros))",
              (example(lambda x, y: torch.broadcast_tensors(x, y)[1], binary_inputs(3), "same shapes"),
               example(lambda x, y: torch.cat(torch.broadcast_tensors(x, y)), _broadcast_inputs),
               example(lambda x, y: torch.cat(torch.broadcast_tensors(x > 0, y > 0)), _broadcast_inputs, "bool")),
              replaces="torch finds the shape by adding zeros of the tensors' type: an int8, "
                       "int16 or uint8 Add before opset 14 and a bool Add (no ONNX Runtime kernel)"),
    GapFiller("aten::l1_loss", 9, _l1_loss_any, "Abs(x - t), reduced", _loss_examples(F.l1_loss),
              semantics="integer sums wrap around as torch's (ONNX Runtime's int64 ReduceSum "
                        "saturates); before opset 11 exactly so for fewer than 2^21 elements"),
    GapFiller("aten::smooth_l1_loss", 9, floating(_smooth_l1_loss, tensors=2),
              "Where(|d| < beta, d^2 / 2 beta, |d| - beta / 2)",
              _loss_examples(F.smooth_l1_loss, beta=0.7)
              + (example(lambda x, t: F.smooth_l1_loss(x, t, beta=0.0), binary_inputs(1.5), "beta=0"),)),
    GapFiller("aten::huber_loss", 9, floating(_huber_loss, tensors=2, result=1),
              "Where(|d| < delta, d^2 / 2, delta (|d| - delta / 2))", _loss_examples(F.huber_loss, delta=0.8)),
    GapFiller("aten::soft_margin_loss", 11, floating(_soft_margin_loss, tensors=2, result=1), "Log1p(Exp(-x t)), reduced",
              tuple(example(lambda x, t, r=r: F.soft_margin_loss(x, _plus_minus_one(t), reduction=r),
                        binary_inputs(1.5), r) for r in _LOSS_REDUCTIONS),
              # the mean and sum reductions add in another order than torch
              tolerance={"float32": (1e-6, 2.9e-45), "float64": (2e-15, 1e-323)}),
]
