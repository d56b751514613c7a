"""Folding a per-channel scale and shift into the custom op before it, where the op's
definition says its output is linear per channel in a weight plus a bias
(:class:`graphkit.ops.ChannelLinear`): an inference BatchNormalization, or Mul/Div/Add/Sub
by a constant that is the same along every axis but the channel's.

``y = op(x; W, b) * s + t`` is ``op(x; W * s, b * s + t)``. The folded weight and bias are
new initializers (the originals stay where something else reads them).
"""

from __future__ import annotations

import numpy as np
import onnx

from graphkit.rewrite.graph.walk import AI_ONNX
from graphkit.rewrite.simplify._context import SimplifyContext
from graphkit.rewrite.simplify._graph import SimplifyScope

__all__ = ["absorb_channel_affine"]


def _per_channel(value: np.ndarray, rank: int, axis: int, channels: int) -> np.ndarray | None:
    """``value`` as a vector over the channels where, broadcast against an output of ``rank``
    dims, it varies along ``axis`` only (a scalar broadcasts); else None."""
    if value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)) if value.size == 1 else value.reshape(-1)


def _affine(ctx: SimplifyContext, scope: SimplifyScope, follower: onnx.NodeProto, y: str, rank: int, axis: int,
            channels: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) per channel that ``follower`` applies to ``y``, or None."""
    op = follower.op_type
    if follower.domain not in AI_ONNX:
        return None
    if op == "BatchNormalization":
        if follower.input[0] != y or len([o for o in follower.output if o]) != 1 or any(
                a.name == "training_mode" and a.i for a in follower.attribute):
            return None
        consts = [scope.value(n) for n in follower.input[1:5]]
        if len(consts) != 4 or any(c is None or c.shape != (channels,) for c in consts):
            return None
        gamma, beta, mean, var = (c.astype(np.float64) for c in consts)
        eps = next((a.f for a in follower.attribute if a.name == "epsilon"), 1e-5)
        scale = gamma / np.sqrt(var + eps)
        return scale, beta - mean * scale
    if op not in ("Mul", "Div", "Add", "Sub") or len(follower.input) != 2:
        return None
    other = follower.input[1] if follower.input[0] == y else follower.input[0]
    if other == y or (op in ("Div", "Sub") and follower.input[0] != y):
        return None
    value = scope.value(other)
    if value is None or value.dtype != dtype:
        return None
    vec = _per_channel(value, rank, axis, channels)
    if vec is None:
        return None
    vec = vec.astype(np.float64)
    ones, zeros = np.ones(channels), np.zeros(channels)
    if op == "Mul":
        return vec, zeros
    if op == "Div":
        return (None if np.any(vec == 0) else (1.0 / vec, zeros))
    return ones, (vec if op == "Add" else -vec)


def absorb_channel_affine(ctx: SimplifyContext, model: onnx.ModelProto) -> int:
    """Fold per-channel scale/shift followers into the custom ops that declare ChannelLinear."""
    folded = 0
    for scope in ctx.scopes(model):
        for k, node in scope.live():
            if node.domain not in ctx.placeholder_domains or len(node.output) != 1:
                continue
            op = ctx.registry.lookup(node.domain, node.op_type)
            if op is None or op.channel_linear is None:
                continue
            folded += _absorb(ctx, scope, k, node, op)
        scope.commit()
    return folded


def _absorb(ctx: SimplifyContext, scope: SimplifyScope, k: int, node: onnx.NodeProto, op) -> int:
    lin = op.channel_linear
    names = [p.name for p in op.inputs]
    wi, bi = names.index(lin.weight), names.index(lin.bias)
    done = 0
    while True:
        y = node.output[0]
        readers = scope.readers(y)
        if y in scope.output_set or len(readers) != 1:
            return done
        weight_name = node.input[wi] if wi < len(node.input) else ""
        weight = scope.value(weight_name) if weight_name else None
        if weight is None or weight.dtype.kind != "f":
            return done
        bias_name = node.input[bi] if bi < len(node.input) else ""
        bias = scope.value(bias_name) if bias_name else None
        if bias_name and bias is None:
            return done
        dims = ctx.types.dims(y) if ctx.types is not None else None
        if dims is None:
            return done
        channels = weight.shape[lin.weight_axis]
        axis = lin.channel_axis + len(dims) if lin.channel_axis < 0 else lin.channel_axis
        f = readers[0]
        follower = scope.nodes[f]
        got = _affine(ctx, scope, follower, y, len(dims), axis, channels, weight.dtype)
        if got is None:
            return done
        scale, shift = got
        shape = [1] * weight.ndim
        shape[lin.weight_axis] = channels
        # Products in float64, rounded once to the weight's type as astype would, without a
        # float64 copy of the weight: the ufunc casts through its small buffers.
        new_w = np.multiply(weight, scale.reshape(shape), out=np.empty_like(weight, order="C"),
                            dtype=np.float64, casting="unsafe")
        base = np.zeros(channels) if bias is None else bias.astype(np.float64)
        new_b = (base * scale + shift).astype(weight.dtype)
        w_name = ctx.fresh(f"{weight_name}_folded")
        b_name = ctx.fresh(f"{bias_name or node.name or 'bias'}_folded")
        for name, value in ((w_name, new_w), (b_name, new_b)):
            made = scope.add_constant(name, value)
            if made is not None:
                scope.placed.setdefault(k, []).append(made)
        scope.set_input(k, wi, w_name)
        scope.set_input(k, bi, b_name)
        z = follower.output[0]
        scope.remove(f)
        node.output[0] = z
        scope.producer.pop(y, None)
        scope.producer[z] = k
        scope.changed = True
        done += 1
