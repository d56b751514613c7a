"""Preconditions shared by the fusions: element types, opsets, axes."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto

from graphkit.rewrite import MatchContext, MatchResult

FLOATS = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE})


def needs_opset(ctx: MatchContext, version: int, op: str) -> MatchResult:
    if ctx.opset < version:
        return MatchResult().fail(f"{op} needs ai.onnx opset >= {version}, the model has {ctx.opset} "
                                  f"(convert it first: --target-opset {version})")
    return MatchResult()


def float_tensor(ctx: MatchContext, name: str, what: str) -> MatchResult:
    elem = ctx.dtype(name)
    if elem is None:
        return MatchResult().fail(f"element type of {what} '{name}' is unknown")
    if elem not in FLOATS:
        return MatchResult().fail(f"{what} '{name}' is {TensorProto.DataType.Name(elem).lower()}, "
                                  "not a floating-point tensor")
    return MatchResult()


def scalar(value: Any) -> float | None:
    """The one value of a constant holding a single element (any shape), else None."""
    if value is None:
        return None
    array = np.asarray(value)
    return float(array.reshape(-1)[0]) if array.size == 1 else None

