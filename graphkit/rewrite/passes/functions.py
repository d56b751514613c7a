"""The attach-functions pass (``--as-functions``): every custom op used gets a model-local
function holding its decomposition; the placeholders stay."""

from __future__ import annotations

import collections
from typing import Any

import onnx
from onnx import helper

from graphkit.errors import GraphkitError, RewriteError, UnsupportedOpError
from graphkit.ops import OpDef, OpRegistry
from graphkit.ops._opdef import PLACEHOLDER_DOMAIN
from graphkit.rewrite.graph.walk import ModelIndex, graphs, scopes
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.lowering.builder import Builder, NameGenerator
from graphkit.rewrite.lowering.plan import node_attrs, unknown_op_hint
from graphkit.rewrite.passes.base import PassResult, PassContext

__all__ = ["attach_functions", "function_attrs", "functions_pass"]


def function_attrs(model: onnx.ModelProto, registry: OpRegistry, path: str | None,
                    index: ModelIndex | None = None) -> dict[str, tuple[OpDef, dict[str, Any]]]:
    """The op and the one set of attributes of every custom op used in ``model``, in the order
    the ops are first met; UnsupportedOpError/RewriteError naming the node where an op is
    unknown, a node's attributes are bad, or two nodes of an op differ.

    ``index``: the model's ModelIndex (collecting the placeholder domains), where it still
    holds: then only the nodes with attributes are read (it kept no other node; a node without
    attributes has the op's defaults), and the walk runs only to name the node of an error.
    """
    if index is not None:
        try:
            read = _function_attrs_indexed(registry, path, index)
        except GraphkitError:
            read = None
        if read is not None:
            return read  # else the walk below meets the same error and names its node
    seen: dict[str, tuple[OpDef, dict[str, Any]]] = {}
    domains = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
    for nodes, _, _ in scopes(model):
        for node in nodes:
            if node.domain not in domains:
                continue
            op = registry.lookup(node.domain, node.op_type)
            if op is None:
                raise UnsupportedOpError("no op package defines this op", path=path, node=node.name,
                                         op=f"{node.domain}::{node.op_type}", hint=unknown_op_hint())
            given = node_attrs(op, node, path)
            if seen.setdefault(op.qualified_name, (op, given))[1] != given:
                raise UnsupportedOpError(
                    "--as-functions needs every node of an op to have the same attributes", path=path,
                    node=node.name, op=op.qualified_name, hint="decompose or bind these nodes instead")
    return seen


def _function_attrs_indexed(registry: OpRegistry, path: str | None,
                            index: ModelIndex) -> dict[str, tuple[OpDef, dict[str, Any]]] | None:
    """function_attrs from the index; None where an op is unknown or its nodes differ."""
    with_attrs: dict[tuple[str, str], list[onnx.NodeProto]] = collections.defaultdict(list)
    for node in index.found:
        with_attrs[(node.domain, node.op_type)].append(node)
    seen: dict[str, tuple[OpDef, dict[str, Any]]] = {}
    for key, count in index.op_counts.items():  # (in the order the walk met them)
        if key[0] not in index.collect:
            continue
        op = registry.lookup(*key)
        if op is None:
            return None
        nodes = with_attrs.get(key, [])
        if count > len(nodes):
            nodes = [*nodes, onnx.NodeProto(domain=key[0], op_type=key[1])]
        for node in nodes:
            given = node_attrs(op, node, path)
            if seen.setdefault(op.qualified_name, (op, given))[1] != given:
                return None
    return seen


def attach_functions(model: onnx.ModelProto, registry: OpRegistry, opset: int, path: str | None,
                      index: ModelIndex | None = None) -> tuple[collections.Counter, collections.Counter]:
    """Give every custom op used in ``model`` a local function holding its decomposition;
    returns the actions and the op counts of the functions' nodes. ``index``: as
    :func:`function_attrs`."""
    attrs_seen = function_attrs(model, registry, path, index)
    existing = {(f.domain, f.name) for f in model.functions}
    actions: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for op, attrs in attrs_seen.values():
        name = op.name
        if (op.domain, name) in existing:
            continue
        dec = op.decomposition_for(opset)
        if dec is None:
            raise UnsupportedOpError(f"no decomposition valid at opset {opset} to put in a function",
                                     path=path, op=op.qualified_name, hint="pick another --target-opset")
        inputs = [p.name for p in op.inputs]
        builder = Builder(opset=opset, prefix=name, names=NameGenerator(inputs), types=TypeTable(),
                          op_name=op.qualified_name)
        try:
            body = builder.finish(list(dec.build(builder, inputs, attrs)), [p.name for p in op.outputs])
        except RewriteError as exc:
            raise RewriteError(f"--as-functions: decomposition '{dec.name}' needs what a function body "
                               f"cannot know: {exc.message}", path=path, op=op.qualified_name,
                               hint="decompose or bind these nodes instead") from exc
        model.functions.append(helper.make_function(
            op.domain, name, inputs, [p.name for p in op.outputs], body,
            [helper.make_opsetid("", opset)], attributes=[a.name for a in op.attributes], doc_string=op.doc))
        actions[(op.qualified_name, f"function:{dec.name}")] += 1
        for g in graphs(helper.make_graph(body, "", [], [])):
            counts.update((n.domain, n.op_type) for n in g.node)
    return actions, counts


def functions_pass(ctx: PassContext, model: onnx.ModelProto) -> PassResult:
    index = ctx.index if ctx.holds("index") and ctx.holds("placeholders") and ctx.index.collect else None
    actions, ctx.attached = attach_functions(model, ctx.registry, ctx.plan.opset, ctx.path, index)
    ctx.plan.actions.update(actions)
    return PassResult(model, bool(actions), f"{sum(actions.values())} functions attached")
