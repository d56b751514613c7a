"""The passes that finish a changed model: fix-imports (consistent opset imports in the
model and its functions) and check (the ONNX checker, and shape inference on each
replacement and on models of up to ``ctx.full_check_nodes`` nodes)."""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from graphkit.ops._opdef import PLACEHOLDER_DOMAIN
from graphkit.rewrite._check import bytes_check, check_context, check_model, check_replacement, check_scan
from graphkit.rewrite.graph.walk import AI_ONNX
from graphkit.rewrite.passes.base import PassResult, PassContext

__all__ = ["check_pass", "fix_opset_imports", "imports_pass"]


def _fix_imports(imports: Any, used: set[str], opset: int, placeholders: frozenset[str]) -> None:
    """Drop unused placeholder-domain imports; import every used domain (ai.onnx at ``opset``)."""
    keep = [imp for imp in imports if not (imp.domain in placeholders and imp.domain not in used)]
    present = {imp.domain for imp in keep}
    if not present & set(AI_ONNX) and used & set(AI_ONNX):
        keep.append(helper.make_opsetid("", opset))
    keep.extend(helper.make_opsetid(d, 1) for d in sorted(used - present - set(AI_ONNX), key=str))
    if [(i.domain, i.version) for i in keep] != [(i.domain, i.version) for i in imports]:
        del imports[:]
        imports.extend(keep)


def fix_opset_imports(model: onnx.ModelProto, opset: int, used: set[str],
                      placeholders: frozenset[str] = frozenset({PLACEHOLDER_DOMAIN})) -> None:
    """Consistent opset imports in the model and in every local function."""
    for fn in model.functions:
        fn_used = {n.domain for n in fn.node}
        _fix_imports(fn.opset_import, fn_used, opset, placeholders)
        used = used | fn_used
    used |= {f.domain for f in model.functions}
    _fix_imports(model.opset_import, used, opset, placeholders)


def imports_pass(ctx: PassContext, model: onnx.ModelProto) -> PassResult:
    before = [(i.domain, i.version) for i in model.opset_import]
    fix_opset_imports(model, ctx.plan.opset, {d for d, _ in ctx.report.ops_after}, ctx.placeholders)
    after = [(i.domain, i.version) for i in model.opset_import]
    return PassResult(model, before != after, f"opset imports {after}")


def check_pass(ctx: PassContext, model: onnx.ModelProto) -> PassResult:
    for r in ctx.plan.replacements:
        check_replacement(r.original, r.nodes, r.types, model.opset_import, ctx.registry, r.rule, ctx.path)
    applied = ", ".join(sorted({how for _, how in ctx.plan.actions} | set(ctx.report.rules.applied)))
    full = ctx.full_check or sum(ctx.report.ops_after.values()) <= ctx.full_check_nodes
    # Lowering only replaces nodes (graph inputs and outputs stay, no tensor it makes is
    # external): what the input's index found holds for the output, unless a tensor was
    # external or a replacement holds subgraphs.
    scan = None
    if ctx.holds("index") and not ctx.index.external and not {"If", "Loop", "Scan"} & {
            op for _, op in (*ctx.plan.emitted, *ctx.attached)}:
        scan = (ctx.index.shapeless, False)
    context, hint = check_context(applied, ctx.report.conversions)
    if ctx.defer_check and not full:
        shapeless, external = check_scan(model) if scan is None else scan
        if not external:
            ctx.deferred_check = bytes_check(model, shapeless, ctx.registry, ctx.path, context, hint)
            return PassResult(model, False)
    checked = model
    if ctx.simplify is not None:  # its weights are the input's or numpy's: checked without their bytes (copied twice else)
        from graphkit.rewrite.graph.inference import skeleton

        checked, scan = skeleton(model), None
    check_model(checked, ctx.registry, path=ctx.path, context=context, full=full, scan=scan, hint=hint)
    return PassResult(model, False)
