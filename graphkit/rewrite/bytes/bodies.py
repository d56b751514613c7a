"""The bodies' byte writer: custom:: placeholders in If branches, Loop and Scan bodies.

One of the writers of graphkit.rewrite.writers (:func:`write` is its side of their one
interface; the placeholders become standard ops in ``LoweringPlan.lower``, as in every
writer). graphkit.rewrite.bytes.main_graph splices replacements into the main graph's serialized node
list. Here every graph nested in a node's attributes (``g``, ``graphs``, at any depth) is
a scope of its own: each main-graph node holding graphs with placeholders is written
again from its serialized bytes, each message on the way down to the placeholders parsed
as a wire.Skeletons message (every message-typed field kept as its bytes) and serialized
again with the placeholders' entries replaced; every other main-graph byte stays as it was.

Reading thousands of subgraphs field by field through protobuf's Python objects costs a
wrapper object per message and per repeated field read; here the subgraphs are read from
the serialized model instead, a field of a block of them at a time: messages of one kind
are parsed together as one message whose fields are all repeated (_columns: protobuf
appends a repeated field's values as they come, an end value after each message tells
them apart), and the placeholders' replacements of one template are written together
(_Layout), a field of all of them at a time.

The result is the objects writer's, byte for byte (tests/test_fastpath.py's corpus):

* Order: ``rewrite_model``'s lower pass visits the node lists in reverse of ModelIndex's
  order (a graph before the graphs nested in it), each in node order; here the same
  order, so the name generator is asked for the same names in the same order.
* Lowering: one ``LoweringPlan`` with one ``LoweringScope`` per node list, as the pass
  has. The first node of each kind is lowered by ``LoweringPlan.lower``. A later node of
  the kind, in a scope holding the kind's template (``LoweringScope.templates``),
  repeats it (``bytes.common.TemplateWriter``, with the names the template reads from its scope,
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
  engine's (``bytes.common.name_seed``); it is asked in the lowering's order, the bytes
  written afterwards.
* Element types: the engine's ``TypeTable`` (``bytes.common.forward_types`` over the main
  graph, subgraphs through TypeTable's own pass), whose pass also lists the scopes
  (``_BodyScopes``, the pass's watch). Where every placeholder input is declared with a type (or is an output
  of a main-graph If/Loop/Scan whose body output is), the declarations alone give the
  whole pass's answer for them (a forward rule never changes a declared name's type) and
  the nodes are not typed; those are read from the serialized subgraphs at once where
  every name a subgraph defines or declares is its own (``_BodyScopes._declared_bulk`` lists
  the conditions), else graph by graph. Otherwise the whole pass runs. Where sibling
  subgraphs define one name (the engine then keeps a table per scope) or a placeholder
  input stays unknown (the engine would run ONNX shape inference), the objects writer runs.
* Check: as ``bytes.main_graph``'s, by parts where its conditions hold (see its docstring). They
  hold in bodies: a replacement reads its placeholder's inputs (visible where the
  placeholder is: the input passed the checker) and names made before it in its scope,
  makes its placeholder's outputs (a body's outputs among them), holds no subgraph, and
  the names generated are unique against every name of every scope (no shadowing of an
  outer name). Checked besides the input: every replacement the plan built, and the
  first adoption and the first repeat of each template with each pattern of empty names.
  External data, a small model or ``full_check`` send the check to the whole output, and
  so does a part the checker refuses (graph inputs or outputs without a shape, in any
  scope, among the reasons: the whole check gives them an empty shape, as the engine's).
* Bytes: a message written again is protobuf's serialization of it (fields in number
  order), so where the input is as protobuf writes it, the output is the objects
  writer's byte for byte; where not, it is the same model (field for field). A main-graph
  node holding its own graphs is not parsed where the messages written again (it, the
  attributes and graphs on the way down) are as protobuf writes them back, read a field
  of many at a time (graphkit.rewrite.bytes.body_splice, which writes every graph holding
  placeholders again): its bytes are the input's with the placeholders' entries replaced
  and the length prefixes around them written again, the same bytes.

Preconditions (each an ``Unsupported``, the report's ``writer_reason`` when the objects
writer runs instead): no model-local functions or training info, no custom node holding
a subgraph, placeholders only in the ``custom`` domain, the main graph's node entries
where the parsed model has them, every placeholder input typed by the forward pass, every
type a decomposition or a kernel's binding asks for known without shape inference (found
when the plan returns, as in bytes.main_graph), one
type table for every scope (no two sibling graphs define a name); a target opset only
where the conversion moves the imports alone or changes nodes by steps on their own fields, which
graphkit's adapters make here (graphkit.rewrite.bytes.conversions.splice_scopes: in every graph,
spliced like the replacements, every graph listed and written as its serialized entries
spliced: ``graph_bytes``).

The steps are :class:`_Bodies`' methods, in :meth:`_Bodies.run`'s order.
"""

from __future__ import annotations

import collections
import itertools
import operator
import sys
from collections.abc import Callable, Iterator
from operator import attrgetter, itemgetter
from typing import Any

import onnx

from graphkit.ops import OpRegistry
from graphkit.ops._opdef import PLACEHOLDER_DOMAIN
from graphkit.rewrite.bytes import conversions
from graphkit.rewrite.bytes import wire
from graphkit.rewrite.bytes import body_splice
from graphkit.rewrite.bytes.body_splice import Scope, graph_bytes, holder_entries
from graphkit.rewrite.bytes.common import (CHECKED_BY_PARTS, BoundWriter, TemplateWriter, assemble, check_parts,
                                          conversion_steps, count_after, forward_types, input_refused, lower_first,
                                          seed_names, writer_types)
from graphkit.rewrite import engine as _engine
from graphkit.rewrite._gcpause import gc_paused
from graphkit.rewrite.graph.walk import AI_ONNX, count_ops
from graphkit.rewrite.bytes.wire import Unsupported
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.lowering.builder import NameGenerator
from graphkit.rewrite.engine import RewriteReport
from graphkit.rewrite.lowering.plan import Lowered, Lowering, LoweringPlan, LoweringScope, Template
from graphkit.rewrite.writers import Pieces, Request

__all__ = ["WHY", "write"]

WHY = ("lowering only, custom nodes in subgraphs, no model-local functions: the replacements are spliced "
       "into the serialized subgraphs, their nested length prefixes written again")
_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS
_NAME, _TYPE, _ELEM = attrgetter("name"), attrgetter("type"), attrgetter("tensor_type.elem_type")
_MAX_DEPTH = 64  # nested graphs deeper than this go to the objects writer (recursion here)
_BULK_DEPTH = 8  # _BodyScopes._declared_bulk reads graphs nested this deep; deeper ones go graph by graph
_CONTROL_FLOW_BODY = {"If": "then_branch", "Loop": "body", "Scan": "body"}
_EVERYTHING = itemgetter(slice(None))  # a repeated field's values as a list, in one call
_CHAIN, _REPEAT = itertools.chain.from_iterable, itertools.repeat


# After each graph, an empty entry of each repeated field _graph_columns reads: node (1),
# initializer (5), input (11), output (12), value_info (13).
_GRAPH_END = b"\x0a\x00\x2a\x00\x5a\x00\x62\x00\x6a\x00"
_GRAPH_FIELDS = ("node", "initializer", "input", "output", "value_info")


def _graph_columns(graphs: list[bytes]) -> dict[str, tuple[list[bytes], list[int]]]:
    """Per field of _GRAPH_FIELDS, the values of every one of the serialized GraphProtos
    ``graphs`` in order (serialized) and how many each has: they are parsed as one message,
    each followed by _GRAPH_END (protobuf appends a repeated field's values as they come; an
    empty value ends a graph's). _NotBulk where one holds an empty value itself."""
    joined = wire.Skeletons.load().graph.FromString(b"".join(itertools.chain.from_iterable(
        zip(graphs, itertools.repeat(_GRAPH_END)))))
    out = {}
    n = len(graphs)
    for name in _GRAPH_FIELDS:
        values = getattr(joined, name)[:]
        ends = list(itertools.compress(itertools.count(), map(operator.not_, values)))
        if len(ends) != n:
            raise _NotBulk
        counts = list(map(operator.sub, ends, itertools.chain((-1,), ends)))
        counts = list(map(operator.sub, counts, itertools.repeat(1)))
        if len(values) != n:
            values = list(itertools.compress(values, values))
        else:
            values = []
        out[name] = (values, counts)
    return out


_MARK = "\x00graphkit\x00"  # ends a message's values of a string field in _columns
_ENDS = {str: _MARK, bytes: b"", int: -1}


def _columns(cls: Any, messages: list[bytes], fields: tuple[tuple[str, int, type, bool], ...]) -> dict[str, Any]:
    """Fields of every one of the serialized ``messages`` at once: they are parsed as one
    message of ``cls`` (every field repeated), each followed by one end value of each field
    read (protobuf appends a repeated field's values as they come). ``fields``: (name, number,
    value type, last): per name, its values in order and how many each message has, or, where
    ``last``, each message's value (its last one, as protobuf keeps a field given twice; the
    field's default where it has none). _NotBulk where a message holds an end value itself."""
    end = b""
    for name, number, kind, _ in fields:
        if kind is int:
            end += wire.encode_varint(number << 3) + wire.encode_varint((1 << 64) - 1)
        else:
            raw = _ENDS[kind].encode() if kind is str else b""
            end += wire.encode_varint(number << 3 | 2) + wire.LENGTHS[len(raw)] + raw
    joined = cls.FromString(b"".join(itertools.chain.from_iterable(zip(messages, itertools.repeat(end)))))
    n = len(messages)
    out: dict[str, Any] = {}
    for name, _, kind, last in fields:
        values = getattr(joined, name)[:]
        mark = _ENDS[kind]
        ends = list(itertools.compress(itertools.count(), map(mark.__eq__, values)))
        if len(ends) != n:
            raise _NotBulk
        counts = list(map(operator.sub, map(operator.sub, ends, itertools.chain((-1,), ends)), itertools.repeat(1)))
        if last:
            default = kind()
            if not any(counts):
                out[name] = [default] * n
            else:
                lasts = map(values.__getitem__, map(operator.sub, ends, itertools.repeat(1)))
                out[name] = list(map(operator.getitem, zip(itertools.repeat(default), lasts), map(bool, counts)))
        else:
            if len(values) != n:
                values = list(itertools.compress(values, map(mark.__ne__, values)))
            else:
                values = []
            out[name] = (values, counts)
    return out


