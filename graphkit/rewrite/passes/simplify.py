"""The simplify pass: the simplify passes the context's ``simplify`` options carry (graphkit.rewrite.simplify's
SimplifyOptions, a :class:`~graphkit.rewrite.passes.base.Simplifier`) after lowering, with the fusions
they hold as rules. Nothing of graphkit.rewrite.simplify is imported here: it sits above the engine
and hands its passes in."""

from __future__ import annotations

import onnx

from graphkit.rewrite.graph.inference import skeleton
from graphkit.rewrite.graph.walk import ModelIndex
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.lowering.builder import Builder, NameGenerator
from graphkit.rewrite.passes.base import PassResult, PassContext
from graphkit.rewrite.rules.apply import apply_rule_set
from graphkit.rewrite.rules.ruleset import RuleSet

__all__ = ["simplify_pass"]


def simplify_pass(ctx: PassContext, model: onnx.ModelProto) -> PassResult:
    """The simplify passes ``ctx.simplify`` runs, with the fusions it holds as rules."""
    options, opset = ctx.simplify, ctx.plan.opset
    rules = RuleSet([r for f in options.fusions if (f.min_opset or 0) <= opset for r in f.rules])

    def fuse(m: onnx.ModelProto) -> int:
        names = NameGenerator(ModelIndex(m).names, adopt=True)
        types = TypeTable(skeleton(m), ctx.registry)  # (the rules' types: inferred without the weights)

        def make_builder(node: onnx.NodeProto, rule_name: str) -> Builder:
            return Builder(opset=opset, prefix=node.name or rule_name, names=names, types=types,
                           node_name=node.name, op_name=rule_name)
        return apply_rule_set(m, rules, make_builder=make_builder, types=types,
                              report=ctx.report.rules, path=ctx.path)
    result = options.run(model, ctx.registry, opset=opset, placeholder_domains=ctx.placeholders, path=ctx.path,
                         fuse=fuse if options.fuse and len(rules) else None)
    ctx.report.kept.update((f"{op} {node}", why) for (node, op), why in result.kept.items())
    if not result.changes:
        return PassResult(model, False)
    ctx.report.passes.extend(result.describe())
    return PassResult(model, True, f"{sum(result.changes.values())} changes in {result.rounds} rounds")
