"""deform_conv2d for torch models: torchvision's API on graphkit's op (imports torch).

- :func:`deform_conv2d` - ``torchvision.ops.deform_conv2d``'s signature and semantics
  (groups and offset groups inferred from the shapes, as torchvision does).
- :class:`DeformConv2d` - ``torchvision.ops.DeformConv2d``: same constructor, parameters
  and initialization; ``forward(input, offset, mask=None)``.
- :func:`torchvision_symbolic` / :func:`torchvision_symbolics` - the tutorial's path: a
  TorchScript symbolic for an existing ``torchvision::deform_conv2d`` op
  (``register_custom_op_symbolic``), registered only inside the ``with`` block, that writes
  the same ``custom::deform_conv2d`` placeholder. :func:`graphkit.export.export` needs
  neither: the OpDef's ``foreign_ops`` entry maps torchvision's op for both exporters.

Both calls go through the op's autograd.Function (:func:`graphkit.export.autograd_function`):
eager runs the C++ forward, ``torch.onnx.export(dynamo=False)`` uses its symbolic, and
``graphkit.export.export(dynamo=True)`` records ``graphkit::deform_conv2d``. Either way the
exported graph holds one ``custom::deform_conv2d`` node per call.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from . import DEFORM_CONV2D

__all__ = ["DeformConv2d", "deform_conv2d", "torchvision_symbolic", "torchvision_symbolics"]

TORCHVISION_OP = "torchvision::deform_conv2d"


def _pair(value: Any, name: str) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value, value]
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return [int(value[0]), int(value[1])]
    raise TypeError(f"[deform_conv2d] {name} must be an int or a pair of ints, got {value!r}")


def deform_conv2d(input: torch.Tensor, offset: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None, stride: Any = (1, 1), padding: Any = (0, 0),
                  dilation: Any = (1, 1), mask: torch.Tensor | None = None) -> torch.Tensor:
    """``torchvision.ops.deform_conv2d``: deformable convolution (DCNv2 when ``mask`` is given).

    input (N, C, H, W); offset (N, 2 * offset_groups * kh * kw, Ho, Wo); weight
    (M, C / groups, kh, kw); bias (M,); mask (N, offset_groups * kh * kw, Ho, Wo).
    """
    from graphkit.export.torch_ops import autograd_function

    if weight.dim() != 4 or input.dim() != 4 or offset.dim() != 4:
        raise ValueError(f"[deform_conv2d] input, offset and weight must be 4-D, got {list(input.shape)}, "
                         f"{list(offset.shape)}, {list(weight.shape)}")
    with warnings.catch_warnings():
        # Under TorchScript tracing sizes are traced values; these are static (parameters'
        # shapes, channel counts), so baking them in as attributes is right.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        kh, kw = int(weight.shape[2]), int(weight.shape[3])
        groups = max(1, int(input.shape[1]) // max(1, int(weight.shape[1])))
        offset_groups = max(1, int(offset.shape[1]) // (2 * kh * kw))
    fn = autograd_function(DEFORM_CONV2D)
    return fn.apply(input, weight, offset, bias, mask, _pair(stride, "stride"), _pair(padding, "padding"),
                    _pair(dilation, "dilation"), groups, offset_groups)


class DeformConv2d(torch.nn.Module):
    """``torchvision.ops.DeformConv2d``: ``forward(input, offset, mask=None)``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True) -> None:
        super().__init__()
        if in_channels % groups:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups:
            raise ValueError("out_channels must be divisible by groups")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = tuple(_pair(kernel_size, "kernel_size"))
        self.stride = tuple(_pair(stride, "stride"))
        self.padding = tuple(_pair(padding, "padding"))
        self.dilation = tuple(_pair(dilation, "dilation"))
        self.weight = torch.nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        self.bias = torch.nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight.shape[1] * self.kernel_size[0] * self.kernel_size[1]
            bound = 1 / math.sqrt(fan_in)
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return deform_conv2d(input, offset, self.weight, self.bias, stride=self.stride, padding=self.padding,
                             dilation=self.dilation, mask=mask)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}")
        s += f", padding={self.padding}" if self.padding != (0, 0) else ""
        s += f", dilation={self.dilation}" if self.dilation != (1, 1) else ""
        s += f", groups={self.groups}" if self.groups != 1 else ""
        s += ", bias=False" if self.bias is None else ""
        return s


def torchvision_symbolic():
    """The tutorial's symbolic for ``torchvision::deform_conv2d``, writing every input and
    attribute onto ``custom::deform_conv2d`` (the tutorial kept only input and offset).
    Derived from the op's ``foreign_ops`` entry, as :func:`graphkit.export.export` does."""
    from graphkit.export import foreign_symbolic

    (foreign,) = [f for f in DEFORM_CONV2D.foreign_ops if f.name == TORCHVISION_OP]
    return foreign_symbolic(DEFORM_CONV2D, foreign)


def _registered(opset: int) -> bool:
    try:
        from torch.onnx._internal.torchscript_exporter import registration
    except ImportError:
        return False
    return registration.registry.is_registered_op(TORCHVISION_OP, opset)


@contextlib.contextmanager
def torchvision_symbolics(opset: int = 9) -> Iterator[None]:
    """Register :func:`torchvision_symbolic` for ``torchvision::deform_conv2d`` (from
    ``opset`` on) for the block only, as the tutorial's ``register_custom_op_symbolic``
    call does; unregistered on exit, even on error. A symbolic registered before is kept."""
    if _registered(opset):
        yield
        return
    torch.onnx.register_custom_op_symbolic(TORCHVISION_OP, torchvision_symbolic(), opset)
    try:
        yield
    finally:
        torch.onnx.unregister_custom_op_symbolic(TORCHVISION_OP, opset)