_NODE_FIELDS = (("input", 1, str, False), ("output", 2, str, False), ("name", 3, str, True),
                ("op_type", 4, str, True), ("attribute", 5, bytes, False), ("domain", 7, str, True))
_PLACEHOLDER_FIELDS = (("input", 1, str, False), ("output", 2, str, False), ("name", 3, str, True),
                       ("op_type", 4, str, True), ("attribute", 5, bytes, False))
_PREFIX_FIELDS = (("name", 3, str, True), ("op_type", 4, str, True))
_HOLDER_FIELDS = (("output", 2, str, False), ("op_type", 4, str, True), ("attribute", 5, bytes, False))
_ATTRIBUTE_FIELDS = (("name", 1, str, True), ("g", 6, bytes, False), ("graphs", 11, bytes, False),
                     ("type", 20, int, True))
_ATTRIBUTE_TYPE = (("type", 20, int, True),)


def _vi_sizes(names: list[str], types: list[bytes]) -> list[int]:
    """The size of each ValueInfoProto holding just a name of ``names`` and a type of ``types``."""
    name_sizes = list(map(len, map(str.encode, names)))
    type_sizes = list(map(len, types))
    if max(name_sizes, default=0) < 0x80 and max(type_sizes, default=0) < 0x80:  # one-byte lengths
        return list(map(operator.add, map(operator.add, name_sizes, type_sizes), itertools.repeat(4)))
    return list(map(_field_sizes, name_sizes, type_sizes))


def _field_sizes(a: int, b: int) -> int:
    """The size of two length-delimited fields with one-byte keys, of values ``a`` and ``b`` bytes long."""
    return 2 + len(wire.LENGTHS[a]) + a + len(wire.LENGTHS[b]) + b


class _Undeclared(Exception):
    """A placeholder reads a name not declared (so far): the types need the whole pass."""


class _NotBulk(Exception):
    """The subgraphs' declarations are not of the form _BodyScopes._declared_bulk reads at once: the
    pass goes graph by graph."""


class _BodyScopes:
    """The bodies' pass over the model: the engine's type table (graph.types.TypeTable, the
    byte writers' policy ``bytes.common.WriterTyping``) typed as the engine's pass types it,
    every node of the main graph read in bulk, subgraphs through TypeTable's own pass, which
    tells this watch (graph.types.Watch) where it goes: it lists the graphs holding
    placeholders, ``scopes`` in ModelIndex's order (the order the pass enters them), and
    counts every node's (domain, op type), ``counts``.

    Without ``forward``, the pass only declares (every graph's inputs, outputs, value_info and
    initializers, in the pass's order) and lists the scopes. That is the whole pass's answer
    for every name declared with an element type: a declaration overwrites, the forward
    rules only fill in names not typed yet (TypeTable.set, setdefault), so a declared name
    ends with its last declaration's type, whatever the nodes do; shapes are declarations
    only. The main graph's If/Loop/Scan outputs take their body outputs' declared types
    (_declared_control_flow). The caller asks it only for names so typed, else runs the
    whole pass. Where every subgraph's names are its own (_declared_bulk), the declarations
    are read a field of every subgraph at a time (``TypeTable.take_declarations``); else
    graph by graph."""

    def __init__(self, model: onnx.ModelProto, registry: OpRegistry, main: Scope, domains: list[str],
                 op_types: list[str], holders: list[int], forward: bool = True, data: bytes = b"",
                 spans: tuple[Any, Any] | None = None) -> None:
        self.scopes = [main]
        self.counts = collections.Counter(zip(domains, op_types))
        self.bulk = False  # the declarations read at once (_declared_bulk): only graphs holding placeholders listed
        self.prefixes: set[str] = set()  # where bulk: the subgraphs' placeholders' names (their op types where unnamed)
        self._main = main
        self._main_holders = iter(holders)  # the pass reaches the main graph's holders in order
        self._frames: list[tuple[Scope, int, Iterator[tuple[int, int]], list]] = []
        self._at: tuple[Scope, int] | None = None
        self._forwarding = forward
        self._graphs: tuple[list[tuple[int, ...]], list[int]] | None = None  # _declared_bulk's, for list_every_graph
        nodes = model.graph.node
        if forward:
            everything = itemgetter(slice(None))
            self.table, self.typing = forward_types(model, registry, nodes, domains, op_types,
                                                    list(map(everything, map(attrgetter("input"), nodes))),
                                                    list(map(everything, map(attrgetter("output"), nodes))),
                                                    set(holders), watch=self)
            self.table.set_watch(None)  # the pass is over (and no cycle keeps the table alive)
            return
        self.made = collections.Counter(itertools.chain.from_iterable(map(attrgetter("output"), nodes)))
        self._main_outputs = self.made.keys()
        self.table, self.typing = table, _ = writer_types(model, registry, watch=self)
        try:
            self._declarations_only(table, nodes, domains, holders, data, spans)
        finally:
            table.set_watch(None)  # the pass is over (and no cycle keeps the table alive)

    def _declarations_only(self, table: TypeTable, nodes: Any, domains: list[str], holders: list[int], data: bytes,
                           spans: tuple[Any, Any] | None) -> None:
        """The declarations-only pass: read at once where it can be (_declared_bulk), else graph by graph."""
        table.declarations_only()
        if spans is not None:
            try:
                self._declared_bulk(data, spans, domains, holders)
                self.bulk = True
                self.scopes.sort(key=attrgetter("path"))  # the pass's order (each graph before those in it)
                return
            except _NotBulk:
                self.prefixes = set()
        for index in holders:
            self.holder(table, nodes[index], domains[index])

    def holder(self, table: TypeTable, node: onnx.NodeProto, domain: str) -> None:
        """The pass reaches ``node``, holding graphs: TypeTable.forward_subgraphs, the graphs
        listed as they are entered (:meth:`graph`), or, declarations only, _declared_holder."""
        parent, index = (self._main, next(self._main_holders)) if self._at is None else self._at
        if not self._forwarding and domain != PLACEHOLDER_DOMAIN:
            return self._declared_holder(node, domain, parent, index)
        positions = [(a, k) for a, attr in enumerate(node.attribute) if attr.type in (_GRAPH, _GRAPHS)
                     for k in range(1 if attr.type == _GRAPH else len(attr.graphs))]
        if not positions:
            return table.forward_subgraphs(node, domain)
        if domain == PLACEHOLDER_DOMAIN:
            raise Unsupported("a custom node with a subgraph")
        made: list[tuple[int, int, Scope]] = []
        self._frames.append((parent, index, iter(positions), made))
        at, self._at = self._at, None
        table.forward_subgraphs(node, domain)
        self._at = at
        self._frames.pop()
        held: dict[int, list[tuple[int, Scope]]] = {}
        for a, k, scope in made:
            held.setdefault(a, []).append((k, scope))
        attributes = node.attribute
        dirty = any(scope.dirty for _, _, scope in made)
        parent.subs.append((index, len(attributes), dirty,
                            [(a, 6 if attributes[a].type == _GRAPH else 11, subs) for a, subs in held.items()]))
        parent.dirty = parent.dirty or dirty

    def graph(self, table: TypeTable, graph: onnx.GraphProto) -> None:
        """TypeTable.forward_graph, listing the graph as a scope (the whole pass; _declared_body
        is the declarations-only one)."""
        parent, index, positions, made = self._frames[-1]
        a, k = next(positions)
        path = (*parent.path, index, a, k)
        if len(path) > 3 * _MAX_DEPTH:
            raise Unsupported(f"graphs nested more than {_MAX_DEPTH} deep")
        scope = Scope(graph, path)
        self.scopes.append(scope)
        made.append((a, k, scope))
        table.declare(graph)
        nodes = graph.node
        domains = list(map(attrgetter("domain"), nodes))
        op_types = list(map(attrgetter("op_type"), nodes))
        scope.size = len(domains)
        self.counts.update(zip(domains, op_types))
        if PLACEHOLDER_DOMAIN in domains:
            scope.custom = [i for i, d in enumerate(domains) if d == PLACEHOLDER_DOMAIN]
            scope.dirty = True
        forward_node = table.forward_node
        for i, node in enumerate(nodes):
            forward_node(node, domains[i], op_types[i])
            if node.attribute:
                self._at = (scope, i)
                self.holder(table, node, domains[i])
                self._at = None

    def _declared_holder(self, node: onnx.NodeProto, domain: str, parent: Scope, index: int) -> None:
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

    def _declared_body(self, graph: onnx.GraphProto, path: tuple[int, ...]) -> Scope:
        """One subgraph, declarations only, listed as a scope (:meth:`graph`'s): TypeTable's
        ``define`` before it and ``defined_untyped`` after (the names it defines that no
        declaration types are left untyped: the union the check looks in is the same as the
        whole pass's). A name the main graph's nodes make too (a model the checker refuses),
        or a placeholder input not declared so far, is left to the whole pass (_Undeclared)."""
        table = self.table
        nodes = graph.node
        outputs = list(map(attrgetter("output"), nodes))
        names = table.define(graph, [name for name in itertools.chain(
            map(_NAME, graph.input), map(_NAME, graph.initializer), itertools.chain.from_iterable(outputs)) if name])
        if not self._main_outputs.isdisjoint(names):
            raise _Undeclared
        scope = Scope(graph, path)
        self.scopes.append(scope)
        table.declare(graph)
        elem = table.elem_types
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
                self.holder(table, nodes[i], domains[i])
                self._at = None
        table.defined_untyped(names)
        return scope

    def _declared_control_flow(self, node: onnx.NodeProto, bodies: dict[str, onnx.GraphProto]) -> None:
        """TypeTable's control-flow rule for a node of the main graph, declarations only: an
        output takes its body output's type where that is declared by now (the whole pass
        has the same type for it then: a forward rule never changes a declared name's) and
        no other node makes the output (else its forward type might come first); anything
        else is left to the whole pass."""
        body = bodies.get(_CONTROL_FLOW_BODY.get(node.op_type, ""))
        if body is None:
            return
        elem = self.table.elem_types
        outs = list(body.output)[1:] if node.op_type == "Loop" else list(body.output)
        for out, body_out in zip(node.output, outs):
            if out:
                t = elem.get(body_out.name)
                if t is None or self.made[out] != 1:
                    raise _Undeclared
                elem.setdefault(out, t)

    def _declared_bulk(self, data: bytes, spans: tuple[Any, Any], domains: list[str], holders: list[int]) -> None:
        """The declarations-only pass over every subgraph, read from the serialized model
        (``data``; ``spans``: the main graph's node entries' starts and ends) as wire.Skeletons, a
        field of body_splice.BLOCK graphs at a time (:class:`_BulkRead`), where its result does not
        depend on the order the graph-by-graph pass goes in (else _NotBulk, before anything is
        changed; that pass then runs):

        * every name a subgraph defines (inputs, node outputs) is defined once in the whole
          model: by no other subgraph, not by the main graph, not declared there (so
          TypeTable's sibling check never fires and no graph redefines another's name);
        * every name a subgraph declares (inputs, outputs, value_info) is one it defines
          itself (so each name's declarations are its own graph's, in that graph's order);
        * every placeholder input is typed when the pass reaches its graph: declared in the main
          graph, an output of an earlier main-graph If/Loop/Scan typed by its body, or declared
          by a graph defining it that the pass entered before (read so far);
        * no subgraph has initializers, graphs nest at most _BULK_DEPTH deep, no custom node
          holds one, no message field is given twice.

        Then the declarations are the same TypeTable.set calls, each graph's in its order
        (equal TypeProto bytes parsed once): the table takes them (TypeTable.take_declarations,
        the TypeProtos, for shapes, made only where asked for: most lowerings read element
        types alone); the names left untyped are those no declaration types; the control-flow
        outputs are typed as _declared_control_flow types them. The scopes listed hold their
        placeholders serialized (``Scope.nodes``)."""
        read = _BulkRead(self, data, spans, domains, holders)
        read.run()
        # Nothing was changed so far: now the pass's result.
        self.table.take_declarations(read.body_elem, read.declared, read.untyped,
                                     [(out, t) for out, (t, _) in read.flow.items()])
        self.counts.update(read.counts)
        self.scopes += read.found
        self._graphs = (read.paths, read.graph_sizes)  # for list_every_graph

    def list_every_graph(self, nodes: Any, holders: list[int]) -> None:
        """After _declared_bulk (which lists the graphs holding placeholders alone, their
        placeholders read): every graph listed as a scope, the graphs nested in each in its
        ``subs``, as the declarations-only pass lists them, each placeholder's fields as read;
        the table stays as it is (the whole pass's: _declared_bulk's conditions). What a
        conversion splicing into every graph needs (conversions.splice_scopes), the graphs
        then written again by graph_bytes (``bulk`` no longer). Where the graphs are and
        their sizes are _declared_bulk's (``_graphs``): only the nodes holding them are read."""
        read = {scope.path: scope for scope in self.scopes[1:]}
        paths, sizes = self._graphs
        size_of = dict(zip(paths, sizes))
        below: dict[tuple[int, ...], list[tuple[int, ...]]] = {}  # a graph's path -> its graphs' paths
        for path in sorted(paths):  # each graph before those in it (the pass's order)
            below.setdefault(path[:-3], []).append(path)
        main = self._main
        main.subs, main.dirty = [], bool(main.custom)
        scopes = self.scopes = [main]
        stack = [(main, nodes)]
        while stack:
            parent, parent_nodes = stack.pop()
            inner = below.get(parent.path)
            if not inner:
                continue
            made: list[tuple[Scope, Any]] = []
            for index, group in itertools.groupby(inner, key=itemgetter(-3)):
                attributes = parent_nodes[index].attribute
                held: list[tuple[int, int, list[tuple[int, Scope]]]] = []
                for a, in_attribute in itertools.groupby(group, key=itemgetter(-2)):
                    attr = attributes[a]
                    one = attr.type == _GRAPH
                    subs = []
                    for path in in_attribute:
                        graph = attr.g if one else attr.graphs[path[-1]]
                        listed = read.get(path)
                        scope = Scope(graph, path, None if listed is None else listed.custom,
                                       None if listed is None else listed.nodes,
                                       None if listed is None else listed.fields)
                        scope.size, scope.dirty = size_of[path], listed is not None
                        scopes.append(scope)
                        if path in below:  # its nodes read only where it holds graphs
                            made.append((scope, graph.node))
                        subs.append((path[-1], scope))
                    held.append((a, 6 if one else 11, subs))
                parent.subs.append((index, len(attributes), False, held))
            stack.extend(made)
        scopes.sort(key=attrgetter("path"))  # the pass's order: each graph, then those in it
        # dirty: a graph holding placeholders or one holding such a graph, found from the deepest up
        for scope in reversed(scopes):
            if scope.subs:
                subs = [(index, n, any(s.dirty for _, _, held_subs in held for _, s in held_subs), held)
                        for index, n, _, held in scope.subs]
                scope.subs = subs
                scope.dirty = scope.dirty or any(d for _, _, d, _ in subs)
        self.bulk = False


