"""TypeTable: the element types and shapes of a model's tensors, the one type table.

Where a type comes from is data, not a subclass:

* declarations: every graph's inputs, outputs, value_info and initializers (``declare``;
  or given in bulk, their TypeProtos made when first asked for: ``take_declarations``);
* forward rules over the nodes: a node's output types from its inputs' (the common standard
  ops, the registry's ops: type_rules.py; If/Loop/Scan from their bodies: here), run over the
  parsed nodes, or over node fields the caller read in bulk (``forward_fields``: the byte writers);
* ONNX shape inference, once, for what those leave unknown; or that alone, the forward rules
  not run (``TypeTable.inferred``: what the converter, kernel binding, the export checks and
  pictures read, each table's scopes made from the inference result: inference.py's
  ``infer_types``, ``Inferred``);
* per scope: sibling graphs that define one name get a table each, looking outer names up
  in the tables around them (``scope``; ``scope(graph, lazy=True)`` waits for a first query).

Read by name: ``elem_type``, ``shape``, ``dims`` / ``static_shape`` (simplify's reading: symbols,
refined past inference by ``refine_dims``), and the TypeProtos as a mapping would give them
(``table[name]``, ``get``, ``in``, ``items()``).

Two small strategy objects change how it is asked, never what it answers: a ``policy``
(:class:`TypePolicy`: which names it may answer, what sibling graphs defining one name mean,
which model ONNX inference runs on; the byte writers' refuses what the engine's table would
find otherwise) and a ``watch`` (:class:`Watch`: told as the forward pass enters each node
holding graphs and each graph, the bodies' byte writer lists its scopes there).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter, itemgetter
from typing import Any, Protocol

import onnx
from onnx import helper

from graphkit.errors import RewriteError
from graphkit.rewrite.graph.inference import Inferred, infer_types, tensor_dims
from graphkit.rewrite.graph.type_rules import (CONTROL_FLOW_BODY, FIRST_INPUT, GENERAL, HOLDER, NONE, OP, SAME,
                                               forward_node, rule_code)
from graphkit.rewrite.graph.walk import AI_ONNX, walk

__all__ = ["TypePolicy", "TypeTable", "Watch"]

_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS
_NAME, _TYPE, _ELEM = attrgetter("name"), attrgetter("type"), attrgetter("tensor_type.elem_type")


class TypePolicy(Protocol):
    """How a table is asked (the engine's table has none: it answers everything it can)."""

    def ask(self, query: Callable[..., Any], name: str, *args: Any) -> Any:
        """``query(name, *args)``, or what answers in its place where it is a name not to answer."""

    def sibling_reuse(self, name: str) -> None:
        """Two sibling graphs define ``name``: return to keep a table per scope, or raise."""

    def inference_model(self) -> onnx.ModelProto:
        """The model ONNX shape inference runs on (or raise: no inference)."""


class Watch(Protocol):
    """Told where the forward pass goes: it does what the table would (``forward_subgraphs``,
    ``forward_graph``) and lists what it sees."""

    def holder(self, table: TypeTable, node: onnx.NodeProto, domain: str) -> None:
        """The pass reaches ``node``, which holds graphs."""

    def graph(self, table: TypeTable, graph: onnx.GraphProto) -> None:
        """The pass enters subgraph ``graph``, ``table`` its table."""


class _SiblingReuse(Exception):
    """Two sibling graphs define one name: the table goes from one map to one per scope."""


class TypeTable:
    """Element types and shapes of a model's tensors, computed on first use.

    Element types come from the declarations (inputs, value_info, initializers,
    constants) and a forward pass over the nodes that knows the common standard ops and
    the registry's ops. Whatever that leaves unknown is asked of ONNX shape inference,
    once, the first time it is needed. A declaration overwrites, a forward rule only fills
    in a name not typed yet: a declared name's type is final whatever the nodes do.

    Scopes: ONNX's SSA form spans nested graphs (a subgraph reads outer values but never
    defines an outer name again), but sibling graphs (an If's branches, two Loop bodies)
    may each define one name, each with its own type. Where no two graphs define a name,
    one map serves every scope; where some do (found by the forward pass), each subgraph
    gets a table of the names it defines that looks the others up in the tables of the
    graphs around it. ``scope(graph)`` is the table a node of ``graph`` sees.

    ``TypeTable.inferred(model)``: a table of ONNX inference's types only (no forward rules),
    each scope's table made from the inference result when asked for.
    """

    # A model with thousands of If/Loop bodies may have a table per body: kept small.
    __slots__ = ("_defined", "_elem", "_found", "_graph", "_inferred", "_lazy", "_model", "_parent", "_pending",
                 "_policy", "_registry", "_scoped", "_state", "_top", "_tables", "_types", "_types_pending", "_watch")

    # TypeProtos given in bulk: names looked up in them before they are all put in the table
    LOOKUPS = 64

    def __init__(self, model: onnx.ModelProto | None = None, registry: Any = None, *,
                 policy: TypePolicy | None = None, watch: Watch | None = None) -> None:
        self._model = model
        self._registry = registry
        self._types: dict[str, onnx.TypeProto] = {}
        self._elem: dict[str, int] = {}
        self._parent: TypeTable | None = None
        # The root table (None: this one). Not a reference to itself: a table in a cycle lives,
        # with the model it holds, until the cyclic collector runs (after the ONNX checker
        # has parsed the output beside it, doubling the peak memory).
        self._top: TypeTable | None = None
        self._graph: onnx.GraphProto | None = None  # a subgraph's table: its graph
        # On the root: whether there is a table per scope; id(subgraph) -> its table then;
        # while there is not, the names subgraphs define and leave untyped (to find one
        # defined twice: a typed one is in the map).
        self._scoped = False
        self._tables: dict[int, TypeTable] = {}
        self._defined: set[str] = set()
        self._state = "new" if model is not None else "done"
        self._policy = policy
        self._watch = watch
        self._pending: tuple | None = None  # forward_fields' node fields, not typed yet
        self._types_pending: list | None = None  # take_declarations' TypeProtos, not in _types yet
        self._found: dict[str, Any] | None = None  # names looked up in them
        self._lazy: Any = None  # scope(graph, lazy=True): (the graph, its table once looked up)
        self._inferred: Inferred | None = None  # a table of inference only (``inferred``): its scopes

    @classmethod
    def inferred(cls, model: onnx.ModelProto, registry: Any = None, *, infer: bool = True,
                 without_weights: bool = False, data_prop: bool = False, flat: bool = False) -> TypeTable:
        """The types ONNX shape inference gives ``model``'s values (custom ops typed through
        ``registry``'s schemas; where inference fails, or without ``infer``, those the model
        states: initializers, inputs, value_info, outputs), no forward rules. ``without_weights``:
        inference runs on a copy without the large initializers; ``data_prop``: with ONNX's data
        propagation (see ``inference.infer_types``; ``flat`` likewise). Within one scope the first type stated for a
        name wins (initializers, inputs, value_info, outputs); a subgraph output that is an outer
        value keeps the outer value's. ``scope(graph)`` of a graph not of the model is a KeyError
        where sibling graphs define one name (else the one map), or an empty table with ``missing_ok``."""
        table = cls(None, registry)
        table._model = model
        table._inferred = found = infer_types(model, registry, infer=infer, without_weights=without_weights,
                                              data_prop=data_prop, flat=flat)
        table._types = found.main
        table._scoped = found.per_scope
        return table

    def _inferred_scope(self, graph: onnx.GraphProto, missing_ok: bool) -> TypeTable:
        """``scope(graph)`` of a table of inference only (the root): a subgraph's table, made
        when asked for (as a ChainMap of its maps and those around it), not kept: kept, each
        would be in a cycle with the root, alive until the cyclic collector runs."""
        found = self._inferred
        if not found.per_scope or graph is self._model.graph:
            return self
        seen = found.scope(graph, missing_ok=missing_ok)
        table = TypeTable(None, self._registry)
        table._tables = table._defined = None
        if seen is None:  # not a graph of the model (missing_ok)
            return table
        table._top, table._graph, table._types, table._inferred = self, graph, seen, found
        return table

    @property
    def _root(self) -> TypeTable:
        return self._top or self

    # -- queries

    def set(self, name: str, tp: onnx.TypeProto) -> None:
        if self._lazy is not None:
            return self._resolve().set(name, tp)
        if self._types_pending is not None:
            self._materialize()
        self._types[name] = tp
        if tp.HasField("tensor_type") and tp.tensor_type.elem_type:
            self._elem[name] = tp.tensor_type.elem_type

    def elem_type(self, name: str) -> int | None:
        if self._lazy is not None:
            return self._resolve().elem_type(name)
        if self._inferred is not None:  # TypeProtos only (each a tensor's, its elem_type set)
            tp = self._types.get(name)
            return None if tp is None else tp.tensor_type.elem_type
        policy = self._root._policy
        if policy is not None:
            return policy.ask(self._elem_type, name)
        return self._elem_type(name)

    def get(self, name: str, default: Any = None) -> Any:
        """The TypeProto of ``name`` as a node of this scope sees it (``default`` where none is
        known); like ``shape``, asks ONNX inference for a name not declared."""
        if self._inferred is not None:  # a table of inference only
            return self._types.get(name, default)
        if self._lazy is not None:
            return self._resolve().get(name, default)
        root = self._root
        if root._state == "done" and root._policy is None and self._types_pending is None:
            tp = self._type(name)
        elif root._policy is not None:
            tp = root._policy.ask(self._type_of, name, True)
        else:
            tp = self._type_of(name, True)
        return default if tp is None else tp

    def getter(self) -> Callable[[str], onnx.TypeProto | None]:
        """``get`` for a loop over many names: in a table of inference only, its map's own
        ``get`` (no Python call between)."""
        return self._types.get if self._inferred is not None else self.get

    def __getitem__(self, name: str) -> onnx.TypeProto:
        if self._inferred is not None:
            return self._types[name]
        tp = self.get(name)
        if tp is None:
            raise KeyError(name)
        return tp

    def __contains__(self, name: object) -> bool:
        if self._inferred is not None:
            return name in self._types
        return self.get(name) is not None

    def items(self) -> Iterable[tuple[str, onnx.TypeProto]]:
        """(name, TypeProto) of every value this scope sees a TypeProto for (after ONNX
        inference, where the table asks it)."""
        if self._lazy is not None:
            return self._resolve().items()
        root = self._root
        if root._state == "new":
            root._forward()
        if root._state == "forward":
            root._infer()
        if self._types_pending is not None:
            self._materialize()
        if self._parent is None:
            return self._types.items()
        chain, table = [], self
        while table is not None:
            chain.append(table._types)
            table = table._parent
        return collections.ChainMap(*chain).items()

    def keys(self) -> Iterable[str]:
        return (name for name, _ in self.items())

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def shape(self, name: str, *, infer: bool = True) -> list[Any] | None:
        """The shape of ``name``; unless ``infer`` is False, ask shape inference when undeclared."""
        if self._lazy is not None:
            return self._resolve().shape(name, infer=infer)
        policy = self._root._policy
        if policy is not None:
            return policy.ask(self._shape, name, infer)
        return self._shape(name, infer)

    def dims(self, name: str) -> list[Any] | None:
        """The dims of ``name`` as this scope sees it (``inference.tensor_dims``: an int, a symbol,
        or ``?name#axis`` for a dim with neither; None: no shape known); in a table of inference
        only, those ``refine_dims`` proved first, each dim read through the dims proved equal."""
        found = self._inferred
        if found is None:
            return tensor_dims(self.get(name), name)
        refined = found.refined
        if name in refined:
            got = refined[name]
        else:
            got = tensor_dims(self._types.get(name), name)
            if not found.per_scope:  # (with maps per scope, only the refined main graph's names are one's)
                refined[name] = got
        resolve = found.resolve
        return got if resolve is None or got is None else resolve(got)

    def static_shape(self, name: str) -> list[int] | None:
        """The dims of ``name`` where every one is a number (None otherwise)."""
        dims = self.dims(name)
        return dims if dims is not None and all(isinstance(d, int) for d in dims) else None

    def refine_dims(self, proved: dict[str, list[Any] | None],
                    resolve: Callable[[list[Any]], list[Any]] | None = None) -> None:
        """A table of inference only: ``proved``, dims of main-graph names a refinement step
        computed past ONNX inference, answered by ``dims`` from now on, in every scope; ``resolve``:
        each dims list read through the dims proved equal (None: none)."""
        found = self._inferred
        if found is None:
            raise RewriteError("TypeTable.refine_dims: only a table of inference only "
                               "(TypeTable.inferred) keeps refined dims; build the table with TypeTable.inferred")
        found.refined.update(proved)
        found.resolve = resolve

    @property
    def elem_types(self) -> dict[str, int]:
        """The element types this table holds so far, by name (what ``elem_type`` answers
        before running the pass further; the pass only adds types)."""
        if not self._elem and self._inferred is not None:
            self._elem.update((name, tp.tensor_type.elem_type) for name, tp in self._types.items())
        return self._elem

    def names(self) -> set[str]:
        """Every name the table holds: typed, declared, or defined and left untyped."""
        names = set(self._elem).union(self._types)
        return names.union(self._defined) if self._defined else names

    def per_scope(self) -> bool:
        """Whether subgraphs have tables of their own (two sibling graphs define one name);
        runs the forward pass if it has not run. Where not, ``scope(graph)`` is this table."""
        if self._lazy is not None:
            return self._resolve().per_scope()
        root = self._root
        if root._state == "new":
            root._forward()
        return root._scoped

    def scope(self, graph: onnx.GraphProto, *, lazy: bool = False, missing_ok: bool = False) -> TypeTable:
        """The table a node of ``graph`` sees: ``graph`` is the model's main graph or one of
        its subgraphs (a graph no longer in the model is typed on its own, inside this table's;
        in a table of inference only, see ``inferred``; ``missing_ok`` is for those).
        ``lazy``: found when first asked (the forward pass that telling scopes apart needs
        runs then, or not at all: a rule that reads no type costs no typing of the model)."""
        if self._lazy is not None:
            if lazy:
                return self._root.scope(graph, lazy=True)
            return self._resolve().scope(graph, missing_ok=missing_ok)
        root = self._root
        if self._inferred is not None:
            return root._inferred_scope(graph, missing_ok)
        if lazy:
            table = TypeTable(None, self._registry)
            table._top, table._lazy = root, [graph, None]
            table._tables = table._defined = None
            return table
        if root._model is None:
            return self  # a function body's: nothing is declared, nothing to tell apart
        if graph is root._model.graph:
            return root
        if root._state == "new":
            root._forward()  # whether one map serves every scope
        if not root._scoped:
            return root
        table = root._tables.get(id(graph))
        if table is None or table._graph is not graph:
            root._index_new_graphs()  # a graph rebuilt after the forward pass (a copy)
            table = root._tables.get(id(graph))
            if table is None or table._graph is not graph:
                table = self._child(graph)
                table.forward_graph(graph)
        return table

    def _resolve(self) -> TypeTable:
        lazy = self._lazy
        if lazy[1] is None:
            lazy[1] = self._top.scope(lazy[0])
        return lazy[1]

    def _elem_type(self, name: str) -> int | None:
        root = self._root
        if root._state == "new":
            root._forward()
        elem = self._get(name)
        if elem is None and root._state == "forward":
            if root._pending is not None:
                root._run_pending()
                elem = self._get(name)
                if elem is not None:
                    return elem
            root._infer()
            elem = self._get(name)
        return elem

    def _type_of(self, name: str, infer: bool) -> onnx.TypeProto | None:
        root = self._root
        if root._state == "new":
            root._forward()
        tp = self._type(name)
        if infer and tp is None and root._state == "forward":
            root._infer()
            tp = self._type(name)
        return tp

    def _shape(self, name: str, infer: bool = True) -> list[Any] | None:
        tp = self._type_of(name, infer)
        if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tp.tensor_type.shape.dim]

    def _get(self, name: str) -> int | None:
        """The element type of ``name`` as this scope sees it (its own, else an outer one)."""
        elem = self._elem.get(name)
        if elem is None and self._parent is not None:
            return self._parent._get(name)
        return elem

    def _type(self, name: str) -> onnx.TypeProto | None:
        if self._types_pending is not None:
            found = self._pending_type(name)
            if found is not None:
                return found
        tp = self._types.get(name)
        if tp is None and self._parent is not None:
            return self._parent._type(name)
        return tp

    # -- declarations

    def declare(self, graph: onnx.GraphProto) -> None:
        """``graph``'s declarations, in order: inputs, outputs, value_info, initializers (a
        TypeProto's ``tensor_type.elem_type`` reads 0 where it holds another type)."""
        outer = self._parent
        if outer is None:  # each list read at once: the same ``set`` calls, in order
            if self._types_pending is not None:
                self._materialize()
            types, elem = self._types, self._elem
            for vis in (graph.input, graph.output, graph.value_info):
                if vis:
                    tps = list(map(_TYPE, vis))
                    names = list(map(_NAME, vis))
                    types.update(zip(names, tps))
                    elem.update(filter(itemgetter(1), zip(names, map(_ELEM, tps))))
        else:
            for vi in (*graph.input, *graph.output, *graph.value_info):
                # A subgraph's output may be an outer value: it keeps the outer value's type.
                if outer._get(vi.name) is None:
                    self.set(vi.name, vi.type)
        for t in graph.initializer:
            self.set(t.name, helper.make_tensor_type_proto(t.data_type, list(t.dims)))

    def take_declarations(self, elem: dict[str, int], declared: list[tuple[list[str], list]],
                          untyped: Iterable[str], flow: Iterable[tuple[str, int]] = ()) -> None:
        """Declarations read elsewhere in bulk, as the declarations-only pass would make them
        (none of their names already here): ``elem`` (taken over: the table's element types
        are added to it), the TypeProtos ``declared`` (lists of names and types, in the order
        declared: put in the table when first asked for), the names defined and left untyped,
        then control-flow outputs typed by their bodies (``flow``: a forward rule, filling in)."""
        elem.update(self._elem)
        self._elem = elem
        self._types_pending = declared
        for out, t in flow:
            elem.setdefault(out, t)
        self._defined.update(untyped)

    def _pending_type(self, name: str) -> onnx.TypeProto | None:
        """A few names are asked for (the checks' shapes): each found in the pending lists, its
        last declaration as the table would hold it, not a million put in the table."""
        found = self._found
        if found is None:
            found = self._found = {}
        if name in found:
            return found[name]
        if len(found) >= self.LOOKUPS:
            self._materialize()
            return None
        tp = None
        for names, tps in reversed(self._types_pending):
            if name in names:
                at = names.index(name)
                try:
                    while True:
                        at = names.index(name, at + 1)
                except ValueError:
                    pass
                tp = tps[at]
                break
        found[name] = tp
        return tp

    def _materialize(self) -> None:
        """The TypeProtos take_declarations left pending put in the table, in their order."""
        pending, self._types_pending, self._found = self._types_pending, None, None
        for names, tps in pending or ():
            self._types.update(zip(names, tps))

    # -- the forward pass

    def _forward(self) -> None:
        self._state = "forward"
        try:
            self.forward_graph(self._model.graph)
        except _SiblingReuse:
            self._types.clear()
            self._elem.clear()
            self._scoped, self._defined = True, None
            self.forward_graph(self._model.graph)

    def forward_node(self, node: onnx.NodeProto, domain: str, op: str) -> None:
        """The element types of one node's outputs from its inputs' (subgraphs aside)."""
        forward_node(self._elem, self._elem.get if self._parent is None else self._get, node, domain, op,
                     self._registry)

    # A recursion, not walk(): a Watch (bytes/body_scopes.BodyScopes) takes each holder and graph over
    # and calls back in (forward_subgraphs, forward_graph) with its own state around each call.
    def forward_graph(self, graph: onnx.GraphProto) -> None:
        """Declare and forward-type ``graph``, this table's graph, and its subgraphs (in tables of their own)."""
        self.declare(graph)
        elem, registry = self._elem, self._registry
        get = elem.get if self._parent is None else self._get
        for node in graph.node:
            domain = node.domain
            forward_node(elem, get, node, domain, node.op_type, registry)
            if node.attribute:
                self._forward_subgraphs(node, domain)

    def _forward_subgraphs(self, node: onnx.NodeProto, domain: str) -> None:
        watch = self._root._watch
        if watch is not None:
            return watch.holder(self, node, domain)
        return self.forward_subgraphs(node, domain)

    def forward_subgraphs(self, node: onnx.NodeProto, domain: str) -> None:
        """Forward-type the graphs ``node`` holds, each in its own table (the watch told)."""
        bodies = None
        root = self._root
        scoped, watch = root._scoped, root._watch
        for attr in node.attribute:
            t = attr.type
            if t == _GRAPH:
                names = None if scoped else self.define(attr.g)
                table = self._child(attr.g)
                table.forward_graph(attr.g) if watch is None else watch.graph(table, attr.g)
                if names:
                    self.defined_untyped(names)
                if bodies is None:
                    bodies = {}
                bodies[attr.name] = table, attr.g
            elif t == _GRAPHS:
                for g in attr.graphs:
                    names = None if scoped else self.define(g)
                    table = self._child(g)
                    table.forward_graph(g) if watch is None else watch.graph(table, g)
                    if names:
                        self.defined_untyped(names)
        if bodies and domain in AI_ONNX:
            self._forward_control_flow(node, bodies)

    def _forward_control_flow(self, node: onnx.NodeProto,
                              bodies: dict[str, tuple[TypeTable, onnx.GraphProto]]) -> None:
        """If/Loop/Scan outputs take the element types of their body's outputs.

        Without this, every model with control flow fell back to whole-model ONNX shape
        inference, whose cost grows with the square of the number of subgraphs.
        """
        found = bodies.get(CONTROL_FLOW_BODY.get(node.op_type, ""))
        if found is None:
            return
        table, body = found
        elem = self._elem
        outs = list(body.output)[1:] if node.op_type == "Loop" else list(body.output)
        for out, body_out in zip(node.output, outs):
            if out and (t := table._get(body_out.name)) is not None:
                elem.setdefault(out, t)

    def _child(self, graph: onnx.GraphProto) -> TypeTable:
        """The table of ``graph``, nested in this table's graph: this one while one map
        serves every scope, else a new one."""
        root = self._root
        if not root._scoped:
            return root
        table = TypeTable(None, self._registry)
        table._parent, table._top, table._graph = self, root, graph
        table._tables = table._defined = None  # the root's only
        root._tables[id(graph)] = table
        return table

    def _index_new_graphs(self) -> None:
        """Tables for the model's graphs that have none (copies made by rebuilding a node list)."""
        tables = self._tables
        for _, v in walk(self._model.graph):
            if v.parent is None:
                v.data = self
                continue
            sub = v.graph
            known = tables.get(id(sub))
            if known is not None and known._graph is sub:
                v.data = known
            else:
                v.parent.data._child(sub).forward_graph(sub)
                v.children = []  # typed with the graphs nested in it

    def define(self, graph: onnx.GraphProto, names: list[str] | None = None) -> list[str]:
        """While one map serves every scope, before subgraph ``graph`` is typed: the names it
        defines (inputs, initializers, node outputs; ``names`` where the caller has them); one
        already typed, or defined untyped, is another graph's (SSA: never an outer one)."""
        root = self._root
        elem, types, untyped = root._elem, root._types, root._defined
        if names is None:
            names = [name for name in itertools.chain((i.name for i in graph.input), (t.name for t in graph.initializer),
                                                      (o for n in graph.node for o in n.output)) if name]
        for name in names:
            if name in elem or name in types or name in untyped:
                self.sibling_reuse(name)
        return names

    def defined_untyped(self, names: list[str]) -> None:
        """After a subgraph is typed: what it defines and left untyped (a sibling may type it)."""
        root = self._root
        elem, untyped = root._elem, root._defined
        for name in names:
            if name not in elem:
                untyped.add(name)

    def sibling_reuse(self, name: str) -> None:
        """Two sibling graphs define ``name``: a table per scope (unless the policy refuses)."""
        policy = self._root._policy
        if policy is not None:
            policy.sibling_reuse(name)
        raise _SiblingReuse(name)

    # -- the forward pass over node fields read in bulk

    def forward_fields(self, nodes: Sequence[onnx.NodeProto], domains: list[str], op_types: list[str],
                       ins: list[Any] | None, outs: list[Any] | None, holders: set[int],
                       read: Iterable[str] | None = None) -> None:
        """The main graph's nodes forward-typed from fields read in bulk (after ``declare``:
        ``domains``, ``op_types``, ``ins``, ``outs`` of the first nodes, up to the last one
        asked about), the same rules in the same order as ``forward_graph``; ``holders``: the
        nodes holding graphs (typed through it). ONNX inference comes next.

        ``read``: the names the caller will ask for; where every one is declared (fan-out from a
        graph input) and no node holds a graph, the nodes wait until a name not declared is
        asked for (holding every node's lists until then costs more memory than the lowering
        itself); ``ins`` and ``outs`` may then be None, read again when needed. None: now."""
        self._state = "forward"
        if read is None or holders or not self._elem.keys() >= set(read) - {""}:
            self._pending = (nodes, domains, op_types, ins, outs, holders)
            self._run_pending()
        else:
            self._pending = (nodes, domains, op_types, None, None, holders)

    def declarations_only(self) -> None:
        """No forward pass: the table answers from declarations (``declare``, ``take_declarations``)
        and the rules its caller runs (``forward_node``...); ONNX inference comes next."""
        self._state = "forward"

    def set_watch(self, watch: Watch | None) -> None:
        """The watch told where the forward pass goes from now on (None: no one)."""
        self._watch = watch

    def forget(self, names: Iterable[str]) -> None:
        """Drop the element types of ``names`` (the caller answers for them otherwise)."""
        elem = self._elem
        for name in names:
            elem.pop(name, None)

    @property
    def waiting(self) -> bool:
        """Whether forward_fields' nodes wait to be typed."""
        return self._pending is not None

    def _run_pending(self) -> None:
        if self._pending is not None:
            (nodes, domains, op_types, ins, outs, holders), self._pending = self._pending, None
            if ins is None:
                everything = itemgetter(slice(None))
                count = len(domains)
                ins = list(map(everything, map(attrgetter("input"), itertools.islice(nodes, count))))
                outs = list(map(everything, map(attrgetter("output"), itertools.islice(nodes, count))))
            self._run(nodes, domains, op_types, ins, outs, holders)

    def _run(self, nodes: Sequence[onnx.NodeProto], domains: list[str], op_types: list[str], ins: list[Any],
             outs: list[Any], holders: set[int]) -> None:
        """forward_graph's node loop over fields read in bulk; the common cases on each node's
        first input and output."""
        elem = self._elem
        get, setdefault = elem.get, elem.setdefault
        registry = self._registry
        table = {pair: rule_code(*pair, registry) for pair in set(zip(domains, op_types))}
        codes = list(map(dict(zip(table, map(itemgetter(0), table.values()))).__getitem__, zip(domains, op_types)))
        in_lens = list(map(len, ins))
        out_lens = list(map(len, outs))
        first_in = list(map(itemgetter(0), ins)) if 0 not in in_lens else [i[0] if i else None for i in ins]
        first_out = list(map(itemgetter(0), outs)) if 0 not in out_lens else [o[0] if o else None for o in outs]
        if out_lens.count(1) != len(out_lens):
            for p, n in enumerate(out_lens):
                if n != 1 and codes[p] <= FIRST_INPUT:
                    codes[p] = GENERAL if codes[p] == SAME else OP
        for p in holders:
            if p < len(codes):
                codes[p] = HOLDER
        for p, code, x, o in zip(itertools.count(), codes, first_in, first_out):
            if code <= FIRST_INPUT:  # one output, typed as input 0 (an op's: when that is typed)
                t = get(x)
                if t is not None:
                    setdefault(o, t)
                    continue
                if code == SAME:
                    continue
            elif code == NONE:
                continue
            if code <= OP:  # a registry op's outputs: the types bound to their variables
                rule = table[(domains[p], op_types[p])][1]
                for out, t in zip(outs[p], rule.outputs(tuple(map(get, ins[p])))):
                    if t is not None:
                        setdefault(out, t)
            else:  # GENERAL, HOLDER: forward_node's rules on the node, then its subgraphs
                self.forward_node(nodes[p], domains[p], op_types[p])
                if code == HOLDER:
                    self._forward_subgraphs(nodes[p], domains[p])

    # -- ONNX shape inference

    def _infer(self) -> None:
        """Ask ONNX shape inference (custom ops known through their schemas), for every scope."""
        self._run_pending()
        if self._types_pending is not None:
            self._materialize()
        if self._policy is not None:
            self._model = self._policy.inference_model()
        self._state = "done"
        types = infer_types(self._model, self._registry)
        if self._scoped:
            found = [(self.scope(graph), own) for graph, own in types.by_graph()]
        else:  # one map: the first type found for a name
            flat: dict[str, onnx.TypeProto] = {}
            for _, own in types.by_graph():
                for name, tp in own.items():
                    flat.setdefault(name, tp)
            found = [(self, flat)]
        for table, own in found:
            have = table._types
            for name, tp in own.items():
                if name not in have or not have[name].tensor_type.HasField("shape"):
                    table.set(name, tp)
