"""What a conversion's modules share: its state (:class:`Conversion`: where the adapters are,
what they have made and read), the constants a node may read (:class:`Constants`), the node
lists a conversion walks, and attribute lookups."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import onnx

from graphkit.errors import RewriteError
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.graph.walk import AI_ONNX, ModelIndex, walk
from graphkit.rewrite.lowering.builder import NameGenerator

__all__ = ["Constants", "Conversion", "find_attr", "function_types", "nested_node_lists", "remove_attr", "roots"]


@dataclass
class Conversion:
    """One conversion to ai.onnx opset ``target``: where its adapters are (``function``,
    ``graph``, ``nodes``: the node's), what they have made and read, the lists to rebuild."""

    target: int
    path: str | None
    model: onnx.ModelProto
    taken: set[str] | None = None  # the model's names, where the caller knows them
    up: bool = True
    function: onnx.FunctionProto | None = None  # the node's, None in the main graph
    graph: onnx.GraphProto | None = None  # the node's subgraph, None in the main graph (or a function's body)
    nodes: Any = None  # the node list holding the node
    made: list[str] = field(default_factory=list)  # names of the values made
    released: list[tuple[Any, Any]] = field(default_factory=list)  # (constant, its list): read no more here
    pick: str = "pick a --target-opset"  # how a hint asks for another target: "<pick> of at least 13"
    keep: str = "keep the model's opset"  # how a hint asks for none
    _names: NameGenerator | None = None
    _types: TypeTable | None = None
    _constants: dict[int, Constants] = field(default_factory=dict)
    _function_types: dict[int, dict[str, onnx.TypeProto]] = field(default_factory=dict)
    shared: dict[tuple, str] = field(default_factory=dict)  # (namespace, input, values) -> constant made
    values: dict[int, list[int]] = field(default_factory=dict)  # id of a constant read -> its ints
    new_constants: dict[int, tuple[Any, list[tuple[str, Any]]]] = field(default_factory=dict)
    replaced: dict[int, Any] = field(default_factory=dict)  # id -> a node list to rebuild, in walk order
    placed: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)  # id(node) -> the nodes in its place
    wrapped: dict[int, tuple[onnx.NodeProto, onnx.NodeProto]] = field(default_factory=dict)  # id -> Transposes around it

    def put_before(self, node: onnx.NodeProto, made: list[onnx.NodeProto]) -> None:
        """Put ``made`` before ``node`` in its node list (when the lists are rebuilt, once each)."""
        self.replaced.setdefault(id(self.nodes), self.nodes)
        self.placed[id(node)] = [*made, node]

    @property
    def names(self) -> NameGenerator:
        """Names that clash with none of the model's (made on first use: most conversions need none)."""
        if self._names is None:
            self._names = NameGenerator(ModelIndex(self.model).names if self.taken is None else self.taken)
        return self._names

    @property
    def types(self) -> TypeTable | dict[str, onnx.TypeProto]:
        """The declared types of the values the node sees (its subgraph's, then the graphs'
        around it: sibling subgraphs may each define one name; a TypeTable of the stated types,
        ``TypeTable.inferred(model, infer=False)``); in a function body, its value_info's."""
        if self.function is not None:
            if id(self.function) not in self._function_types:
                self._function_types[id(self.function)] = function_types(self.function)
            return self._function_types[id(self.function)]
        if self._types is None:
            self._types = TypeTable.inferred(self.model, infer=False)
        return self._types if self.graph is None else self._types.scope(self.graph)

    def constant(self, name: str) -> tuple[Any, Any] | None:
        """The constant (Constant node or initializer, with the list holding it) ``name`` is
        where the node is: its subgraph's, else the graphs' around it (sibling subgraphs may
        each define one name), in the node's namespace (the main graph's or its function's)."""
        holder = self.model.graph if self.function is None else self.function
        if id(holder) not in self._constants:
            self._constants[id(holder)] = Constants(holder, overridable=self.model.ir_version >= 4)
        return self._constants[id(holder)].get(name, self.graph)

    def error(self, node: onnx.NodeProto, message: str, hint: str) -> RewriteError:
        where = f" (in function {self.function.name})" if self.function is not None else ""
        return RewriteError(f"cannot convert {node.op_type} to ai.onnx opset {self.target}{where}: {message}",
                            path=self.path, node=node.name or (node.output[0] if node.output else ""),
                            op=f"ai.onnx::{node.op_type}", hint=hint)