class _BulkRead:
    """_BodyScopes._declared_bulk's read of every subgraph, a level of nesting at a time and in each
    level a block of body_splice.BLOCK graphs at a time, each block's steps a method, in
    :meth:`read_block`'s order. It changes nothing of the table (_declared_bulk then does):
    where a condition does not hold, _NotBulk leaves the table as it was."""

    def __init__(self, listing: _BodyScopes, data: bytes, spans: tuple[Any, Any], domains: list[str],
                 holders: list[int]) -> None:
        self.listing = listing
        self.sk = wire.Skeletons.load()
        self.data = data
        self.starts, self.ends = spans
        self.elem0 = listing.table.elem_types
        self.paths: list[tuple[int, ...]] = []  # every subgraph's, in the order read (level by level)
        self.graph_sizes: list[int] = []  # and its node count
        self.owners: list[dict[str, int]] = []  # per block, each name its graphs define -> that graph
        self.declared: list[tuple[list[str], list]] = []  # per block and field: names, types
        self.parsed: dict[bytes, tuple[onnx.TypeProto, int]] = {}  # a TypeProto's bytes -> it, its element type
        # The names subgraphs define, each once in the model: typed by their graph's declarations
        # (-> element type) or left untyped (a graph declares only names it defines: checked)
        self.body_elem: dict[str, int] = {}
        self.untyped: set[str] = set()
        # every name of the main graph (made, declared, typed, defined untyped): none a subgraph's
        self.main_names = set(listing.made).union(listing.table.names())
        self.flow: dict[str, tuple[int, int]] = {}  # a main-graph If/Loop/Scan output -> its type, the node
        self.found: list[Scope] = []
        self.counts: collections.Counter = collections.Counter()
        # (serialized holder node, its path, its domain), level by level
        self.level: list[tuple[bytes, tuple[int, ...], str]] = list(zip(
            map(self._value, holders), zip(holders), map(domains.__getitem__, holders)))

    def _value(self, index: int) -> bytes:
        """The serialized main-graph node ``index`` (its entry's value)."""
        data, start = self.data, self.starts[index]
        return data[start + 2 if data[start + 1] < 0x80 else wire.read_varint(data, start + 1)[1]:self.ends[index]]

    def _typed_before(self, x: str, g: int) -> bool:
        """Whether placeholder input ``x`` of subgraph ``g`` is typed when the pass reaches ``g``."""
        if x in self.elem0:
            return True
        if x in self.flow:
            return self.flow[x][1] < self.paths[g][0]
        o = next((own[x] for own in self.owners if x in own), None)
        return o is not None and x in self.body_elem and (o == g or self.paths[o] <= self.paths[g])

    def run(self) -> None:
        """Every level of nesting, each a block of graphs at a time."""
        level = self.level
        depth = 0
        while level:
            depth += 1
            if depth > _BULK_DEPTH:
                raise _NotBulk
            below: list[tuple[bytes, tuple[int, ...], str]] = []
            for at in range(0, len(level), body_splice.BLOCK):
                below += self.read_block(level[at:at + body_splice.BLOCK], depth)
            level = below

    def read_block(self, block: list[tuple[bytes, tuple[int, ...], str]], depth: int) -> list:
        """The graphs a block of holder nodes hold (``block``: each one's bytes, path, domain):
        their nodes counted, their declarations, the names they define, the main graph's
        control-flow outputs they type, their placeholders listed; returns the next level's
        holders (the nodes of these graphs holding graphs)."""
        first = len(self.paths)
        graph_bytes, control_flow = self.held_graphs(block, depth)
        these = _graph_columns(graph_bytes)
        del graph_bytes
        ids = range(first, len(self.paths))
        if these["initializer"][0]:
            raise _NotBulk
        flat_bytes, sizes = these["node"]
        self.graph_sizes += sizes
        node_columns = _columns(self.sk.nodes, flat_bytes, _NODE_FIELDS)
        owner_of_node = list(_CHAIN(map(_REPEAT, ids, sizes)))
        flat_domains = node_columns["domain"]
        self.counts.update(zip(flat_domains, node_columns["op_type"]))
        names_made, n_made = node_columns["output"]
        made_by = list(_CHAIN(map(_REPEAT, owner_of_node, n_made)))
        del n_made
        block_declared = self.declarations(these, ids, names_made, made_by)
        block_owner, block_elem = self.own_names(names_made, made_by, block_declared)
        del names_made, made_by
        if control_flow:
            self.control_flow_types(control_flow, block_declared, these["output"][1], block_elem, first)
        del block_declared
        offsets = list(itertools.accumulate(sizes, initial=0))
        self.placeholders(node_columns, flat_bytes, flat_domains, owner_of_node, offsets, first, block_owner,
                          block_elem)
        return self.next_level(node_columns, flat_bytes, flat_domains, owner_of_node, offsets, first)

    def held_graphs(self, block: list[tuple[bytes, tuple[int, ...], str]], depth: int) -> tuple[list[bytes], list]:
        """The graphs the block's nodes hold, serialized, their paths listed; and per main-graph
        If/Loop/Scan (``depth`` 1): (its index, op type, outputs, its body's place in ``paths``)."""
        paths = self.paths
        raws, bases, holder_domains = zip(*block)
        if PLACEHOLDER_DOMAIN in holder_domains:
            raise _NotBulk  # a custom node holding a graph: the graph-by-graph pass says so
        held = _columns(self.sk.nodes, raws, _HOLDER_FIELDS)
        del raws
        attributes, n_attributes = held["attribute"]
        attrs = _columns(self.sk.attributes, attributes, _ATTRIBUTE_FIELDS)
        del attributes
        a_types, a_names = attrs["type"], attrs["name"]
        g_values, g_counts = attrs["g"]
        gs_values, gs_counts = attrs["graphs"]
        g_at = list(itertools.accumulate(g_counts, initial=0))
        gs_at = list(itertools.accumulate(gs_counts, initial=0))
        holder_of = list(_CHAIN(map(_REPEAT, range(len(block)), n_attributes)))
        index_of = list(_CHAIN(map(range, n_attributes)))
        # If/Loop/Scan of the main graph: the attribute naming their body (the last, as a dict keeps it)
        wanted = [_CONTROL_FLOW_BODY.get(op, "") if depth == 1 and d in AI_ONNX else ""
                  for op, d in zip(held["op_type"], holder_domains)]
        bodies: dict[int, int] = {}
        graph_bytes: list[bytes] = []
        single = list(itertools.compress(range(len(a_types)), map(_GRAPH.__eq__, a_types)))
        if _GRAPHS not in a_types and all(map(operator.eq, map(g_counts.__getitem__, single), _REPEAT(1))):
            # every graph an attribute's one (If, Loop, Scan): their paths and bytes at once
            holder_at = list(map(holder_of.__getitem__, single))
            graph_bytes = list(map(g_values.__getitem__, map(g_at.__getitem__, single)))
            base_paths = len(paths)
            paths += map(operator.add, map(bases.__getitem__, holder_at),
                         zip(map(index_of.__getitem__, single), _REPEAT(0)))
            named = list(map(wanted.__getitem__, holder_at))
            if any(named):  # If/Loop/Scan of the main graph: the attribute naming their body (the last)
                chosen = list(map(operator.and_, map(bool, named),
                                  map(operator.eq, map(a_names.__getitem__, single), named)))
                bodies = dict(zip(itertools.compress(holder_at, chosen),
                                  itertools.compress(range(base_paths, len(paths)), chosen)))
            single = None
        for j in () if single is None else itertools.compress(range(len(a_types)), map(
                operator.or_, map(_GRAPH.__eq__, a_types), map(_GRAPHS.__eq__, a_types))):
            h = holder_of[j]
            base, a = bases[h], index_of[j]
            if a_types[j] == _GRAPH:
                if g_counts[j] != 1:
                    raise _NotBulk
                graph_bytes.append(g_values[g_at[j]])
                paths.append((*base, a, 0))
                if wanted[h] and a_names[j] == wanted[h]:
                    bodies[h] = len(paths) - 1
            else:
                for k in range(gs_counts[j]):
                    graph_bytes.append(gs_values[gs_at[j] + k])
                    paths.append((*base, a, k))
        del attrs, a_types, a_names, g_values, gs_values, holder_of, index_of
        outputs, n_outputs = held["output"]
        output_at = list(itertools.accumulate(n_outputs, initial=0))
        control_flow = [(bases[h][0], held["op_type"][h], outputs[output_at[h]:output_at[h + 1]], body)
                        for h, body in bodies.items()]
        return graph_bytes, control_flow

    def declarations(self, these: dict, ids: range, names_made: list[str], made_by: list[int]) -> list[tuple]:
        """Per field (input, output, value_info) of the block's graphs: (field, names, the graph
        declaring each, their TypeProtos, their element types). The inputs' names are added to
        ``names_made`` and ``made_by`` (a graph defines its inputs)."""
        parsed, vi_from = self.parsed, self.sk.value_info.FromString
        block_declared = []
        for field in ("input", "output", "value_info"):
            vis, counts_of = these[field]
            # Their names and types at once: the ValueInfoProtos one after the other parse as
            # one ValueInfoColumns, each field's values in order. Where each holds exactly one
            # name and one type (its size is theirs), they are its own; else one by one.
            columns = self.sk.value_infos.FromString(b"".join(vis))
            names = columns.name[:]
            raw_types = columns.type[:]
            if len(names) != len(vis) or len(raw_types) != len(vis) or columns.doc_string or \
                    columns.metadata_props or list(map(len, vis)) != _vi_sizes(names, raw_types):
                vis = list(map(vi_from, vis))
                names = list(map(_NAME, vis))
                tps = list(map(_EVERYTHING, map(_TYPE, vis)))
                if not all(map(operator.le, map(len, tps), _REPEAT(1))):
                    raise _NotBulk
                raw_types = [t[0] if t else b"" for t in tps]
                del tps
            del vis, columns
            for b in set(raw_types).difference(parsed):
                tp = onnx.TypeProto.FromString(b)
                parsed[b] = (tp, tp.tensor_type.elem_type)
            pairs = list(map(parsed.__getitem__, raw_types))
            del raw_types
            by = list(_CHAIN(map(_REPEAT, ids, counts_of)))
            block_declared.append((field, names, by, list(map(itemgetter(0), pairs)),
                                   list(map(itemgetter(1), pairs))))
            if field == "input":
                names_made += names
                made_by += by
        return block_declared

    def own_names(self, names_made: list[str], made_by: list[int], block_declared: list[tuple]) -> tuple[dict, dict]:
        """The names the block's graphs define (each once in the model, none the main graph's, each
        declared only by its own graph): each one's graph, and the element types declared for
        them (the others left untyped); the declarations kept, in order."""
        if "" in names_made:
            keep = list(map(bool, names_made))
            names_made = list(itertools.compress(names_made, keep))
            made_by = list(itertools.compress(made_by, keep))
        # (looked up in the block's own dicts first: the model's are big, slow to look in)
        block_owner = dict(zip(names_made, made_by))
        if len(block_owner) != len(names_made) or not self.main_names.isdisjoint(names_made):
            raise _NotBulk
        self.owners.append(block_owner)
        get_owner = block_owner.get
        block_elem: dict[str, int] = {}
        for field, names, by, tps, elems in block_declared:
            if not all(map(operator.eq, map(get_owner, names), by)):
                raise _NotBulk  # a graph declares a name it does not define
            block_elem.update(filter(itemgetter(1), zip(names, elems)))
            self.declared.append((names, tps))
        # a name is typed by its own graph's declarations or not at all (checked just above):
        # the names defined here are block_elem's and block_untyped, none defined before
        block_untyped = list(itertools.filterfalse(block_elem.__contains__, names_made))
        body_elem, untyped = self.body_elem, self.untyped
        typed_size, untyped_size = len(body_elem), len(untyped)
        body_elem.update(block_elem)
        untyped.update(block_untyped)
        if len(body_elem) != typed_size + len(block_elem) or len(untyped) != untyped_size + len(
                block_untyped) or not untyped.isdisjoint(block_elem) or not body_elem.keys().isdisjoint(
                block_untyped):
            raise _NotBulk
        return block_owner, block_elem

    def control_flow_types(self, control_flow: list, block_declared: list[tuple], n_outputs: list[int],
                           block_elem: dict[str, int], first: int) -> None:
        """Each output of a main-graph If/Loop/Scan takes its body output's type (a Loop's after
        the condition), every output made once (else the graph-by-graph pass finds which way)."""
        made, elem0 = self.listing.made, self.elem0
        for field, names, by, tps, elems in block_declared:
            if field != "output":
                continue
            at_output = list(itertools.accumulate(n_outputs, initial=0))
            indices, op_types, node_outputs, bodies_at = zip(*control_flow)
            skip = list(map(int, map(operator.eq, op_types, _REPEAT("Loop"))))
            body_outputs = map(names.__getitem__, map(slice, map(operator.add, map(
                at_output.__getitem__, map(operator.sub, bodies_at, _REPEAT(first))), skip),
                map(at_output.__getitem__, map(operator.add, map(operator.sub, bodies_at, _REPEAT(first)),
                                                _REPEAT(1)))))
            pairs = list(map(list, map(zip, node_outputs, body_outputs)))
            outs = list(map(itemgetter(0), _CHAIN(pairs)))
            ts = list(map(block_elem.get, map(itemgetter(1), _CHAIN(pairs))))
            at = list(_CHAIN(map(_REPEAT, indices, map(len, pairs))))
            del pairs
            if "" in outs:
                keep = list(map(bool, outs))
                outs, ts, at = (list(itertools.compress(c, keep)) for c in (outs, ts, at))
            if None in ts or not all(map(operator.eq, map(made.__getitem__, outs), _REPEAT(1))):
                raise _NotBulk  # the graph-by-graph pass finds which way (_Undeclared)
            new = list(map(operator.not_, map(elem0.__contains__, outs)))
            self.flow.update(zip(itertools.compress(outs, new), zip(itertools.compress(ts, new),
                                                                     itertools.compress(at, new))))

    def placeholders(self, node_columns: dict, flat_bytes: list[bytes], flat_domains: list[str],
                     owner_of_node: list[int], offsets: list[int], first: int, block_owner: dict[str, int],
                     block_elem: dict[str, int]) -> None:
        """The block's placeholders, each input typed when the pass reaches its graph (else
        _NotBulk); the graphs holding them listed as scopes, with what the lowering reads of each
        placeholder (``Scope.fields``: not parsed again there)."""
        at_custom = list(itertools.compress(range(len(flat_bytes)), map(operator.eq, flat_domains,
                                                                       _REPEAT(PLACEHOLDER_DOMAIN))))
        if not at_custom:
            return
        paths, elem0 = self.paths, self.elem0
        owner_of = list(map(owner_of_node.__getitem__, at_custom))
        all_inputs, n_inputs = node_columns["input"]
        input_at = list(itertools.accumulate(n_inputs, initial=0))
        inputs = list(map(all_inputs.__getitem__, map(slice, map(input_at.__getitem__, at_custom),
                                                      map(input_at.__getitem__, map(operator.add, at_custom,
                                                                                    _REPEAT(1))))))
        del all_inputs, n_inputs, input_at
        xs = list(_CHAIN(inputs))
        xg = list(_CHAIN(map(_REPEAT, owner_of, map(len, inputs))))
        # most are typed in the main graph or by their own graph; the others one by one
        quick = list(map(operator.or_, map(operator.or_, map(operator.not_, xs), map(elem0.__contains__, xs)),
                         map(operator.and_, map(operator.eq, map(block_owner.get, xs), xg),
                             map(block_elem.__contains__, xs))))
        if not all(quick):  # outputs of earlier If/Loop/Scan nodes of the main graph, most likely
            slow = list(map(operator.not_, quick))
            xs, xg = list(itertools.compress(xs, slow)), list(itertools.compress(xg, slow))
            made_at = list(map(self.flow.get, xs, _REPEAT((None, len(self.starts)))))
            quick = list(map(operator.lt, map(itemgetter(1), made_at),
                             map(itemgetter(0), map(paths.__getitem__, xg))))
            if not all(quick):
                slow = list(map(operator.not_, quick))
                if not all(map(self._typed_before, itertools.compress(xs, slow), itertools.compress(xg, slow))):
                    raise _NotBulk
        del xs, xg, quick
        # what the lowering reads of each, kept (Scope.fields): not parsed again there
        all_outputs, n_outputs = node_columns["output"]  # (input names appended after: not reached)
        output_at = list(itertools.accumulate(n_outputs, initial=0))
        outputs = list(map(all_outputs.__getitem__, map(slice, map(output_at.__getitem__, at_custom), map(
            output_at.__getitem__, map(operator.add, at_custom, _REPEAT(1))))))
        del all_outputs, n_outputs, output_at
        op_types = list(map(sys.intern, map(node_columns["op_type"].__getitem__, at_custom)))  # kept: one each
        prefixes = [name or op for name, op in zip(map(node_columns["name"].__getitem__, at_custom), op_types)]
        self.listing.prefixes.update(prefixes)
        keys = [b""] * len(at_custom)
        node_attributes, n_node_attributes = node_columns["attribute"]
        if node_attributes:
            attribute_at = list(itertools.accumulate(n_node_attributes, initial=0))
            keys = [b"".join(node_attributes[attribute_at[p]:attribute_at[p + 1]]) if
                    n_node_attributes[p] else b"" for p in at_custom]
        fields = list(zip(inputs, outputs, prefixes, op_types, keys))
        del inputs, outputs, op_types, prefixes, keys
        index_in = list(map(operator.sub, at_custom, map(offsets.__getitem__, map(
            operator.sub, owner_of, _REPEAT(first)))))
        if len(set(owner_of)) == len(owner_of):  # one placeholder a graph
            self.found += map(Scope, _REPEAT(None), map(paths.__getitem__, owner_of), map(list, zip(index_in)),
                              map(list, zip(map(flat_bytes.__getitem__, at_custom))), map(list, zip(fields)))
        else:
            by_graph: dict[int, tuple[list[int], list[bytes], list[tuple]]] = {}
            for g, i, p, f in zip(owner_of, index_in, at_custom, fields):
                place = by_graph.get(g)
                if place is None:
                    place = by_graph[g] = ([], [], [])
                place[0].append(i)
                place[1].append(flat_bytes[p])
                place[2].append(f)
            self.found += [Scope(None, paths[g], custom, placeholders, graph_fields)
                           for g, (custom, placeholders, graph_fields) in by_graph.items()]

    def next_level(self, node_columns: dict, flat_bytes: list[bytes], flat_domains: list[str],
                   owner_of_node: list[int], offsets: list[int], first: int) -> list:
        """The next level: the nodes of the block's graphs holding graphs (bytes, path, domain), in order."""
        below = []
        node_attributes, n_node_attributes = node_columns["attribute"]
        if node_attributes:  # their types a column: the nodes with a graph attribute, in order
            a_types = _columns(self.sk.attributes, node_attributes, _ATTRIBUTE_TYPE)["type"]
            with_graph = list(map(operator.or_, map(_GRAPH.__eq__, a_types), map(_GRAPHS.__eq__, a_types)))
            if any(with_graph):
                of_node = list(_CHAIN(map(_REPEAT, range(len(flat_bytes)), n_node_attributes)))
                paths = self.paths
                for p in dict.fromkeys(itertools.compress(of_node, with_graph)):
                    g = owner_of_node[p]
                    below.append((flat_bytes[p], (*paths[g], p - offsets[g - first]), flat_domains[p]))
        return below


