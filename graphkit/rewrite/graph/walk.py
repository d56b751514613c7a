"""Walking a model: every graph, subgraph and function body, in one pass where possible."""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping
import contextlib
import itertools
import sys
from typing import Any, ContextManager, Protocol

import onnx

__all__ = ["AI_ONNX", "elem_types", "graph_node_lists", "graph_tree", "graphs", "node_lists", "scopes", "value_types", "ModelIndex",
           "ScopedTypes"]

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


def _nested(nodes: Any) -> list[onnx.GraphProto]:
    """The graphs held directly in the attributes of ``nodes``, in order."""
    out = []
    for node in nodes:
        if node.attribute:
            for attr in node.attribute:
                t = attr.type
                if t == _GRAPH:
                    out.append(attr.g)
                elif t == _GRAPHS:
                    out.extend(attr.graphs)
    return out


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph nested in its nodes' attributes (depth first, in order)."""
    stack = [graph]
    pop, extend = stack.pop, stack.extend
    while stack:
        g = pop()
        yield g
        inner = _nested(g.node)
        if inner:
            inner.reverse()
            extend(inner)


def scopes(model: onnx.ModelProto) -> Iterator[tuple[Any, set[str], list[onnx.TensorProto]]]:
    """(node list, protected names, visible initializers) of every graph, subgraph and function,
    depth first: a graph before the graphs nested in it, the main graph's before the functions'."""
    def walk(graph: onnx.GraphProto, outer: list[onnx.TensorProto]):
        stack = [(graph, outer)]
        while stack:
            g, seen = stack.pop()
            visible = [*seen, *g.initializer] if g.initializer else seen
            yield g.node, {o.name for o in g.output}, visible
            inner = _nested(g.node)
            if inner:
                stack.extend((sub, visible) for sub in reversed(inner))

    yield from walk(model.graph, [])
    for fn in model.functions:
        yield fn.node, set(fn.output), []
        for g in _nested(fn.node):
            yield from walk(g, [])


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
        for fn in (None, *model.functions):
            if fn is None:
                stack, in_function = [(model.graph, -1)], False
            else:
                self.names.update(fn.input)
                self.names.update(fn.output)
                self.node_lists.append((fn.node, True))
                self._ops = None
                stack, in_function = [(g, -1) for g in self._nodes(fn.node)], True
                stack.reverse()
            while stack:
                g, parent = stack.pop()
                self._graph(g)
                self.node_lists.append((g.node, in_function))
                self._ops = [] if ops and not in_function else None
                inner = self._nodes(g.node)
                if not in_function:
                    tree.append((g, parent, self._ops))
                if inner:
                    inner.reverse()
                    at = len(tree) - 1
                    stack.extend((sub, at) for sub in inner)
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

    def _nodes(self, nodes: Any) -> list[onnx.GraphProto]:
        """Count and name ``nodes``; returns the graphs held in their attributes, in order."""
        counts = self.op_counts
        update = self.names.update
        add = self.names.add
        inner: list[onnx.GraphProto] = []
        external = False
        ops = self._ops
        keep = None if ops is None else ops.append
        intern = sys.intern
        collect, found = self.collect, self.found.append
        for n in nodes:
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
                for attr in n.attribute:
                    t = attr.type
                    if t == _GRAPH:
                        inner.append(attr.g)
                    elif t == _GRAPHS:
                        inner.extend(attr.graphs)
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
    out: list[tuple[Any, bool, onnx.GraphProto | None]] = [(g.node, False, g) for g in graphs(model.graph)]
    for fn in model.functions:
        out.append((fn.node, True, None))
        out.extend((g.node, True, g) for sub in _nested(fn.node) for g in graphs(sub))
    return out


def count_ops(model: onnx.ModelProto) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for nodes, _, _ in scopes(model):
        for n in nodes:
            counts[(n.domain, n.op_type)] += 1
    return counts


class _Schemas(Protocol):
    """What :func:`value_types` needs of an OpRegistry (not imported: ops imports this module)."""

    def onnx_schemas(self) -> ContextManager[Any]: ...


def graph_tree(graph: onnx.GraphProto) -> list[tuple[onnx.GraphProto, int]]:
    """(graph, index of the graph it is nested in; -1 for ``graph``) for ``graph`` and every
    subgraph, in :func:`graphs`' order."""
    out: list[tuple[onnx.GraphProto, int]] = []
    stack = [(graph, -1)]
    while stack:
        g, parent = stack.pop()
        here = len(out)
        out.append((g, parent))
        inner = _nested(g.node)
        if inner:
            stack.extend((sub, here) for sub in reversed(inner))
    return out


