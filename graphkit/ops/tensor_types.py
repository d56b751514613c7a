"""ONNX tensor type strings ('tensor(float)'), element types (TensorProto.FLOAT) and numpy dtypes.

The one table graphkit converts between them with (op type constraints are type strings;
models carry element types; kernels see numpy dtypes).
"""

from __future__ import annotations

import numpy as np
import onnx

__all__ = ["elem_type", "numpy_dtype", "type_string"]


def elem_type(type_str: str) -> int | None:
    """'tensor(float)' -> TensorProto.FLOAT; None for anything else."""
    if not (isinstance(type_str, str) and type_str.startswith("tensor(") and type_str.endswith(")")):
        return None
    value = getattr(onnx.TensorProto, type_str[len("tensor("):-1].upper(), None)
    return value if isinstance(value, int) else None


def type_string(elem: int) -> str | None:
    """TensorProto.FLOAT16 -> 'tensor(float16)'; None for an unknown element type."""
    try:
        return f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"
    except ValueError:
        return None


def numpy_dtype(type_str: str) -> np.dtype | None:
    """'tensor(float)' -> float32; None for non-tensor types or ones numpy lacks."""
    elem = elem_type(type_str)
    if elem is None:
        return None
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
    except (KeyError, TypeError, ValueError):
        return None
