"""MatMul + Add -> Gemm where Gemm computes the same: A and B 2-D, the bias broadcasting to (M, N).

MatMul on 3-D or batched inputs (every Linear inside a transformer) is left alone.
"""

from __future__ import annotations

from graphkit.rewrite import MatchContext, MatchResult, Rule
from graphkit.rewrite.fusions._common import float_tensor


def pattern(op, a, b, c):
    return op.Add(op.MatMul(a, b), c)


def check(ctx: MatchContext, a, b, c) -> MatchResult:
    if not (ok := float_tensor(ctx, a, "A")):
        return ok
    for what, name in (("A", a), ("B", b)):
        rank = ctx.rank(name)
        if rank != 2:
            return MatchResult().fail(f"MatMul input {what} '{name}' is "
                                      f"{'of unknown rank' if rank is None else f'{rank}-D'}, Gemm needs 2-D")
    maker = ctx.producer(c)
    if maker is not None and maker.op_type == "MatMul" and list(maker.input) == [a, b]:
        return MatchResult().fail(f"the bias '{c}' is the MatMul's own output (Add(m, m))")
    if ctx.dtype(b) != ctx.dtype(a) or ctx.dtype(c) != ctx.dtype(a):
        return MatchResult().fail("A, B and the bias differ in element type")
    m, n = ctx.shape(a)[0], ctx.shape(b)[1]
    shape = ctx.shape(c)
    if shape is None or len(shape) > 2:
        return MatchResult().fail(f"bias '{c}' has shape {shape}, Gemm needs one broadcasting to [M, N]")
    for have, want in zip(reversed(shape), (n, m)):
        if have != 1 and (have is None or have != want):
            return MatchResult().fail(f"bias '{c}' has shape {shape}, which does not broadcast to [{m}, {n}]")
    return MatchResult()


def rewrite(op, a, b, c):
    return op.Gemm(a, b, c)


RULES = (Rule("matmul_add_gemm", pattern, rewrite, check=check, commute=True),)