def _serialized(scopes: list[Scope]) -> Iterator[bytes]:
    """The placeholders of ``scopes``, in order, serialized."""
    for s in scopes:
        yield from s.nodes if s.nodes is not None else map(onnx.NodeProto.SerializeToString,
                                                           map(s.graph.node.__getitem__, s.custom))


def _real(node: bytes) -> onnx.NodeProto:
    """The serialized node ``node``, parsed."""
    return onnx.NodeProto.FromString(node)


def _split(values: list, counts: list[int]) -> list[list]:
    """``values`` cut into lists of ``counts[i]`` values, in order."""
    at = list(itertools.accumulate(counts, initial=0))
    return list(map(values.__getitem__, map(slice, at, at[1:])))


def _bound(writer: BoundWriter, node: Any) -> bytes:
    """``writer.emit`` for a wire.Skeletons NodeProto: the node with the bound one's domain and attributes."""
    attributes = getattr(writer, "attribute_bytes", None)
    if attributes is None:
        attributes = writer.attribute_bytes = [a.SerializeToString() for a in writer.attributes]
    out = wire.Skeletons.load().node()
    out.CopyFrom(node)
    out.domain = writer.domain
    del out.attribute[:]
    out.attribute.extend(attributes)
    return wire.entry(out.SerializeToString())


