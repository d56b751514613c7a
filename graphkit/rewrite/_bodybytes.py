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
  in this scope) and the instance is written from it, or, for a body whose one
  placeholder this is (nothing else in the scope could see what adopt() leaves there),
  the same constants and instance are written from ``LoweringPlan.adoption``; anything
  else (shape-dependent decompositions, bindings of several nodes, a template the plan
  builds again) is lowered by the plan. ``LoweringPlan.count`` counts the repeats.
* Names: the generator starts empty where no name of the model starts with a
  placeholder's ``<prefix>/`` (every generated name does; bodies' names and the outer
  names they read are in the bytes searched), else with every name of the model, as the
  engine's (``_fastpath._name_seed``).
* Element types: the engine's ``TypeTable`` (``_fastpath._ForwardTypes`` over the main
  graph, subgraphs through TypeTable's own pass), whose pass also lists the scopes
  (``_Types``). Where every placeholder input is declared with a type (or is an output
  of a main-graph If/Loop/Scan whose body output is), the declarations alone give the
  whole pass's answer for them (a forward rule never changes a declared name's type) and
  the nodes are not typed; otherwise the whole pass runs. Where sibling subgraphs define
  one name (the engine then keeps a table per scope) or a placeholder input stays
  unknown (the engine would run ONNX shape inference), the objects writer runs.
