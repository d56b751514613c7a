"""A user rule file for `graphkit rewrite --rules`: turn Mul(x, 2) -> Add(., y) back into
custom::my_add, so it can be bound to the fused kernel.

    graphkit rewrite std.onnx fused.onnx --rules samples/rules/fuse_my_add.py --bind native
"""

import numpy as np
from onnx import helper

from graphkit.rewrite import MatchResult, Rule, RuleSet

FLOATS = (np.float16, np.float32, np.float64)  # my_add's type constraint


def pattern(op, x, y):
    return op.Add(op.Mul(x, 2.0), y)


def same_dtype(ctx, x, y):
    """Only fuse where x and y are float tensors of one element type (my_add's constraint)."""
    types = {ctx.dtype(x), ctx.dtype(y)}
    if None in types:
        return MatchResult().fail("the element type of x or y is unknown")
    names = sorted(np.dtype(helper.tensor_dtype_to_np_dtype(t)).name for t in types)
    if len(names) != 1:
        return MatchResult().fail(f"x and y have different element types ({', '.join(names)})")
    if np.dtype(names[0]).type not in FLOATS:
        return MatchResult().fail(f"my_add takes float16/float/double tensors, x and y are {names[0]}")
    return MatchResult()


def rewrite(op, x, y):
    return op.my_add(x, y, _domain="custom")


rules = RuleSet([Rule("fuse_my_add", pattern, rewrite, check=same_dtype, commute=True)])
