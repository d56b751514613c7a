"""A user rule file for `graphkit rewrite --rules`: turn Mul(x, 2) -> Add(., y) back into
custom::my_add, so it can be bound to the fused kernel.

    graphkit rewrite std.onnx fused.onnx --rules samples/rules/fuse_my_add.py --bind native
"""

from graphkit.rewrite import MatchResult, Rule, RuleSet


def pattern(op, x, y):
    return op.Add(op.Mul(x, 2.0), y)


def same_dtype(ctx, x, y):
    """Only fuse where both operands are float tensors of one type (my_add's constraint)."""
    return MatchResult()


def rewrite(op, x, y):
    return op.my_add(x, y, _domain="custom")


rules = RuleSet([Rule("fuse_my_add", pattern, rewrite, check=same_dtype, commute=True)])