* Check: as ``_fastpath``'s, by parts where its conditions hold (see its docstring). They
  hold in bodies: a replacement reads its placeholder's inputs (visible where the
  placeholder is: the input passed the checker) and names made before it in its scope,
  makes its placeholder's outputs (a body's outputs among them), holds no subgraph, and
  the names generated are unique against every name of every scope (no shadowing of an
  outer name). Checked besides the input: every replacement the plan built, and the
  first adoption and the first repeat of each template with each pattern of empty names.
  External data, a small model or ``full_check`` send the check to the whole output, and
  so does a part the checker refuses (graph inputs or outputs without a shape, in any
  scope, among the reasons: the whole check gives them an empty shape, as the engine's).

Preconditions (each an ``Unsupported``, the report's ``writer_reason`` when the objects
writer runs instead): no model-local functions or training info, no custom node holding
a subgraph, placeholders only in the ``custom`` domain, each graph's node entries where
the parsed model has them, every placeholder input typed by the forward pass, one type
table for every scope (no two sibling graphs define a name); a target opset only where the
conversion moves the imports alone or changes nodes by steps on their own fields, which
graphkit's adapters make here (graphkit.rewrite._convertbytes.splice_scopes: in every graph,
spliced like the replacements).
"""

from __future__ import annotations

import collections
import itertools
import operator
from collections.abc import Callable, Iterator
from operator import attrgetter, itemgetter
from typing import Any

import onnx

from graphkit.ops import PLACEHOLDER_DOMAIN, OpRegistry
from graphkit.rewrite import _convertbytes
from graphkit.rewrite import _fastpath as _fp
from graphkit.rewrite import engine as _engine
from graphkit.rewrite._fastpath import _LENGTHS, Unsupported
from graphkit.rewrite._gcpause import gc_paused
from graphkit.rewrite._walk import AI_ONNX, count_ops
from graphkit.rewrite.builder import NameGenerator, TypeTable
from graphkit.rewrite.engine import RewriteReport
from graphkit.rewrite.plan import Lowered, Lowering, LoweringPlan, LoweringScope, Template

__all__ = ["lower_bytes", "lower_pieces", "WHY"]

WHY = ("lowering only, custom nodes in subgraphs, no model-local functions: the replacements are spliced "
       "into the serialized subgraphs, their nested length prefixes written again")
_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS
_NAME, _TYPE, _ELEM = attrgetter("name"), attrgetter("type"), attrgetter("tensor_type.elem_type")
_MAX_DEPTH = 64  # nested graphs deeper than this go to the objects writer (recursion here)


class _Scope:
    """One graph: its parsed message, its path from the main graph, the placeholders' indices
    and the nested graphs (``subs``: per node holding graphs, (node index, [(attribute index,
    [(position among the attribute's graphs, _Scope)])]))."""

    __slots__ = ("graph", "path", "size", "custom", "subs", "dirty")

    def __init__(self, graph: onnx.GraphProto, path: tuple[int, ...]) -> None:
        self.graph = graph
        self.path = path  # (node, attribute, graph) indices down from the main graph: tuples sort in output order
        self.custom: list[int] = []
        self.size = 0  # nodes
        # per node holding graphs: (node index, its attribute count, whether a graph it holds is dirty,
        # [(attribute index, its graphs' field number, [(position among them, _Scope)])])
        self.subs: list[tuple[int, int, bool, list[tuple[int, int, list[tuple[int, _Scope]]]]]] = []
        self.dirty = False  # it or a graph nested in it holds a placeholder


class _Undeclared(Exception):
    """A placeholder reads a name not declared (so far): the types need the whole pass."""


class _Types(_fp._ForwardTypes):
    """The engine's type table (``_fastpath._ForwardTypes`` over every node of the main graph,
    subgraphs through TypeTable's own pass) whose pass through the subgraphs also lists them:
    ``scopes`` in ModelIndex's order (the order the pass enters them), ``counts`` every node's
    (domain, op type), each scope's placeholders and nested graphs.

    Without ``forward``, the pass only declares (every graph's inputs, outputs, value_info and
    initializers, in the pass's order) and lists the scopes. That is the whole pass's answer
    for every name declared with an element type: a declaration overwrites, the forward
    rules only fill in names not typed yet (TypeTable.set, setdefault), so a declared name
    ends with its last declaration's type, whatever the nodes do; shapes are declarations
    only. The main graph's If/Loop/Scan outputs take their body outputs' declared types
    (_declared_control_flow). The caller asks it only for names so typed, else runs the
    whole pass."""

    def __init__(self, model: onnx.ModelProto, registry: OpRegistry, main: _Scope, domains: list[str],
                 op_types: list[str], holders: list[int], forward: bool = True) -> None:
        self.scopes = [main]
        self.counts = collections.Counter(zip(domains, op_types))
        self._main = main
        self._main_holders = iter(holders)  # the pass reaches the main graph's holders in order
        self._frames: list[tuple[_Scope, int, Iterator[tuple[int, int]], list]] = []
        self._at: tuple[_Scope, int] | None = None
        self._forwarding = forward
        nodes = model.graph.node
        if forward:
            everything = itemgetter(slice(None))
            super().__init__(model, registry, nodes, domains, op_types,
                             list(map(everything, map(attrgetter("input"), nodes))),
                             list(map(everything, map(attrgetter("output"), nodes))), set(holders), set())
            return
        TypeTable.__init__(self, model, registry)
        self._made = collections.Counter(itertools.chain.from_iterable(map(attrgetter("output"), nodes)))
        self._main_outputs = self._made.keys()
        self._avoid: set[str] = set()
        self.lowering = True
        self.inference_model = None
        self._declare(model.graph)
        if "" in self._elem:
            raise Unsupported("a declared tensor without a name")
        self._state = "forward"
        self._pending = None
        for index in holders:
            self._forward_subgraphs(nodes[index], domains[index])

    def _forward_subgraphs(self, node: onnx.NodeProto, domain: str) -> None:
        parent, index = (self._main, next(self._main_holders)) if self._at is None else self._at
        if not self._forwarding and domain != PLACEHOLDER_DOMAIN:
            return self._declared_holder(node, domain, parent, index)
        positions = [(a, k) for a, attr in enumerate(node.attribute) if attr.type in (_GRAPH, _GRAPHS)
                     for k in range(1 if attr.type == _GRAPH else len(attr.graphs))]
        if not positions:
            return super()._forward_subgraphs(node, domain)
        if domain == PLACEHOLDER_DOMAIN:
            raise Unsupported("a custom node with a subgraph")
        made: list[tuple[int, int, _Scope]] = []
        self._frames.append((parent, index, iter(positions), made))
        at, self._at = self._at, None
        super()._forward_subgraphs(node, domain)
        self._at = at
        self._frames.pop()
        held: dict[int, list[tuple[int, _Scope]]] = {}
        for a, k, scope in made:
            held.setdefault(a, []).append((k, scope))
        attributes = node.attribute
        dirty = any(scope.dirty for _, _, scope in made)
        parent.subs.append((index, len(attributes), dirty,
                            [(a, 6 if attributes[a].type == _GRAPH else 11, subs) for a, subs in held.items()]))
        parent.dirty = parent.dirty or dirty

    def _declared_holder(self, node: onnx.NodeProto, domain: str, parent: _Scope, index: int) -> None:
        """The declarations-only pass through the graphs ``node`` (node ``index`` of ``parent``)
        holds: per graph, _declared_body; the main graph's If/Loop/Scan outputs then take their
        bodies' declared types (_declared_control_flow)."""
        attributes = node.attribute
        held = []
        bodies = {}
        dirty = False
        base = (*parent.path, index)
        deep = len(base) + 2 > 3 * _MAX_DEPTH
        for a, attr in enumerate(attributes):
            t = attr.type
            if deep and (t == _GRAPH or t == _GRAPHS and attr.graphs):
                raise Unsupported(f"graphs nested more than {_MAX_DEPTH} deep")
            if t == _GRAPH:
                g = attr.g
                scope = self._declared_body(g, (*base, a, 0))
                bodies[attr.name] = g
                held.append((a, 6, [(0, scope)]))
                dirty = dirty or scope.dirty
            elif t == _GRAPHS:
                subs = []
                for k, g in enumerate(attr.graphs):
                    scope = self._declared_body(g, (*base, a, k))
                    subs.append((k, scope))
                    dirty = dirty or scope.dirty
                if subs:
                    held.append((a, 11, subs))
        if not held:  # no graph after all (an empty ``graphs``): TypeTable's pass does nothing either
            return
        if parent is self._main and bodies and domain in AI_ONNX:
            self._declared_control_flow(node, bodies)
        parent.subs.append((index, len(attributes), dirty, held))
        parent.dirty = parent.dirty or dirty

    def _declared_body(self, graph: onnx.GraphProto, path: tuple[int, ...]) -> _Scope:
        """One subgraph, declarations only, listed as a scope (``_forward_graph``'s): TypeTable's
        ``_define`` before it and ``_defined_untyped`` after (the names it defines that no
        declaration types are left untyped: the union the check looks in is the same as the
        whole pass's). A name the main graph's nodes make too (a model the checker refuses),
        or a placeholder input not declared so far, is left to the whole pass (_Undeclared)."""
        nodes = graph.node
        outputs = list(map(attrgetter("output"), nodes))
        # TypeTable._define: the names it defines; one typed or defined untyped already is another graph's
        names = [name for name in itertools.chain(map(_NAME, graph.input), map(_NAME, graph.initializer),
                                                  itertools.chain.from_iterable(outputs)) if name]
        elem, types, untyped = self._elem, self._types, self._defined
        for name in names:
            if name in elem or name in types or name in untyped:
                self._sibling_reuse(name)
        if not self._main_outputs.isdisjoint(names):
            raise _Undeclared
        scope = _Scope(graph, path)
        self.scopes.append(scope)
        self._declare(graph)
        domains = list(map(attrgetter("domain"), nodes))
        op_types = list(map(attrgetter("op_type"), nodes))
        scope.size = len(domains)
        self.counts.update(zip(domains, op_types))
        if PLACEHOLDER_DOMAIN in domains:
            scope.custom = [i for i, d in enumerate(domains) if d == PLACEHOLDER_DOMAIN]
            scope.dirty = True
            if not all(x in elem for i in scope.custom for x in nodes[i].input if x):
                raise _Undeclared  # not declared so far: the whole pass will be needed (If outputs, say)
        for i, attributes in enumerate(map(attrgetter("attribute"), nodes)):
            if attributes:
                self._at = (scope, i)
                self._forward_subgraphs(nodes[i], domains[i])
                self._at = None
        for name in names:  # TypeTable._defined_untyped
            if name not in elem:
                untyped.add(name)
        return scope

    def _declared_control_flow(self, node: onnx.NodeProto, bodies: dict[str, onnx.GraphProto]) -> None:
        """TypeTable._forward_control_flow for a node of the main graph, declarations only: an
        output takes its body output's type where that is declared by now (the whole pass
        has the same type for it then: a forward rule never changes a declared name's) and
        no other node makes the output (else its forward type might come first); anything
        else is left to the whole pass."""
        body = bodies.get({"If": "then_branch", "Loop": "body", "Scan": "body"}.get(node.op_type, ""))
        if body is None:
            return
        elem = self._elem
        outs = list(body.output)[1:] if node.op_type == "Loop" else list(body.output)
        for out, body_out in zip(node.output, outs):
            if out:
                t = elem.get(body_out.name)
                if t is None or self._made[out] != 1:
                    raise _Undeclared
                elem.setdefault(out, t)

    def _declare(self, graph: onnx.GraphProto) -> None:
        """TypeTable._declare, each list read in bulk: the same TypeTable.set calls in order (a
        TypeProto's ``tensor_type.elem_type`` reads 0 where it holds another type)."""
        types, elem = self._types, self._elem
        for vis in (graph.input, graph.output, graph.value_info):
            if vis:
                tps = list(map(_TYPE, vis))
                names = list(map(_NAME, vis))
                types.update(zip(names, tps))
                elem.update(filter(itemgetter(1), zip(names, map(_ELEM, tps))))
        if graph.initializer:
            for t in graph.initializer:
                self.set(t.name, onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)))

    def _forward_graph(self, graph: onnx.GraphProto) -> None:
        """TypeTable._forward_graph, listing the graph as a scope (the whole pass; _declared_body
        is the declarations-only one)."""
        parent, index, positions, made = self._frames[-1]
        a, k = next(positions)
        path = (*parent.path, index, a, k)
        if len(path) > 3 * _MAX_DEPTH:
            raise Unsupported(f"graphs nested more than {_MAX_DEPTH} deep")
        scope = _Scope(graph, path)
        self.scopes.append(scope)
        made.append((a, k, scope))
        self._declare(graph)
        nodes = graph.node
        domains = list(map(attrgetter("domain"), nodes))
        op_types = list(map(attrgetter("op_type"), nodes))
        scope.size = len(domains)
        self.counts.update(zip(domains, op_types))
        if PLACEHOLDER_DOMAIN in domains:
            scope.custom = [i for i, d in enumerate(domains) if d == PLACEHOLDER_DOMAIN]
            scope.dirty = True
        forward_node = self._forward_node
        for i, node in enumerate(nodes):
            forward_node(node, domains[i], op_types[i])
            if node.attribute:
                self._at = (scope, i)
                self._forward_subgraphs(node, domains[i])
                self._at = None


def _fields(data: bytes, pos: int, end: int, wanted: int) -> list[tuple[int, int, int]]:
    """(entry start, value start, entry end) of each length-delimited field ``wanted`` of the
    message at ``data[pos:end]`` (``_fastpath._entries``, with one-byte keys and lengths read inline)."""
    out = []
    varint = _fp._varint
    while pos < end:
        start = pos
        key = data[pos]
        pos += 1
        if key >= 0x80:
            key, pos = varint(data, start)
        wire = key & 7
        if wire == 2:
            n = data[pos]
            if n < 0x80:
                value = pos + 1
            else:
                n, value = varint(data, pos)
            pos = value + n
            if key >> 3 == wanted:
                out.append((start, value, pos))
        elif wire == 0:
            while data[pos] >= 0x80:
                pos += 1
            pos += 1
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise Unsupported(f"wire type {wire}")
    if pos != end:
        raise Unsupported("truncated field")
    return out


def _node_spans(data: bytes, pos: int, end: int) -> tuple[list[int], list[int]]:
    """Starts and ends of a GraphProto's node entries (field 1)."""
    fields = _fields(data, pos, end, 1)
    return list(map(itemgetter(0), fields)), list(map(itemgetter(2), fields))


def _splice(data: bytes, v0: int, v1: int, edits: list[tuple[int, int, bytes]]) -> bytes:
    """``data[v0:v1]`` with each (start, end, bytes) of ``edits`` (in order) put in place."""
    return b"".join(_spliced(data, v0, v1, edits))


def _spliced(data: bytes, v0: int, v1: int, edits: list[tuple[int, int, bytes]]) -> list[bytes]:
    """_splice's pieces, in order."""
    parts = []
    at = v0
    for start, end, new in edits:
        parts += (data[at:start], new)
        at = end
    parts.append(data[at:v1])
    return parts


def _graph_bytes(data: bytes, scope: _Scope, v0: int, v1: int, slots: dict[int, list[bytes]],
                 entries: tuple[list[int], list[int]] | None = None, joined: bool = True) -> Any:
    """The value of ``scope``'s graph (at ``data[v0:v1]``; ``entries``: its node entries' starts
    and ends where known) with its placeholders replaced (``slots``: by scope id, in the
    placeholders' order, taken out of it: each written once) and its nested graphs holding
    placeholders written again, their length prefixes new. ``joined=False``: as its pieces, in order."""
    starts, ends = entries if entries is not None else _node_spans(data, v0, v1)
    if len(starts) != scope.size:
        raise Unsupported("a graph's node entries do not match the parsed model")
    key = id(scope)
    edits = list(zip(map(starts.__getitem__, scope.custom), map(ends.__getitem__, scope.custom), slots.pop(key, ())))
    L = _LENGTHS
    for index, n_attributes, dirty, held in scope.subs:
        if not dirty:
            continue
        start, end = starts[index], ends[index]
        n0 = start + 2 if data[start + 1] < 0x80 else _fp._varint(data, start + 1)[1]
        attributes = _fields(data, n0, end, 5)
        if len(attributes) != n_attributes:
            raise Unsupported("a node's attribute entries do not match the parsed model")
        node_edits = []
        for a, field, subs in held:
            a_start, a0, a1 = attributes[a]
            graphs = _fields(data, a0, a1, field)
            if len(graphs) != len(subs):
                raise Unsupported("an attribute's graph entries do not match the parsed model")
            tag = b"\x32" if field == 6 else b"\x5a"
            attr_edits = []
            for k, sub in subs:
                if not sub.dirty:
                    continue
                e_start, s0, s1 = graphs[k]
                if sub.subs:
                    graph = _graph_bytes(data, sub, s0, s1, slots)
                else:  # a graph holding none: its placeholders' entries replaced, inline
                    sub_starts, sub_ends = _node_spans(data, s0, s1)
                    if len(sub_starts) != sub.size:
                        raise Unsupported("a graph's node entries do not match the parsed model")
                    pieces = []
                    at = s0
                    for i, new in zip(sub.custom, slots.pop(id(sub))):
                        pieces += (data[at:sub_starts[i]], new)
                        at = sub_ends[i]
                    pieces.append(data[at:s1])
                    graph = b"".join(pieces)
                attr_edits.append((e_start, s1, tag + L[len(graph)] + graph))
            if attr_edits:
                body = _splice(data, a0, a1, attr_edits)
                node_edits.append((a_start, a1, b"\x2a" + L[len(body)] + body))
        body = _splice(data, n0, end, node_edits)
        edits.append((start, end, b"\x0a" + L[len(body)] + body))
    if scope.custom and scope.subs:
        edits.sort(key=itemgetter(0))
    return _splice(data, v0, v1, edits) if joined else _spliced(data, v0, v1, edits)


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
        """``template.instantiate(inputs, outputs, prefix, fresh)``, serialized."""
        return self.written.emit([*inputs, *[""] * (self.n_inputs - len(inputs)),
                                  *map(template.constants.__getitem__, self.reads), *outputs], prefix, fresh)


class _Adoption:
    """``LoweringPlan.adopt`` in a scope with no constants yet (a body whose only placeholder
    this is), written as bytes: each constant the template reads, a copy of its node named
    and producing ``fresh(prefix + "/const")``, then the template's instance reading them."""

    def __init__(self, plan: LoweringPlan, key: tuple) -> None:
        template, reads = plan.adoption(key)
        self.tails = []
        for _, const in reads:
            if const.input or len(const.output) != 1:
                raise Unsupported("a template reading a constant that is not a Constant node")
            rest = onnx.NodeProto()
            rest.CopyFrom(const)
            rest.ClearField("output")
            rest.ClearField("name")
            self.tails.append(rest.SerializeToString())  # the fields after output (2) and name (3)
        self.emitter = _Emitter(Template(template.nodes, template.inputs, template.outputs, template.prefix,
                                         {name: name for name, _ in reads}))
        self.template = template
        self.constants = [const for _, const in reads]  # what count() counts of each adoption

    def emit(self, inputs: list[str], outputs: list[str], prefix: str, fresh: Callable[[str], str]) -> bytes:
        emitter = self.emitter
        pad = emitter.n_inputs - len(inputs)
        if not self.tails:  # the instance alone, written straight from its values
            return emitter.written.emit([*inputs, *[""] * pad, *outputs] if pad else inputs + outputs, prefix, fresh)
        L = _LENGTHS
        parts = []
        made = []
        for tail in self.tails:
            name = fresh(prefix + "/const")
            made.append(name)
            raw = name.encode()
            field = L[len(raw)] + raw
            body = b"".join((b"\x12", field, b"\x1a", field, tail))
            parts += (b"\x0a", L[len(body)], body)
        parts.append(emitter.written.emit([*inputs, *[""] * pad, *made, *outputs], prefix, fresh))
        return b"".join(parts)


def lower_bytes(data: bytes, model: onnx.ModelProto, *, registry: OpRegistry,
                prefer: tuple[Lowering, ...], check: bool = True, full_check: bool = False,
                path: str | None = None, progress: Callable[[str, int, int], None] | None = None,
                target_opset: int | None = None) -> tuple[bytes, RewriteReport]:
    """``_fastpath.lower_bytes`` for models with placeholders in subgraphs: the rewritten
    bytes and the report ``rewrite_model`` gives; Unsupported where the objects writer must run."""
    out, report = lower_pieces(data, model, registry=registry, prefer=prefer, check=check, full_check=full_check,
                               path=path, progress=progress, target_opset=target_opset)
    return out.join(), report


def lower_pieces(data: bytes, model: onnx.ModelProto, *, registry: OpRegistry,
                 prefer: tuple[Lowering, ...], check: bool = True, full_check: bool = False,
                 path: str | None = None, progress: Callable[[str, int, int], None] | None = None,
                 target_opset: int | None = None) -> tuple[_fp.Pieces, RewriteReport]:
    """lower_bytes, the output as its pieces (``_fastpath.Pieces``: written to a file as they are)."""
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
           target_opset: int | None) -> tuple[_fp.Pieces, RewriteReport, Callable[[], None] | None]:
    top = _fp._entries(data, 0, len(data))
    fields = [e[0] for e in top]
    if fields.count(_fp._M_GRAPH) != 1:
        raise Unsupported("graph field not present exactly once")
    if _fp._M_FUNCTIONS in fields or _fp._M_TRAINING_INFO in fields:
        raise Unsupported("model-local functions or training info")
    _, _, g0, g1 = top[fields.index(_fp._M_GRAPH)]

    nodes = model.graph.node
    if prefer == (Lowering.KEEP,):
        if target_opset is not None and target_opset != _engine.ai_onnx_opset(model):
            raise Unsupported("--target-opset with nothing to lower (the objects writer moves the imports)")
        return _fp.Pieces([data]), RewriteReport(ops_before=count_ops(model), ops_after=count_ops(model)), None
    # The checker's part on the input runs before the lists below are made (_fastpath's
    # docstring: its parse of the model and those lists are never held at once), where the
    # output will surely be checked by parts: more main-graph nodes than a full check takes.
    input_refused = None
    if check and not full_check and len(nodes) > _engine.FULL_CHECK_NODES and not _fp.has_external_data(
            data, model):
        input_refused = _fp._input_refused(data, registry)
    # The engine's type table, its pass listing the scopes: every node is read once here.
    main = _Scope(model.graph, ())
    domains = list(map(attrgetter("domain"), nodes))
    main.size = len(domains)
    if PLACEHOLDER_DOMAIN in domains:
        main.custom = [i for i, d in enumerate(domains) if d == PLACEHOLDER_DOMAIN]
        main.dirty = True
    holders = [i for i, node in enumerate(nodes) if node.attribute and any(
        a.type == _GRAPH or a.type == _GRAPHS for a in node.attribute)]
    op_types = list(map(attrgetter("op_type"), nodes))
    try:
        types = _Types(model, registry, main, domains, op_types, holders, forward=False)
        # A subgraph's placeholders were checked as the pass reached them (types are only
        # added to): the main graph's are left.
        declared = types._elem.keys()
        if not all(x in declared for i in main.custom for x in nodes[i].input if x):
            raise _Undeclared
    except _Undeclared:  # a placeholder reads a name no graph declares with a type: the forward rules'
        custom, dirty = main.custom, main.dirty
        main = _Scope(model.graph, ())
        main.custom, main.dirty, main.size = custom, dirty, len(nodes)
        types = _Types(model, registry, main, domains, op_types, holders)
    del domains, op_types
    scopes = types.scopes
    report = RewriteReport(ops_before=types.counts)
    types.counts = collections.Counter()
    placeholders = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
    if len(placeholders) > 1 and (placeholders - {PLACEHOLDER_DOMAIN}) & {d for d, _ in report.ops_before}:
        raise Unsupported("placeholders in op domains other than 'custom'")
    standard = registry.standard_op_types()
    if standard and not standard.isdisjoint(report.ops_before):
        raise Unsupported("standard ops lowered as graphkit ops (" + ", ".join(
            sorted({o for d, o in standard & set(report.ops_before)})) + ")")
    current = _engine.ai_onnx_opset(model)
    converting = target_opset is not None and target_opset != current
    changed = _fp._conversion(model, report.ops_before, collections.Counter(), current, target_opset, bodies=True) \
        if converting else None
    lists = [s for s in scopes if s.custom]
    if not lists:
        if converting:
            raise Unsupported("--target-opset with nothing to lower (the objects writer moves the imports)")
        report.ops_after = report.ops_before.copy()
        return _fp.Pieces([data]), report, None
    starts, ends, others = _fp._node_entries(data, g0, g1)

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
    spliced = None
    if changed is not None:  # graphkit's adapters, before the lowering as in the objects writer
        try:
            spliced = _convertbytes.splice_scopes(data, model, main, changed, target_opset, others, ends, g1, path)
        except _convertbytes.NotSpliced as exc:
            raise Unsupported(f"--target-opset {target_opset} needs the objects writer's conversion: {exc}") from exc
        if seed is not None:
            seed.update(spliced.made)
    opset = target_opset if target_opset is not None else current or _engine.DEFAULT_OPSET
    plan = LoweringPlan(registry, prefer, opset, path=path, names=NameGenerator(seed or ()))
    fresh = plan.names.fresh
    elem = types.elem_type
    declared = types._elem.get  # elem_type's first look (no names to avoid here, nothing pending after the pass)

    slots: dict[int, list[bytes]] = {}  # scope id -> its placeholders' replacements, in order
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

    adoptions: dict[tuple, _Adoption] = {}
    adopted: collections.Counter = collections.Counter()  # (kind, template nodes' id) -> adoptions written
    adopted_as: dict[tuple, Lowered] = {}
    for done, scope in enumerate(reversed(lists)):
        if progress is not None and done >= next_report:
            progress("lowering", done * total // len(lists), total)
            next_report = done + max(1, step * len(lists) // total)
        lscope = None  # the scope's LoweringScope, made where the plan needs it
        alone = len(scope.custom) == 1
        graph_nodes = scope.graph.node
        made_here = slots[id(scope)] = []
        for i in scope.custom:
            node = graph_nodes[i]
            inputs = node.input[:]
            outputs = node.output[:]
            values = inputs + outputs
            attributes = node.attribute
            op_type = node.op_type
            kind = (op_type, b"".join([a.SerializeToString() for a in attributes]) if attributes else b"",
                    len(inputs), tuple(map(values.index, values)), tuple([(declared(x) or elem(x)) if x else None for x in inputs]))
            first = kinds.get(kind)
            count += 1
            mode = None
            if first is None:
                lscope = lscope or LoweringScope(types)
                lowered = plan.lower(node, lscope)
                kinds[kind] = lowered
            elif first.how is Lowering.DECOMPOSE:  # what LoweringPlan._decompose does, in bytes
                key = first.key
                template = None if lscope is None else lscope.templates.get(key)
                prefix = node.name or op_type
                if template is not None:  # a repeat in this scope
                    made = emitter(template)
                    made_here.append(entries := made.emit(template, inputs, outputs, prefix, fresh))
                    repeats[(kind, id(made.nodes))] += 1
                    if (kind, id(made.nodes)) not in repeated:
                        repeated[(kind, id(made.nodes))] = Lowered(first.op, first.how, first.action, [], template)
                    mode = ("repeat", kind, id(made.nodes))
                elif alone and plan.adoptable(key):  # a body's one placeholder: adopted, in bytes
                    adoption = adoptions.get(key)
                    if adoption is None:
                        adoption = adoptions[key] = _Adoption(plan, key)
                    made_here.append(entries := adoption.emit(inputs, outputs, prefix, fresh))
                    group = (kind, id(adoption.template.nodes))
                    adopted[group] += 1
                    if group not in adopted_as:
                        adopted_as[group] = Lowered(first.op, first.how, first.action, [], adoption.template,
                                                    adoption.constants)
                    mode = ("adopt", *group)
                elif plan.adoptable(key):  # the first in this scope: another scope's template adopted
                    lscope = lscope or LoweringScope(types)
                    template, constants = plan.adopt(key, prefix, lscope)
                    made = emitter(template)
                    entries = b"".join(_fp._entry(c.SerializeToString()) for c in constants)
                    made_here.append(entries := entries + made.emit(template, inputs, outputs, prefix, fresh))
                    plan.count(Lowered(first.op, first.how, first.action, [], template, constants),
                               node.domain, op_type)
                    mode = ("adopt", kind, id(made.nodes))
                else:
                    lscope = lscope or LoweringScope(types)
                    lowered = plan.lower(node, lscope)
            elif len(first.nodes) == 1:  # bound: the node with the first one's domain and attributes
                writer = bound.get(kind)
                if writer is None:
                    writer = bound[kind] = _fp._Bound(first.nodes[0])
                made_here.append(entries := writer.emit(node))
                repeats[(kind, 0)] += 1
                repeated.setdefault((kind, 0), first)
                mode = ("bound", kind)
            else:
                lscope = lscope or LoweringScope(types)
                lowered = plan.lower(node, lscope)
            if mode is None:
                made_here.append(entries := b"".join(_fp._entry(r.SerializeToString()) for r in lowered.nodes))
                checked.append(((*scope.path, i), entries, inputs, outputs))
            elif check:
                pattern = (*mode, "" in values and tuple(map(operator.not_, values)))
                if pattern not in seen:
                    seen.add(pattern)
                    checked.append(((*scope.path, i), entries, inputs, outputs))
    if progress is not None:
        progress("lowering", total, total)
    for (kind, _), n in repeats.items():
        plan.count(repeated[(kind, _)], PLACEHOLDER_DOMAIN, kind[0], n, repeated=True)
    for group, n in adopted.items():
        plan.count(adopted_as[group], PLACEHOLDER_DOMAIN, group[0][0], n)
    _fp.count_after(report, plan)

    if spliced is not None:  # the converted nodes spliced like the replacements
        spliced.merge(scopes, slots)
        checked += spliced.checked
    graph = _graph_bytes(data, main, g0, g1, slots, (starts, ends), joined=False)  # pieces, joined only where asked
    if spliced is not None:
        graph = spliced.insert(graph, data, g1)
    del slots, spliced
    out, header, import_entries = _fp.assemble(data, model, top, graph, report, opset=opset,
                                               placeholders=placeholders, target_opset=target_opset,
                                               current=current, lowered=count, why=WHY,
                                               converted=None if changed is None else sorted(changed))
    del graph
    if not check:
        return out, report, None

    def run_check() -> None:
        out_model: list[onnx.ModelProto] = []

        def output_model() -> onnx.ModelProto:
            if not out_model:
                out_model.append(onnx.load_model_from_string(out.join()))
            return out_model[0]

        types.lowering = False
        types.inference_model = output_model
        opset_imports = onnx.ModelProto.FromString(import_entries).opset_import
        for r in plan.replacements:
            _engine.check_replacement(r.original, r.nodes, types, opset_imports, registry, r.rule, path)
        applied = ", ".join(sorted({how for _, how in plan.actions}))
        context, hint = _engine.check_context(applied, report.conversions)
        full = full_check or sum(report.ops_after.values()) <= _engine.FULL_CHECK_NODES
        if full or _fp.has_external_data(data, model):
            _engine.check_model(output_model(), registry, path=path, context=context, full=full, hint=hint)
            return
        # In the output's order (a subgraph where its node is): a name is made before it is read.
        checked.sort(key=itemgetter(0))
        why = _fp._check_parts(data, model, header, [c[1:] for c in checked], {d for d, _ in report.ops_after}, registry,
                               frozenset(AI_ONNX) if converting else frozenset(), input_refused)
        if why is None:
            report.writer_reason += f"; {_fp.CHECKED_BY_PARTS}"
        else:  # the checker's verdict on the whole output (graph inputs or outputs without a shape, in
            # any scope, refuse the input's part: the engine's check gives them an empty one, as the objects writer's)
            report.writer_reason += f"; checked whole ({why})"
            _engine.check_model(output_model(), registry, path=path, context=context, full=False, hint=hint)

    return out, report, run_check

