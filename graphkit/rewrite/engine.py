"""The rewrite: a short sequence of passes over one model, each saying what it changed.

``rewrite_model`` copies the model, builds one :class:`~graphkit.rewrite.lowering.plan.LoweringPlan`
and runs the passes of :data:`PASSES` in order: convert the opset, apply pattern rules,
apply graphsurgeon rules, lower the custom:: placeholders, attach functions, fix the
opset imports, check. Each pass states its precondition (``applies``) and returns a
:class:`PassResult`, recorded in the report. Works on the protobuf directly: untouched
nodes keep their order, names and fields, and every scope (subgraphs of If/Loop/Scan,
model-local functions) is visited.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import onnx
from onnx import helper

from graphkit.errors import GraphkitError, ModelLoadError, RewriteError, UnsupportedOpError
from graphkit.ops import PLACEHOLDER_DOMAIN, OpDef, OpRegistry, default_registry
from graphkit.rewrite._gcpause import gc_paused
from graphkit.rewrite.rules.graphsurgeon import GraphSurgeonRule, apply_graphsurgeon_rules
from graphkit.rewrite.rules.ruleset import GraphPass, OpDelta, Rule, RuleSet, apply_rule_set
from graphkit.rewrite._check import bytes_check, check_context, check_model, check_replacement, check_scan
from graphkit.rewrite.convert.opset import convert as convert_by_adapters
from graphkit.rewrite.lowering.selection import check_target_opset
from graphkit.rewrite.lowering.standard_ops import recognise
from graphkit.rewrite.graph.walk import AI_ONNX, ModelIndex, count_ops, graph_node_lists, graphs, node_lists, scopes
from graphkit.rewrite.lowering.builder import Builder, NameGenerator, TypeTable
from graphkit.rewrite.lowering.plan import Lowering, LoweringScope, node_attrs, unknown_op_hint
from graphkit.rewrite.passes.base import (ANALYSES, DEFAULT_OPSET, Pass, PassResult, RewriteContext, RewriteReport,
                                          ai_onnx_opset)
from graphkit.rewrite.writers import Pieces, Request

__all__ = ["ANALYSES", "DEFAULT_OPSET", "DEFAULT_PREFERENCE", "PASSES", "Lowering", "Pass", "PassResult", "RewriteContext",
           "RewriteReport", "ai_onnx_opset", "check_model", "check_replacement", "fix_opset_imports", "rewrite_model",
           "same_schemas", "write"]

# Read by the passes through RewriteContext (and by the byte writers here) when a rewrite starts.
FULL_CHECK_NODES = 20_000
PROGRESS_MIN_NODES = 10_000  # smaller models finish before a progress bar would help
PROGRESS_STEP = 2_000
DEFAULT_PREFERENCE = (Lowering.DECOMPOSE, Lowering.NATIVE, Lowering.PYTHON)


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


def _convert_opset(model: onnx.ModelProto, target: int, path: str | None, taken: set[str] | None = None,
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


def _function_attrs(model: onnx.ModelProto, registry: OpRegistry, path: str | None,
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
    """_function_attrs from the index; None where an op is unknown or its nodes differ."""
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


def _attach_functions(model: onnx.ModelProto, registry: OpRegistry, opset: int, path: str | None,
                      index: ModelIndex | None = None) -> tuple[collections.Counter, collections.Counter]:
    """Give every custom op used in ``model`` a local function holding its decomposition;
    returns the actions and the op counts of the functions' nodes. ``index``: as
    :func:`_function_attrs`."""
    attrs_seen = _function_attrs(model, registry, path, index)
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


# -- the passes ---------------------------------------------------------------------------

def _recognise_pass(ctx: RewriteContext, model: onnx.ModelProto) -> PassResult:
    """Standard nodes an op computes become its placeholders before the version converter
    sees them (it has no adapter for DeformConv across opset 19, nor for one under 19)."""
    made = recognise(model, ctx.registry, ctx.path, ctx.target_opset)
    return PassResult(model, bool(made), ", ".join(f"{n} {what}" for what, n in sorted(made.items())))


def _convert_pass(ctx: RewriteContext, model: onnx.ModelProto) -> PassResult:
    before = ai_onnx_opset(model)
    indexed = ctx.holds("index")
    taken = ctx.index.names if indexed else None  # extended in place with the names made
    out, how = _convert_opset(model, ctx.target_opset, ctx.path, taken, ctx.index.op_counts if indexed else None)
    broken: frozenset[str] = frozenset()
    if ctx.converting:
        standard = any(d in AI_ONNX for d, _ in ctx.report.ops_before)
        ctx.report.conversions.append((before, ctx.target_opset, how if standard and before is not None
                                       else "imports only"))
        if out is model and indexed and how == "imports only":  # the same nodes: the same names
            ctx.same_nodes = True
            ctx.make_plan(out, ctx.index.names)
        elif how.startswith("adapters") and taken is not None:  # the names, with the adapters' constants'
            # Going up, the adapters add initializers and touch no node list but a function
            # body's, or below IR 4 the main graph's (Constant nodes): the index holds where
            # neither is. Going down they may remove Constants.
            ctx.same_nodes = how == "adapters" and before < ctx.target_opset \
                and not out.functions and out.ir_version >= 4
            broken = frozenset() if ctx.same_nodes else frozenset({"index"})
            ctx.make_plan(out, taken)
        else:
            broken = frozenset({"index"})
            ctx.make_plan(out, ModelIndex(out).names)
    else:  # same opset: the imports are rewritten to ai.onnx, the names are the same
        ctx.plan.opset = ai_onnx_opset(out)
    return PassResult(out, ctx.converting, f"ai.onnx opset {before} -> {ctx.target_opset}", broken)


def _rules_pass(ctx: RewriteContext, model: onnx.ModelProto) -> PassResult:
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
    # graphs are still the model's.
    broken = frozenset() if delta.exact and delta.in_place else frozenset({"index"})
    if total and delta.exact and (not ctx.converting or ctx.same_nodes):  # the input's counts, changed
        counts = ctx.report.ops_before.copy()
        counts.update(delta.counts)
        ctx.counts = +counts
        ctx.valid.add("counts")
    return PassResult(model, total > 0, f"{total} rewrites", broken)


def _graphsurgeon_pass(ctx: RewriteContext, model: onnx.ModelProto) -> PassResult:
    gs_rules = [r for r in ctx.rules if isinstance(r, GraphSurgeonRule)]
    out = apply_graphsurgeon_rules(model, gs_rules, ctx.report.rules, ctx.path)
    if out is model:
        return PassResult(model, False)
    ctx.make_plan(out, ModelIndex(out).names)  # names and types of the rebuilt graph
    applied = sum(ctx.report.rules.applied.get(r.name, 0) for r in gs_rules)
    return PassResult(out, True, f"{applied} rewrites")


def _lower_pass(ctx: RewriteContext, model: onnx.ModelProto) -> PassResult:
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


def _functions_pass(ctx: RewriteContext, model: onnx.ModelProto) -> PassResult:
    # The index's placeholder nodes are the model's where no pass changed a node since (rules
    # may overwrite nodes where they are and keep the index valid).
    index = ctx.index if ctx.holds("index") and ctx.index.collect and not ctx.report.rules.applied else None
    actions, ctx.attached = _attach_functions(model, ctx.registry, ctx.plan.opset, ctx.path, index)
    ctx.plan.actions.update(actions)
    return PassResult(model, bool(actions), f"{sum(actions.values())} functions attached")


def _simplify_pass(ctx: RewriteContext, model: onnx.ModelProto) -> PassResult:
    """graphkit.rewrite.simplify's passes, with the fusions its options hold as rules."""
    from graphkit.rewrite.simplify._run import describe, run_simplify

    options, opset = ctx.simplify, ctx.plan.opset
    rules = RuleSet([r for f in options.fusions if (f.min_opset or 0) <= opset for r in f.rules])

    def fuse(m: onnx.ModelProto) -> int:
        from graphkit.rewrite.simplify._shapes import skeleton

        names = NameGenerator(ModelIndex(m).names, adopt=True)
        types = TypeTable(skeleton(m), ctx.registry)  # (the rules' types: inferred without the weights)

        def make_builder(node: onnx.NodeProto, rule_name: str) -> Builder:
            return Builder(opset=opset, prefix=node.name or rule_name, names=names, types=types,
                           node_name=node.name, op_name=rule_name)
        return apply_rule_set(m, rules, make_builder=make_builder, types=types,
                              report=ctx.report.rules, path=ctx.path)
    result = run_simplify(model, ctx.registry, opset=opset, placeholder_domains=ctx.placeholders, options=options,
                          path=ctx.path, fuse=fuse if options.fuse and len(rules) else None)
    ctx.report.kept.update((f"{op} {node}", why) for (node, op), why in result.kept.items())
    if not result.changes:
        return PassResult(model, False)
    ctx.simplified = True
    ctx.report.passes.extend(describe(result))
    return PassResult(model, True, f"{sum(result.changes.values())} changes in {result.rounds} rounds")


