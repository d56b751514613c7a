"""Walking a model: every graph, subgraph and function body, in one pass where possible.

:func:`walk` is the one walk over a model's graphs; everything here and every caller that
visits subgraphs goes through it. It yields ``(event, visit)``:

- ``(ENTER, v)`` for each graph (the main graph, each If/Loop/Scan body at any depth, held
  in a GRAPH or a GRAPHS attribute) and each function body, before the graphs nested in it;
- ``(EXIT, v)`` after them, where ``exits=True``;
- ``(NODE, v)`` for each node of ``v`` (``v.at``: its position), where ``nodes=True``, the
  graphs the node holds entered right after it (a node-by-node walk in document order).

A :class:`Visit` carries where the graph is: ``graph`` (None for a function's own body),
``nodes``, ``function``, ``parent`` (the visit around it), ``node``/``attribute``/``index``
(what holds it), ``depth``, ``path`` and ``outer_names()`` (what its nodes may read from
the graphs around it), and ``data``, the caller's per-scope state: set on ENTER, read by the
nested graphs through ``parent.data`` (the outer scope's visible initializers, types, a
position in a tree...). A caller that scans the nodes anyway hands the graphs it found to
``v.children`` on ENTER, and the walk does not scan them again.

Order: depth first, a graph before the graphs nested in it, the graphs its nodes hold in
node and attribute order (``reverse=True``: last first); for a model, the main graph's tree, then each function
body's. The walk keeps its own stack, so a model nested thousands of levels deep does not
reach Python's recursion limit, and it costs one pass over the nodes.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
import sys
from typing import Any

import onnx

__all__ = ["AI_ONNX", "ENTER", "EXIT", "NODE", "graph_node_lists", "graph_tree", "graphs", "held_graphs", "holds_graphs",
           "node_lists", "outer_reads", "scopes", "subgraphs", "walk", "ModelIndex", "Visit"]

# The two spellings of the standard ONNX domain in opset imports and nodes.
AI_ONNX = ("", "ai.onnx")

_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS
_TENSOR = onnx.AttributeProto.TENSOR
_TENSORS = onnx.AttributeProto.TENSORS
_EXTERNAL = onnx.TensorProto.EXTERNAL


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs held directly in ``node``'s attributes (If branches, Loop/Scan bodies)."""
    for attr in node.attribute:
        if attr.type == _GRAPH:
            yield attr.g
        elif attr.type == _GRAPHS:
            yield from attr.graphs


def holds_graphs(node: onnx.NodeProto) -> bool:
    """Whether ``node`` holds a graph in an attribute (an If, Loop, Scan...)."""
    return bool(node.attribute) and any(a.type == _GRAPH or a.type == _GRAPHS for a in node.attribute)


def held_graphs(nodes: Any) -> list[tuple[int, int, int]]:
    """(node's position in ``nodes``, attribute's position in the node, position in a GRAPHS
    attribute or -1) of every graph held directly in the attributes of ``nodes``, in order.
    Positions, not objects: a protobuf wrapper is tracked by the cyclic collector, and
    holding one per graph of a model with 100k graphs makes it run often."""
    out = []
    for i, node in enumerate(nodes):
        if node.attribute:
            out.extend(_held_by(i, node))
    return out


def _held_by(i: int, node: onnx.NodeProto) -> list[tuple[int, int, int]]:
    """:func:`held_graphs`' entries for ``node``, at position ``i``."""
    out = []
    for a, attr in enumerate(node.attribute):
        t = attr.type
        if t == _GRAPH:
            out.append((i, a, -1))
        elif t == _GRAPHS:
            out.extend((i, a, k) for k in range(len(attr.graphs)))
    return out


def _enter(v: Visit, entry: tuple[int, int, int]) -> Visit:
    """The visit of the graph ``entry`` (a :func:`held_graphs` entry of ``v``'s nodes) names."""
    i, a, k = entry
    node = v.nodes[i]
    attr = node.attribute[a]
    g = attr.g if k < 0 else attr.graphs[k]
    return Visit(g, g.node, v.function, v, node, attr, k)


ENTER, EXIT, NODE = "enter", "exit", "node"


