"""Two Transposes in a row: removed when the second undoes the first, else one Transpose."""

from __future__ import annotations

from graphkit.rewrite import MatchContext, MatchResult, Rule


def pattern(op, x, first, second):
    return op.Transpose(op.Transpose(x, perm=first), perm=second)


def _perms(ctx: MatchContext, x, first, second) -> tuple[list[int], list[int]] | MatchResult:
    rank = ctx.rank(x)
    perms = []
    for perm in (first, second):
        if perm is None:  # no perm: the axes reversed
            if rank is None:
                return MatchResult().fail(f"a Transpose without perm on '{x}' of unknown rank")
            perm = list(range(rank))[::-1]
        perms.append([int(p) for p in perm])
    axes = list(range(len(perms[0])))
    if sorted(perms[0]) != axes or sorted(perms[1]) != axes:
        return MatchResult().fail(f"perms {perms[0]} and {perms[1]} are not permutations of one rank")
    return perms[0], perms[1]


def composed(first: list[int], second: list[int]) -> list[int]:
    """Transpose(Transpose(x, first), second) == Transpose(x, composed(first, second))."""
    return [first[axis] for axis in second]


def check_inverse(ctx: MatchContext, x, first, second) -> MatchResult:
    perms = _perms(ctx, x, first, second)
    if isinstance(perms, MatchResult):
        return perms
    if composed(*perms) != list(range(len(perms[0]))):
        return MatchResult().fail(f"perm {perms[1]} does not undo {perms[0]}")
    return MatchResult()


def check_merge(ctx: MatchContext, x, first, second) -> MatchResult:
    perms = _perms(ctx, x, first, second)
    if isinstance(perms, MatchResult):
        return perms
    if composed(*perms) == list(range(len(perms[0]))):
        return MatchResult().fail(f"perm {perms[1]} undoes {perms[0]} (cancelled, not merged)")
    return MatchResult()


def cancel(op, x, first, second):
    return x


def merge(op, x, first, second):
    rank = len(first) if first is not None else len(second)
    fill = list(range(rank))[::-1]
    return op.Transpose(x, perm=composed(list(first or fill), list(second or fill)))


RULES = (Rule("transpose_cancel", pattern, cancel, check=check_inverse),
         Rule("transpose_merge", pattern, merge, check=check_merge))
