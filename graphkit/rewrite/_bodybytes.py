"""The byte writer inside subgraphs: custom:: placeholders in If branches, Loop and Scan bodies.

graphkit.rewrite._fastpath splices replacements into the main graph's serialized node
list. Here every graph nested in a node's attributes (``g``, ``graphs``, at any depth) is
a scope of its own: its node entries are located in the serialized model as the main
graph's are, each placeholder's entry is replaced by its replacement's, and the nested
messages around it (the graph, its attribute, the node holding it, up to the main graph)
are written again with their new length prefixes. Nothing else moves.

The result is the objects writer's, byte for byte (tests/test_fastpath.py's corpus):

* Order: ``rewrite_model``'s lower pass visits the node lists in reverse of ModelIndex's
  order (a graph before the graphs nested in it), each in node order; here the same
  order, so the name generator is asked for the same names in the same order.
* Lowering: one ``LoweringPlan`` with one ``LoweringScope`` per node list, as the pass
  has. The first node of each kind is lowered by ``LoweringPlan.lower``. A later node of
  the kind, in a scope holding the kind's template (``LoweringScope.templates``),
  repeats it (``_fastpath._Template``, with the names the template reads from its scope,
  an adopted template's constants, as slots); in a scope without one, where the plan
  would adopt another scope's template, ``LoweringPlan.adopt`` does (its constants made
  in this scope) and the instance is written from it; anything else (shape-dependent
  decompositions, bindings of several nodes, a template the plan builds again) is
  lowered by the plan. ``LoweringPlan.count`` counts the repeats.
* Names: the generator starts empty where no name of the model starts with a
  placeholder's ``<prefix>/`` (every generated name does; bodies' names and the outer
  names they read are in the bytes searched), else with every name of the model, as the
  engine's (``_fastpath._name_seed``).
* Element types: ``_fastpath._ForwardTypes`` over every node of the main graph, the
  subgraphs through ``TypeTable``'s own pass (same declarations, rules and order as the
  engine's type table); a placeholder input it leaves unknown sends the model to the
  objects writer (the engine would run ONNX shape inference).
* Check: as ``_fastpath``'s, by parts where its conditions hold (see its docstring). They
  hold in bodies: a replacement reads its placeholder's inputs (visible where the
  placeholder is: the input passed the checker) and names made before it in its scope,
  makes its placeholder's outputs (a body's outputs among them), holds no subgraph, and
  the names generated are unique against every name of every scope (no shadowing of an
  outer name). Checked besides the input: every replacement the plan built, and the
  first adoption and the first repeat of each template with each pattern of empty names.
  Graph inputs or outputs without a shape in any scope, external data, a small model or
  ``full_check`` send the check to the whole output.

Preconditions (each an ``Unsupported``, the report's ``writer_reason`` when the objects
writer runs instead): no model-local functions or training info, no custom node holding
a subgraph, placeholders only in the ``custom`` domain, each graph's node entries where
the parsed model has them, every placeholder input typed by the forward pass; a target
opset only where the conversion moves the imports alone.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import Any

import onnx

from graphkit.ops import PLACEHOLDER_DOMAIN, OpRegistry
from graphkit.rewrite import _fastpath as _fp
from graphkit.rewrite import engine as _engine
from graphkit.rewrite._fastpath import _LENGTHS, Unsupported
from graphkit.rewrite._gcpause import gc_paused
from graphkit.rewrite._walk import AI_ONNX
from graphkit.rewrite.builder import NameGenerator
from graphkit.rewrite.engine import RewriteReport
from graphkit.rewrite.plan import Lowered, Lowering, LoweringPlan, LoweringScope, Template

__all__ = ["lower_bytes", "WHY"]

WHY = ("lowering only, custom nodes in subgraphs, no model-local functions: the replacements are spliced "
       "into the serialized subgraphs, their nested length prefixes written again")
_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS
_MAX_DEPTH = 64  # nested graphs deeper than this go to the objects writer (recursion here)


class _Scope:
    """One graph: its parsed message, where its value lies in the model's bytes, its node
    entries, the placeholders' indices and the nested graphs (``subs``: per node holding
    graphs, (node index, [(attribute index, [(position among the attribute's graphs, _Scope)])]));
    ``spots``: where the nodes holding graphs with placeholders and their attributes are
    (see _locate)."""

    __slots__ = ("graph", "path", "v0", "v1", "starts", "ends", "others", "custom", "subs", "spots", "dirty")

    def __init__(self, graph: onnx.GraphProto, path: tuple[int, ...]) -> None:
        self.graph = graph
        self.path = path  # (node, attribute, graph) indices down from the main graph: tuples sort in output order
        self.v0 = self.v1 = 0
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.others: list[tuple[int, int, int]] = []
        self.custom: list[int] = []
        self.subs: list[tuple[int, list[tuple[int, list[tuple[int, _Scope]]]]]] = []
        self.spots: list[tuple[int, int, list[tuple[int, int, int, bytes, list[tuple[int, _Scope]]]]]] = []
        self.dirty = False  # it or a graph nested in it holds a placeholder


def _walk(graph: onnx.GraphProto, scopes: list[_Scope], pairs: list, shapeless: list[bool],
          path: tuple[int, ...] = ()) -> _Scope:
    """Append the scope of ``graph`` then those of the graphs nested in it (ModelIndex's order);
    ``pairs`` gets every node's (domain, op type), ``shapeless[0]`` whether a subgraph's input
    or output has a tensor type without a shape."""
    if len(path) > 3 * _MAX_DEPTH:
        raise Unsupported(f"graphs nested more than {_MAX_DEPTH} deep")
    scope = _Scope(graph, path)
    scopes.append(scope)
    nodes = graph.node
    domains = list(map(attrgetter("domain"), nodes))
    pairs += zip(domains, map(attrgetter("op_type"), nodes))
    if PLACEHOLDER_DOMAIN in domains:
        scope.custom = [i for i, d in enumerate(domains) if d == PLACEHOLDER_DOMAIN]
        scope.dirty = True
    if path and not shapeless[0]:
        shapeless[0] = any(vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")
                           for vis in (graph.input, graph.output) for vi in vis)
    for index, node in enumerate(nodes):
        attributes = node.attribute
        if not attributes:
            continue
        held = []
        for a, attr in enumerate(attributes):
            t = attr.type
            if t == _GRAPH:
                subs = [attr.g]
            elif t == _GRAPHS:
                subs = list(attr.graphs)
            else:
                continue
            if domains[index] == PLACEHOLDER_DOMAIN:
                raise Unsupported("a custom node with a subgraph")
            held.append((a, [(k, _walk(g, scopes, pairs, shapeless, (*path, index, a, k)))
                             for k, g in enumerate(subs)]))
        if held:
            scope.subs.append((index, held))
            scope.dirty = scope.dirty or any(s.dirty for _, subs in held for _, s in subs)
    return scope


def _locate(data: bytes, scope: _Scope, v0: int, v1: int) -> None:
    """Where ``scope``'s graph (its value at ``data[v0:v1]``) and its node entries are, and
    the same for the nested graphs that hold placeholders: ``spots`` gets, per node holding
    them, (node index, its value's start, [(attribute entry start, its value's start and
    end, the graph field's tag, [(graph entry start, _Scope)])])."""
    scope.v0, scope.v1 = v0, v1
    starts, ends, scope.others = _fp._node_entries(data, v0, v1)
    graph_nodes = scope.graph.node
    if len(starts) != len(graph_nodes):
        raise Unsupported("a graph's node entries do not match the parsed model")
    scope.starts, scope.ends = starts, ends
    for index, held in scope.subs:
        if not any(s.dirty for _, subs in held for _, s in subs):
            continue
        _, n0 = _fp._varint(data, starts[index] + 1)
        attributes = [e for e in _fp._entries(data, n0, ends[index]) if e[0] == 5]
        node_attributes = graph_nodes[index].attribute
        if len(attributes) != len(node_attributes) or any(data[e[1]] != 0x2A for e in attributes):
            raise Unsupported("a node's attribute entries do not match the parsed model")
        spot = []
        for a, subs in held:
            _, a_start, a0, a1 = attributes[a]
            field = 6 if node_attributes[a].type == _GRAPH else 11
            entries = [e for e in _fp._entries(data, a0, a1) if e[0] == field]
            if len(entries) != len(subs) or any(data[e[1]] != (field << 3 | 2) for e in entries):
                raise Unsupported("an attribute's graph entries do not match the parsed model")
            dirty = []
            for k, sub in subs:
                if sub.dirty:
                    _, e_start, s0, s1 = entries[k]
                    _locate(data, sub, s0, s1)
                    dirty.append((e_start, sub))
            if dirty:
                spot.append((a_start, a0, a1, bytes([field << 3 | 2]), dirty))
        scope.spots.append((index, n0, spot))


def _splice(data: bytes, v0: int, v1: int, edits: list[tuple[int, int, bytes]]) -> bytes:
    """``data[v0:v1]`` with each (start, end, bytes) of ``edits`` (in order) put in place."""
    parts = []
    at = v0
    for start, end, new in edits:
        parts += (data[at:start], new)
        at = end
    parts.append(data[at:v1])
    return b"".join(parts)


def _graph_bytes(data: bytes, scope: _Scope, slots: dict[tuple[int, int], bytes]) -> bytes:
    """The value of ``scope``'s graph with its placeholders replaced (``slots`` by (scope id,
    node index)) and its nested graphs written again."""
    starts, ends = scope.starts, scope.ends
    key = id(scope)
    edits = [(starts[i], ends[i], slots[(key, i)]) for i in scope.custom]
    for index, n0, spot in scope.spots:
        node_edits = []
        for a_start, a0, a1, tag, dirty in spot:
            attr_edits = []
            for e_start, sub in dirty:
                graph = _graph_bytes(data, sub, slots)
                attr_edits.append((e_start, sub.v1, tag + _LENGTHS[len(graph)] + graph))
            body = _splice(data, a0, a1, attr_edits)
            node_edits.append((a_start, a1, b"\x2a" + _LENGTHS[len(body)] + body))
        body = _splice(data, n0, ends[index], node_edits)
        edits.append((starts[index], ends[index], b"\x0a" + _LENGTHS[len(body)] + body))
    if scope.custom and scope.spots:
        edits.sort(key=itemgetter(0))
    return _splice(data, scope.v0, scope.v1, edits)


class _Emitter:
    """A plan template written as serialized nodes for any scope: the names it reads from its
    scope (an adopted template's constants) are slots after its inputs."""

    def __init__(self, template: Template) -> None:
        self.nodes = template.nodes  # kept: emitters are found by the identity of this list
        self.reads = list(template.constants)
        self.n_inputs = len(template.inputs)
        view = Template(template.nodes, [*template.inputs, *self.reads], template.outputs, template.prefix)
        self.written = _fp._Template(view)

    def emit(self, template: Template, inputs: list[str], outputs: list[str], prefix: str,
             fresh: Callable[[str], str]) -> bytes:
        constants = template.constants
        values = [*inputs, *[""] * (self.n_inputs - len(inputs)), *map(constants.__getitem__, self.reads), *outputs]
        return self.written.emit(values, prefix, fresh)


def lower_bytes(data: bytes, model: onnx.ModelProto, *, registry: OpRegistry,
                prefer: tuple[Lowering, ...], check: bool = True, full_check: bool = False,
                path: str | None = None, progress: Callable[[str, int, int], None] | None = None,
                target_opset: int | None = None) -> tuple[bytes, RewriteReport]:
    """``_fastpath.lower_bytes`` for models with placeholders in subgraphs: the rewritten
    bytes and the report ``rewrite_model`` gives; Unsupported where the objects writer must run."""
    try:
        with gc_paused():
            out, report, run_check = _lower(data, model, registry, prefer, check, full_check, path, progress,
                                            target_opset)
        if run_check is not None:
            run_check()
        return out, report
    finally:
        _fp._Canonical.forget()


def _lower(data: bytes, model: onnx.ModelProto, registry: OpRegistry, prefer: tuple[Lowering, ...], check: bool,
           full_check: bool, path: str | None, progress: Callable[[str, int, int], None] | None,
           target_opset: int | None) -> tuple[bytes, RewriteReport, Callable[[], None] | None]:
    top = _fp._entries(data, 0, len(data))
    fields = [e[0] for e in top]
    if fields.count(_fp._M_GRAPH) != 1:
        raise Unsupported("graph field not present exactly once")
    if _fp._M_FUNCTIONS in fields or _fp._M_TRAINING_INFO in fields:
        raise Unsupported("model-local functions or training info")
    _, _, g0, g1 = top[fields.index(_fp._M_GRAPH)]

    scopes: list[_Scope] = []
    pairs: list[tuple[str, str]] = []
    shapeless = [any(vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")
                     for vis in (model.graph.input, model.graph.output) for vi in vis)]
    main = _walk(model.graph, scopes, pairs, shapeless)
    report = RewriteReport(ops_before=collections.Counter(pairs))
    del pairs
    placeholders = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
    if len(placeholders) > 1 and (placeholders - {PLACEHOLDER_DOMAIN}) & {d for d, _ in report.ops_before}:
        raise Unsupported("placeholders in op domains other than 'custom'")
    standard = registry.standard_op_types()
    if standard and prefer != (Lowering.KEEP,) and not standard.isdisjoint(report.ops_before):
        raise Unsupported("standard ops lowered as graphkit ops (" + ", ".join(
            sorted({o for d, o in standard & set(report.ops_before)})) + ")")
    current = _engine.ai_onnx_opset(model)
    converting = target_opset is not None and target_opset != current
    if converting:
        _fp._imports_only(report.ops_before, current, target_opset)
    lists = [s for s in scopes if s.custom]
    if not lists or prefer == (Lowering.KEEP,):
        if converting:
            raise Unsupported("--target-opset with nothing to lower (the objects writer moves the imports)")
        report.ops_after = report.ops_before.copy()
        return data, report, None
    _locate(data, main, g0, g1)
    starts, ends, others = main.starts, main.ends, main.others

    # The engine's type table: the forward pass over every node, subgraphs included.
    nodes = model.graph.node
    everything = itemgetter(slice(None))
    holders = {index for index, _ in main.subs}
    types = _fp._ForwardTypes(model, registry, nodes, list(map(attrgetter("domain"), nodes)),
                              list(map(attrgetter("op_type"), nodes)),
                              list(map(everything, map(attrgetter("input"), nodes))),
                              list(map(everything, map(attrgetter("output"), nodes))), holders, set())

    prefixes = {n.name or n.op_type for s in lists for n in map(s.graph.node.__getitem__, s.custom)}
    regions = [(start, end) for field, start, _, end in top if field != _fp._M_GRAPH]
    regions += [(start, end) for field, start, end in others if field not in (5, 15)]
    if starts:
        contiguous = not any(starts[0] <= start < ends[-1] for _, start, _ in others)
        regions.append((starts[0], ends[-1]) if contiguous else (g0, g1))
    initializers = model.graph.initializer
    tensor_names = list(map(attrgetter("name"), initializers)) if any(f == 5 for f, _, _ in others) else []
    if any(f == 15 for f, _, _ in others):
        regions.append((g0, g1))
    seed = _fp._name_seed(data, regions, tensor_names, prefixes, model)
    opset = target_opset if target_opset is not None else current or _engine._DEFAULT_OPSET
    plan = LoweringPlan(registry, prefer, opset, path=path, names=NameGenerator(seed or ()))
    fresh = plan.names.fresh
    elem = types.elem_type

    slots: dict[tuple[int, int], bytes] = {}
    kinds: dict[tuple, Any] = {}  # kind of node -> the first such node's Lowered (its key, how, template)
    bound: dict[tuple, _fp._Bound] = {}
    emitters: dict[int, _Emitter] = {}
    repeats: collections.Counter = collections.Counter()  # (kind, template nodes' id) -> nodes repeated
    repeated: dict[tuple, Lowered] = {}
    checked: list[tuple[tuple, bytes, list[str], list[str]]] = []  # what the check by parts reads
    seen: set[tuple] = set()
    count = 0
    total = sum(report.ops_before.values())
    if progress is not None and total <= getattr(_engine, "PROGRESS_MIN_NODES", 10_000):
        progress = None
    step = max(1, getattr(_engine, "PROGRESS_STEP", 2_000))
    next_report = 0

    def emitter(template: Template) -> _Emitter:
        made = emitters.get(id(template.nodes))
        if made is None or list(template.constants) != made.reads:
            made = emitters[id(template.nodes)] = _Emitter(template)
        return made

    for done, scope in enumerate(reversed(lists)):
        if progress is not None and done >= next_report:
            progress("lowering", done * total // len(lists), total)
            next_report = done + max(1, step * len(lists) // total)
        lscope = LoweringScope(types)
        graph_nodes = scope.graph.node
        for i in scope.custom:
            node = graph_nodes[i]
            inputs = node.input[:]
            outputs = node.output[:]
            values = inputs + outputs
            attributes = node.attribute
            kind = (node.op_type, b"".join([a.SerializeToString() for a in attributes]) if attributes else b"",
                    len(inputs), tuple(map(values.index, values)), tuple([elem(x) if x else None for x in inputs]))
            first = kinds.get(kind)
            count += 1
            mode = None
            if first is None:
                lowered = plan.lower(node, lscope)
                kinds[kind] = lowered
            elif first.how is Lowering.DECOMPOSE:  # what LoweringPlan._decompose does, in bytes
                template = lscope.templates.get(first.key)
                prefix = node.name or node.op_type
                if template is not None:  # a repeat in this scope
                    made = emitter(template)
                    slots[(id(scope), i)] = entries = made.emit(template, inputs, outputs, prefix, fresh)
                    repeats[(kind, id(made.nodes))] += 1
                    if (kind, id(made.nodes)) not in repeated:
                        repeated[(kind, id(made.nodes))] = Lowered(first.op, first.how, first.action, [], template)
                    mode = ("repeat", kind, id(made.nodes))
                elif plan.adoptable(first.key):  # the first in this scope: another scope's template adopted
                    template, constants = plan.adopt(first.key, prefix, lscope)
                    made = emitter(template)
                    entries = b"".join(_fp._entry(c.SerializeToString()) for c in constants)
                    slots[(id(scope), i)] = entries = entries + made.emit(template, inputs, outputs, prefix, fresh)
                    plan.count(Lowered(first.op, first.how, first.action, [], template, constants),
                               node.domain, node.op_type)
                    mode = ("adopt", kind, id(made.nodes))
                else:
                    lowered = plan.lower(node, lscope)
            elif first.how is not Lowering.DECOMPOSE and len(first.nodes) == 1:
                writer = bound.get(kind)
                if writer is None:
                    writer = bound[kind] = _fp._Bound(first.nodes[0])
                slots[(id(scope), i)] = entries = writer.emit(node)
                repeats[(kind, 0)] += 1
                repeated.setdefault((kind, 0), first)
                mode = ("bound", kind)
            else:
                lowered = plan.lower(node, lscope)
            if mode is None:
                slots[(id(scope), i)] = entries = b"".join(_fp._entry(r.SerializeToString()) for r in lowered.nodes)
                checked.append(((*scope.path, i), entries, inputs, outputs))
            elif check:
                pattern = (*mode, tuple(not v for v in values))
                if pattern not in seen:
                    seen.add(pattern)
                    checked.append(((*scope.path, i), entries, inputs, outputs))
    if progress is not None:
        progress("lowering", total, total)
    for (kind, _), n in repeats.items():
        plan.count(repeated[(kind, _)], PLACEHOLDER_DOMAIN, kind[0], n, repeated=True)
    report.actions = plan.actions
    report.passed_over = plan.selection.passed_over
    after = report.ops_before.copy()
    after.subtract(plan.lowered)
    after.update(plan.emitted)
    report.ops_after = +after

    graph = _graph_bytes(data, main, slots)
    del slots
    import_entries, start_imports = _fp._fixed_imports(model, opset, {d for d, _ in report.ops_after}, placeholders,
                                                       target_opset)
    imports = import_entries
    if converting:
        report.conversions.append((current, target_opset, "imports only"))
        report.passes.append(("convert-opset", f"ai.onnx opset {current} -> {target_opset}"))
    report.passes.append(("lower", f"{count} placeholders lowered"))
    fixed = [(i.domain, i.version) for i in onnx.ModelProto.FromString(import_entries).opset_import]
    if fixed != start_imports:
        report.passes.append(("fix-imports", f"opset imports {fixed}"))
    report.writer, report.writer_reason = "bytes", WHY
    if converting:
        report.writer_reason += f"; {_fp.IMPORTS_ONLY.format(current, target_opset)}"
    parts = []
    graph_at = 0
    for field, start, _, end in top:
        if field == _fp._M_OPSET_IMPORT:
            if imports:
                parts.append(imports)
                imports = b""
        elif field == _fp._M_GRAPH:
            graph_at = len(parts)
            parts += [b"\x3a", _LENGTHS[len(graph)], graph]
        else:
            parts.append(data[start:end])
    out = b"".join([*parts, imports])
    header = b"".join([*parts[:graph_at], *parts[graph_at + 3:], imports])
    del parts, graph
    if not check:
        return out, report, None

    def run_check() -> None:
        out_model: list[onnx.ModelProto] = []

        def output_model() -> onnx.ModelProto:
            if not out_model:
                out_model.append(onnx.load_model_from_string(out))
            return out_model[0]

        types.lowering = False
        types.inference_model = output_model
        opset_imports = onnx.ModelProto.FromString(import_entries).opset_import
        for r in plan.replacements:
            _engine._check_replacement(r.original, r.nodes, types, opset_imports, registry, r.rule, path)
        applied = ", ".join(sorted({how for _, how in plan.actions}))
        context = f" after rewrite ({applied})"
        full = full_check or sum(report.ops_after.values()) <= _engine.FULL_CHECK_NODES
        if full or shapeless[0] or _fp.has_external_data(data, model):
            _engine.check_model(output_model(), registry, path=path, context=context, full=full)
            return
        # In the output's order (a subgraph where its node is): a name is made before it is read.
        checked.sort(key=itemgetter(0))
        why = _fp._check_parts(data, model, header, [c[1:] for c in checked], {d for d, _ in report.ops_after}, registry,
                               frozenset(AI_ONNX) if converting else frozenset())
        if why is None:
            report.writer_reason += f"; {_fp.CHECKED_BY_PARTS}"
        else:
            report.writer_reason += f"; checked whole ({why})"
            _fp._check_bytes(out, registry, path, context)

    return out, report, run_check

