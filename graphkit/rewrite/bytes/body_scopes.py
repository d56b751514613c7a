"""The bodies' byte writer's pass over the model: the scopes it lists, the types it gives.

:class:`BodyScopes` types the model with the engine's type table (graph.types.TypeTable,
the byte writers' policy bytes.common.WriterTyping), the table's pass telling it (its
watch) where it goes: it lists the graphs holding placeholders (body_splice.SpliceGraph, in
ModelIndex's order) and counts every node's op. Where the placeholders read only declared
names, the pass only declares, and where every subgraph's names are its own the
declarations are read from the serialized model a field of a block of graphs at a time
(bytes.body_bulk), else graph by graph.
"""

from __future__ import annotations

import collections
import itertools
import operator
from collections.abc import Iterator
from operator import attrgetter, itemgetter
from typing import Any

import onnx

from graphkit.ops import OpRegistry
from graphkit.ops._opdef import PLACEHOLDER_DOMAIN
from graphkit.rewrite.bytes.body_bulk import BulkRead, MainNodes
from graphkit.rewrite.bytes.body_splice import SpliceGraph
from graphkit.rewrite.bytes.columns import NotBulk
from graphkit.rewrite.bytes.common import forward_types, writer_types
from graphkit.rewrite.graph.type_rules import CONTROL_FLOW_BODY
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.graph.walk import AI_ONNX
from graphkit.rewrite.writers import Unsupported

__all__ = ["MAX_DEPTH", "BodyScopes", "Undeclared"]

_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS
_NAME, _TYPE, _ELEM = attrgetter("name"), attrgetter("type"), attrgetter("tensor_type.elem_type")
MAX_DEPTH = 64  # nested graphs deeper than this go to the objects writer (recursion in the writer)
_EVERYTHING = itemgetter(slice(None))  # a repeated field's values as a list, in one call
_CHAIN, _REPEAT = itertools.chain.from_iterable, itertools.repeat


class Undeclared(Exception):
    """A placeholder reads a name not declared (so far): the types need the whole pass."""