def _bound_all(writer: BoundWriter, nodes: list[bytes]) -> list[bytes]:
    """``_bound`` for each of the serialized ``nodes``, a field of all of them at a time."""
    sk = wire.Skeletons.load().node
    attributes = getattr(writer, "attribute_bytes", None)
    if attributes is None:
        attributes = writer.attribute_bytes = [a.SerializeToString() for a in writer.attributes]
    repeat = itertools.repeat
    parsed = list(map(sk.FromString, nodes))
    list(map(setattr, parsed, repeat("domain"), repeat(writer.domain)))
    list(map(sk.ClearField, parsed, repeat("attribute")))
    if attributes:
        entries = b"".join(b"\x2a" + wire.LENGTHS[len(a)] + a for a in attributes)
        list(map(sk.MergeFromString, parsed, repeat(entries)))
    return list(map(wire.entry, map(sk.SerializeToString, parsed)))


class _Layout:
    """A template's nodes (after an adoption's constants) written for many placeholders at a
    time, a field of all of them at once: ``emit(values, asked)`` is, per placeholder, the
    entries ``TemplateWriter.emit`` (and ``_Adoption.emit``) write, from its values (the
    template's inputs padded, the constants it reads, its outputs) and the names the
    generator gave it (``asks``: per template node, its name, then the names it generates)."""

    def __init__(self, written: TemplateWriter, tails: list[bytes], n_inputs: int) -> None:
        self.plan = written._plan
        self.tails = tails  # per constant made first: its node's fields after output and name
        self.n_inputs = n_inputs  # constants are the values after the inputs
        self.asks: list[str] = []
        self.generated: list[int] = []  # per generated name (in slot order): its place in ``asks``
        for suffix, generated, _, _ in self.plan:
            self.asks.append(suffix)
            for g in generated:
                self.generated.append(len(self.asks))
                self.asks.append(g)
        self.n_values: int | None = None

    def emit(self, values: list[list[str]], asked: list[list[str]]) -> list[bytes]:
        L = wire.LENGTHS
        lengths = L.__getitem__
        repeat = itertools.repeat
        add = operator.add
        v_cols = list(zip(*values))
        a_cols = list(zip(*asked))
        n_values = len(v_cols)
        encoded: dict[int, tuple[list[bytes], list[bytes], list[int]]] = {}

        def column(slot: int) -> tuple[list[bytes], list[bytes], list[int]]:
            """(names, their length prefixes, prefix + name sizes) of a values slot (or, past the
            values, a generated name's), encoded once."""
            got = encoded.get(slot)
            if got is None:
                names = v_cols[slot] if slot < n_values else a_cols[self.generated[slot - n_values]]
                raw = list(map(str.encode, names))
                sizes = list(map(len, raw))
                prefixes = list(map(lengths, sizes))
                got = encoded[slot] = (raw, prefixes, list(map(add, sizes, map(len, prefixes))))
            return got

        columns: list[Any] = []
        for c, tail in enumerate(self.tails):  # Constant nodes: output and name, then the rest
            raw, prefixes, sized = column(self.n_inputs + c)
            body = list(map(add, map(add, sized, sized), repeat(2 + len(tail))))
            columns += (repeat(b"\x0a"), map(lengths, body), repeat(b"\x12"), prefixes, raw, repeat(b"\x1a"),
                        prefixes, raw, repeat(tail))
        at = 0
        for suffix, generated, fields, rest in self.plan:
            raw_names = list(map(str.encode, a_cols[at]))
            at += 1 + len(generated)
            name_sizes = list(map(len, raw_names))
            name_prefixes = list(map(lengths, name_sizes))
            fixed = len(rest)
            sizes: Any = list(map(add, name_sizes, map(len, name_prefixes)))
            body: list[Any] = []
            for f in fields:
                if f.__class__ is int:
                    raw, prefixes, sized = column(f)
                    body += (prefixes, raw)
                    sizes = map(add, sizes, sized)
                else:
                    body.append(repeat(f))
                    fixed += len(f)
            columns += (repeat(b"\x0a"), map(lengths, map(add, sizes, repeat(fixed))), *body, name_prefixes,
                        raw_names, repeat(rest))
        return list(map(b"".join, zip(*columns)))


class _Emitter:
    """A plan template written as serialized nodes for any scope: the names it reads from its
    scope (an adopted template's constants) are slots after its inputs."""

    def __init__(self, template: Template) -> None:
        self.nodes = template.nodes  # kept: emitters are found by the identity of this list
        self.reads = list(template.constants)
        self.n_inputs = len(template.inputs)
        view = Template(template.nodes, [*template.inputs, *self.reads], template.outputs, template.prefix)
        self.written = TemplateWriter(view)

    def emit(self, template: Template, inputs: list[str], outputs: list[str], prefix: str,
             fresh: Callable[[str], str]) -> bytes:
        """``template.instantiate(inputs, outputs, prefix, fresh)``, serialized."""
        return self.written.emit([*inputs, *[""] * (self.n_inputs - len(inputs)),
                                  *map(template.constants.__getitem__, self.reads), *outputs], prefix, fresh)


