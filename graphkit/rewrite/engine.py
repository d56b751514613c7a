"""The rewrite: a short sequence of passes over one model, each saying what it changed.

``rewrite_model`` copies the model, builds one :class:`~graphkit.rewrite.lowering.plan.LoweringPlan`
and runs the passes of :data:`PASSES` in order: convert the opset, apply pattern rules,
apply graphsurgeon rules, lower the custom:: placeholders, attach functions, fix the
opset imports, check. Each pass states its precondition (``applies``) and returns a
:class:`PassResult`, recorded in the report. Works on the protobuf directly: untouched
nodes keep their order, names and fields, and every scope (subgraphs of If/Loop/Scan,
model-local functions) is visited. The passes are in :mod:`graphkit.rewrite.passes`, one
module per kind, with what they share (:class:`PassContext`, :class:`PassResult`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import onnx
from onnx import helper

from graphkit.errors import ModelLoadError
from graphkit.ops import OpRegistry, default_registry
from graphkit.ops._opdef import PLACEHOLDER_DOMAIN
from graphkit.rewrite._check import check_context, check_model, check_replacement  # (the byte writers read them here)
from graphkit.rewrite._gcpause import gc_paused
from graphkit.rewrite.graph.walk import ModelIndex, count_ops
from graphkit.rewrite.lowering.plan import Lowering
from graphkit.rewrite.lowering.selection import check_target_opset
from graphkit.rewrite.passes.base import (ANALYSES, DEFAULT_OPSET, Pass, PassResult, PassContext, RewriteReport,
                                          ai_onnx_opset)
from graphkit.rewrite.passes.convert import convert_pass, recognise_pass, same_schemas
from graphkit.rewrite.passes.finish import check_pass, fix_opset_imports, imports_pass
from graphkit.rewrite.passes.functions import functions_pass
from graphkit.rewrite.passes.lower import lower_pass
from graphkit.rewrite.passes.rules import graphsurgeon_pass, rules_pass
from graphkit.rewrite.passes.simplify import simplify_pass
from graphkit.rewrite.rules.graphsurgeon import GraphSurgeonRule
from graphkit.rewrite.rules.ruleset import GraphPass, Rule, RuleSet
from graphkit.rewrite.writers import Pieces, Request

__all__ = ["ANALYSES", "DEFAULT_OPSET", "DEFAULT_PREFERENCE", "PASSES", "Lowering", "Pass", "PassResult", "PassContext",
           "RewriteReport", "ai_onnx_opset", "check_context", "check_model", "check_replacement", "fix_opset_imports",
           "rewrite_model", "same_schemas", "write"]

# Read by the passes through PassContext (and by the byte writers here) when a rewrite starts.
FULL_CHECK_NODES = 20_000
PROGRESS_MIN_NODES = 10_000  # smaller models finish before a progress bar would help
PROGRESS_STEP = 2_000
DEFAULT_PREFERENCE = (Lowering.DECOMPOSE, Lowering.NATIVE, Lowering.PYTHON)


def _ops_after(ctx: PassContext, model: onnx.ModelProto) -> collections.Counter:
    if not ctx.holds("counts"):
        return count_ops(model)
    after = ctx.counts.copy()  # derived, not walked for: a million nodes are not counted again
    after.subtract(ctx.plan.lowered)
    after.update(ctx.plan.emitted)
    after.update(ctx.attached)
    return +after


# The rewrite, in order. The last two run only when an earlier pass changed the model.
# "simplify" runs the passes of the SimplifyOptions handed in (graphkit.rewrite.simplify's, through
# passes/base.py's Simplifier) until none changes the model.
_INDEX, _BOTH, _ALL = frozenset({"index"}), frozenset({"index", "counts"}), ANALYSES
PASSES: tuple[Pass, ...] = (
    Pass("recognise-standard-ops", lambda ctx, m: ctx.converting and ctx.has_standard and
         ctx.prefer != (Lowering.KEEP,), recognise_pass),
    # Both say in their PassResult which of what they keep their change broke.
    Pass("convert-opset", lambda ctx, m: ctx.target_opset is not None, convert_pass,
         requires=_INDEX, keeps=_ALL),
    Pass("rules", lambda ctx, m: any(isinstance(r, (Rule, GraphPass)) for r in ctx.rules), rules_pass,
         requires=_BOTH, keeps=_ALL),
    Pass("graphsurgeon-rules", lambda ctx, m: any(isinstance(r, GraphSurgeonRule) for r in ctx.rules),
         graphsurgeon_pass),
    # Lowering replaces nodes where they are: the index's lists and graphs stay the model's.
    Pass("lower", lambda ctx, m: ctx.prefer != (Lowering.KEEP,) and (
        ctx.has_placeholders or bool(ctx.report.rules.applied)), lower_pass, requires=_BOTH, keeps=_BOTH),
    Pass("attach-functions", lambda ctx, m: ctx.as_functions and (
        ctx.has_placeholders or bool(ctx.report.rules.applied)), functions_pass,
         requires=frozenset({"index", "placeholders"}), keeps=_BOTH),
    Pass("simplify", lambda ctx, m: ctx.simplify is not None, simplify_pass),
    Pass("fix-imports", lambda ctx, m: True, imports_pass, keeps=_BOTH),
    Pass("check", lambda ctx, m: ctx.check, check_pass, requires=_INDEX, keeps=_BOTH),
)
_FINISHING = ("fix-imports", "check")


def rewrite_model(model: onnx.ModelProto, *, registry: OpRegistry | None = None,
                  lowering: Lowering | Sequence[Lowering] = DEFAULT_PREFERENCE,
                  rules: Iterable[Rule] | None = None, target_opset: int | None = None,
                  as_functions: bool = False, check: bool = True, full_check: bool = False,
                  path: str | None = None, progress: Callable[[str, int, int], None] | None = None,
                  copy: bool = True, simplify: Any = None) -> tuple[onnx.ModelProto, RewriteReport]:
    """Apply ``rules``, then lower every custom:: node of ``model``; returns a new model and a report.

    ``lowering`` is one lowering or a preference order: each node gets the first that
    fits (a decomposition valid at the target opset, a native or a Python kernel).
    ``Lowering.KEEP`` leaves placeholders alone; ``as_functions`` keeps them and attaches
    their decompositions as model-local functions (ONNX Runtime runs a registered kernel
    where there is one, the function body elsewhere). ``target_opset`` converts the
    model's standard ops first. ``progress(phase, done, total)`` is called while lowering
    models of more than PROGRESS_MIN_NODES nodes.

    ``model`` itself is not modified, unless ``copy`` is False: then the rewrite works on
    ``model`` itself (no copy: half the memory), for a caller that owns it and only wants
    the result (the model returned may be ``model``, and after an error ``model`` may be
    half rewritten). A model where nothing applies comes back unchanged field for field. ``check`` runs the ONNX checker on the result and strict
    shape inference on each distinct replacement, and on the whole model when it has at
    most FULL_CHECK_NODES nodes or ``full_check`` is set. ``simplify`` (a
    :class:`graphkit.rewrite.simplify.SimplifyOptions`: a
    :class:`~graphkit.rewrite.passes.base.Simplifier`) runs the simplify passes after lowering. The passes run are :data:`PASSES`.
    """
    return _rewrite(model, registry=registry, lowering=lowering, rules=rules, target_opset=target_opset,
                    as_functions=as_functions, check=check, full_check=full_check, path=path, progress=progress,
                    copy=copy, simplify=simplify)[:2]


def write(request: Request) -> tuple[Pieces, RewriteReport]:
    """The objects writer, behind graphkit.rewrite.writers' interface: it takes the request's
    model (rewritten in place, the bytes let go, where the request owns it), runs
    ``rewrite_model``'s passes with the request's options and serializes the result; where
    the request owns the model, the ONNX checker's part of the check runs on those bytes,
    once the objects are gone."""
    model, owned = request.release()
    out, report, deferred = _rewrite(model, registry=request.registry, lowering=request.prefer, check=request.check,
                                     full_check=request.full_check, path=request.path, progress=request.progress,
                                     target_opset=request.target_opset, copy=not owned, defer_check=owned,
                                     **request.options)
    del model
    result = out.SerializeToString()
    del out
    if deferred is not None:
        deferred(result)
    return Pieces([result]), report


def _rewrite(model: onnx.ModelProto, *, registry: OpRegistry | None = None,
             lowering: Lowering | Sequence[Lowering] = DEFAULT_PREFERENCE, rules: Iterable[Rule] | None = None,
             target_opset: int | None = None, as_functions: bool = False, check: bool = True,
             full_check: bool = False, path: str | None = None,
             progress: Callable[[str, int, int], None] | None = None, copy: bool = True, defer_check: bool = False,
             simplify: Any = None) -> tuple[onnx.ModelProto, RewriteReport, Callable[[bytes], None] | None]:
    """rewrite_model; with ``defer_check``, the ONNX checker's part of the check may come back
    as a function to run on the serialized result (None: nothing left to check)."""
    with gc_paused():
        return _passes(model, registry=registry, lowering=lowering, rules=rules, target_opset=target_opset,
                       as_functions=as_functions, check=check, full_check=full_check, path=path,
                       progress=progress, copy=copy, defer_check=defer_check, simplify=simplify)


def _passes(model: onnx.ModelProto, *, registry: OpRegistry | None, lowering: Lowering | Sequence[Lowering],
            rules: Iterable[Rule] | None, target_opset: int | None, as_functions: bool, check: bool,
            full_check: bool, path: str | None, progress: Callable[[str, int, int], None] | None, copy: bool,
            defer_check: bool, simplify: Any = None) -> tuple[onnx.ModelProto, RewriteReport, Callable[[bytes], None] | None]:
    registry = default_registry() if registry is None else registry
    if target_opset is not None:
        check_target_opset(target_opset)
    prefer = (lowering,) if isinstance(lowering, Lowering) else tuple(lowering)
    if as_functions:
        prefer = (Lowering.KEEP,)
    # Converting to the same opset rewrites the imports in place without counting as a change:
    # they are put back if nothing changed, so that "unchanged" stays true of what comes back.
    imports = [(i.domain, i.version) for i in model.opset_import] if target_opset is not None else None
    if copy:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    else:
        out = model
    placeholders = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
    # (rules start from the op types it reads; functions are attached for the nodes it finds)
    index = ModelIndex(out, ops=bool(rules), collect=placeholders if as_functions else frozenset())
    bad = next((k for k in index.op_counts if not (isinstance(k[0], str) and isinstance(k[1], str))), None)
    if bad is not None:  # protobuf hands over names that are not UTF-8 text as bytes
        raise ModelLoadError(f"a node's domain or op type {bad!r} is not valid UTF-8 text", path=path,
                             hint="re-export the model; ONNX names are UTF-8")
    bad = None
    if set(map(type, index.names)) - {str}:  # (the types in bulk: a million names take milliseconds)
        bad = next(name for name in index.names if name.__class__ is not str)
    if bad is not None:
        raise ModelLoadError(f"the name {bad[:60]!r} is not valid UTF-8 text", path=path,
                             hint="re-export the model; ONNX names are UTF-8")
    ctx = PassContext(registry, prefer, rules if isinstance(rules, RuleSet) else RuleSet(rules or ()),
                         target_opset, as_functions, check, full_check, path, progress,
                         RewriteReport(ops_before=index.op_counts), placeholders, defer_check=defer_check,
                         full_check_nodes=FULL_CHECK_NODES, progress_min_nodes=PROGRESS_MIN_NODES,
                         progress_step=PROGRESS_STEP)
    ctx.converting = target_opset is not None and target_opset != ai_onnx_opset(out)
    ctx.has_standard = bool(registry.standard_op_types() & set(index.op_counts))
    ctx.has_placeholders = bool(ctx.placeholders & index.domains) or ctx.has_standard
    ctx.index = index
    ctx.counts = ctx.report.ops_before
    ctx.simplify = simplify
    ctx.make_plan(out, index.names)
    modified = False
    for p in PASSES:
        if p.name in _FINISHING and not modified:
            break
        if p.name == "fix-imports":
            ctx.report.actions = ctx.plan.actions
            ctx.report.passed_over = ctx.plan.selection.passed_over
            ctx.report.ops_after = _ops_after(ctx, out)
        if not p.applies(ctx, out):
            continue
        ctx.running = p
        try:
            result = p.run(ctx, out)
        finally:
            ctx.running = None
        out = result.model
        if result.modified:
            modified = True
            ctx.valid &= p.keeps
            ctx.valid -= result.invalidates
            ctx.report.passes.append((p.name, result.detail))
    if not modified:
        ctx.report.ops_after = ctx.report.ops_before.copy()
        if not copy:
            if imports is not None and [(i.domain, i.version) for i in model.opset_import] != imports:
                del model.opset_import[:]
                model.opset_import.extend(helper.make_opsetid(d, v) for d, v in imports)
            return model, ctx.report, None
        unchanged = onnx.ModelProto()
        unchanged.CopyFrom(model)
        return unchanged, ctx.report, None
    return out, ctx.report, ctx.deferred_check