class BodyScopes:
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

    def __init__(self, model: onnx.ModelProto, registry: OpRegistry, main: SpliceGraph, domains: list[str],
                 op_types: list[str], holders: list[int], forward: bool = True, data: bytes = b"",
                 spans: tuple[Any, Any] | None = None, read: MainNodes | None = None) -> None:
        self.scopes = [main]
        self.counts = collections.Counter(zip(domains, op_types))
        self.bulk = False  # the declarations read at once (_declared_bulk): only graphs holding placeholders listed
        self.prefixes: set[str] = set()  # where bulk: the subgraphs' placeholders' names (their op types where unnamed)
        self._main = main
        self._main_holders = iter(holders)  # the pass reaches the main graph's holders in order
        self._frames: list[tuple[SpliceGraph, int, Iterator[tuple[int, int]], list]] = []
        self._at: tuple[SpliceGraph, int] | None = None
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
        self.made = collections.Counter(itertools.chain.from_iterable(map(attrgetter("output"), nodes))) \
            if read is None else read.made
        self._main_outputs = self.made.keys()
        self.table, self.typing = table, _ = writer_types(model, registry, watch=self)
        try:
            self._declarations_only(table, nodes, domains, holders, data, spans, read)
        finally:
            table.set_watch(None)  # the pass is over (and no cycle keeps the table alive)

    def _declarations_only(self, table: TypeTable, nodes: Any, domains: list[str], holders: list[int], data: bytes,
                           spans: tuple[Any, Any] | None, read: MainNodes | None) -> None:
        """The declarations-only pass: read at once where it can be (_declared_bulk), else graph by graph."""
        table.declarations_only()
        if spans is not None:
            try:
                self._declared_bulk(data, spans, domains, holders, read)
                self.bulk = True
                self.scopes.sort(key=attrgetter("path"))  # the pass's order (each graph before those in it)
                return
            except NotBulk:
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
        made: list[tuple[int, int, SpliceGraph]] = []
        self._frames.append((parent, index, iter(positions), made))
        at, self._at = self._at, None
        table.forward_subgraphs(node, domain)
        self._at = at
        self._frames.pop()
        held: dict[int, list[tuple[int, SpliceGraph]]] = {}
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
        if len(path) > 3 * MAX_DEPTH:
            raise Unsupported(f"graphs nested more than {MAX_DEPTH} deep")
        scope = SpliceGraph(graph, path)
        self.scopes.append(scope)
        made.append((a, k, scope))
        table.declare(graph)
        nodes = graph.node
        domains, op_types = self._listed(scope, nodes)
        forward_node = table.forward_node
        for i, node in enumerate(nodes):
            forward_node(node, domains[i], op_types[i])
            if node.attribute:
                self._at = (scope, i)
                self.holder(table, node, domains[i])
                self._at = None

    def _listed(self, scope: SpliceGraph, nodes: Any) -> tuple[list[str], list[str]]:
        """The domains and op types of ``scope``'s nodes, counted; its placeholders listed."""
        domains = list(map(attrgetter("domain"), nodes))
        op_types = list(map(attrgetter("op_type"), nodes))
        scope.size = len(domains)
        self.counts.update(zip(domains, op_types))
        if PLACEHOLDER_DOMAIN in domains:
            scope.custom = [i for i, d in enumerate(domains) if d == PLACEHOLDER_DOMAIN]
            scope.dirty = True
        return domains, op_types

    # A recursion, not walk(): the watch's side of TypeTable's pass (holder() is its callback), step
    # for step with the whole pass (define, declare, holders, defined_untyped); MAX_DEPTH bounds it.
    def _declared_holder(self, node: onnx.NodeProto, domain: str, parent: SpliceGraph, index: int) -> None:
        """The declarations-only pass through the graphs ``node`` (node ``index`` of ``parent``)
        holds: per graph, _declared_body; the main graph's If/Loop/Scan outputs then take their
        bodies' declared types (_declared_control_flow)."""
        attributes = node.attribute
        held = []
        bodies = {}
        dirty = False
        base = (*parent.path, index)
        deep = len(base) + 2 > 3 * MAX_DEPTH
        for a, attr in enumerate(attributes):
            t = attr.type
            if deep and (t == _GRAPH or t == _GRAPHS and attr.graphs):
                raise Unsupported(f"graphs nested more than {MAX_DEPTH} deep")
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

    def _declared_body(self, graph: onnx.GraphProto, path: tuple[int, ...]) -> SpliceGraph:
        """One subgraph, declarations only, listed as a scope (:meth:`graph`'s): TypeTable's
        ``define`` before it and ``defined_untyped`` after (the names it defines that no
        declaration types are left untyped: the union the check looks in is the same as the
        whole pass's). A name the main graph's nodes make too (a model the checker refuses),
        or a placeholder input not declared so far, is left to the whole pass (Undeclared)."""
        table = self.table
        nodes = graph.node
        outputs = list(map(attrgetter("output"), nodes))
        names = table.define(graph, [name for name in itertools.chain(
            map(_NAME, graph.input), map(_NAME, graph.initializer), itertools.chain.from_iterable(outputs)) if name])
        if not self._main_outputs.isdisjoint(names):
            raise Undeclared
        scope = SpliceGraph(graph, path)
        self.scopes.append(scope)
        table.declare(graph)
        elem = table.elem_types
        domains, _ = self._listed(scope, nodes)
        if scope.custom and not all(x in elem for i in scope.custom for x in nodes[i].input if x):
            raise Undeclared  # not declared so far: the whole pass will be needed (If outputs, say)
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
        body = bodies.get(CONTROL_FLOW_BODY.get(node.op_type, ""))
        if body is None:
            return
        elem = self.table.elem_types
        outs = list(body.output)[1:] if node.op_type == "Loop" else list(body.output)
        for out, body_out in zip(node.output, outs):
            if out:
                t = elem.get(body_out.name)
                if t is None or self.made[out] != 1:
                    raise Undeclared
                elem.setdefault(out, t)

    def _declared_bulk(self, data: bytes, spans: tuple[Any, Any], domains: list[str], holders: list[int],
                       read: MainNodes | None = None) -> None:
        """The declarations-only pass over every subgraph, read from the serialized model
        (``data``; ``spans``: the main graph's node entries' starts and ends) as wire.Skeletons, a
        field of body_splice.BLOCK graphs at a time (body_bulk.BulkRead), where its result does not
        depend on the order the graph-by-graph pass goes in (else NotBulk, before anything is
        changed; that pass then runs):

        * every name a subgraph defines (inputs, node outputs) is defined once in the whole
          model: by no other subgraph, not by the main graph, not declared there (so
          TypeTable's sibling check never fires and no graph redefines another's name);
        * every name a subgraph declares (inputs, outputs, value_info) is one it defines
          itself (so each name's declarations are its own graph's, in that graph's order);
        * every placeholder input is typed when the pass reaches its graph: declared in the main
          graph, an output of an earlier main-graph If/Loop/Scan typed by its body, or declared
          by a graph defining it that the pass entered before (read so far);
        * no subgraph has initializers, graphs nest at most body_bulk.BULK_DEPTH deep, no custom node
          holds one, no message field is given twice.

        Then the declarations are the same TypeTable.set calls, each graph's in its order
        (equal TypeProto bytes parsed once): the table takes them (TypeTable.take_declarations,
        the TypeProtos, for shapes, made only where asked for: most lowerings read element
        types alone); the names left untyped are those no declaration types; the control-flow
        outputs are typed as _declared_control_flow types them. The scopes listed hold their
        placeholders serialized (``SpliceGraph.nodes``). ``read``: the main graph's nodes, where
        main_nodes read them."""
        read = BulkRead(self, data, spans, domains, holders, None if read is None else read.held)
        read.run()
        # Nothing was changed so far: now the pass's result.
        self.table.take_declarations(read.body_elem, read.declared, read.untyped,
                                     zip(read.flow, map(itemgetter(0), read.flow.values())))
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
        their sizes are _declared_bulk's (``_graphs``): only the nodes holding them are read,
        the graphs of one graph's nodes a field of all of them at a time; a graph listed
        already (holding placeholders) keeps its scope."""
        read = {scope.path: scope for scope in self.scopes[1:]}
        paths, sizes = self._graphs
        order = sorted(range(len(paths)), key=paths.__getitem__)  # each graph before those in it (the pass's order)
        paths = list(map(paths.__getitem__, order))
        scopes = list(map(read.get, paths))
        listed = list(map(operator.is_not, scopes, _REPEAT(None)))
        for k in itertools.compress(range(len(paths)), map(operator.not_, listed)):
            scopes[k] = SpliceGraph(None, paths[k])
        list(map(setattr, scopes, _REPEAT("size"), map(sizes.__getitem__, order)))
        list(map(setattr, scopes, _REPEAT("dirty"), listed))
        del order, listed, read
        below: dict[tuple[int, ...], list[int]] = {}  # a graph's path -> its graphs' places in ``paths``
        if all(map(operator.eq, map(len, paths), _REPEAT(3))):  # every graph a main-graph node's
            below[()] = list(range(len(paths)))
        else:
            for k, parent in enumerate(map(itemgetter(slice(None, -3)), paths)):
                below.setdefault(parent, []).append(k)
        main = self._main
        main.subs, main.dirty = [], bool(main.custom)
        stack = [(main, nodes)]
        while stack:
            parent, parent_nodes = stack.pop()
            inner = below.get(parent.path)
            if not inner:
                continue
            inner_paths = list(map(paths.__getitem__, inner))
            inner_scopes = list(map(scopes.__getitem__, inner))
            node_at = list(map(itemgetter(-3), inner_paths))
            attribute_at = list(map(itemgetter(-2), inner_paths))
            holding = list(dict.fromkeys(node_at))
            holder_attributes = dict(zip(holding, map(attrgetter("attribute"), map(parent_nodes.__getitem__, holding))))
            attributes = list(map(operator.getitem, map(holder_attributes.__getitem__, node_at), attribute_at))
            types = list(map(attrgetter("type"), attributes))
            if all(map(operator.eq, types, _REPEAT(_GRAPH))):  # each attribute one graph (If, Loop, Scan)
                graphs = list(map(attrgetter("g"), attributes))
                list(map(setattr, inner_scopes, _REPEAT("graph"), graphs))
                del attributes
                # per node holding graphs: (index, its attribute count, whether a graph it holds is dirty (the
                # graphs holding graphs are found dirty below), per attribute: (its index, 6, [(0, scope)]))
                held = list(zip(attribute_at, _REPEAT(6), map(list, zip(zip(_REPEAT(0), inner_scopes)))))
                cuts = [*itertools.compress(range(1, len(node_at)), map(operator.ne, node_at[1:], node_at[:-1])),
                        len(node_at)]
                cuts = list(map(slice, [0, *cuts[:-1]], cuts))
                dirty = list(map(any, map(list(map(attrgetter("dirty"), inner_scopes)).__getitem__, cuts)))
                parent.subs += zip(holding, map(len, map(holder_attributes.__getitem__, holding)), dirty,
                                   map(held.__getitem__, cuts))
                del held, cuts, dirty
            else:
                graphs = [attr.g if t == _GRAPH else attr.graphs[path[-1]]
                          for attr, t, path in zip(attributes, types, inner_paths)]
                list(map(setattr, inner_scopes, _REPEAT("graph"), graphs))
                del attributes
                last_index = last_attribute = -1
                subs: list[tuple[int, SpliceGraph]] = []
                held_by: list[tuple[int, int, list[tuple[int, SpliceGraph]]]] = []
                for index, a, path, scope, t in zip(node_at, attribute_at, inner_paths, inner_scopes, types):
                    if index != last_index:
                        held_by = []
                        parent.subs.append((index, len(holder_attributes[index]), False, held_by))
                        last_index, last_attribute = index, -1
                    if a != last_attribute:
                        subs = []
                        held_by.append((a, 6 if t == _GRAPH else 11, subs))
                        last_attribute = a
                    subs.append((path[-1], scope))
            # the graphs holding graphs: their nodes read
            if len(below) > 1:
                stack.extend((scope, graph.node) for path, scope, graph in zip(inner_paths, inner_scopes, graphs)
                             if path in below)
        scopes = self.scopes = [main, *scopes]
        if len(below) == 1:  # the main graph's nodes' graphs alone: their holders' dirty as found above
            main.dirty = main.dirty or any(map(itemgetter(2), main.subs))
            self.bulk = False
            return
        # dirty: a graph holding placeholders or one holding such a graph, found from the deepest up
        for scope in reversed(list(itertools.compress(scopes, map(attrgetter("subs"), scopes)))):
            subs = [(index, n, any(s.dirty for _, _, held_subs in held for _, s in held_subs), held)
                    for index, n, _, held in scope.subs]
            scope.subs = subs
            scope.dirty = scope.dirty or any(d for _, _, d, _ in subs)
        self.bulk = False