class Visit:
    """A graph or function body met by :func:`walk`, with where it is.

    ``graph``: the GraphProto (None for a function's own body); ``nodes``: its node list;
    ``function``: the FunctionProto whose body it is or is nested in (None outside functions);
    ``parent``: the Visit of the graph around it (None at a root); ``node``, ``attribute``,
    ``index``: the node holding it, the attribute, the position in a GRAPHS attribute (-1 for
    GRAPH); ``depth``: 0 at a root. ``data``: free for the caller (the state it keeps per
    scope, read by the scopes nested in it through ``parent.data``). ``children``: set it
    on ENTER to the graphs held in ``nodes`` as ``held_graphs`` lists them, where the caller scans
    the nodes anyway, and the walk does not scan them again. ``at``: with ``nodes=True``, the
    position of the node of the current NODE event."""

    __slots__ = ("at", "attribute", "children", "data", "depth", "function", "graph", "index", "node", "nodes",
                 "parent")

    def __init__(self, graph: onnx.GraphProto | None, nodes: Any, function: onnx.FunctionProto | None = None,
                 parent: Visit | None = None, node: onnx.NodeProto | None = None,
                 attribute: onnx.AttributeProto | None = None, index: int = -1) -> None:
        self.graph, self.nodes, self.function = graph, nodes, function
        self.parent, self.node, self.attribute, self.index = parent, node, attribute, index
        self.depth = 0 if parent is None else parent.depth + 1
        self.children: list | None = None
        self.data: Any = None
        self.at = -1

    @property
    def in_function(self) -> bool:
        return self.function is not None

    @property
    def path(self) -> str:
        """Where the graph is: ``main``, ``function d::f``, then ``/node/attribute`` (``[k]``
        in a GRAPHS attribute) per level."""
        parts = []
        v = self
        while v.parent is not None:
            where = v.attribute.name if v.index < 0 else f"{v.attribute.name}[{v.index}]"
            parts.append(f"{v.node.name or v.node.op_type}/{where}")
            v = v.parent
        parts.append("main" if v.graph is not None else f"function {v.function.domain}::{v.function.name}")
        return "/".join(reversed(parts))

    def outer(self) -> Iterator[Visit]:
        """The visits around this one, innermost first."""
        v = self.parent
        while v is not None:
            yield v
            v = v.parent

    def outer_names(self) -> set[str]:
        """The names the scopes around this one define (graph inputs, initializers, node
        outputs; a function body's inputs): what its nodes may read from outside."""
        names: set[str] = set()
        for v in self.outer():
            if v.graph is not None:
                names.update(i.name for i in v.graph.input)
                names.update(t.name for t in v.graph.initializer)
            elif v.function is not None:
                names.update(v.function.input)
            for n in v.nodes:
                names.update(n.output)
        names.discard("")
        return names


def walk(root: onnx.ModelProto | onnx.GraphProto | onnx.FunctionProto, *, functions: bool = True,
         exits: bool = False, nodes: bool = False, reverse: bool = False) -> Iterator[tuple[str, Visit]]:
    """Every graph of ``root`` as (event, Visit): (ENTER, v) before the graphs nested in
    ``v``'s nodes, (EXIT, v) after them where ``exits``; with ``nodes``, (NODE, v) for each of
    ``v``'s nodes (``v.at`` its position), the graphs a node holds entered right after it.
    Depth first, a graph's nested graphs in node and attribute order (last first where
    ``reverse``; with ``nodes``, a node's own graphs); for a model,
    the main graph's tree, then (where ``functions``) each function body and the graphs in it.
    Iterative: any nesting depth; each node is read once."""
    if isinstance(root, onnx.ModelProto):
        roots = [Visit(root.graph, root.graph.node)]
        if functions:
            roots.extend(Visit(None, fn.node, fn) for fn in root.functions)
    elif isinstance(root, onnx.FunctionProto):
        roots = [Visit(None, root.node, root)]
    else:
        roots = [Visit(root, root.node)]
    if nodes:
        yield from _node_walk(roots, exits, reverse)
        return
    for top in roots:
        yield ENTER, top
        # frames: [visit, its nodes still to scan (an iterator; None: scanned), the graphs found
        # and still to enter, last first: (node, attribute, k), or held_graphs' positions].
        # Graphs are found node by node, so only the open graphs and one node's graphs are
        # held at a time (a model may hold 100k graphs, and holding a wrapper object for each
        # makes the cyclic collector run often).
        stack = [_frame(top, reverse)]
        while stack:
            frame = stack[-1]
            v, scan, pending = frame
            if not pending and scan is not None:
                for node in scan:
                    if node.attribute:
                        for attr in node.attribute:
                            t = attr.type
                            if t == _GRAPH:
                                pending.append((node, attr, -1))
                            elif t == _GRAPHS:
                                pending.extend((node, attr, k) for k in range(len(attr.graphs)))
                        if pending:
                            pending.reverse()
                            break
                else:
                    frame[1] = None
            if pending:
                node, attr, k = pending.pop()
                if node.__class__ is int:  # a held_graphs entry (v.children)
                    node = v.nodes[node]
                    attr = node.attribute[attr]
                g = attr.g if k < 0 else attr.graphs[k]
                child = Visit(g, g.node, v.function, v, node, attr, k)
                yield ENTER, child
                stack.append([child, iter(child.nodes), []] if child.children is None and not reverse
                             else _frame(child, reverse))
                continue
            stack.pop()
            if exits:
                yield EXIT, v


