"""The types a gap filler computes in: a TorchScript value's torch dtype, constants of a
value's type, casts, torch's type promotion over an ATen op's arguments, and
:func:`floating` (a symbolic computed in the floating dtype torch's CPU kernels use)."""

from __future__ import annotations

import functools

import torch

__all__ = ["ELEMENT_TYPES", "ONNX_TYPES", "SCALAR_TYPES", "SMALL_INTEGERS", "cast_to", "compute_type", "const",
           "dtype_of", "floating", "is_float", "result_dtype"]


_DTYPES = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16,
           "BFloat16": torch.bfloat16, "Long": torch.int64, "Int": torch.int32,
           "Short": torch.int16, "Char": torch.int8, "Byte": torch.uint8, "Bool": torch.bool}
ONNX_TYPES = {torch.float32: 1, torch.float64: 11, torch.float16: 10, torch.bfloat16: 16}


def dtype_of(v) -> torch.dtype | None:
    try:
        return _DTYPES.get(v.type().scalarType())
    except (AttributeError, RuntimeError):
        return None


def _rank(v) -> int | None:
    try:
        return v.type().dim()
    except (AttributeError, RuntimeError):
        return None


def is_float(v) -> bool:
    return dtype_of(v) in ONNX_TYPES


def const(g, value, like):
    """A constant holding ``value`` with ``like``'s element type."""
    dtype = dtype_of(like)
    if dtype is None and g.opset >= 15:
        return g.op("CastLike", g.op("Constant", value_t=torch.tensor(value, dtype=torch.float32)), like)
    return g.op("Constant", value_t=torch.tensor(value, dtype=dtype or torch.float32))


def result_dtype(g, values, *, floating: bool = True) -> torch.dtype | None:
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
        dtype = dtype_of(v)
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


SMALL_INTEGERS = (torch.int8, torch.uint8, torch.int16)


def floating(fn, *, tensors: int = 1, promote: int | None = None, exact_float32: bool = False,
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
        out = result_dtype(g, args[:promote], floating=not integers)
        if out in SMALL_INTEGERS:  # ONNX Runtime lacks most 8- and 16-bit integer kernels
            cast = [cast_to(g, a, torch.int64) for a in args[:tensors]]
            return cast_to(g, fn(g, *cast, *args[tensors:]), out)
        if out is None or not out.is_floating_point:  # unknown types (scripted code): as written
            return fn(g, *args)
        work = torch.float32 if out in (torch.float16, torch.bfloat16) else out
        if result is not None:
            out = result_dtype(g, args[:result], floating=not integers) or out
        if exact_float32 and work == torch.float32:
            work = torch.float64
        cast = [cast_to(g, a, work) for a in args[:tensors]]
        return cast_to(g, fn(g, *cast, *args[tensors:]), out)

    return symbolic


# torch's ScalarType numbering (a `dtype=` argument reaches a symbolic as this int) and the
# ONNX element type of each dtype.
SCALAR_TYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64,
                 5: torch.float16, 6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16}
ELEMENT_TYPES = {torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 5, torch.int32: 6,
                  torch.int64: 7, torch.bool: 9, torch.float16: 10, torch.float64: 11, torch.bfloat16: 16}


def cast_to(g, v, dtype: torch.dtype | None):
    """``v`` as ``dtype`` (no node when it already is, or when either type is unknown)."""
    if dtype is None or dtype_of(v) in (None, dtype):
        return v
    return g.op("Cast", v, to_i=ELEMENT_TYPES[dtype])


def compute_type(dtype: torch.dtype | None) -> torch.dtype | None:
    """The type ONNX Runtime's CPU kernels for Sub and CumSum compute ``dtype`` in: float16
    and bfloat16 in float32 (one rounding at the end, as torch's CPU kernels), 8- and 16-bit
    integers in int64 (the final Cast wraps around as torch does)."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if dtype in (torch.uint8, torch.int8, torch.int16):
        return torch.int64
    return dtype