def roots(model: onnx.ModelProto) -> list[tuple[int, Any, Any]]:
    """(ai.onnx opset, function or None, node list) of the main graph and of each function
    importing ai.onnx."""
    def opset(imports: Any) -> int | None:
        return next((i.version for i in imports if i.domain in AI_ONNX), None)

    out = []
    if (main := opset(model.opset_import)) is not None:
        out.append((main, None, model.graph.node))
    for fn in model.functions:
        if (version := opset(fn.opset_import)) is not None:
            out.append((version, fn, fn.node))
    return out


def nested_node_lists(root: onnx.GraphProto | onnx.FunctionProto) -> Iterator[tuple[Any, onnx.GraphProto | None]]:
    """(node list, the subgraph holding it; None: ``root``'s own) of ``root`` (the main graph or
    a function) and of every subgraph nested in its nodes: a list before the lists of the
    subgraphs in it, the last met first. A list's subgraphs are looked up once the caller is
    done with it."""
    for _, v in walk(root, reverse=True):
        yield v.nodes, None if v.parent is None else v.graph


def function_types(fn: onnx.FunctionProto) -> dict[str, onnx.TypeProto]:
    """The types ``fn``'s value_info declares (names are unique in a body and its subgraphs)."""
    return {vi.name: vi.type for vi in fn.value_info if vi.HasField("type")}


class Constants:
    """The tensors Constant nodes and initializers of a namespace (the main graph, or a
    function body, and their subgraphs) hold, by name, with the list holding each, per graph:
    a name is looked up in the node's graph, then the graphs around it (sibling subgraphs,
    then and else branches, may each define one name). ``nested=False``: the holder's own
    only, for lookups from its own nodes (a subgraph's constants are not theirs to see);
    ``op_types``: then its nodes' op types, where the caller read them already."""

    def __init__(self, holder: onnx.GraphProto | onnx.FunctionProto, nested: bool = True,
                 overridable: bool = True, op_types: list[str] | None = None) -> None:
        self._root = id(holder)
        self._graphs: list[Any] = []  # held: their ids stay theirs
        self._own: dict[int, dict[str, tuple[Any, Any]]] = {}
        self._parent: dict[int, int | None] = {}
        if not nested:
            self._graphs.append(holder)
            self._parent[id(holder)] = None
            own: dict[str, tuple[Any, Any]] = {}
            if isinstance(holder, onnx.GraphProto):
                _own_initializers(holder, own, overridable)
            nodes = holder.node
            is_constant = map(operator.eq, map(attrgetter("op_type"), nodes) if op_types is None else op_types,
                              itertools.repeat("Constant"))
            for node in map(nodes.__getitem__, itertools.compress(itertools.count(), is_constant)):
                if node.domain in AI_ONNX and len(node.output) == 1:
                    own[node.output[0]] = (node, nodes)
            self._own[id(holder)] = own
            return
        for _, v in walk(holder, reverse=True):
            g = v.data = holder if v.parent is None else v.graph
            self._graphs.append(g)
            self._parent[id(g)] = None if v.parent is None else id(v.parent.data)
            own = {}
            if isinstance(g, onnx.GraphProto):
                _own_initializers(g, own, overridable)
            for node in g.node:
                if node.op_type == "Constant" and node.domain in AI_ONNX and len(node.output) == 1:
                    own[node.output[0]] = (node, g.node)
            if own:
                self._own[id(g)] = own

    def get(self, name: str, graph: onnx.GraphProto | None) -> tuple[Any, Any] | None:
        """What ``name`` is for a node of ``graph`` (None: the namespace's own node list)."""
        at: int | None = self._root if graph is None else id(graph)
        if at not in self._parent:  # not a graph of this namespace: nothing is known there
            return None
        while at is not None:
            found = self._own.get(at)
            if found is not None and name in found:
                return found[name]
            at = self._parent[at]
        return None


def _own_initializers(graph: onnx.GraphProto, own: dict[str, tuple[Any, Any]], overridable: bool) -> None:
    """``graph``'s initializers into ``own``, but, where ``overridable`` (IR 4 and up), those that
    are also its inputs: a value fed at run time may replace one, so it is no constant (an
    adapter going down would bake the default into an attribute). Below IR 4 every
    initializer is a graph input and none can be replaced (ONNX Runtime's rule too)."""
    inits = graph.initializer
    if not inits:
        return
    fed = {i.name for i in graph.input} if overridable and graph.input else ()
    for init in inits:
        if init.name not in fed:
            own[init.name] = (init, inits)


def find_attr(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    """``node``'s attribute ``name``, else None."""
    return next((a for a in node.attribute if a.name == name), None)


def remove_attr(node: onnx.NodeProto, name: str) -> None:
    """Remove ``node``'s attribute ``name``, where it has one."""
    for i, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[i]
            return
