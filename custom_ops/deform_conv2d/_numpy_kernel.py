"""deform_conv2d in numpy: the Python kernel ONNX Runtime runs through onnxruntime-extensions.

Vectorized: the four bilinear corners of every sampling point are computed once per offset
group and read as whole channel rows from a channels-last copy of the input (one fancy-index
gather per corner), the mask is folded into the corner weights, and the columns meet the
weight in one batched matmul (BLAS).
"""

from __future__ import annotations

import numpy as np

from custom_ops.deform_conv2d import _shapes


def _absent(t) -> bool:
    # onnxruntime-extensions cannot pass a missing optional input: an empty tensor stands for it.
    return t is None or t.size == 0


def python_kernel(input, weight, offset, bias=None, mask=None, *, stride=(1, 1), padding=(0, 0),
                  dilation=(1, 1), groups=1, offset_groups=1):
    bias = None if _absent(bias) else bias
    mask = None if _absent(mask) else mask
    attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
             "offset_groups": offset_groups}
    arrays = (input, weight, offset, bias, mask)
    _shapes.check([None if a is None else list(a.shape) for a in arrays], attrs)
    dtype = input.dtype
    if any(a is not None and a.dtype != dtype for a in arrays):
        raise TypeError(f"inputs must share one dtype, got {[None if a is None else str(a.dtype) for a in arrays]}")
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    n, c, h, w = input.shape
    m, cin_g, kh, kw = weight.shape
    ho, wo = offset.shape[2:]
    og, kk, p = offset_groups, kh * kw, ho * wo
    cg = c // og
    out = np.empty((n, m, ho, wo), dtype)
    if out.size == 0:
        return out

    off = offset.reshape(n, og, kk, 2, ho, wo)
    tap_y = np.repeat(np.arange(kh, dtype=dtype) * dh, kw).reshape(1, 1, kk, 1, 1)
    tap_x = np.tile(np.arange(kw, dtype=dtype) * dw, kh).reshape(1, 1, kk, 1, 1)
    y = off[:, :, :, 0] + tap_y + (np.arange(ho, dtype=dtype) * sh - ph).reshape(1, 1, 1, ho, 1)
    x = off[:, :, :, 1] + tap_x + (np.arange(wo, dtype=dtype) * sw - pw).reshape(1, 1, 1, 1, wo)
    inside = (y > -1) & (y < h) & (x > -1) & (x < w)
    y0, x0 = np.floor(y), np.floor(x)
    ly, lx = y - y0, x - x0
    y0i, x0i = y0.astype(np.int64), x0.astype(np.int64)
    scale = inside.astype(dtype)
    if mask is not None:
        scale = scale * mask.reshape(n, og, kk, ho, wo)

    # (n, og, h*w, cg): channel rows of each pixel contiguous, so each gather moves rows.
    pixels = np.ascontiguousarray(input.reshape(n, og, cg, h * w).transpose(0, 1, 3, 2))
    batch = np.arange(n).reshape(n, 1, 1, 1, 1)
    group = np.arange(og).reshape(1, og, 1, 1, 1)
    sampled = np.zeros((n, og, kk, ho, wo, cg), dtype)
    for dy, wy in ((0, 1 - ly), (1, ly)):
        for dx, wx in ((0, 1 - lx), (1, lx)):
            yc, xc = y0i + dy, x0i + dx
            valid = (yc >= 0) & (yc < h) & (xc >= 0) & (xc < w)
            weight_c = np.where(valid, wy * wx * scale, dtype.type(0))
            index = np.clip(yc, 0, h - 1) * w + np.clip(xc, 0, w - 1)
            sampled += pixels[batch, group, index] * weight_c[..., None]
    # sampled[n, og, (i, j), (oh, ow), cg] -> columns[n, group, (oh, ow), (c, i, j)]
    columns = sampled.reshape(n, og, kk, p, cg).transpose(0, 3, 1, 4, 2).reshape(n, p, groups, cin_g * kk)
    columns = columns.transpose(0, 2, 1, 3)  # (n, groups, p, K)
    wmat = weight.reshape(groups, m // groups, cin_g * kk)
    result = np.matmul(wmat, columns.transpose(0, 1, 3, 2))  # (n, groups, m/g, p)
    out[...] = result.reshape(n, m, ho, wo)
    if bias is not None:
        out += bias.reshape(1, m, 1, 1)
    return out
