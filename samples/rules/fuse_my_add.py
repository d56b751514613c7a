"""A user rule file for `graphkit rewrite --rules`: turn Mul(x, 2) -> Add(., y) back into
custom::my_add, so it can be bound to the fused kernel.

    graphkit rewrite std.onnx fused.onnx --rules samples/rules/fuse_my_add.py --bind native
"""

import numpy as np

from graphkit.rewrite import MatchResult, Rule, RuleSet

FLOATS = (np.float16, np.float32, np.float64)  # my_add's type constraint


def pattern(op, x, y):
    return op.Add(op.Mul(x, 2.0), y)


def same_dtype(ctx, x, y):
    """Only fuse where x and y are float tensors of one type (my_add's constraint).

    The context holds the matched nodes and constant values, not tensor types. ONNX's Mul
    and Add give both inputs one type T, so the matched Mul's constant 2 has the element
    type of x (and of y); a constant x or y is read as well.
    """
    mul = next(n for n in ctx.nodes if n.op_type == "Mul")
    values = [ctx.constant(name) for name in (*mul.input, x, y)]
    dtypes = sorted({v.dtype.name for v in values if v is not None})
    if len(dtypes) != 1:
        return MatchResult().fail(f"x and y have different element types ({', '.join(dtypes)})")
    if np.dtype(dtypes[0]).type not in FLOATS:
        return MatchResult().fail(f"my_add takes float16/float/double tensors, x and y are {dtypes[0]}")
    return MatchResult()


def rewrite(op, x, y):
    return op.my_add(x, y, _domain="custom")


rules = RuleSet([Rule("fuse_my_add", pattern, rewrite, check=same_dtype, commute=True)])
