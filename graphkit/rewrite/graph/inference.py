"""What ONNX shape inference (or the model, without it) states a model's values are, per
scope: :func:`infer_types` and its result, :class:`Inferred`, what
``TypeTable.inferred`` and a table's inference step (``TypeTable._infer``) are built from.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ContextManager, Protocol

import onnx

from graphkit.rewrite.graph.walk import graph_tree

__all__ = ["Inferred", "Schemas", "infer_types"]


class Schemas(Protocol):
    """What :func:`infer_types` needs of an OpRegistry (not imported: ops imports graph/walk.py)."""

    def onnx_schemas(self) -> ContextManager[Any]: ...


class Inferred:
    """Value name -> TypeProto per scope, as ONNX inference (or the model) states them. ONNX's SSA
    form spans nested graphs (a subgraph may read an outer value but not define that name
    again), while sibling graphs (then/else branches, different Loop bodies) may each define the
    same name, with another type. Where some do, each graph has its own names, looked up through
    the graphs it is nested in; where none do (the common case), one map serves every scope."""

    __slots__ = ("_index", "_main", "_own", "_tree")

    def __init__(self, main: onnx.GraphProto, own: list[dict[str, Any]],
                 tree: list[tuple[onnx.GraphProto, int]] | None = None) -> None:
        self._main = main
        self._own = own
        self._tree = tree  # None: one map; else the graphs, held (their ids stay theirs), and their parents
        self._index = {id(g): i for i, (g, _) in enumerate(tree)} if tree is not None else None

    @property
    def main(self) -> dict[str, Any]:
        """What the main graph defines (with one map: every value)."""
        return self._own[0]

    @property
    def per_scope(self) -> bool:
        """Whether two sibling graphs define one name (each graph has a map of its own)."""
        return self._tree is not None

    def scope(self, graph: onnx.GraphProto, *, missing_ok: bool = False) -> Mapping[str, Any] | None:
        """The values ``graph``'s nodes see: its own, then those of the graphs around it. With
        maps per scope, a graph not of the model's graph tree (one in a function body) sees
        None where ``missing_ok``, else is a KeyError."""
        if self._index is None:
            return self._own[0]
        i = self._index.get(id(graph))
        if i is None or self._tree[i][0] is not graph:
            if missing_ok:
                return None
            raise KeyError(f"graph '{graph.name}' is not a graph of this model")
        maps = []
        while i >= 0:
            maps.append(self._own[i])
            i = self._tree[i][1]
        return maps[0] if len(maps) == 1 else collections.ChainMap(*maps)

    def by_graph(self) -> Iterator[tuple[onnx.GraphProto, dict[str, Any]]]:
        """(graph, the values it defines itself) for every graph, in ``walk.graphs``' order;
        with one map, (the main graph, every value)."""
        if self._tree is None:
            return iter([(self._main, self._own[0])])
        return ((g, own) for (g, _), own in zip(self._tree, self._own))


def _stated(g: onnx.GraphProto, types: dict[str, onnx.TypeProto], outer: Any = ()) -> None:
    """The tensor types ``g`` states (initializers, inputs, value_info, outputs) into ``types``,
    the first for a name winning; none for a name in ``outer``."""
    for init in g.initializer:
        if init.data_type:
            types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims)))
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type and vi.name not in outer:
            types.setdefault(vi.name, vi.type)


def _siblings_share_a_name(graphs: Iterable[onnx.GraphProto]) -> bool:
    """Whether two of ``graphs`` define one name (inputs, initializers, node outputs); in a
    valid model, none defines an outer graph's."""
    seen: set[str] = set()
    for g in graphs:
        for name in itertools.chain((i.name for i in g.input), (t.name for t in g.initializer),
                                    (o for n in g.node for o in n.output)):
            if name:
                if name in seen:
                    return True
                seen.add(name)
    return False


def infer_types(model: onnx.ModelProto, registry: Schemas | None = None, *, infer: bool = True) -> Inferred:
    """Tensor type of every value of ``model``'s graph and subgraphs whose element type is
    known: initializers, inputs, value_info and outputs, after ONNX shape inference when
    ``infer`` (custom ops typed through ``registry``'s schemas), per scope. Best effort: where
    inference fails, the types the model states. Within one scope, the first type stated for a
    name wins; a graph output that is an outer value stays the outer value's."""
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
        return Inferred(model.graph, [flat])
    tree = graph_tree(model.graph) if inferred is not model else read
    own: list[dict[str, onnx.TypeProto]] = []
    for g, parent in read:
        types: dict[str, onnx.TypeProto] = {}
        _stated(g, types, _outer(own, tree, parent))
        own.append(types)
    return Inferred(model.graph, own, tree)


def _outer(own: list[dict[str, Any]], tree: list[tuple[onnx.GraphProto, int]], parent: int) -> Any:
    """The names the graphs around one (``parent`` and up) define."""
    maps = []
    while parent >= 0:
        maps.append(own[parent])
        parent = tree[parent][1]
    return collections.ChainMap(*maps)
