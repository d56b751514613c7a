"""deform_conv2d's torch semantics, written with torch ops only (runs on fake tensors too).

torchvision's rules: the sampling point of output (oh, ow), kernel tap (i, j) and offset
group g is ``y = oh * sh - ph + i * dh + offset[g, i, j, 0]``, ``x = ow * sw - pw + j * dw +
offset[g, i, j, 1]``; it reads 0 unless ``-1 < y < H`` and ``-1 < x < W``, and otherwise
interpolates bilinearly between its four neighbours, each neighbour outside the image
reading 0. The sample is multiplied by ``mask[g, i, j]`` (when given), and the columns are
multiplied with the weight as a grouped convolution. NaN or infinite offsets fail the
bounds test and read 0 (see the package docstring for the edge-value semantics); flat
pixel indices are int64, exact for any image size.
"""

from __future__ import annotations

from typing import Any

from . import _shapes


def _shape(t: Any) -> list[Any]:
    return [d if isinstance(d, int) else None for d in t.shape]


def reference(input, weight, offset, bias=None, mask=None, stride=(1, 1), padding=(0, 0),
              dilation=(1, 1), groups=1, offset_groups=1):
    import torch

    attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
             "offset_groups": offset_groups}
    _shapes.check([_shape(t) if t is not None else None for t in (input, weight, offset, bias, mask)],
                  attrs)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    n, c, h, w = input.shape
    m, cin_g, kh, kw = weight.shape
    ho, wo = offset.shape[2], offset.shape[3]
    og, kk = offset_groups, kh * kw
    cg = c // og
    dtype, device = input.dtype, input.device

    off = offset.reshape(n, og, kk, 2, ho, wo)
    tap_y = (torch.arange(kh, device=device, dtype=dtype) * dh).repeat_interleave(kw)
    tap_x = (torch.arange(kw, device=device, dtype=dtype) * dw).repeat(kh)
    row = torch.arange(ho, device=device, dtype=dtype) * sh - ph
    col = torch.arange(wo, device=device, dtype=dtype) * sw - pw
    # integral base point first (exact), then the offset: torchvision's order of additions
    y = (tap_y.view(1, 1, kk, 1, 1) + row.view(1, 1, 1, ho, 1)) + off[:, :, :, 0]  # (n, og, kk, ho, wo)
    x = (tap_x.view(1, 1, kk, 1, 1) + col.view(1, 1, 1, 1, wo)) + off[:, :, :, 1]
    inside = (y > -1) & (y < h) & (x > -1) & (x < w)
    zero = torch.zeros((), dtype=dtype, device=device)
    y, x = torch.where(inside, y, zero), torch.where(inside, x, zero)  # outside (or NaN): safe indices

    y0, x0 = torch.floor(y), torch.floor(x)
    ly, lx = y - y0, x - x0
    length = kk * ho * wo
    flat = input.reshape(n, og, cg, h * w)
    # one zero pixel at flat index H*W, read by every corner outside the image: such a
    # corner contributes 0 without reading a pixel (a NaN there stays out, as in torchvision)
    flat = torch.cat([flat, flat.new_zeros(n, og, cg, 1)], dim=3)
    sampled = None
    for dy, wy in ((0, 1 - ly), (1, ly)):
        for dx, wx in ((0, 1 - lx), (1, lx)):
            yc, xc = y0 + dy, x0 + dx
            valid = inside & (yc >= 0) & (yc <= h - 1) & (xc >= 0) & (xc <= w - 1)
            weight_c = torch.where(valid, wy * wx, zero)
            # flat index in int64: a float32 index is inexact past 2^24 pixels
            index = yc.clamp(0, h - 1).to(torch.int64) * w + xc.clamp(0, w - 1).to(torch.int64)
            index = torch.where(valid, index, h * w)
            index = index.reshape(n, og, 1, length).expand(n, og, cg, length)
            term = torch.gather(flat, 3, index) * weight_c.reshape(n, og, 1, length)
            sampled = term if sampled is None else sampled + term
    if mask is not None:
        # torchvision multiplies the interpolated sample (0 outside the image) by the mask,
        # so an infinite or NaN mask gives mask * 0 = NaN at a point outside the image and
        # mask * sample (+-inf) inside, even where a corner's weight is 0
        sampled = sampled * mask.reshape(n, og, 1, length)
    # sampled[n, og, cg, (i, j, oh, ow)] -> columns[n, group, (c, i, j), (oh, ow)]
    columns = sampled.reshape(n, groups, cin_g * kk, ho * wo)
    out = torch.matmul(weight.reshape(groups, m // groups, cin_g * kk), columns)
    out = out.reshape(n, m, ho, wo)
    if bias is not None:
        out = out + bias.reshape(1, m, 1, 1)
    return out
