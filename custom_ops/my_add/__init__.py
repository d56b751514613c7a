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


def _mul_add(builder, inputs: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
    a, b = inputs
    two = builder.constant(2, like=a)
    return [builder.op("Add", builder.op("Mul", a, two), b)]


MY_ADD = OpDef(
    name="my_add",
    doc="Returns 2 * a + b, with numpy broadcasting.",
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
