"""Walking a model: every graph, subgraph and function body, in one pass where possible."""

from __future__ import annotations

import collections
from collections.abc import Iterator
import contextlib
from typing import Any, ContextManager, Protocol

import onnx

__all__ = ["AI_ONNX", "elem_types", "graphs", "node_lists", "scopes", "value_types", "ModelIndex"]

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
    whether any tensor (initializers, sparse ones, attributes, any scope) is stored externally."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.op_counts: collections.Counter = collections.Counter()
        self.names: set[str] = set()
        self.node_lists: list[tuple[Any, bool]] = []
        self.shapeless: list[onnx.TypeProto.Tensor] = []
        self.external = False
        for fn in (None, *model.functions):
            if fn is None:
                stack, in_function = [model.graph], False
            else:
                self.names.update(fn.input)
                self.names.update(fn.output)
                self.node_lists.append((fn.node, True))
                stack, in_function = self._nodes(fn.node), True
                stack.reverse()
            while stack:
                g = stack.pop()
                self._graph(g)
                self.node_lists.append((g.node, in_function))
                inner = self._nodes(g.node)
                if inner:
                    inner.reverse()
                    stack.extend(inner)

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
        for n in nodes:
            counts[(n.domain, n.op_type)] += 1
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
    out = [(g.node, False) for g in graphs(model.graph)]
    for fn in model.functions:
        out.append((fn.node, True))
        out.extend((g.node, True) for sub in _nested(fn.node) for g in graphs(sub))
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


def value_types(model: onnx.ModelProto, registry: _Schemas | None = None, *,
                infer: bool = True) -> dict[str, onnx.TypeProto]:
    """Tensor type of every value of ``model``'s graph and subgraphs whose element type is
    known: initializers, inputs, value_info and outputs, after ONNX shape inference when
    ``infer`` (custom ops typed through ``registry``'s schemas). Best effort: where
    inference fails, the types the model states. The first type stated for a name wins."""
    inferred = model
    if infer:
        schemas = registry.onnx_schemas() if registry is not None else contextlib.nullcontext()
        try:
            with schemas:
                inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
        except Exception:  # noqa: BLE001 - inference is a best effort, never a requirement
            inferred = model
    types: dict[str, onnx.TypeProto] = {}
    for g in graphs(inferred.graph):
        for init in g.initializer:
            if init.data_type:
                types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims)))
        for vi in (*g.input, *g.value_info, *g.output):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types.setdefault(vi.name, vi.type)
    return types


def elem_types(model: onnx.ModelProto, registry: _Schemas | None = None) -> dict[str, int]:
    """Element type (``TensorProto.FLOAT``...) of every value :func:`value_types` types."""
    return {name: t.tensor_type.elem_type for name, t in value_types(model, registry).items()}
