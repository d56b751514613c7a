"""custom::rms_norm: RMS normalization over the last axis, as an op package for graphkit.

    inv_rms = 1 / sqrt(mean(x * x, axis=-1, keepdims=True) + epsilon)
    y       = x * inv_rms * weight          (weight optional, shape x.shape[-1:])

Two outputs (y, and inv_rms for a backward pass or a later layer), an optional input, a
float attribute, a C++ kernel (rms_norm.cc), a numpy kernel, a decomposition into
standard ONNX ops (opset 18: ReduceMean takes its axes as an input) and the torch
reference. The torch op is ``torch.ops.acme.rms_norm``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from graphkit.ops import Attr, AttrType, Decomposition, NativeKernels, OpDef, OpPackage, Param

FLOATS = ("tensor(float)", "tensor(double)")


def reference(x, weight, epsilon):
    """The torch semantics (plain torch ops, so it also runs on fake tensors)."""
    import torch

    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    y = x * inv_rms
    if weight is not None:
        y = y * weight
    return y, inv_rms


def python_kernel(x, weight, epsilon):
    """The numpy kernel; ``weight`` is an empty array when the node omits it."""
    import numpy as np

    acc = np.float64 if x.dtype == np.float64 else np.float32
    mean = np.mean(np.square(x, dtype=acc), axis=-1, keepdims=True)
    inv_rms = (1.0 / np.sqrt(mean + acc(epsilon))).astype(x.dtype)
    y = x * inv_rms
    if weight is not None and weight.size:
        y = y * weight
    return y.astype(x.dtype, copy=False), inv_rms


def infer_shapes(shapes: list[Any], attrs: Mapping[str, Any]) -> list[Any]:
    x = shapes[0]
    if x is None:
        return [None, None]
    if not x:
        raise ValueError("x must have at least one dimension")
    weight = shapes[1] if len(shapes) > 1 else None
    if weight is not None and (len(weight) != 1 or (isinstance(weight[0], int) and isinstance(x[-1], int)
                                                     and weight[0] != x[-1])):
        raise ValueError(f"weight must have shape [{x[-1]}], got {weight}")
    return [list(x), [*x[:-1], 1]]


def decompose(builder, inputs: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
    """ReduceMean (axes as an input: opset 18), Sqrt, Reciprocal, Mul."""
    import onnx

    x = inputs[0]
    weight = inputs[1] if len(inputs) > 1 else ""
    axes = builder.constant([-1], dtype=onnx.TensorProto.INT64)
    mean = builder.op("ReduceMean", builder.op("Mul", x, x), axes, keepdims=1)
    inv_rms = builder.op("Reciprocal", builder.op("Sqrt", builder.op(
        "Add", mean, builder.constant(attrs["epsilon"], like=x))))
    y = builder.op("Mul", x, inv_rms)
    if weight:
        y = builder.op("Mul", y, weight)
    return [y, inv_rms]


RMS_NORM = OpDef(
    name="rms_norm",
    doc="RMS normalization over the last axis: y = x / sqrt(mean(x^2) + epsilon) * weight.",
    inputs=(Param("x", "T", "(..., D)"), Param("weight", "T", "(D,)", optional=True)),
    outputs=(Param("y", "T", "(..., D)"), Param("inv_rms", "T", "(..., 1)")),
    type_constraints={"T": FLOATS},
    attributes=(Attr("epsilon", AttrType.FLOAT, 1e-6, "added to the mean square"),),
    reference=reference,
    infer_shapes=infer_shapes,
    python_kernel=python_kernel,
    native=True,
    decompositions=(Decomposition("reduce_mean", decompose, min_opset=18),),
    torch_namespace="acme",
)

PACKAGE = OpPackage(
    name="rms_norm_ops",
    ops=(RMS_NORM,),
    native=NativeKernels(root=Path(__file__).parent, sources=("rms_norm.cc",)),
    doc="RMS normalization for graphkit",
)

__all__ = ["PACKAGE", "RMS_NORM", "decompose", "infer_shapes", "python_kernel", "reference"]
