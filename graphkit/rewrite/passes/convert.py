"""The passes about the model's standard ops before anything else: recognise-standard-ops
(standard nodes an op computes become its placeholders) and convert-opset
(``--target-opset``: graphkit's adapters, :mod:`graphkit.rewrite.convert`)."""

from __future__ import annotations

import collections

import onnx
from onnx import helper

from graphkit.errors import RewriteError
from graphkit.rewrite.convert.opset import convert as convert_by_adapters
from graphkit.rewrite.graph.walk import AI_ONNX, ModelIndex, count_ops
from graphkit.rewrite.lowering.standard_ops import recognise
from graphkit.rewrite.passes.base import PassResult, PassContext, ai_onnx_opset

__all__ = ["convert_opset", "convert_pass", "recognise_pass", "same_schemas"]


def convert_opset(model: onnx.ModelProto, target: int, path: str | None, taken: set[str] | None = None,
                   op_counts: collections.Counter | None = None) -> tuple[onnx.ModelProto, str]:
    """Move the model's standard ops to ai.onnx opset ``target`` (custom nodes ride along).

    Returns the model and how: "imports only" where no standard op of the model (any scope)
    has a new version between the two opsets, or the model imports no ai.onnx opset to
    convert from (every node stays as it is), "adapters" where
    graphkit's own adapters converted every node (rewrite/convert/opset.py: one pass, linear),
    with onnx's converter on each node no adapter covers, one at a time ("adapters; onnx's
    converter node by node: ..."), else "version converter": onnx's on the whole model, whose
    cost grows with the square of the number of subgraphs (see convert/opset.py), where a node no
    adapter covers holds subgraphs.
    """
    from onnx import version_converter

    current = ai_onnx_opset(model)
    standard = {op for d, op in (count_ops(model) if op_counts is None else op_counts) if d in AI_ONNX}
    same = current is not None and current != target and bool(standard) and same_schemas(standard, current, target)
    how = "imports only"
    if current is None or current == target or not standard or same:
        converted = model
    elif not (done := convert_by_adapters(model, target, path=path, taken=taken, ops=standard)).fallback:
        converted, how = model, "adapters"
        if done.expanded:
            how += f"; ONNX's function bodies for {', '.join(done.expanded)}"
        if done.by_onnx:
            how += f"; onnx's converter node by node: {', '.join(done.by_onnx)}"
    else:
        how = "version converter"
        try:
            converted = version_converter.convert_version(model, target)
        except Exception as exc:  # the converter raises bare RuntimeErrors / its own types
            raise RewriteError(f"cannot convert from opset {current} to {target}: {str(exc).splitlines()[0]}",
                               path=path, op=f"ai.onnx::{done.fallback[0].split()[0]}",
                               hint="pick a --target-opset the converter supports, or omit it") from exc
    imports = [imp for imp in converted.opset_import if imp.domain not in AI_ONNX]
    del converted.opset_import[:]
    converted.opset_import.extend([helper.make_opsetid("", target), *imports])
    return converted, how


def same_schemas(ops: set[str], a: int, b: int) -> bool:
    """Whether each ai.onnx op of ``ops`` has the same schema version at opsets ``a`` and ``b``."""
    low, high = sorted((a, b))
    for op in ops:
        try:
            if onnx.defs.get_schema(op, high, "").since_version > low:
                return False
        except onnx.defs.SchemaError:
            return False
    return True


def recognise_pass(ctx: PassContext, model: onnx.ModelProto) -> PassResult:
    """Standard nodes an op computes become its placeholders before the version converter
    sees them (it has no adapter for DeformConv across opset 19, nor for one under 19)."""
    made = recognise(model, ctx.registry, ctx.path, ctx.target_opset)
    return PassResult(model, bool(made), ", ".join(f"{n} {what}" for what, n in sorted(made.items())))


# What a conversion that made or removed nodes breaks: the node lists, the op counts, the
# placeholder nodes. Where it kept every node list (imports only, adapters going up), all hold.
_NODES = frozenset({"index", "counts", "placeholders"})


def convert_pass(ctx: PassContext, model: onnx.ModelProto) -> PassResult:
    before = ai_onnx_opset(model)
    indexed = ctx.holds("index")
    taken = ctx.index.names if indexed else None  # extended in place with the names made
    out, how = convert_opset(model, ctx.target_opset, ctx.path, taken, ctx.index.op_counts if indexed else None)
    broken: frozenset[str] = frozenset()
    if ctx.converting:
        standard = any(d in AI_ONNX for d, _ in ctx.report.ops_before)
        ctx.report.conversions.append((before, ctx.target_opset, how if standard and before is not None
                                       else "imports only"))
        if out is model and indexed and how == "imports only":  # the same nodes: the same names
            ctx.make_plan(out, ctx.index.names)
        elif how.startswith("adapters") and taken is not None:  # the names, with the adapters' constants'
            # Going up, the adapters add initializers and touch no node list but a function
            # body's, or below IR 4 the main graph's (Constant nodes): the index holds where
            # neither is. Going down they may remove Constants.
            same_nodes = how == "adapters" and before < ctx.target_opset \
                and not out.functions and out.ir_version >= 4
            broken = frozenset() if same_nodes else _NODES
            ctx.make_plan(out, taken)
        else:
            broken = _NODES
            ctx.make_plan(out, ModelIndex(out).names)
    else:  # same opset: the imports are rewritten to ai.onnx, the names are the same
        ctx.plan.opset = ai_onnx_opset(out)
    return PassResult(out, ctx.converting, f"ai.onnx opset {before} -> {ctx.target_opset}", broken)
