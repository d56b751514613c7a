"""What ONNX shape inference (or the model, without it) states a model's values are, per
scope: :func:`infer_types` and its result, :class:`Inferred`, what
``TypeTable.inferred`` and a table's inference step (``TypeTable._infer``) are built from;
:func:`skeleton`, the model inference runs on without its large weights; and dims as
simplify reads them (:func:`tensor_dims`; refined ones kept in ``Inferred.refined``).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ContextManager, Protocol

import onnx

from graphkit.rewrite.graph.walk import graph_tree

__all__ = ["SMALL_INITIALIZER", "Inferred", "Schemas", "infer_types", "skeleton", "small_initializer", "tensor_dims"]

# initializers up to this many bytes stay for inference on a skeleton (shape inputs); larger ones become inputs
SMALL_INITIALIZER = 1024


class Schemas(Protocol):
    """What :func:`infer_types` needs of an OpRegistry (not imported: ops imports graph/walk.py)."""

    def onnx_schemas(self) -> ContextManager[Any]: ...


class Inferred:
    """Value name -> TypeProto per scope, as ONNX inference (or the model) states them. ONNX's SSA
    form spans nested graphs (a subgraph may read an outer value but not define that name
    again), while sibling graphs (then/else branches, different Loop bodies) may each define the
    same name, with another type. Where some do, each graph has its own names, looked up through
    the graphs it is nested in; where none do (the common case), one map serves every scope."""

    __slots__ = ("_index", "_main", "_own", "_tree", "refined", "resolve")

    def __init__(self, main: onnx.GraphProto, own: list[dict[str, Any]],
                 tree: list[tuple[onnx.GraphProto, int]] | None = None) -> None:
        self._main = main
        self._own = own
        self._tree = tree  # None: one map; else the graphs, held (their ids stay theirs), and their parents
        self._index = {id(g): i for i, (g, _) in enumerate(tree)} if tree is not None else None
        # dims by name (``TypeTable.dims``): those a refinement step proved, and those read so far
        # (one map only: with maps per scope, a name's dims depend on the scope); then ``resolve``
        # maps each dims list through the dims proved equal (None: none)
        self.refined: dict[str, list[Any] | None] = {}
        self.resolve: Callable[[list[Any]], list[Any]] | None = None

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
    _stated_initializers(g, types)
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type and vi.name not in outer:
            types.setdefault(vi.name, vi.type)


def _stated_initializers(g: onnx.GraphProto, types: dict[str, onnx.TypeProto]) -> None:
    for init in g.initializer:
        if init.data_type:
            types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims)))


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


def infer_types(model: onnx.ModelProto, registry: Schemas | None = None, *, infer: bool = True,
                without_weights: bool = False, data_prop: bool = False, flat: bool = False) -> Inferred:
    """Tensor type of every value of ``model``'s graph and subgraphs whose element type is
    known: initializers, inputs, value_info and outputs, after ONNX shape inference when
    ``infer`` (custom ops typed through ``registry``'s schemas; ``data_prop``: ONNX's data
    propagation, the values of shape arithmetic; ``without_weights``: run on :func:`skeleton`,
    the model's large initializers typed graph inputs), per scope. Best effort: where
    inference fails, the types the model states. Within one scope, the first type stated for
    a name wins (a graph's initializers, inputs, value_info, outputs, in that order; the
    model's own initializers first); a graph output that is an outer value stays the outer
    value's. ``flat``: the caller knows no node of the model holds a graph (the walk looking
    for them is skipped)."""
    source = skeleton(model) if without_weights else model
    inferred = source
    if infer:
        schemas = registry.onnx_schemas() if registry is not None else contextlib.nullcontext()
        try:
            with schemas:
                inferred = onnx.shape_inference.infer_shapes(source, check_type=False, strict_mode=False,
                                                             data_prop=data_prop)
        except Exception:  # noqa: BLE001 - inference is a best effort, never a requirement
            inferred = source
    read = [(inferred.graph, -1)] if flat else graph_tree(inferred.graph)
    first: dict[str, onnx.TypeProto] = {}
    if source is not model:  # the weights left out of the skeleton: their types from the model
        _stated_initializers(model.graph, first)
    if not _siblings_share_a_name(g for g, _ in read[1:]):
        for g, _ in read:
            _stated(g, first)
        return Inferred(model.graph, [first])
    tree = graph_tree(model.graph) if inferred is not model else read
    own: list[dict[str, onnx.TypeProto]] = []
    for g, parent in read:
        types: dict[str, onnx.TypeProto] = first if not own else {}
        _stated(g, types, _outer(own, tree, parent))
        own.append(types)
    return Inferred(model.graph, own, tree)


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without its large initializers (typed graph inputs instead) nor functions' docs."""
    g = model.graph
    small, large = [], []
    for t in g.initializer:
        (small if small_initializer(t) else large).append(t)
    graph = onnx.GraphProto(name=g.name)
    graph.node.extend(g.node)
    graph.input.extend(g.input)
    declared = {i.name for i in g.input}
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in large if t.name not in declared)
    graph.output.extend(g.output)
    graph.value_info.extend(g.value_info)
    graph.initializer.extend(small)
    graph.sparse_initializer.extend(g.sparse_initializer)
    out = onnx.ModelProto(ir_version=model.ir_version, producer_name=model.producer_name)
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    out.graph.CopyFrom(graph)
    return out


def small_initializer(t: onnx.TensorProto) -> bool:
    """Whether ``t`` stays in :func:`skeleton` (a shape input, not a weight)."""
    count = 1
    for d in t.dims:
        count *= d
    # (from the dims: reading raw_data would copy the bytes of every weight)
    return t.data_location != onnx.TensorProto.EXTERNAL and count * 8 <= SMALL_INITIALIZER


def tensor_dims(tp: onnx.TypeProto | None, name: str) -> list[Any] | None:
    """The dims of a tensor type: an int, a symbol (the model's dim_param, or the "unk__N" ONNX
    inference names a dim it cannot tell, and copies wherever that dim goes: within one
    inference, one name is one dim), or for a dim with neither, a symbol of its own
    (``?name#axis``, equal only to itself); None: no tensor type, or no shape."""
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    dims: list[Any] = []
    for axis, d in enumerate(tp.tensor_type.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(f"?{name}#{axis}")
    return dims


def _outer(own: list[dict[str, Any]], tree: list[tuple[onnx.GraphProto, int]], parent: int) -> Any:
    """The names the graphs around one (``parent`` and up) define."""
    maps = []
    while parent >= 0:
        maps.append(own[parent])
        parent = tree[parent][1]
    return collections.ChainMap(*maps)
