"""deform_conv2d in numpy: the Python kernel ONNX Runtime runs through onnxruntime-extensions.

Vectorized: the four bilinear corners of every sampling point are computed once per offset
group, each corner is one ``np.take`` of whole channel planes per image and offset group
(the mask folded into its weights), and the columns meet the weight in one batched matmul
(BLAS), with no transposes: the sampled layout already is the columns' layout.
"""

from __future__ import annotations

import numpy as np

from . import _shapes


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
    y = (tap_y + (np.arange(ho, dtype=dtype) * sh - ph).reshape(1, 1, 1, ho, 1)) + off[:, :, :, 0]
    x = (tap_x + (np.arange(wo, dtype=dtype) * sw - pw).reshape(1, 1, 1, 1, wo)) + off[:, :, :, 1]
    inside = (y > -1) & (y < h) & (x > -1) & (x < w)
    y, x = np.where(inside, y, 0), np.where(inside, x, 0)  # outside (or NaN): weight 0, safe index
    y0, x0 = np.floor(y), np.floor(x)
    ly, lx = y - y0, x - x0
    y0i, x0i = y0.astype(np.int64), x0.astype(np.int64)
    # the mask is folded into the corner weights, unless it holds inf or NaN: then it multiplies
    # the samples, as torchvision's mask * sample does (mask * 0 = NaN outside the image)
    fold = mask is not None and bool(np.isfinite(mask).all())
    scale = inside.astype(dtype)
    if fold:
        scale = scale * mask.reshape(n, og, kk, ho, wo)

    images = input.reshape(n, og, cg, h * w)
    # one zero pixel at H*W for the corners outside the image (they never read a real one)
    images = np.concatenate([images, np.zeros((n, og, cg, 1), dtype)], axis=3)
    length = kk * p
    sampled = np.zeros((n, og, cg, length), dtype)  # (n, og, cg, (tap, position))
    for dy, wy in ((0, 1 - ly), (1, ly)):
        for dx, wx in ((0, 1 - lx), (1, lx)):
            yc, xc = y0i + dy, x0i + dx
            valid = inside & (yc >= 0) & (yc < h) & (xc >= 0) & (xc < w)
            weight_c = np.where(valid, wy * wx * scale, dtype.type(0)).reshape(n, og, length)
            index = np.where(valid, np.clip(yc, 0, h - 1) * w + np.clip(xc, 0, w - 1), h * w).reshape(n, og, length)
            for b in range(n):
                for g in range(og):  # one gather of whole channel planes per image and group
                    sampled[b, g] += np.take(images[b, g], index[b, g], axis=1) * weight_c[b, g]
    if mask is not None and not fold:
        sampled *= mask.reshape(n, og, 1, length)
    # sampled[n, og, cg, (i, j, oh, ow)] is columns[n, group, (c, i, j), (oh, ow)]
    columns = sampled.reshape(n, groups, cin_g * kk, p)
    result = np.matmul(weight.reshape(groups, m // groups, cin_g * kk), columns)  # (n, groups, m/g, p)
    out[...] = result.reshape(n, m, ho, wo)
    if bias is not None:
        out += bias.reshape(1, m, 1, 1)
    return out
