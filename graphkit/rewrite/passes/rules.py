"""The passes applying the user's rules: pattern rules and graph passes (rules), then
graphsurgeon rules."""

from __future__ import annotations

import onnx

from graphkit.rewrite.graph.walk import ModelIndex
from graphkit.rewrite.lowering.builder import Builder
from graphkit.rewrite.passes.base import PassResult, PassContext
from graphkit.rewrite.rules.graphsurgeon import GraphSurgeonRule, apply_graphsurgeon_rules
from graphkit.rewrite.rules.apply import apply_rule_set
from graphkit.rewrite.rules.ruleset import OpDelta

__all__ = ["graphsurgeon_pass", "rules_pass"]


def rules_pass(ctx: PassContext, model: onnx.ModelProto) -> PassResult:
    plan, types = ctx.plan, ctx.types

    def make_builder(node: onnx.NodeProto, rule_name: str) -> Builder:
        return Builder(opset=plan.opset, prefix=node.name or rule_name, names=plan.names,
                       types=types, node_name=node.name, op_name=rule_name)

    delta = OpDelta()
    # The input's index has every graph: not walked for again.
    tree = ctx.index.tree if ctx.holds("index") else None
    total = apply_rule_set(model, ctx.rules, make_builder=make_builder, types=types, report=ctx.report.rules,
                           path=ctx.path, delta=delta, tree=tree)
    if tree:  # the op types it read for the rules (a pointer per node) are of no more use
        ctx.index.tree = [(graph, parent, None) for graph, parent, _ in tree]
    # Nodes overwritten where they were (none holding subgraphs): the index's node lists and
    # graphs are still the model's; its placeholder nodes may not be.
    broken = {"placeholders"} if delta.exact and delta.in_place else {"placeholders", "index"}
    if total and delta.exact and ctx.holds("counts"):  # the counts, changed by what the rules did
        counts = ctx.counts.copy()
        counts.update(delta.counts)
        ctx.counts = +counts
    else:
        broken.add("counts")
    return PassResult(model, total > 0, f"{total} rewrites", frozenset(broken))


def graphsurgeon_pass(ctx: PassContext, model: onnx.ModelProto) -> PassResult:
    gs_rules = [r for r in ctx.rules if isinstance(r, GraphSurgeonRule)]
    out = apply_graphsurgeon_rules(model, gs_rules, ctx.report.rules, ctx.path)
    if out is model:
        return PassResult(model, False)
    ctx.make_plan(out, ModelIndex(out).names)  # names and types of the rebuilt graph
    applied = sum(ctx.report.rules.applied.get(r.name, 0) for r in gs_rules)
    return PassResult(out, True, f"{applied} rewrites")
