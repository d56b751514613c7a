"""Conv followed by an inference BatchNormalization -> one Conv with folded weights.

    W' = W * s[:, None, ...],  B' = (B - mean) * s + beta,  s = gamma / sqrt(var + eps)

The folded weight and bias become new initializers; the old ones, now unused, are pruned.
Every Conv attribute is kept; the Conv bias is optional.
"""

from __future__ import annotations

import numpy as np

from graphkit.rewrite import MatchContext, MatchResult, Rule, const, optional

_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def pattern(op, x, w, b, gamma, beta, mean, var, epsilon, training_mode,
            auto_pad, dilations, group, kernel_shape, pads, strides):
    conv = op.Conv(x, const(w), optional(const(b)), auto_pad=auto_pad, dilations=dilations, group=group,
                   kernel_shape=kernel_shape, pads=pads, strides=strides)
    return op.BatchNormalization(conv, const(gamma), const(beta), const(mean), const(var),
                                 epsilon=epsilon, training_mode=training_mode)


def _fold(w, b, gamma, beta, mean, var, epsilon):
    dtype = w.dtype
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + float(epsilon))
    new_w = w.astype(np.float64) * scale.reshape((-1,) + (1,) * (w.ndim - 1))
    bias = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
    new_b = (bias - mean) * scale + beta
    return new_w.astype(dtype), new_b.astype(dtype)


def check(ctx: MatchContext, x, w, b, gamma, beta, mean, var, epsilon, training_mode, **attrs) -> MatchResult:
    if training_mode:
        return MatchResult().fail("BatchNormalization is in training mode (its statistics change)")
    if w.dtype.kind != "f":
        return MatchResult().fail(f"the Conv weight is {w.dtype}, not floating point")
    channels = w.shape[0] if w.ndim >= 3 else None
    for what, value in (("scale", gamma), ("B", beta), ("mean", mean), ("var", var), ("Conv bias", b)):
        if value is not None and value.shape != (channels,):
            return MatchResult().fail(f"BatchNormalization {what} has shape {list(value.shape)}, the Conv "
                                      f"has {channels} output channels")
    if np.any(var.astype(np.float64) + float(epsilon) <= 0):
        return MatchResult().fail("var + epsilon is not positive")
    return MatchResult()


def rewrite(op, x, w, b, gamma, beta, mean, var, epsilon, training_mode, **attrs):
    new_w, new_b = _fold(w, b, gamma, beta, mean, var, epsilon)
    kept = {k: v for k, v in attrs.items() if k in _CONV_ATTRS and v is not None}
    return op.Conv(x, op.initializer(new_w, name="conv_bn_weight"), op.initializer(new_b, name="conv_bn_bias"),
                   **kept)


RULES = (Rule("conv_bn", pattern, rewrite, check=check),)
