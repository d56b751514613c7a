"""Identity nodes removed; graph outputs keep their names.

An Identity in the middle of a graph goes away (its consumers read its input). One that
produces a graph output goes away too when its input comes from a node of the same graph
used by nothing else: that node then produces the output under its name (a graph pass).
An Identity from a graph input or initializer straight to a graph output stays.
"""

from __future__ import annotations

from graphkit.rewrite import GraphPass, MatchContext, MatchResult, Rule, Scope


def check(ctx: MatchContext, x0) -> MatchResult:
    out = ctx.nodes[0].output[0]
    if out in ctx.view.protected:
        return MatchResult().fail(f"its output '{out}' is a graph output (see identity_output)")
    return MatchResult()


def rewrite(op, x0):
    return x0


def rename_into_outputs(scope: Scope) -> int | MatchResult:
    """Identity(r) -> y, y a graph output, r made here for it alone: the producer makes y."""
    view = scope.view()
    drop = []
    for index, node in enumerate(scope.nodes):
        if node.op_type != "Identity" or node.domain not in ("", "ai.onnx") or len(node.input) != 1:
            continue
        src, out = node.input[0], node.output[0]
        producer = view.producer.get(src)
        if (out not in scope.protected or src in scope.protected or producer is None
                or view.consumers.get(src, []) != [index]):
            continue
        made = scope.nodes[producer]
        made.output[list(made.output).index(src)] = out
        drop.append(index)
    if not drop:
        return MatchResult().fail("no Identity makes a graph output from a tensor used by it alone")
    for index in reversed(drop):
        del scope.nodes[index]
    return len(drop)


RULES = (Rule.node("identity", "Identity", rewrite, check=check),
         GraphPass("identity_output", rename_into_outputs))
