"""The lower pass: every custom:: placeholder (and standard node an op computes) replaced
by its lowering (:meth:`graphkit.rewrite.lowering.plan.LoweringPlan.lower_nodes`), inner
scopes first, with progress on large models."""

from __future__ import annotations

from collections.abc import Callable

import onnx

from graphkit.rewrite.graph.walk import graph_node_lists, node_lists
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.lowering.plan import LoweringScope
from graphkit.rewrite.passes.base import PassResult, PassContext

__all__ = ["lower_pass"]


def lower_pass(ctx: PassContext, model: onnx.ModelProto) -> PassResult:
    plan = ctx.plan
    total = sum(ctx.report.ops_before.values())
    progress = ctx.progress if total > ctx.progress_min_nodes else None
    domains, standard = plan.domains, plan.standard
    lists = None
    if ctx.holds("counts"):  # what the rules left, counted
        left = any(d in domains or (standard and (d, op) in standard) for d, op in ctx.counts)
    else:
        # Every node list: the input's index while no pass before changed the model.
        lists = ctx.index.node_lists if ctx.holds("index") else node_lists(model)
        left = any(any(n.domain in domains for n in nodes) or (standard and any((n.domain, n.op_type) in standard
                                                                           for n in nodes)) for nodes, _ in lists)
    if not left:
        if progress is not None:  # nothing to lower (rules replaced every placeholder): no typing pass
            progress("lowering", total, total)
        return PassResult(model, False, "0 placeholders lowered")
    if lists is None:
        lists = ctx.index.node_lists if ctx.holds("index") else node_lists(model)
    # Where sibling subgraphs define one name, each graph's nodes are typed by its own table.
    lists = graph_node_lists(model) if len(lists) > 1 and ctx.types.per_scope() else [(*entry, None) for entry in lists]
    done = 0
    count = 0
    for nodes, in_function, graph in reversed(lists):  # inner scopes first, as in the rules pass
        if not any(n.domain in domains for n in nodes) and not (
                standard and any((n.domain, n.op_type) in standard for n in nodes)):
            done += len(nodes)
            continue
        # A function body's tensor types are its callers': nothing is looked up in the
        # model's table (which would also run whole-model shape inference per call site).
        scope = LoweringScope(TypeTable() if in_function else ctx.types if graph is None else ctx.types.scope(graph))
        tick = None if progress is None else _ticker(progress, done, total, ctx.progress_step)
        done += len(nodes)
        count += plan.lower_nodes(nodes, scope, progress=tick)
    if progress is not None:
        progress("lowering", total, total)
    return PassResult(model, count > 0, f"{count} placeholders lowered")


def _ticker(progress: Callable[[str, int, int], None], offset: int, total: int, step: int) -> Callable[[int], None]:
    def tick(i: int) -> None:
        if i % step == 0:
            progress("lowering", offset + i, total)
    return tick