class _Adoption:
    """``LoweringPlan.adopt`` in a scope with no constants yet (a body whose only placeholder
    this is), written as bytes (by its _Layout): each constant the template reads, a copy of
    its node named and producing ``fresh(prefix + "/const")`` (``tails``: its fields after the
    output and the name), then the template's instance reading them."""

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


def _run_end(block: list, start: int, kinds_of: list[int], offset: int, kind: int) -> int:
    """Where the run of bodies from ``block[start]`` on ends: bodies with one placeholder each,
    of ``kind`` (``kinds_of[offset + i]`` is the kind of ``block[i]``'s placeholder)."""
    end = start
    while end < len(block) and len(block[end].custom) == 1 and kinds_of[offset + end] == kind:
        end += 1
    return end


def write(request: Request) -> tuple[Pieces, RewriteReport]:
    """The bodies' byte writer (graphkit.rewrite.writers' interface): the request's model with
    the placeholders of every graph lowered, as the pieces of the serialized output, and the
    report ``rewrite_model`` gives; Unsupported where the objects writer must run."""
    with gc_paused():
        rewrite = _Bodies(request)
        out, run_check = rewrite.run()
        report = rewrite.report
        del rewrite  # what the check does not read
        if run_check is not None:
            run_check()
        # the rewrite's lists (held by the check) freed while the collector is paused: once it
        # runs again, its first pass walks every object made in the pause that is still alive
        del run_check
    return out, report


