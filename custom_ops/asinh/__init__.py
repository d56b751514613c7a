"""asinh(x): the tutorial's ATen op without an export rule, as a graphkit placeholder.

Two ways out of a torch model (see README, "Export"):

- ``torch.asinh(x)`` in a model exports as the standard ``Asinh`` node: graphkit's export
  registers a symbolic for ``aten::asinh`` for the call only (one entry of
  ``graphkit.export.GAP_FILLERS``).
- ``custom::asinh`` (this op) is written instead when the model calls graphkit's op
  (``TorchOps().asinh(x)``) or when the export is asked for it without touching the model
  (``export(..., placeholders=["asinh"])``, ``graphkit export ... --placeholder asinh``).
  The placeholder is then lowered per target: ``Asinh`` at opset >= 9, the ``log_sqrt``
  composition at opsets 7-8, and anywhere with the rules in :mod:`graphkit_ops.asinh.no_asinh`
  (``graphkit rewrite ... --rules graphkit_ops.asinh.no_asinh``) for runtimes without Asinh;
  or bound to the numpy kernel (``--bind python``).

``log_sqrt`` computes ``sign(x) * log(|x| + sqrt(x*x + 1))``, the cancellation-free form of
``log(x + sqrt(x*x + 1))``: for x = -100 the textbook form subtracts two numbers near 100
and loses three digits in float32 (error ~1e-3); this one stays within a few ulps. Both
overflow in ``x*x`` for |x| > ~1.8e19 in float32 (the result is then inf, asinh is ~44.7).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from graphkit.ops import Decomposition, OpDef, Param

FLOATS = ("tensor(float16)", "tensor(float)", "tensor(double)")


def reference(x):
    """The torch semantics."""
    import torch

    return torch.asinh(x)


def python_kernel(x):
    """The numpy kernel run by ONNX Runtime through onnxruntime-extensions."""
    import numpy as np

    return np.arcsinh(x)


def standard_asinh(builder, inputs: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
    """The standard ONNX op (opset 9 and later); for double inputs the ``log_sqrt``
    composition, which is exact in double: ONNX Runtime's CPU provider implements Asinh
    for float and float16 only ("Could not find an implementation for Asinh(9)")."""
    import onnx

    from graphkit.errors import RewriteError

    try:
        double = builder.dtype(inputs[0]) == onnx.TensorProto.DOUBLE
    except RewriteError:  # unknown type (a function body): the standard op
        double = False
    return log_sqrt(builder, inputs, attrs) if double else [builder.op("Asinh", inputs[0])]


def log_sqrt(builder, inputs: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
    """sign(x) * log(|x| + sqrt(x*x + 1)) with ops every runtime has (opset 7 and later).

    The sign is ``Sign(x)`` from opset 9 on, ``1 - 2 * Cast(x < 0)`` before (Sign is new in
    opset 9), so negative inputs do not cancel and asinh(0) = 0 exactly.
    """
    x = inputs[0]
    one = builder.constant(1, like=x)
    magnitude = builder.op("Abs", x)
    root = builder.op("Sqrt", builder.op("Add", builder.op("Mul", x, x), one))
    value = builder.op("Log", builder.op("Add", magnitude, root))
    if builder.opset >= 9:
        sign = builder.op("Sign", x)
    else:
        negative = builder.op("Cast", builder.op("Less", x, builder.constant(0, like=x)),
                              to=builder.dtype(x))
        sign = builder.op("Sub", one, builder.op("Mul", builder.constant(2, like=x), negative))
    return [builder.op("Mul", sign, value)]


ASINH = OpDef(
    name="asinh",
    doc="Inverse hyperbolic sine, elementwise: asinh(x) = log(x + sqrt(x*x + 1)).",
    inputs=(Param("x", "T"),),
    outputs=(Param("y", "T"),),
    type_constraints={"T": FLOATS},
    reference=reference,
    infer_shapes=lambda shapes, attrs: [shapes[0]],
    python_kernel=python_kernel,
    decompositions=(
        Decomposition("asinh", standard_asinh, min_opset=9),
        Decomposition("log_sqrt", log_sqrt, min_opset=7),
    ),
)

__all__ = ["ASINH", "log_sqrt", "python_kernel", "reference", "standard_asinh"]