def _frame(v: Visit, reverse: bool) -> list[Any]:
    """A frame of :func:`walk`'s stack for a visit just entered."""
    held = v.children
    if held is None and reverse:
        held = held_graphs(v.nodes)
    if held is not None:
        return [v, None, list(held) if reverse else held[::-1]]
    return [v, iter(v.nodes), []]


def _node_walk(roots: list[Visit], exits: bool, reverse: bool) -> Iterator[tuple[str, Visit]]:
    """:func:`walk` with NODE events."""
    for top in roots:
        yield ENTER, top
        # frames: [visit, the graphs of its current node still to enter (last first), next node]
        stack: list[list[Any]] = [[top, None, 0]]
        while stack:
            frame = stack[-1]
            v, pending = frame[0], frame[1]
            if pending:
                child = _enter(v, pending.pop())
                yield ENTER, child
                stack.append([child, None, 0])
                continue
            all_nodes, i = v.nodes, frame[2]
            if i < len(all_nodes):
                frame[2] = i + 1
                v.at = i
                yield NODE, v
                node = all_nodes[i]
                if node.attribute:
                    held = _held_by(i, node)
                    if held:
                        frame[1] = held if reverse else held[::-1]
                continue
            stack.pop()
            if exits:
                yield EXIT, v


def outer_reads(graph: onnx.GraphProto) -> set[str]:
    """The names ``graph`` (a subgraph) and the graphs nested in it read from enclosing scopes."""
    if not any(map(holds_graphs, graph.node)):  # (most bodies: no walk needed)
        local = _defined(graph)
        return _reads(graph, local, set())
    found: set[str] = set()
    for event, v in walk(graph, exits=True):
        if event == ENTER:  # (what it defines, what it and the graphs in it read from outside it)
            v.data = (_defined(v.graph), set())
            continue
        local, refs = v.data
        _reads(v.graph, local, refs)
        if v.parent is None:
            found = refs
        else:
            outer_local, outer_refs = v.parent.data
            outer_refs.update(n for n in refs if n not in outer_local)
    return found


def _defined(graph: onnx.GraphProto) -> set[str]:
    local = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        local.update(node.output)
    return local


def _reads(graph: onnx.GraphProto, local: set[str], refs: set[str]) -> set[str]:
    """``refs`` with what ``graph``'s own nodes and outputs read that is not in ``local``."""
    for node in graph.node:
        refs.update(n for n in node.input if n and n not in local)
    refs.update(o.name for o in graph.output if o.name not in local)
    return refs


def graphs(graph: onnx.GraphProto, *, reverse: bool = False) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph nested in its nodes' attributes (depth first, in order;
    a graph's nested graphs last first where ``reverse``)."""
    for _, v in walk(graph, reverse=reverse):
        yield v.graph


def scopes(model: onnx.ModelProto) -> Iterator[tuple[Any, set[str], list[onnx.TensorProto]]]:
    """(node list, protected names, visible initializers) of every graph, subgraph and function,
    depth first: a graph before the graphs nested in it, the main graph's before the functions'."""
    for _, v in walk(model):
        g = v.graph
        if g is None:
            v.data = []
            yield v.nodes, set(v.function.output), v.data
            continue
        seen = [] if v.parent is None or v.parent.graph is None else v.parent.data
        v.data = visible = [*seen, *g.initializer] if g.initializer else seen
        yield g.node, {o.name for o in g.output}, visible