class _Bodies:
    """One rewrite by the bodies' byte writer, a step a method, in :meth:`run`'s order: read the
    main graph around its nodes (the preconditions), check the input, make the type table (its
    pass lists the graphs holding placeholders), seed the names (and splice the conversion),
    lower every graph's placeholders a block of graphs at a time (:meth:`lower_block`: the
    first of each kind by the plan, the others repeated or adopted, written a field of many at
    a time by _Layout), count, splice the graphs and assemble the output, check it."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.data, self.model, self.registry = request.data, request.model, request.registry

    def run(self) -> tuple[Pieces, Callable[[], None] | None]:
        """The output, and the check to run on it (None: no check)."""
        if not self.read():
            return Pieces([self.data]), None
        self.check_input()
        if not self.type_table():
            return Pieces([self.data]), None
        self.seed_and_convert()
        self.start_lowering()
        order = self.order
        for at in range(0, len(order), body_splice.BLOCK):
            self.lower_block(order[at:at + body_splice.BLOCK])
            if self.pending >= body_splice.BLOCK:
                self.flush()
        self.flush()
        self.count()
        out = self.splice()
        return out, (self.checker(out) if self.request.check else None)

    def read(self) -> bool:
        """The model's top-level entries and the preconditions on them; False: nothing to lower
        (``Lowering.KEEP``)."""
        data, model, request = self.data, self.model, self.request
        self.top = top = wire.entries(data, 0, len(data))
        fields = [e[0] for e in top]
        if fields.count(wire.MODEL_GRAPH) != 1:
            raise Unsupported("graph field not present exactly once")
        if wire.MODEL_FUNCTIONS in fields or wire.MODEL_TRAINING_INFO in fields:
            raise Unsupported("model-local functions or training info")
        _, _, *self.graph_span = top[fields.index(wire.MODEL_GRAPH)]
        if request.prefer == (Lowering.KEEP,):
            if request.target_opset is not None and request.target_opset != _engine.ai_onnx_opset(model):
                raise Unsupported("--target-opset with nothing to lower (the objects writer moves the imports)")
            self.report = RewriteReport(ops_before=count_ops(model), ops_after=count_ops(model))
            return False
        return True

    def check_input(self) -> None:
        """The checker's part on the input, before the lists below are made (bytes.main_graph's
        docstring: its parse of the model and those lists are never held at once), where the
        output will surely be checked by parts: more main-graph nodes than a full check takes."""
        request = self.request
        self.input_refused = None
        if request.check and not request.full_check and len(self.model.graph.node) > _engine.FULL_CHECK_NODES \
                and not request.has_external_data():
            self.input_refused = input_refused(self.data, self.registry)

    def type_table(self) -> bool:
        """The main graph's fields, the engine's type table (its pass lists the scopes: every node
        is read once here) and the preconditions; False: no graph holds a placeholder."""
        data, model, registry, request = self.data, self.model, self.registry, self.request
        nodes = model.graph.node
        domains = list(map(attrgetter("domain"), nodes))
        custom = [i for i, d in enumerate(domains) if d == PLACEHOLDER_DOMAIN] if PLACEHOLDER_DOMAIN in domains else []
        holders = [i for i, node in enumerate(nodes) if node.attribute and any(
            a.type == _GRAPH or a.type == _GRAPHS for a in node.attribute)]
        op_types = list(map(attrgetter("op_type"), nodes))
        g0, g1 = self.graph_span
        starts, ends, others = wire.node_entries(data, g0, g1)
        if len(starts) != len(nodes):
            raise Unsupported("node entries do not match the parsed graph")
        self.starts, self.ends, self.others = starts, ends, others
        listing, main = self._listing(nodes, domains, op_types, custom, holders, True)
        report = self.report = RewriteReport(ops_before=listing.counts)
        placeholders = self.placeholders = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
        if len(placeholders) > 1 and (placeholders - {PLACEHOLDER_DOMAIN}) & {d for d, _ in report.ops_before}:
            raise Unsupported("placeholders in op domains other than 'custom'")
        standard = registry.standard_op_types()
        if standard and not standard.isdisjoint(report.ops_before):
            raise Unsupported("standard ops lowered as graphkit ops (" + ", ".join(
                sorted({o for d, o in standard & set(report.ops_before)})) + ")")
        target = request.target_opset
        current = self.current = _engine.ai_onnx_opset(model)
        self.converting = target is not None and target != current
        self.changed = changed = conversion_steps(model, report.ops_before, collections.Counter(), current, target,
                                                  bodies=True) if self.converting else None
        if changed is not None and listing.bulk:  # the conversion splices into every graph: their scopes listed
            listing.list_every_graph(nodes, holders)
        listing.counts = collections.Counter()
        self.listing, self.types, self.typing, self.main = listing, listing.table, listing.typing, main
        self.lists = [s for s in listing.scopes if s.custom]
        if not self.lists:
            if self.converting:
                raise Unsupported("--target-opset with nothing to lower (the objects writer moves the imports)")
            report.ops_after = report.ops_before.copy()
            return False
        return True

    def _listing(self, nodes: Any, domains: list[str], op_types: list[str], custom: list[int], holders: list[int],
                 bulk: bool) -> tuple[_BodyScopes, Scope]:
        """The pass (its type table, the scopes it lists) and the main graph's scope; ``bulk``: the subgraphs' declarations may be read
        at once (where a placeholder reads a name no graph declares with a type, the whole pass)."""
        model = self.model
        main = Scope(model.graph, (), list(custom))
        main.size, main.dirty = len(nodes), bool(custom)
        try:
            listing = _BodyScopes(model, self.registry, main, domains, op_types, holders, forward=False,
                                  data=self.data, spans=(self.starts, self.ends) if bulk else None)
            # A subgraph's placeholders were checked as the pass reached them (types are only
            # added to): the main graph's are left.
            declared = listing.table.elem_types.keys()
            if not all(x in declared for i in custom for x in nodes[i].input if x):
                raise _Undeclared
        except _Undeclared:  # a placeholder reads a name no graph declares with a type: the forward rules'
            main = Scope(model.graph, (), list(custom))
            main.size, main.dirty = len(nodes), bool(custom)
            listing = _BodyScopes(model, self.registry, main, domains, op_types, holders)
        return listing, main

    def seed_and_convert(self) -> None:
        """The names the generator starts with (the placeholders' prefixes: those the bulk read
        kept, the others read now), the conversion spliced into every graph (before the
        lowering, as in the objects writer), and the lowering plan."""
        data, model, request = self.data, self.model, self.request
        prefixes: set[str] = set(self.listing.prefixes)  # those _declared_bulk read
        unread = [s for s in self.lists if s.fields is None]
        block = body_splice.BLOCK
        for at in range(0, len(unread), block):
            columns = _columns(wire.Skeletons.load().nodes, list(_serialized(unread[at:at + block])), _PREFIX_FIELDS)
            prefixes.update([name or op for name, op in zip(columns["name"], columns["op_type"])])
        del unread
        seed = seed_names(data, model, self.top, self.others, self.starts, self.ends, self.graph_span, prefixes)
        target = request.target_opset
        self.spliced = None
        if self.changed is not None:  # graphkit's adapters, before the lowering as in the objects writer
            try:
                self.spliced = conversions.splice_scopes(data, model, self.main, self.changed, target, self.others,
                                                           self.ends, self.graph_span[1], request.path)
            except conversions.NotSpliced as exc:
                raise Unsupported(f"--target-opset {target} needs the objects writer's conversion: {exc}") from exc
            if seed is not None:
                seed.update(self.spliced.made)
        self.opset = target if target is not None else self.current or _engine.DEFAULT_OPSET
        self.plan = LoweringPlan(self.registry, request.prefer, self.opset, path=request.path,
                                 names=NameGenerator(seed or ()))

    def start_lowering(self) -> None:
        """What the lowering fills in and looks up, graph after graph."""
        self.slots: dict[int, list[Any]] = {}  # scope id -> its placeholders' replacements, in order
        self.kinds: dict[int, Any] = {}  # kind of node (its number) -> the first such node's Lowered
        self.bound: dict[tuple, BoundWriter] = {}
        self.emitters: dict[int, _Emitter] = {}
        self.repeats: collections.Counter = collections.Counter()  # (kind, template nodes' id) -> nodes repeated
        self.repeated: dict[tuple, Lowered] = {}
        self.checked: list[list] = []  # what the check by parts reads: [path, entries, inputs, outputs]
        self.seen: set[tuple] = set()
        self.adoptions: dict[tuple, _Adoption] = {}
        self.adopted: collections.Counter = collections.Counter()  # (kind, template nodes' id) -> adoptions written
        self.adopted_as: dict[tuple, Lowered] = {}
        # Repeats and adoptions are written a block at a time, a field of all of them at once
        # (_Layout): per layout, each one's values, the names the generator gave it (asked in
        # the order the one-by-one writer asks), and where its entries go.
        self.rows: dict[int, tuple[_Layout, list, list, list]] = {}
        self.layouts: dict[int, tuple[Any, _Layout]] = {}  # id(TemplateWriter) -> it (kept: ids stay its), its layout
        # kind number -> what writes a body's one placeholder of that kind, adopted (while its rows are kept)
        self.alone_rows: dict[int, tuple] = {}
        self.pending = 0
        self.order = list(reversed(self.lists))  # the objects writer's order: a graph before those nested in it
        self.count_lowered = sum(map(len, map(attrgetter("custom"), self.order)))
        self.kind_numbers: dict[tuple, int] = {}
        self.numbers = itertools.count()
        progress, self.total = self.request.progress, sum(self.report.ops_before.values())
        if progress is not None and self.total <= getattr(_engine, "PROGRESS_MIN_NODES", 10_000):
            progress = None
        self.progress = progress
        self.step = max(1, getattr(_engine, "PROGRESS_STEP", 2_000))
        self.next_report = 0
        self.done_scopes = 0

    def emitter(self, template: Template) -> _Emitter:
        """The writer of ``template`` for any scope (one per template's nodes and constants read)."""
        made = self.emitters.get(id(template.nodes))
        if made is None or list(template.constants) != made.reads:
            made = self.emitters[id(template.nodes)] = _Emitter(template)
        return made

    def layout_of(self, written: Any, tails: list[bytes], n_inputs: int) -> tuple[_Layout, list, list, list]:
        """The rows of the layout writing ``written`` (the template writer), made where there are none."""
        got = self.rows.get(id(written))
        if got is None:
            known = self.layouts.get(id(written))
            if known is None:
                known = self.layouts[id(written)] = (written, _Layout(written, tails, n_inputs))
            got = self.rows[id(written)] = (known[1], [], [], [])
        return got

    def flush(self) -> None:
        """The rows kept so far written, each where its entries go (and where the check reads them)."""
        self.alone_rows.clear()
        for layout, values, asked, targets in self.rows.values():
            written = layout.emit(values, asked)
            wheres, places, checks = zip(*targets)
            list(map(list.__setitem__, wheres, places, written))
            for check_entry, entries in zip(itertools.compress(checks, checks), itertools.compress(written, checks)):
                check_entry[1] = entries
        self.rows.clear()
        self.pending = 0

    def read_block(self, block: list[Scope]) -> _Block:
        """The block's placeholders (serialized) and a field of all of them at a time: inputs,
        outputs, prefixes, op types, values, and each one's kind (op, attributes, arity,
        aliasing among inputs and outputs, input types) as a number."""
        elem, declared = self.types.elem_type, self.types.elem_types.get  # elem_type's first look: declared
        ph = list(_serialized(block))
        if all(map(attrgetter("fields"), block)):  # as _declared_bulk read them
            read = list(itertools.chain.from_iterable(map(attrgetter("fields"), block)))
            ins_of, outs_of, prefixes, ops_of, attr_keys = map(list, zip(*read))
            del read
            list(map(setattr, block, itertools.repeat("fields"), itertools.repeat(None)))  # read once: freed as it goes
        else:
            columns = _columns(wire.Skeletons.load().nodes, ph, _PLACEHOLDER_FIELDS)
            ins_of, outs_of = _split(*columns["input"]), _split(*columns["output"])
            ops_of = columns["op_type"]
            prefixes = [name or op for name, op in zip(columns["name"], ops_of)]
            attributes, n_attributes = columns["attribute"]
            attr_keys = [b""] * len(ph)
            if attributes:  # a kind's attributes: their bytes
                for k, key in zip(itertools.compress(range(len(ph)), n_attributes),
                                  map(b"".join, _split(attributes, [n for n in n_attributes if n]))):
                    attr_keys[k] = key
            del columns, attributes, n_attributes
        values_of = list(map(operator.add, ins_of, outs_of))
        aliasing: list[Any] = list(map(operator.eq, map(len, map(set, values_of)), map(len, values_of)))
        for k in itertools.compress(range(len(ph)), map(operator.not_, aliasing)):
            aliasing[k] = tuple(map(values_of[k].index, values_of[k]))
        input_at = list(itertools.accumulate(map(len, ins_of), initial=0))
        all_types = tuple(map(declared, itertools.chain.from_iterable(ins_of)))
        in_types = list(map(all_types.__getitem__, map(slice, input_at, input_at[1:])))  # tuples, one a node
        del input_at, all_types
        for k in itertools.compress(range(len(ph)), map(operator.or_, map(operator.contains, in_types,
                                                                         itertools.repeat(None)),
                                                       map(operator.contains, ins_of, itertools.repeat("")))):
            in_types[k] = tuple([(declared(x) or elem(x)) if x else None for x in ins_of[k]])
        # each kind as a number (hashed once here, not at every lookup)
        kinds_of = list(map(self.kind_numbers.setdefault, zip(ops_of, attr_keys, map(len, ins_of), aliasing,
                                                               map(len, outs_of), in_types), self.numbers))
        return _Block(block, ph, ins_of, outs_of, prefixes, ops_of, values_of, kinds_of)

    def lower_block(self, scopes: list[Scope]) -> None:
        """Every placeholder of a block of graphs, in order: a run of bodies whose one placeholder
        is of a kind bound or adopted before, all at once (:meth:`bound_run`, :meth:`adopted_run`);
        any other graph's placeholders one by one (:meth:`lower_scope`)."""
        b = self.read_block(scopes)
        kinds_of, bound, alone_rows, progress = b.kinds_of, self.bound, self.alone_rows, self.progress
        n_lists = len(self.lists)
        k = -1  # the last placeholder lowered, in the block
        n_scopes = len(scopes)
        at_scope = 0
        while at_scope < n_scopes:
            scope = scopes[at_scope]
            at_scope += 1
            if progress is not None and self.done_scopes >= self.next_report:
                progress("lowering", self.done_scopes * self.total // n_lists, self.total)
                self.next_report = self.done_scopes + max(1, self.step * n_lists // self.total)
            self.done_scopes += 1
            if len(scope.custom) == 1 and ((kind := kinds_of[k + 1]) in bound or kind in alone_rows):
                # Bodies whose one placeholder is of a kind bound or adopted before, one after the
                # other: what lower_scope does for each, for all of them at once.
                run_end = _run_end(scopes, at_scope, kinds_of, k + 2 - at_scope, kind)
                run = scopes[at_scope - 1:run_end]
                self.done_scopes += len(run) - 1
                at_scope = run_end
                first_k, k = k + 1, k + len(run)
                if kind in bound:
                    self.bound_run(b, run, first_k, kind)
                else:
                    self.adopted_run(b, run, first_k, kind)
                continue
            k = self.lower_scope(b, scope, k)

    def bound_run(self, b: _Block, run: list[Scope], first_k: int, kind: int) -> None:
        """Bodies (``run``, from the block's placeholder ``first_k`` on) whose one placeholder is of
        a kind bound before: each the node with the bound one's domain and attributes."""
        n = len(run)
        last = first_k + n
        written = _bound_all(self.bound[kind], b.ph[first_k:last])
        self.slots.update(zip(map(id, run), map(list, zip(written))))
        self.repeats[(kind, 0)] += n
        self.repeated.setdefault((kind, 0), self.kinds[kind])
        if self.request.check:
            values_r = b.values_of[first_k:last]
            empty = list(map(operator.contains, values_r, itertools.repeat("")))
            for j in (range(n) if any(empty) else range(1)):
                pattern = ("bound", kind, empty[j] and tuple(map(operator.not_, values_r[j])))
                if pattern not in self.seen:
                    self.seen.add(pattern)
                    self.checked.append([(*run[j].path, run[j].custom[0]), written[j], b.ins_of[first_k + j],
                                         b.outs_of[first_k + j]])

    def adopted_run(self, b: _Block, run: list[Scope], first_k: int, kind: int) -> None:
        """Bodies whose one placeholder is of a kind adopted before (another scope's template, its
        constants made in each body): their rows added to that adoption's layout, the names asked
        of the generator a grid at a time."""
        v_rows, a_rows, targets, asks, n_made, n_inputs, group, pattern_of = self.alone_rows[kind]
        n = len(run)
        last = first_k + n
        asked = ["/const"] * n_made + asks
        m = len(asked)
        names = self.plan.names.fresh_grid(b.prefixes[first_k:last], asked)
        row_at = range(0, n * m, m)
        ins_r, outs_r = b.ins_of[first_k:last], b.outs_of[first_k:last]
        pad = n_inputs - len(ins_r[0])
        if pad or n_made:
            made = map(names.__getitem__, map(slice, row_at, map(operator.add, row_at, itertools.repeat(n_made))))
            v_rows += map(list.__add__, map(list.__add__, map(list.__add__, ins_r, itertools.repeat([""] * pad)),
                                            made), outs_r)
        else:
            v_rows += b.values_of[first_k:last]
        a_rows += map(names.__getitem__, map(slice, map(operator.add, row_at, itertools.repeat(n_made)),
                                             map(operator.add, row_at, itertools.repeat(m))))
        del names
        self.adopted[group] += n
        heres = [[None] for _ in range(n)]
        self.slots.update(zip(map(id, run), heres))
        checks: list[Any] = [None] * n
        if self.request.check:
            values_r = b.values_of[first_k:last]
            empty = list(map(operator.contains, values_r, itertools.repeat("")))
            for j in (range(n) if any(empty) else range(1)):
                pattern = (*pattern_of, empty[j] and tuple(map(operator.not_, values_r[j])))
                if pattern not in self.seen:
                    self.seen.add(pattern)
                    checks[j] = [(*run[j].path, run[j].custom[0]), None, ins_r[j], outs_r[j]]
                    self.checked.append(checks[j])
        targets += zip(heres, itertools.repeat(0), checks)
        self.pending += n

    def lower_scope(self, b: _Block, scope: Scope, k: int) -> int:
        """The placeholders of one graph, one by one (``k``: the block's placeholder before its
        first; returns its last): what LoweringPlan.lower does for each, in bytes where a kind's
        first node was lowered before (a repeat of this scope's template, an adoption of
        another's, a binding), else by the plan. Returns the last placeholder's index."""
        plan, types, fresh, kinds, check = self.plan, self.types, self.plan.names.fresh, self.kinds, self.request.check
        lscope = None  # the scope's LoweringScope, made where the plan needs it
        alone = len(scope.custom) == 1
        made_here = self.slots[id(scope)] = [None] * len(scope.custom)
        for j, i in enumerate(scope.custom):
            k += 1
            node = b.ph[k]
            kind = b.kinds_of[k]
            inputs, outputs, values = b.ins_of[k], b.outs_of[k], b.values_of[k]
            first = kinds.get(kind)
            mode = None
            entries = None
            if first is None:
                lscope = lscope or LoweringScope(types)
                lowered = lower_first(plan, _real(node), lscope, self.typing)
                kinds[kind] = lowered
            elif first.how is Lowering.DECOMPOSE:  # what LoweringPlan._decompose does, in bytes
                key = first.key
                template = None if lscope is None else lscope.templates.get(key)
                prefix = b.prefixes[k]
                if template is not None:  # a repeat in this scope
                    made = self.emitter(template)
                    layout, v_rows, a_rows, targets = self.layout_of(made.written, [], made.n_inputs)
                    pad = made.n_inputs - len(inputs)
                    v_rows.append([*inputs, *[""] * pad, *map(template.constants.__getitem__, made.reads),
                                   *outputs] if pad or made.reads else values)
                    a_rows.append([fresh(prefix + a) for a in layout.asks])
                    group = (kind, id(made.nodes))
                    self.repeats[group] += 1
                    if group not in self.repeated:
                        self.repeated[group] = Lowered(first.op, first.how, first.action, [], template)
                    mode = ("repeat", *group)
                elif alone and plan.adoptable(key):  # a body's one placeholder: adopted, in bytes
                    adoption = self.adoptions.get(key)
                    if adoption is None:
                        adoption = self.adoptions[key] = _Adoption(plan, key)
                    written = adoption.emitter.written
                    layout, v_rows, a_rows, targets = self.layout_of(written, adoption.tails,
                                                                     adoption.emitter.n_inputs)
                    made_names = [fresh(prefix + "/const") for _ in adoption.tails]
                    pad = adoption.emitter.n_inputs - len(inputs)
                    v_rows.append([*inputs, *[""] * pad, *made_names, *outputs] if pad or made_names else values)
                    a_rows.append([fresh(prefix + a) for a in layout.asks])
                    group = (kind, id(adoption.template.nodes))
                    self.adopted[group] += 1
                    if group not in self.adopted_as:
                        self.adopted_as[group] = Lowered(first.op, first.how, first.action, [], adoption.template,
                                                         adoption.constants)
                    mode = ("adopt", *group)
                    self.alone_rows[kind] = (v_rows, a_rows, targets, layout.asks, len(adoption.tails),
                                             adoption.emitter.n_inputs, group, mode)
                elif plan.adoptable(key):  # the first in this scope: another scope's template adopted
                    lscope = lscope or LoweringScope(types)
                    template, constants = plan.adopt(key, prefix, lscope)
                    made = self.emitter(template)
                    entries = b"".join(wire.entry(c.SerializeToString()) for c in constants)
                    entries += made.emit(template, inputs, outputs, prefix, fresh)
                    plan.count(Lowered(first.op, first.how, first.action, [], template, constants),
                               PLACEHOLDER_DOMAIN, b.ops_of[k])
                    mode = ("adopt", kind, id(made.nodes))
                else:
                    lscope = lscope or LoweringScope(types)
                    lowered = lower_first(plan, _real(node), lscope, self.typing)
            elif len(first.nodes) == 1:  # bound: the node with the first one's domain and attributes
                writer = self.bound.get(kind)
                if writer is None:
                    writer = self.bound[kind] = BoundWriter(first.nodes[0])
                entries = _bound(writer, wire.Skeletons.load().node.FromString(node))
                self.repeats[(kind, 0)] += 1
                self.repeated.setdefault((kind, 0), first)
                mode = ("bound", kind)
            else:
                lscope = lscope or LoweringScope(types)
                lowered = lower_first(plan, _real(node), lscope, self.typing)
            if mode is None:
                made_here[j] = entries = b"".join(wire.entry(r.SerializeToString()) for r in lowered.nodes)
                self.checked.append([(*scope.path, i), entries, inputs, outputs])
                continue
            check_entry = None
            if check:
                pattern = (*mode, "" in values and tuple(map(operator.not_, values)))
                if pattern not in self.seen:
                    self.seen.add(pattern)
                    check_entry = [(*scope.path, i), entries, inputs, outputs]
                    self.checked.append(check_entry)
            if entries is None:
                targets.append((made_here, j, check_entry))
                self.pending += 1
            else:
                made_here[j] = entries
        return k

    def count(self) -> None:
        """The repeats and adoptions counted in the plan; the report's counts after."""
        if self.progress is not None:
            self.progress("lowering", self.total, self.total)
        plan = self.plan
        op_of_kind = {number: key[0] for key, number in self.kind_numbers.items()}
        for (kind, _), n in self.repeats.items():
            plan.count(self.repeated[(kind, _)], PLACEHOLDER_DOMAIN, op_of_kind[kind], n, repeated=True)
        for group, n in self.adopted.items():
            plan.count(self.adopted_as[group], PLACEHOLDER_DOMAIN, op_of_kind[group[0]], n)
        count_after(self.report, plan)

    def splice(self) -> Pieces:
        """The graphs holding placeholders written again around their new entries, and the
        output assembled around the main graph."""
        data, slots, spliced, starts, ends = self.data, self.slots, self.spliced, self.starts, self.ends
        g0, g1 = self.graph_span
        if spliced is not None:  # the converted nodes spliced like the replacements
            spliced.merge(self.listing.scopes, slots)
            self.checked += spliced.checked
        if not self.listing.bulk:  # every graph listed, the graphs in each (scope.subs): spliced in place, nested
            graph = graph_bytes(data, self.main, g0, g1, slots, (starts, ends), joined=False)  # pieces
            if spliced is not None:
                graph = spliced.insert(graph, data, g1)
        else:  # the graphs holding placeholders only: their main-graph nodes written again from skeletons
            edits = holder_entries(data, (starts, ends), [s for s in self.lists if s.path], slots)
            if self.main.custom:
                edits += zip(self.main.custom, slots.pop(id(self.main)))
                edits.sort(key=itemgetter(0))
            view = memoryview(data)  # big slices without a copy
            graph = []
            at = g0
            for index, entries in edits:
                start = starts[index]
                graph += (view[at:start] if start - at > 4096 else data[at:start], entries)
                at = ends[index]
            graph.append(view[at:g1])
            del edits, view
        del self.slots, self.spliced
        changed = self.changed
        out, self.header, self.import_entries = assemble(
            data, self.model, self.top, graph, self.report, opset=self.opset, placeholders=self.placeholders,
            target_opset=self.request.target_opset, current=self.current, lowered=self.count_lowered, why=WHY,
            converted=None if changed is None else sorted(changed))
        return out

    def checker(self, out: Pieces) -> Callable[[], None]:
        """The check of the output ``out``, as a function holding only what it reads (the rest is
        freed before it runs): each replacement the plan built, then the ONNX checker's verdict,
        by parts where bytes.main_graph's conditions hold, else on the whole output."""
        request, data, model, registry, report = self.request, self.data, self.model, self.registry, self.report
        plan, typing, types, checked = self.plan, self.typing, self.types, self.checked
        header, import_entries = self.header, self.import_entries
        same_schemas = frozenset(AI_ONNX) if self.converting else frozenset()
        refused, path = self.input_refused, request.path

        def run_check() -> None:
            out_model: list[onnx.ModelProto] = []

            def output_model() -> onnx.ModelProto:
                if not out_model:
                    out_model.append(onnx.load_model_from_string(out.join()))
                return out_model[0]

            typing.checking(output_model)
            opset_imports = onnx.ModelProto.FromString(import_entries).opset_import
            for r in plan.replacements:
                _engine.check_replacement(r.original, r.nodes, types, opset_imports, registry, r.rule, path)
            applied = ", ".join(sorted({how for _, how in plan.actions}))
            context, hint = _engine.check_context(applied, report.conversions)
            full = request.full_check or sum(report.ops_after.values()) <= _engine.FULL_CHECK_NODES
            if full or request.has_external_data():
                _engine.check_model(output_model(), registry, path=path, context=context, full=full, hint=hint)
                return
            # In the output's order (a subgraph where its node is): a name is made before it is read.
            checked.sort(key=itemgetter(0))
            why = check_parts(data, model, header, [c[1:] for c in checked], {d for d, _ in report.ops_after},
                              registry, same_schemas, refused)
            if why is None:
                report.writer_reason += f"; {CHECKED_BY_PARTS}"
            else:  # the checker's verdict on the whole output (graph inputs or outputs without a shape, in
                # any scope, refuse the input's part: the engine's check gives them an empty one, as the objects writer's)
                report.writer_reason += f"; checked whole ({why})"
                _engine.check_model(output_model(), registry, path=path, context=context, full=False, hint=hint)

        return run_check


class _Block:
    """A block of graphs' placeholders, a field of all of them at a time (:meth:`_Bodies.read_block`)."""

    __slots__ = ("scopes", "ph", "ins_of", "outs_of", "prefixes", "ops_of", "values_of", "kinds_of")

    def __init__(self, scopes: list[Scope], ph: list[bytes], ins_of: list, outs_of: list, prefixes: list[str],
                 ops_of: list[str], values_of: list, kinds_of: list[int]) -> None:
        self.scopes, self.ph, self.ins_of, self.outs_of = scopes, ph, ins_of, outs_of
        self.prefixes, self.ops_of, self.values_of, self.kinds_of = prefixes, ops_of, values_of, kinds_of