def _imports_pass(ctx: RewriteContext, model: onnx.ModelProto) -> PassResult:
    before = [(i.domain, i.version) for i in model.opset_import]
    fix_opset_imports(model, ctx.plan.opset, {d for d, _ in ctx.report.ops_after}, ctx.placeholders)
    after = [(i.domain, i.version) for i in model.opset_import]
    return PassResult(model, before != after, f"opset imports {after}")


def _check_pass(ctx: RewriteContext, model: onnx.ModelProto) -> PassResult:
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
    if ctx.simplified:  # its weights are the input's or numpy's: checked without their bytes (copied twice else)
        from graphkit.rewrite.simplify._shapes import skeleton

        checked, scan = skeleton(model), None
    check_model(checked, ctx.registry, path=ctx.path, context=context, full=full, scan=scan, hint=hint)
    return PassResult(model, False)


def _ops_after(ctx: RewriteContext, model: onnx.ModelProto) -> collections.Counter:
    report = ctx.report
    if ctx.simplified:
        return count_ops(model)
    if ctx.holds("counts"):  # rules (counted), then lowering or functions
        after = ctx.counts.copy()
    elif report.rules.applied or (ctx.converting and not ctx.same_nodes):
        return count_ops(model)
    else:  # the input's nodes: derive the counts instead of walking the model
        after = report.ops_before.copy()
    after.subtract(ctx.plan.lowered)
    after.update(ctx.plan.emitted)
    after.update(ctx.attached)
    return +after