class ModelIndex:
    """One pass over a model: op counts, every name in use (nodes and tensors), and every
    node list (``node_lists``: (nodes, in a function body), the main graph's first, each
    graph before the graphs nested in it). For the check, besides: ``shapeless``, the
    tensor types of graph inputs/outputs (any graph) without a shape, and ``external``,
    whether any tensor (initializers, sparse ones, attributes, any scope) is stored externally.
    ``tree``: the main graph and its subgraphs, each as (graph, position in ``tree`` of the
    graph holding it; -1 for the main graph, its nodes' op types (interned) where ``ops``,
    else None), in ``node_lists``' order. ``found``: the nodes (any scope, in that order) whose
    domain is one of ``collect`` and that have attributes (a node's Python object costs
    hundreds of bytes: the others are only counted)."""

    def __init__(self, model: onnx.ModelProto, *, ops: bool = False, collect: frozenset[str] = frozenset()) -> None:
        self.op_counts: collections.Counter = collections.Counter()
        self.names: set[str] = set()
        self.node_lists: list[tuple[Any, bool]] = []
        self.shapeless: list[onnx.TypeProto.Tensor] = []
        self.external = False
        self.tree: list[tuple[onnx.GraphProto, int, list[str] | None]] = []
        self.found: list[onnx.NodeProto] = []
        self.collect = collect
        tree = self.tree
        self._ops: list[str] | None = None  # _nodes' op types, where asked for
        for _, v in walk(model):
            g = v.graph
            if g is None:  # a function's own body
                fn = v.function
                self.names.update(fn.input)
                self.names.update(fn.output)
                self.node_lists.append((fn.node, True))
                self._ops = None
                v.children = self._nodes(fn.node)
                continue
            in_function = v.function is not None
            self._graph(g)
            self.node_lists.append((g.node, in_function))
            self._ops = [] if ops and not in_function else None
            v.children = self._nodes(g.node)
            if not in_function:
                v.data = len(tree)
                tree.append((g, -1 if v.parent is None else v.parent.data, self._ops))
        self._ops = None

    def _graph(self, g: onnx.GraphProto) -> None:
        """A graph's own fields: names of inputs, outputs, initializers and value_info."""
        update = self.names.update
        shapeless = self.shapeless
        for vis in (g.input, g.output):
            if vis:
                update(v.name for v in vis)
                for vi in vis:
                    tp = vi.type
                    if tp.HasField("tensor_type") and not tp.tensor_type.HasField("shape"):
                        shapeless.append(tp.tensor_type)
        if g.initializer:
            update(t.name for t in g.initializer)
            self.external = self.external or any(t.data_location == _EXTERNAL for t in g.initializer)
        if g.sparse_initializer:
            update(t.values.name for t in g.sparse_initializer)
            self.external = self.external or any(
                t.values.data_location == _EXTERNAL or t.indices.data_location == _EXTERNAL
                for t in g.sparse_initializer)
        if g.value_info:
            update(v.name for v in g.value_info)

    def _nodes(self, nodes: Any) -> list[tuple[int, int, int]]:
        """Count and name ``nodes``; returns the graphs held in their attributes, in order, as
        :func:`walk` takes them (``Visit.children``)."""
        counts = self.op_counts
        update = self.names.update
        add = self.names.add
        inner: list[tuple[int, int, int]] = []
        external = False
        ops = self._ops
        keep = None if ops is None else ops.append
        intern = sys.intern
        collect, found = self.collect, self.found.append
        for i, n in enumerate(nodes):
            op, domain = n.op_type, n.domain
            counts[(domain, op)] += 1
            if domain in collect and n.attribute:
                found(n)
            if keep is not None:
                keep(intern(op))
            add(n.name)
            update(n.input)
            update(n.output)
            if n.attribute:
                for a, attr in enumerate(n.attribute):
                    t = attr.type
                    if t == _GRAPH:
                        inner.append((i, a, -1))
                    elif t == _GRAPHS:
                        inner.extend((i, a, k) for k in range(len(attr.graphs)))
                    elif t == _TENSOR:
                        external = external or attr.t.data_location == _EXTERNAL
                    elif t == _TENSORS:
                        external = external or any(x.data_location == _EXTERNAL for x in attr.tensors)
        if external:
            self.external = True
        return inner

    @property
    def domains(self) -> set[str]:
        return {d for d, _ in self.op_counts}


def node_lists(model: onnx.ModelProto) -> list[tuple[Any, bool]]:
    """(nodes, in a function body) of every graph, subgraph and function, in ModelIndex's order."""
    return [(nodes, in_function) for nodes, in_function, _ in graph_node_lists(model)]


def graph_node_lists(model: onnx.ModelProto) -> list[tuple[Any, bool, onnx.GraphProto | None]]:
    """(nodes, in a function body, the graph holding them; None for a function's own body) of
    every graph, subgraph and function, in ModelIndex's order."""
    return [(v.nodes, v.function is not None, v.graph) for _, v in walk(model)]


def count_ops(model: onnx.ModelProto) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for nodes, _, _ in scopes(model):
        for n in nodes:
            counts[(n.domain, n.op_type)] += 1
    return counts


def graph_tree(graph: onnx.GraphProto) -> list[tuple[onnx.GraphProto, int]]:
    """(graph, index of the graph it is nested in; -1 for ``graph``) for ``graph`` and every
    subgraph, in :func:`graphs`' order."""
    out: list[tuple[onnx.GraphProto, int]] = []
    for _, v in walk(graph):
        v.data = len(out)
        out.append((v.graph, -1 if v.parent is None else v.parent.data))
    return out
