"""asinh(x): the tutorial's ATen op without an export rule, as a graphkit placeholder.

Two ways out of a torch model (see docs/export.md, "asinh"):

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

``log_sqrt`` computes asinh to a few ulps over every float type's whole range (see its
docstring): the textbook ``log(x + sqrt(x*x + 1))`` loses three digits at x = -100 in
float32, returns 0 below |x| ~ 6e-8 (1e-20 in float64) and inf where ``x*x`` overflows.
Every lowering agrees with ``torch.asinh`` within :attr:`ASINH.tolerance`, signed zeros
included (tests/test_edges.py).
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
    composition (correct to a few ulps in double): ONNX Runtime's CPU provider implements
    Asinh for float and float16 only ("Could not find an implementation for Asinh(9)")."""
    import onnx

    from graphkit.errors import RewriteError

    try:
        double = builder.dtype(inputs[0]) == onnx.TensorProto.DOUBLE
    except RewriteError:  # unknown type (a function body): the standard op
        double = False
    return log_sqrt(builder, inputs, attrs) if double else [builder.op("Asinh", inputs[0])]


def _as_type_of(builder, flag: str, x: str) -> str:
    """Bool tensor ``flag`` as 0/1 of ``x``'s element type."""
    from graphkit.errors import RewriteError

    try:
        return builder.op("Cast", flag, to=builder.dtype(x))
    except RewriteError:
        if builder.opset < 15:
            raise
        return builder.op("CastLike", flag, x)


def _log1p(builder, u: str, like: str) -> str:
    """log(1 + u) for u >= 0 (of ``like``'s type) without cancellation and without Where
    (opset 7): u * log(w) / (w - 1) with w = 1 + u rounded; u itself where w rounds to 1."""
    one = builder.constant(1, like=like)
    w = builder.op("Add", one, u)
    d = builder.op("Sub", w, one)
    exact = _as_type_of(builder, builder.op("Not", builder.op("Greater", d, builder.constant(0, like=like))), like)
    ratio = builder.op("Div", builder.op("Log", w), builder.op("Add", d, exact))  # no 0 / 0
    return builder.op("Add", builder.op("Mul", exact, u),
                      builder.op("Mul", builder.op("Sub", one, exact), builder.op("Mul", u, ratio)))


def log_sqrt(builder, inputs: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
    """asinh with ops every runtime has (opset 7 and later, every float type),
    exact to a few ulps over the whole range, for every float type:

    - |x| < 1: log1p(|x| + x^2 / (1 + sqrt(1 + x^2))) (no cancellation; asinh(1e-20) is
      1e-20, not log(1 + 1e-20) = 0);
    - |x| >= 1: log|x| + log(1 + sqrt(1 + 1/x^2)) (no overflow: asinh(1e300) is 691.47,
      not log(inf));
    - x's sign bit restored by a multiplication (asinh(-0.0) is -0.0), not Sign (0 for
      -0.0) nor Where (ONNX Runtime's Where drops -0.0 from its true branch).

    The branches are blended with 0/1 weights of clamped inputs, so both stay finite.
    """
    x = inputs[0]
    one = builder.constant(1, like=x)
    zero = builder.constant(0, like=x)
    magnitude = builder.op("Abs", x)
    is_small = _as_type_of(builder, builder.op("Less", magnitude, one), x)
    # min(|x|, 1) and max(|x|, 1) as |x|^w with w in {0, 1} (pow(v, 0) is 1 even for inf and
    # NaN): finite in the branch not taken, and opset 7 has no double Min, Max or Clip
    small = builder.op("Pow", magnitude, is_small)
    large = builder.op("Pow", magnitude, builder.op("Sub", one, is_small))
    square = builder.op("Mul", small, small)
    root = builder.op("Add", one, builder.op("Sqrt", builder.op("Add", one, square)))
    below = _log1p(builder, builder.op("Add", small, builder.op("Div", square, root)), x)
    inverse = builder.op("Div", one, large)
    tail = builder.op("Sqrt", builder.op("Add", one, builder.op("Mul", inverse, inverse)))
    above = builder.op("Add", builder.op("Log", large), builder.op("Log", builder.op("Add", one, tail)))
    value = builder.op("Add", builder.op("Mul", is_small, below),
                       builder.op("Mul", builder.op("Sub", one, is_small), above))
    # the sign bit: x < 0, or 1 / x < 0 for -0.0 (a NaN's sign is not visible: NaN stays NaN)
    negative = builder.op("Or", builder.op("Less", x, zero),
                          builder.op("Less", builder.op("Div", one, x), zero))
    sign = builder.op("Sub", one, builder.op("Mul", builder.constant(2, like=x),
                                             _as_type_of(builder, negative, x)))
    return [builder.op("Mul", value, sign)]


ASINH = OpDef(
    name="asinh",
    doc="Inverse hyperbolic sine, elementwise: asinh(x) = log(x + sqrt(x*x + 1)).",
    inputs=(Param("x", "T"),),
    outputs=(Param("y", "T"),),
    type_constraints={"T": FLOATS},
    reference=reference,
    infer_shapes=lambda shapes, attrs: [shapes[0]],
    python_kernel=python_kernel,
    # log_sqrt rounds at each step: a few ulps (measured worst 2.4e-7 in float32, 4e-16 in float64)
    tolerance={"float32": (4.8e-7, 2.9e-45), "float64": (9e-16, 1e-323)},
    decompositions=(
        Decomposition("asinh", standard_asinh, min_opset=9),
        Decomposition("log_sqrt", log_sqrt, min_opset=7),
    ),
)

__all__ = ["ASINH", "log_sqrt", "python_kernel", "reference", "standard_asinh"]
