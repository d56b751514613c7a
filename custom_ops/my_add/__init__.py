"""my_add(a, b) = 2a + b: the tutorial's brand-new op with a C++ forward.

Kernels beside this file: my_add.cc (ONNX Runtime, native library) and
my_add_torch.cpp (the torch C++ extension forward).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from graphkit.ops import Decomposition, OpDef, Param, broadcast

FLOATS = ("tensor(float16)", "tensor(float)", "tensor(double)")


def reference(a, b):
    """The torch semantics (plain torch ops, so it also runs on fake tensors)."""
    return 2 * a + b


def _torch_forward():
    from graphkit.export.extension import load_extension

    return load_extension("my_add", __name__, ["my_add_torch.cpp"]).my_add


def python_kernel(a, b):
    """The numpy kernel run by ONNX Runtime through onnxruntime-extensions."""
    import numpy as np

    y = np.multiply(a, a.dtype.type(2))
    if isinstance(y, np.ndarray) and y.shape == np.broadcast_shapes(a.shape, b.shape):
        return np.add(y, b, out=y)  # in place: one allocation less per call
    return np.add(y, b)


# float16 a with |a| above this doubles past float16's largest value (65504): torch's 2 * a
# is inf there. ONNX Runtime runs float16 Mul and Add in float32 between casts it inserts
# (and removes any Cast pair that would round 2a), so the decomposition overflows by hand.
_FLOAT16_HALF_MAX = 32752.0


def _mul_add(builder, inputs: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
    from onnx import TensorProto

    from graphkit.errors import RewriteError

    a, b = inputs
    try:
        half = builder.dtype(a) == TensorProto.FLOAT16
    except RewriteError:  # type unknown (a function body): as written
        half = False
    if half:
        # 2a rounded to float16 first, as torch: +-inf where |a| > 32752 (my_add(65504, -inf)
        # is NaN), by a / 0 there (a / 1 elsewhere; opset 7 has no Where). Elsewhere 2a is
        # exact and 2a + b rounded once from float32 is float16's correctly rounded sum
        # (24 >= 2 * 11 + 2 bits: double rounding is innocuous).
        over = builder.op("Greater", builder.op("Abs", a), builder.constant(_FLOAT16_HALF_MAX, like=a))
        divisor = builder.op("Sub", builder.constant(1, like=a), builder.op("Cast", over, to=TensorProto.FLOAT16))
        a = builder.op("Div", a, divisor)
    y = builder.op("Add", builder.op("Mul", a, builder.constant(2, like=inputs[0])), b)
    return [y]


MY_ADD = OpDef(
    name="my_add",
    doc=("Returns 2 * a + b, with numpy broadcasting, rounded as torch does: 2a first (in "
         "float16 it overflows to inf for |a| > 32752, so my_add(65504, -inf) is NaN), then "
         "the sum, in every lowering and dtype."),
    inputs=(Param("a", "T"), Param("b", "T")),
    outputs=(Param("y", "T"),),
    type_constraints={"T": FLOATS},
    reference=reference,
    infer_shapes=lambda shapes, attrs: [broadcast(*shapes)],
    torch_forward=_torch_forward,
    python_kernel=python_kernel,
    native=True,
    decompositions=(Decomposition("mul_add", _mul_add, min_opset=7),),
)