class ScopedTypes(Mapping[str, Any]):
    """Value name -> type, per scope. ONNX's SSA form spans nested graphs (a subgraph may read
    an outer value but not define that name again), while sibling graphs (then/else branches,
    different Loop bodies) may each define the same name, with another type. Where some do,
    each graph has its own names, looked up through the graphs it is nested in; where none
    do (the common case), one map serves every scope.

    ``scope(graph)``: what a node of ``graph`` (the main graph or a subgraph of the model the
    map was made for) sees. As a Mapping: what a main-graph node sees (with one map, the
    subgraphs' values besides, which no main-graph node reads)."""

    def __init__(self, main: onnx.GraphProto, own: list[dict[str, Any]],
                 tree: list[tuple[onnx.GraphProto, int]] | None = None) -> None:
        self._main = main
        self._own = own
        self._tree = tree  # None: one map; else the graphs, held (their ids stay theirs), and their parents
        self._index = {id(g): i for i, (g, _) in enumerate(tree)} if tree is not None else None

    def __getitem__(self, name: str) -> Any:
        return self._own[0][name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._own[0])

    def __len__(self) -> int:
        return len(self._own[0])

    @property
    def per_scope(self) -> bool:
        """Whether two sibling graphs define one name (each graph has a map of its own)."""
        return self._tree is not None

    def scope(self, graph: onnx.GraphProto, *, missing_ok: bool = False) -> Mapping[str, Any]:
        """The values ``graph``'s nodes see: its own, then those of the graphs around it.
        With maps per scope, a graph not of the model's graph tree (one in a function body)
        sees nothing where ``missing_ok``, else is a KeyError."""
        if self._index is None:
            return self._own[0]
        i = self._index.get(id(graph))
        if i is None or self._tree[i][0] is not graph:
            if missing_ok:
                return {}
            raise KeyError(f"graph '{graph.name}' is not a graph of this model")
        maps = []
        while i >= 0:
            maps.append(self._own[i])
            i = self._tree[i][1]
        return collections.ChainMap(*maps)

    def by_graph(self) -> Iterator[tuple[onnx.GraphProto, dict[str, Any]]]:
        """(graph, the values it defines itself) for every graph, in :func:`graphs`' order;
        with one map, (the main graph, every value)."""
        if self._tree is None:
            return iter([(self._main, self._own[0])])
        return ((g, own) for (g, _), own in zip(self._tree, self._own))

    def mapped(self, fn: Any) -> ScopedTypes:
        """The same scopes, each value ``fn(value)``."""
        return ScopedTypes(self._main, [{name: fn(t) for name, t in own.items()} for own in self._own], self._tree)


def _stated(g: onnx.GraphProto, types: dict[str, onnx.TypeProto], outer: Any = ()) -> None:
    """The tensor types ``g`` states (initializers, inputs, value_info, outputs) into ``types``,
    the first for a name winning; none for a name in ``outer``."""
    for init in g.initializer:
        if init.data_type:
            types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims)))
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type and vi.name not in outer:
            types.setdefault(vi.name, vi.type)


def _siblings_share_a_name(subgraphs: Iterator[onnx.GraphProto]) -> bool:
    """Whether two of ``subgraphs`` define one name (inputs, initializers, node outputs); in a
    valid model, none defines an outer graph's."""
    seen: set[str] = set()
    for g in subgraphs:
        for name in itertools.chain((i.name for i in g.input), (t.name for t in g.initializer),
                                    (o for n in g.node for o in n.output)):
            if name:
                if name in seen:
                    return True
                seen.add(name)
    return False


def value_types(model: onnx.ModelProto, registry: _Schemas | None = None, *,
                infer: bool = True) -> ScopedTypes:
    """Tensor type of every value of ``model``'s graph and subgraphs whose element type is
    known: initializers, inputs, value_info and outputs, after ONNX shape inference when
    ``infer`` (custom ops typed through ``registry``'s schemas), per scope (:class:`ScopedTypes`).
    Best effort: where inference fails, the types the model states. Within one scope, the
    first type stated for a name wins; a graph output that is an outer value stays the outer
    value's."""
    inferred = model
    if infer:
        schemas = registry.onnx_schemas() if registry is not None else contextlib.nullcontext()
        try:
            with schemas:
                inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
        except Exception:  # noqa: BLE001 - inference is a best effort, never a requirement
            inferred = model
    read = graph_tree(inferred.graph)
    if not _siblings_share_a_name(g for g, _ in read[1:]):
        flat: dict[str, onnx.TypeProto] = {}
        for g, _ in read:
            _stated(g, flat)
        return ScopedTypes(model.graph, [flat])
    tree = graph_tree(model.graph) if inferred is not model else read
    own: list[dict[str, onnx.TypeProto]] = []
    for g, parent in read:
        types: dict[str, onnx.TypeProto] = {}
        _stated(g, types, _outer(own, tree, parent))
        own.append(types)
    return ScopedTypes(model.graph, own, tree)


def _outer(own: list[dict[str, Any]], tree: list[tuple[onnx.GraphProto, int]], parent: int) -> Any:
    """The names the graphs around one (``parent`` and up) define."""
    maps = []
    while parent >= 0:
        maps.append(own[parent])
        parent = tree[parent][1]
    return collections.ChainMap(*maps)


def elem_types(model: onnx.ModelProto, registry: _Schemas | None = None) -> ScopedTypes:
    """Element type (``TensorProto.FLOAT``...) of every value :func:`value_types` types, per scope."""
    return value_types(model, registry).mapped(lambda t: t.tensor_type.elem_type)
