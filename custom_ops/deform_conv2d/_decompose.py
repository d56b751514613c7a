"""deform_conv2d in standard ONNX ops, by opset (declaration order in the OpDef is preference):

- ``onnx_deform_conv`` (opset >= 19): one standard ``DeformConv`` node; same semantics.
- ``grid_sample`` (opset >= 16): every sampling point becomes a ``GridSample`` grid point
  (bilinear, zeros padding, align_corners=0: exactly torchvision's per-corner rule), the
  mask multiplies the samples, and a grouped 1x1 ``Conv`` applies the weight and bias.
- ``gather`` (opset >= 11): the four bilinear corners of each sampling point are read with
  ``GatherElements`` from the flattened image (int64 flat indices, exact for any image
  size) and blended with their (masked) weights, then the same 1x1 ``Conv``.

Both sampling decompositions give a point outside the image (far, infinite or NaN
coordinates) 0 before it reaches GridSample or an index, as the reference does, and a
corner outside the image never reads a pixel. GridSample's grid is normalized to [-1, 1]
in the model's float type, which costs about size * 2^-24 pixel of position in float32
(2.4e-4 px at 4100 wide): a sample moves by up to that times the sum of its four corners'
magnitudes, more than a few ulps of the output where a huge pixel has a small bilinear
weight (tests/test_edges.py::test_grid_sample_position_error_is_what_its_docstring_says).
gather and the kernels are exact at any size.

The two sampling decompositions need the weight's shape (kernel size, channels) to be
static; batch, height and width may be dynamic (computed with Shape/Slice in the graph).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from onnx import TensorProto

from . import _shapes

__all__ = ["onnx_deform_conv", "grid_sample", "gather"]


def _fail(message: str, hint: str | None = None):
    from graphkit.errors import RewriteError

    return RewriteError(message, hint=hint)


def _geometry(b, inputs: Sequence[str], attrs: Mapping[str, Any], *, need_weight: bool) -> _shapes.Geometry:
    shapes = [b.shape(name) if name else None for name in inputs]
    try:
        geo = _shapes.check(shapes, attrs)
    except ValueError as exc:
        raise _fail(str(exc), hint="fix the model that produced this node") from None
    if need_weight:
        wshape = shapes[1]
        if wshape is None or not all(isinstance(d, int) for d in wshape):
            raise _fail(f"the weight's shape must be static to decompose (got "
                        f"{'unknown' if wshape is None else wshape})",
                        hint="make the weight an initializer or give it a static shape, or bind "
                             "the op to a kernel (--bind native / --bind python)")
    return geo


def _i64(b, values) -> str:
    return b.constant(np.asarray(values, dtype=np.int64), dtype=TensorProto.INT64)


def _dim(b, shape: str, axis: int) -> str:
    """Dimension ``axis`` of a Shape output, as a 1-D int64 tensor of length 1."""
    return b.Slice(shape, _i64(b, [axis]), _i64(b, [axis + 1]))


def _unsqueeze_last(b, x: str, rank: int) -> str:
    if b.opset >= 13:
        return b.Unsqueeze(x, _i64(b, [rank]))
    return b.Unsqueeze(x, axes=[rank])


class _Plan:
    """What both sampling decompositions share: sizes, shape tensors and sampling points."""

    def __init__(self, b, inputs: Sequence[str], attrs: Mapping[str, Any]) -> None:
        self.b = b
        self.x, self.weight, self.offset, self.bias, self.mask = (list(inputs) + ["", ""])[:5]
        _geometry(b, inputs, attrs, need_weight=True)
        m, cin_g, kh, kw = b.shape(self.weight)
        self.groups, self.og = attrs["groups"], attrs["offset_groups"]
        self.m, self.cin_g, self.kh, self.kw = m, cin_g, kh, kw
        self.kk = kh * kw
        self.c = cin_g * self.groups
        self.cg = self.c // self.og
        self.stride, self.padding, self.dilation = attrs["stride"], attrs["padding"], attrs["dilation"]
        self.dtype = b.dtype(self.x)
        in_shape, off_shape = b.Shape(self.x), b.Shape(self.offset)
        self.n = _dim(b, in_shape, 0)
        self.h, self.w = _dim(b, in_shape, 2), _dim(b, in_shape, 3)
        self.ho, self.wo = _dim(b, off_shape, 2), _dim(b, off_shape, 3)

    def const(self, value) -> str:
        return self.b.constant(np.asarray(value), like=self.x)

    def as_float(self, dims: str) -> str:
        return self.b.Cast(dims, to=self.dtype)

    def points(self) -> tuple[str, str]:
        """(y, x): the sampling points, each (N * offset_groups, kh * kw, Ho, Wo)."""
        b, kk = self.b, self.kk
        (sh, sw), (ph, pw), (dh, dw) = self.stride, self.padding, self.dilation
        off = b.Reshape(self.offset, b.Concat(_i64(b, [-1, kk, 2]), self.ho, self.wo, axis=0))
        dy = b.Gather(off, _i64(b, 0), axis=2)
        dx = b.Gather(off, _i64(b, 1), axis=2)
        scalar = _i64(b, np.zeros((0,), np.int64))
        zero, one = _i64(b, 0), _i64(b, 1)
        rows = self.as_float(b.Range(zero, b.Reshape(self.ho, scalar), one))  # (Ho,)
        cols = self.as_float(b.Range(zero, b.Reshape(self.wo, scalar), one))  # (Wo,)
        if sh != 1:
            rows = b.Mul(rows, self.const(sh))
        if sw != 1:
            cols = b.Mul(cols, self.const(sw))
        taps_y = np.repeat(np.arange(self.kh) * dh - ph, self.kw).reshape(kk, 1, 1)
        taps_x = np.tile(np.arange(self.kw) * dw - pw, self.kh).reshape(kk, 1, 1)
        base_y = b.Add(b.Reshape(rows, _i64(b, [-1, 1])), self.const(taps_y))  # (kk, Ho, 1)
        base_x = b.Add(cols, self.const(taps_x))  # (kk, 1, Wo)
        return b.Add(dy, base_y), b.Add(dx, base_x)

    def inside(self, y: str, x: str) -> str:
        """-1 < y < H and -1 < x < W: the points that read the image (False for NaN)."""
        b, minus_one = self.b, self.const(-1)
        h, w = self.as_float(self.h), self.as_float(self.w)
        return b.And(b.And(b.Greater(y, minus_one), b.Less(y, h)),
                     b.And(b.Greater(x, minus_one), b.Less(x, w)))

    def mask_rows(self, shape_tail: Sequence[str]) -> str:
        """The mask reshaped to (N * offset_groups, 1, *shape_tail)."""
        b = self.b
        return b.Reshape(self.mask, b.Concat(_i64(b, [-1, 1]), *shape_tail, axis=0))

    def convolve(self, samples: str) -> str:
        """samples (N * og, C / og, kk * Ho * Wo in any split) -> output, via a 1x1 grouped Conv."""
        b = self.b
        columns = b.Reshape(samples, b.Concat(self.n, _i64(b, [self.c * self.kk]), self.ho, self.wo, axis=0))
        weight = b.Reshape(self.weight, _i64(b, [self.m, self.cin_g * self.kk, 1, 1]))
        args = [columns, weight] + ([self.bias] if self.bias else [])
        return b.Conv(*args, group=self.groups, kernel_shape=[1, 1])


def onnx_deform_conv(b, inputs: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
    x, weight, offset, bias, mask = (list(inputs) + ["", ""])[:5]
    _geometry(b, inputs, attrs, need_weight=False)
    args = [x, weight, offset]
    if mask:
        args += [bias, mask]
    elif bias:
        args.append(bias)
    (ph, pw) = attrs["padding"]
    return [b.DeformConv(*args, strides=list(attrs["stride"]), pads=[ph, pw, ph, pw],
                         dilations=list(attrs["dilation"]), group=attrs["groups"],
                         offset_group=attrs["offset_groups"])]


def grid_sample(b, inputs: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
    p = _Plan(b, inputs, attrs)
    y, x = p.points()
    # A point outside (far, infinite or NaN) goes to (-2, -2), where every corner is outside:
    # GridSample reads 0 there, while it may read border pixels for huge values or NaN.
    inside = p.inside(y, x)
    outside = p.const(-2)
    y, x = b.Where(inside, y, outside), b.Where(inside, x, outside)
    # align_corners=0: pixel = ((g + 1) * size - 1) / 2, so g = (2 * pixel + 1) / size - 1.
    one, two = p.const(1), p.const(2)
    gy = b.Sub(b.Div(b.Add(b.Mul(y, two), one), p.as_float(p.h)), one)
    gx = b.Sub(b.Div(b.Add(b.Mul(x, two), one), p.as_float(p.w)), one)
    grid = b.Concat(_unsqueeze_last(b, gx, 4), _unsqueeze_last(b, gy, 4), axis=-1)  # (N*og, kk, Ho, Wo, 2)
    grid = b.Reshape(grid, b.Concat(_i64(b, [0, -1]), p.wo, _i64(b, [2]), axis=0))  # (N*og, kk*Ho, Wo, 2)
    image = b.Reshape(p.x, b.Concat(_i64(b, [-1, p.cg]), p.h, p.w, axis=0))  # (N*og, C/og, H, W)
    mode = "linear" if b.opset >= 20 else "bilinear"
    samples = b.GridSample(image, grid, mode=mode, padding_mode="zeros", align_corners=0)
    if p.mask:
        samples = b.Mul(samples, p.mask_rows([b.Mul(p.ho, _i64(b, [p.kk])), p.wo]))
    return [p.convolve(samples)]


def gather(b, inputs: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
    p = _Plan(b, inputs, attrs)
    y, x = p.points()
    flat = _i64(b, [0, 1, -1])  # (N*og, kk, Ho, Wo) -> (N*og, 1, kk*Ho*Wo)
    h, w = p.as_float(p.h), p.as_float(p.w)
    one, minus_one = p.const(1), p.const(-1)
    zero = p.const(0)
    h_last, w_last = b.Sub(h, one), b.Sub(w, one)
    inside = p.inside(y, x)
    y, x = b.Where(inside, y, zero), b.Where(inside, x, zero)  # outside (or NaN): safe indices
    y0, x0 = b.Floor(y), b.Floor(x)
    ly, lx = b.Sub(y, y0), b.Sub(x, x0)
    y1, x1 = b.Add(y0, one), b.Add(x0, one)
    pixels = b.Mul(p.h, p.w)
    image = b.Reshape(p.x, b.Concat(_i64(b, [-1, p.cg]), pixels, axis=0))  # (N*og, C/og, H*W)
    # plus one zero pixel at H*W, which corners outside the image read (never a real pixel)
    image = b.Pad(image, _i64(b, [0, 0, 0, 0, 0, 1]))
    spread = _i64(b, [1, p.cg, 1])
    total = None
    def clamped(v: str, last: str) -> str:  # integral, in [-1, size]: exact in int64
        return b.Cast(b.Max(b.Min(v, last), zero), to=TensorProto.INT64)

    for yc, wy in ((y0, b.Sub(one, ly)), (y1, ly)):
        valid_y = b.And(inside, b.And(b.Greater(yc, minus_one), b.Less(yc, h)))  # integral: 0 <= yc <= H-1
        row = b.Mul(clamped(yc, h_last), p.w)  # flat indices in int64: exact past 2^24 pixels
        for xc, wx in ((x0, b.Sub(one, lx)), (x1, lx)):
            valid = b.And(valid_y, b.And(b.Greater(xc, minus_one), b.Less(xc, w)))
            weight = b.Mul(wy, wx)  # a corner outside reads the zero pixel
            index = b.Where(valid, b.Add(row, clamped(xc, w_last)), pixels)
            index = b.Expand(b.Reshape(index, flat), spread)
            term = b.Mul(b.GatherElements(image, index, axis=2), b.Reshape(weight, flat))
            total = term if total is None else b.Add(total, term)
    if p.mask:  # mask * sample, as torchvision: an infinite or NaN mask gives NaN outside the image
        total = b.Mul(total, b.Reshape(p.mask, b.Concat(_i64(b, [-1, 1]), b.Mul(b.Mul(p.ho, p.wo), _i64(b, [p.kk])), axis=0)))
    return [p.convolve(total)]
