"""Three projections of one input -> one MatMul of the packed weights and a Split (packed QKV).

    q, k, v = x @ Wq + bq, x @ Wk + bk, x @ Wv + bv
 -> q, k, v = Split(x @ [Wq | Wk | Wv] + [bq | bk | bv], [nq, nk, nv], axis=-1)

An attention block's query, key and value Linears as exported one by one (BERT): one MatMul
of x instead of three. The pattern's three roots share only x (graphkit.rewrite.rules.roots finds
the second and third from x's readers). Weights (2-D, of one floating-point type) and biases
(1-D, one per output column) must be constants, read only once three projections matched (a
MatMul's weights are not read to find that it has no siblings); the packed ones become
initializers and the old ones are pruned. ``qkv_pack`` takes the projections with a bias,
``qkv_pack_matmul`` (after it) those without. GPT-2's export already packs them (c_attn: one
Gemm, then a Split): there is nothing to fuse.
"""

from __future__ import annotations

import numpy as np

from graphkit.rewrite import MatchContext, MatchResult, Rule
from graphkit.rewrite.fusions._common import float_tensor


def _projection(op, x, w, b):
    return op.Add(op.MatMul(x, w), b)


def with_bias(op, x, wq, bq, wk, bk, wv, bv):
    return _projection(op, x, wq, bq), _projection(op, x, wk, bk), _projection(op, x, wv, bv)


def without_bias(op, x, wq, wk, wv):
    return op.MatMul(x, wq), op.MatMul(x, wk), op.MatMul(x, wv)


def _values(read, names: tuple[str | None, ...]) -> list[np.ndarray] | str:
    """The constants' values, or the name of the first that is none."""
    values = []
    for name in names:
        value = read(name)
        if value is None:
            return name
        values.append(value)
    return values


def check(ctx: MatchContext, x, wq, wk, wv, bq=None, bk=None, bv=None) -> MatchResult:
    if not (ok := float_tensor(ctx, x, "input")):
        return ok
    biased = bq is not None
    values = _values(ctx.constant, (wq, wk, wv, bq, bk, bv) if biased else (wq, wk, wv))
    if isinstance(values, str):
        return MatchResult().fail(f"{'bias' if values in (bq, bk, bv) else 'weight'} '{values}' is not a constant")
    weights = values[:3]  # the roots are alike: which projection is which is the graph's order
    if any(w.ndim != 2 for w in weights):
        return MatchResult().fail(f"a weight is {next(w.ndim for w in weights if w.ndim != 2)}-D, "
                                  "packing needs 2-D weights")
    if any(w.dtype != weights[0].dtype for w in weights) or weights[0].dtype.kind != "f":
        return MatchResult().fail(f"the weights are {', '.join(str(w.dtype) for w in weights)}, packing needs "
                                  "one floating-point type")
    if any(w.shape[0] != weights[0].shape[0] for w in weights):
        return MatchResult().fail(f"the weights have {', '.join(str(w.shape[0]) for w in weights)} rows")
    for w, b in zip(weights, values[3:]):
        if b.shape != (w.shape[1],) or b.dtype != w.dtype:
            return MatchResult().fail(f"a bias is {b.dtype} of shape {list(b.shape)}, packing needs {w.dtype} of "
                                      f"shape [{w.shape[1]}] (its MatMul's columns)")
    return MatchResult()


def rewrite(op, x, wq, wk, wv, bq=None, bk=None, bv=None):
    weights = _values(op.constant_value, (wq, wk, wv))
    y = op.MatMul(x, op.initializer(np.concatenate(weights, axis=1), name="qkv_weight"))
    if bq is not None:
        y = op.Add(y, op.initializer(np.concatenate(_values(op.constant_value, (bq, bk, bv))), name="qkv_bias"))
    sizes = [w.shape[1] for w in weights]
    if op.opset >= 13:  # the sizes an input from 13, an attribute before
        return op.Split(y, op.initializer(np.array(sizes, np.int64), name="qkv_sizes"), axis=-1, _outputs=3)
    return op.Split(y, axis=-1, split=sizes, _outputs=3)


RULES = (Rule("qkv_pack", with_bias, rewrite, check=check, commute=True),
         Rule("qkv_pack_matmul", without_bias, rewrite, check=check))
