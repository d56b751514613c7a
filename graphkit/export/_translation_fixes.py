"""Corrections to torch's own dynamo translations, active for every ``dynamo=True`` export.

Each entry replaces one ATen op's translation in ``custom_translation_table`` where torch
2.13's (onnxscript's torchlib) disagrees with torch eager; each was found by
``bench/zoo.py`` and is tested against torch in ``tests/test_zoo.py``.

- ``aten::scaled_dot_product_attention`` with a bool mask: a query row whose mask is all
  False (a padding position of a left-padded batch, GPT-2 and Llama with an attention
  mask) gives zeros in torch; torchlib masks with the dtype's lowest value instead of -inf,
  so its softmax is uniform there, not NaN, and its NaN-to-zero step never fires. The fix
  keeps torchlib's graph and zeroes the rows whose mask holds no True.
- ``aten::clamp.Tensor`` with two scalar bounds (what torch's type promotion makes of a
  float16 ``x.clamp(0.0, 2.5)``): torchlib writes ``Min(Max(x, lo), hi)``, which onnxscript
  0.7.2's optimizer fuses into a ``Clip`` whose bounds it names ``<x>_min``/``<x>_max``;
  a second clamp of the same tensor reuses those names, one pair of bounds is lost, and
  ONNX Runtime refuses the model ("Node input 'x_min_1' is not a graph input"). The fix
  writes the ``Clip`` itself (torch's own translation of ``aten::clamp`` with number bounds,
  which float32 gets; ``Clip`` with min > max gives max, as torch does).
- ``aten::erf`` (``special_erf``) and ``aten::gelu`` of float64: torchlib writes Erf (Gelu from opset 20, whose
  function body is Erf), which ONNX Runtime has no double kernel for. The fixes write
  fdlibm's erf (:mod:`graphkit.export._erf_double`, the gap fillers' builder) for float64
  and keep torchlib's translation for every other dtype.
"""

# No `from __future__ import annotations`: torch's exporter reads the translation's type
# hints (inputs vs attributes), which name types imported inside _sdpa.
import typing
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["translation_fixes"]


def _sdpa() -> Callable[..., Any]:
    import onnx_ir as ir
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops import nn as torchlib
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat
    from onnxscript.onnx_types import TensorType

    base = torchlib.aten_scaled_dot_product_attention

    def scaled_dot_product_attention(query: TFloat, key: TFloat, value: TFloat,
                                     attn_mask: typing.Optional[TensorType] = None,
                                     dropout_p: float = 0.0, is_causal: bool = False,
                                     scale: typing.Optional[float] = None,
                                     enable_gqa: bool = False) -> TFloat:
        out = base(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if attn_mask is None or attn_mask.dtype != ir.DataType.BOOL:
            return out
        attends = op.ReduceMax(op.Cast(attn_mask, to=ir.DataType.INT32), op.Constant(value_ints=[-1]),
                               keepdims=1)
        zero = op.CastLike(op.Constant(value_float=0.0), out)
        return op.Where(op.Cast(attends, to=ir.DataType.BOOL), out, zero)

    return scaled_dot_product_attention


def _clamp_tensor() -> Callable[..., Any]:
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops import core as torchlib
    from onnxscript.function_libs.torch_lib.tensor_typing import TReal

    base = torchlib.aten_clamp_tensor

    def scalar(value: Any) -> bool:
        return value is not None and value.shape is not None and len(value.shape) == 0

    def clamp_tensor(self: TReal, min: typing.Optional[TReal] = None,  # noqa: A002 - torch's names
                     max: typing.Optional[TReal] = None) -> TReal:  # noqa: A002
        if not (scalar(min) and scalar(max)):
            return base(self, min, max)
        return op.Clip(self, op.CastLike(min, self), op.CastLike(max, self))

    return clamp_tensor


class _Graph:
    """TorchScript's ``g.op(name, *inputs, **attrs)`` over onnxscript's opset, for the
    builders in :mod:`graphkit.export._erf_double` (attribute names lose their ``_i``/``_t``)."""

    def __init__(self, opset: Any) -> None:
        self._opset = opset

    def op(self, name: str, *inputs: Any, **attrs: Any) -> Any:
        import onnx_ir as ir

        attrs = {key.rsplit("_", 1)[0]: value for key, value in attrs.items()}
        if name == "Constant":
            return self._opset.Constant(value=ir.tensor(attrs["value"].numpy()))
        return getattr(self._opset, name)(*inputs, **attrs)


def _erf() -> Callable[..., Any]:
    import onnx_ir as ir
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

    from graphkit.export._erf_double import erf_double

    def erf(self: TFloat) -> TFloat:
        if self.dtype == ir.DataType.DOUBLE:
            return erf_double(_Graph(op), self, signed_zero=True)
        return op.Erf(self)  # torchlib's translation

    return erf


def _gelu(opset: int) -> Callable[..., Any]:
    import onnx_ir as ir
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops import nn as torchlib
    from onnxscript.function_libs.torch_lib.tensor_typing import TReal

    from graphkit.export._erf_double import gelu_double

    base = torchlib.aten_gelu
    if opset >= 20:  # torch's own translation from opset 20 on: Gelu
        from torch.onnx._internal.exporter._torchlib.ops.nn import aten_gelu_opset20 as base

    def gelu(self: TReal, approximate: str = "none") -> TReal:
        if self.dtype == ir.DataType.DOUBLE:
            return gelu_double(_Graph(op), self, approximate)
        return base(self, approximate=approximate)

    return gelu


def translation_fixes(opset: int = 18) -> dict[Any, Callable[..., Any]]:
    """``custom_translation_table`` entries correcting torch's translations (see above) for
    an export at ``opset`` (>= 18, what the dynamo exporter builds)."""
    import torch

    fixes: dict[Any, Callable[..., Any]] = {}
    try:  # torchlib internals: another onnxscript may lack them; then torch's translation stays
        fixes[torch.ops.aten.scaled_dot_product_attention.default] = _sdpa()
    except (ImportError, AttributeError) as exc:
        warnings.warn(f"graphkit: sdpa translation fix off with this onnxscript ({exc}): fully masked "
                      "attention rows follow torchlib (uniform), not torch (zeros)", stacklevel=2)
    try:
        fixes[torch.ops.aten.clamp.Tensor] = _clamp_tensor()
    except (ImportError, AttributeError) as exc:
        warnings.warn(f"graphkit: clamp translation fix off with this onnxscript ({exc}): two clamps of "
                      "one float16 tensor may give a model ONNX Runtime refuses", stacklevel=2)
    try:
        fixes[torch.ops.aten.erf.default] = fixes[torch.ops.aten.special_erf.default] = _erf()
        fixes[torch.ops.aten.gelu.default] = _gelu(opset)
    except (ImportError, AttributeError) as exc:
        warnings.warn(f"graphkit: erf/gelu translation fix off with this onnxscript ({exc}): float64 erf "
                      "and gelu export as Erf, which ONNX Runtime cannot run (use dynamo=False)", stacklevel=2)
    return fixes
