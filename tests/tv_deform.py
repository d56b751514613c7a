"""torchvision's deform_conv2d op without torchvision (its C++ ops do not load here).

:func:`declare` defines ``torchvision::deform_conv2d`` with ``torch.library`` under a given
schema (torchvision's real one: :data:`REAL_SCHEMA`), graphkit's reference as its kernel
and fake kernel; :func:`tv_deform_conv2d` is torchvision.ops.deform_conv2d's body (how
models reach the op) and :class:`TVBlock` a DCN block calling it. :func:`build` is the
model factory for ``graphkit export tests/tv_deform.py:build`` (it declares the op in its
own process when nothing has).
"""

from __future__ import annotations

import torch

from graphkit_ops.deform_conv2d import DEFORM_CONV2D

# torchvision/csrc/ops/deform_conv2d.cpp, as torchvision declares it
REAL_SCHEMA = ("deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
               "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
               "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor")


def _kernel(input, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, groups, og, use_mask):
    return DEFORM_CONV2D.reference(input, weight, offset, bias, mask if use_mask else None,
                                   [sh, sw], [ph, pw], [dh, dw], groups, og)


def declare(schema: str = REAL_SCHEMA) -> torch.library.Library:
    """Define ``torchvision::deform_conv2d``; the caller destroys the returned Library."""
    lib = torch.library.Library("torchvision", "DEF")
    try:
        lib.define(schema)
        if "use_mask" in schema:
            lib.impl("deform_conv2d", _kernel, "CompositeExplicitAutograd")
            torch.library.register_fake("torchvision::deform_conv2d", _kernel, lib=lib)
    except Exception:
        lib._destroy()
        raise
    return lib


def tv_deform_conv2d(input, offset, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                     mask=None):
    """torchvision.ops.deform_conv2d's body."""
    use_mask = mask is not None
    if mask is None:
        mask = torch.zeros((input.shape[0], 1), device=input.device, dtype=input.dtype)
    if bias is None:
        bias = torch.zeros(weight.shape[0], device=input.device, dtype=input.dtype)
    weights_h, weights_w = weight.shape[-2:]
    n_offset_grps = offset.shape[1] // (2 * weights_h * weights_w)
    n_weight_grps = input.shape[1] // weight.shape[1]
    return torch.ops.torchvision.deform_conv2d(
        input, weight, offset, mask, bias, stride[0], stride[1], padding[0], padding[1],
        dilation[0], dilation[1], n_weight_grps, n_offset_grps, use_mask)


class TVBlock(torch.nn.Module):
    """A DCN block as mmdet/detectron2 write it: a conv predicts offsets (and a mask),
    torchvision's deform_conv2d applies them; weight groups 2, offset groups 2."""

    def __init__(self, use_mask: bool = True, bias: bool = True) -> None:
        super().__init__()
        self.use_mask = use_mask
        self.predict = torch.nn.Conv2d(4, 3 * 2 * 9, 3, stride=2, padding=1)
        self.weight = torch.nn.Parameter(torch.randn(6, 2, 3, 3) / 4)
        self.bias = torch.nn.Parameter(torch.randn(6)) if bias else None

    def forward(self, x):
        p = self.predict(x)
        offset, mask = p[:, :36], torch.sigmoid(p[:, 36:])
        return tv_deform_conv2d(x, offset, self.weight, self.bias, stride=(2, 2), padding=(1, 1),
                                mask=mask if self.use_mask else None)


_LIBS: list[torch.library.Library] = []  # build()'s declaration lives as long as its process


def build() -> TVBlock:
    if not hasattr(torch.ops.torchvision, "deform_conv2d"):
        _LIBS.append(declare())
    torch.manual_seed(0)
    return TVBlock()