# The rewrite, in order. The last two run only when an earlier pass changed the model.
# "simplify" runs graphkit.rewrite.simplify's passes (SIMPLIFY_PASSES) until none changes the model.
_INDEX, _BOTH = frozenset({"index"}), ANALYSES
PASSES: tuple[Pass, ...] = (
    Pass("recognise-standard-ops", lambda ctx, m: ctx.converting and ctx.has_standard and
         ctx.prefer != (Lowering.KEEP,), _recognise_pass),
    Pass("convert-opset", lambda ctx, m: ctx.target_opset is not None, _convert_pass,
         requires=_INDEX, keeps=_INDEX),
    Pass("rules", lambda ctx, m: any(isinstance(r, (Rule, GraphPass)) for r in ctx.rules), _rules_pass,
         requires=_INDEX, keeps=_BOTH),  # ("counts" holds after it only where it counted)
    Pass("graphsurgeon-rules", lambda ctx, m: any(isinstance(r, GraphSurgeonRule) for r in ctx.rules),
         _graphsurgeon_pass),
    # Lowering replaces nodes where they are: the index's lists and graphs stay the model's.
    Pass("lower", lambda ctx, m: ctx.prefer != (Lowering.KEEP,) and (
        ctx.has_placeholders or bool(ctx.report.rules.applied)), _lower_pass, requires=_BOTH, keeps=_BOTH),
    Pass("attach-functions", lambda ctx, m: ctx.as_functions and (
        ctx.has_placeholders or bool(ctx.report.rules.applied)), _functions_pass, requires=_INDEX, keeps=_BOTH),
    Pass("simplify", lambda ctx, m: ctx.simplify is not None, _simplify_pass),
    Pass("fix-imports", lambda ctx, m: True, _imports_pass, keeps=_BOTH),
    Pass("check", lambda ctx, m: ctx.check, _check_pass, requires=_INDEX, keeps=_BOTH),
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
    :class:`graphkit.rewrite.simplify.SimplifyOptions`) runs the simplify passes after
    lowering. The passes run are :data:`PASSES`.
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
    ctx = RewriteContext(registry, prefer, rules if isinstance(rules, RuleSet) else RuleSet(rules or ()),
                         target_opset, as_functions, check, full_check, path, progress,
                         RewriteReport(ops_before=index.op_counts), placeholders, defer_check=defer_check,
                         full_check_nodes=FULL_CHECK_NODES, progress_min_nodes=PROGRESS_MIN_NODES,
                         progress_step=PROGRESS_STEP)
    ctx.converting = target_opset is not None and target_opset != ai_onnx_opset(out)
    ctx.has_standard = bool(registry.standard_op_types() & set(index.op_counts))
    ctx.has_placeholders = bool(ctx.placeholders & index.domains) or ctx.has_standard
    ctx.index = index
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
        result = p.run(ctx, out)
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
