"""Scopes: the node lists of a model (main graph, subgraphs, function bodies) that rules and
graph passes rewrite, and what each sees (initializers, types, its graph's interface).

A :class:`~graphkit.rewrite.GraphPass` edits a scope's nodes in place; in the main graph it
may also change the model's interface with the methods below (``add_input``,
``remove_input``, ``add_output``, ``remove_output``, ``rename``, then ``prune`` what nothing
reads any more). A subgraph's inputs and outputs are its node's (an If's outputs, a Loop's
carried values): there only ``rename`` is allowed; a function body's interface is its callers'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import helper

from graphkit.errors import RewriteError
from graphkit.rewrite.graph.edit import outer_names
from graphkit.rewrite.graph.view import GraphView
from graphkit.rewrite.graph.walk import AI_ONNX, graphs, subgraphs, walk
from graphkit.rewrite.graph.types import TypeTable

__all__ = ["Scope", "model_scopes"]

_INTERFACE_HINT = "change the interface in a GraphPass(..., main_only=True): it runs in the main graph only"


@dataclass
class Scope:
    """One node list of a model (main graph, subgraph or function body) and what it sees.

    ``types`` knows the model's element types and shapes (computed once per rewrite;
    empty in function bodies, whose types are the caller's). ``main``: the model's main graph,
    the only scope whose inputs and outputs a pass may add or remove.
    """

    nodes: Any  # the repeated NodeProto field, edited in place
    protected: set[str]  # graph outputs: their names must stay produced
    initializers: list[onnx.TensorProto]  # visible here (enclosing graphs' included)
    graph: onnx.GraphProto | None  # None in a function body
    types: TypeTable
    opset: int
    make_builder: Callable[[onnx.NodeProto, str], Any]
    base_dir: str | None = None  # the model file's directory: external data is read from there
    ops: list[str] | None = None  # the nodes' op types where already read (the first view takes them)
    main: bool = False

    def view(self) -> GraphView:
        """A fresh index of producers, consumers and constants (build it after editing nodes)."""
        ops, self.ops = self.ops, None
        return GraphView(self.nodes, protected=self.protected, initializers=self.initializers,
                         base_dir=self.base_dir, ops=ops)

    def builder(self, node: onnx.NodeProto, name: str) -> Any:
        """A Builder for nodes replacing ``node``. In a graph, ``op.initializer()`` collects
        tensors in its ``initializers`` list (a graph pass hands them to add_initializers());
        in a function body it makes Constant nodes."""
        b = self.make_builder(node, name)
        if self.graph is not None:
            b.initializers = []
        return b

    def add_initializers(self, tensors: Iterable[onnx.TensorProto]) -> list[onnx.NodeProto]:
        """Put ``tensors`` in this graph; in a function body, return them as Constant nodes."""
        tensors = list(tensors)
        if self.graph is not None:
            self.graph.initializer.extend(tensors)
            self.initializers.extend(tensors)
            return []
        return [helper.make_node("Constant", [], [t.name], name=t.name, value=t) for t in tensors]

    # -- the graph's interface

    @property
    def inputs(self) -> list[str]:
        """The names of this graph's inputs, in order (none in a function body)."""
        return [i.name for i in self.graph.input] if self.graph is not None else []

    @property
    def outputs(self) -> list[str]:
        """The names of this graph's outputs, in order (none in a function body)."""
        return [o.name for o in self.graph.output] if self.graph is not None else []

    def add_input(self, name: str, elem_type: int | None = None, shape: Sequence[Any] | None = None) -> None:
        """Make tensor ``name`` a graph input. Where a node computes it, its readers read the
        input instead (the node's output is renamed; ``prune()`` removes what is left unread).
        The type is ``elem_type`` and ``shape`` where given, else the tensor's."""
        graph = self._graph("add_input", main=True)
        if name in self.inputs:
            raise RewriteError(f"add_input: '{name}' is already an input")
        tp = self._type("add_input", name, elem_type, shape)
        for node in self.nodes:
            for i, out in enumerate(node.output):
                if out == name:
                    node.output[i] = self._fresh(f"{name}_cut")
        self.initializers[:] = [t for t in self.initializers if t.name != name]  # fed now: not a constant
        _drop_value_info(graph, name)
        graph.input.append(helper.make_value_info(name, tp))

    def remove_input(self, name: str) -> None:
        """Drop graph input ``name``; nothing may read it."""
        graph = self._graph("remove_input", main=True)
        if name not in self.inputs:
            raise RewriteError(f"remove_input: '{name}' is not an input of the graph (its inputs: {self.inputs})")
        readers = [f"node '{n.name or n.op_type}'" for n in self.nodes
                   if name in n.input or any(name in outer_names(g) for g in subgraphs(n))]
        if name in self.outputs:
            readers.append("the graph's outputs")
        if readers:
            raise RewriteError(f"remove_input: '{name}' is read by {', '.join(readers[:5])}",
                               hint="remove or rewire its readers first (prune() removes nodes nothing reads)")
        kept = [i for i in graph.input if i.name != name]
        del graph.input[:]
        graph.input.extend(kept)
        self.initializers.extend(t for t in graph.initializer if t.name == name)  # a constant again

    def add_output(self, name: str, elem_type: int | None = None, shape: Sequence[Any] | None = None) -> None:
        """Make tensor ``name`` (an input, an initializer or a node's output) a graph output; the
        type is ``elem_type`` and ``shape`` where given, else the tensor's."""
        graph = self._graph("add_output", main=True)
        if name in self.outputs:
            raise RewriteError(f"add_output: '{name}' is already an output")
        if name not in self._defined(graph):
            raise RewriteError(f"add_output: no tensor '{name}' in this graph")
        tp = self._type("add_output", name, elem_type, shape)
        _drop_value_info(graph, name)
        graph.output.append(helper.make_value_info(name, tp))
        self.protected.add(name)

    def remove_output(self, name: str) -> None:
        """Drop graph output ``name``; what computes it stays until ``prune()``."""
        graph = self._graph("remove_output", main=True)
        if name not in self.outputs:
            raise RewriteError(f"remove_output: '{name}' is not an output of the graph (its outputs: {self.outputs})")
        kept = [o for o in graph.output if o.name != name]
        del graph.output[:]
        graph.output.extend(kept)
        self.protected.discard(name)

    def rename(self, old: str, new: str) -> None:
        """Rename tensor ``old`` (an input, initializer or node output of this graph) to ``new``
        everywhere: where it is made, its readers (subgraphs' too), the graph's outputs and
        value_info. ``new`` must be a name the model does not have."""
        graph = self._graph("rename")
        if old == new:
            return
        if old not in self._defined(graph):
            raise RewriteError(f"rename: no tensor '{old}' in this graph")
        names = self._names()
        if new in self._defined(graph) or any(new in n.input for g in graphs(graph) for n in g.node) or (
                names is not None and new in names):
            raise RewriteError(f"rename: '{new}' is already a tensor of this graph", hint="pick another name")
        elem = self.types.elem_type(old)
        shape = self.types.shape(old, infer=False)
        for info in (*graph.input, *graph.output, *graph.value_info):
            if info.name == old:
                info.name = new
        for tensor in graph.initializer:
            if tensor.name == old:
                tensor.name = new
        for node in self.nodes:
            _replace(node.input, old, new)
            _replace(node.output, old, new)
            for sub in subgraphs(node):  # reads of an outer name (a subgraph never defines it again)
                for g in graphs(sub):
                    for n in g.node:
                        _replace(n.input, old, new)
                    for o in g.output:
                        if o.name == old:
                            o.name = new
        if old in self.protected:
            self.protected.discard(old)
            self.protected.add(new)
        if elem is not None:
            self.types.set(new, helper.make_tensor_type_proto(elem, shape))
        if names is not None:
            names.reserve(new)

    def prune(self) -> int:
        """Remove the nodes whose outputs nothing reads and no graph output is (transitively);
        returns how many. Unused initializers go at the end of the rewrite."""
        needed = set(self.protected)  # the graph outputs (a function body's too)
        kept: list[onnx.NodeProto] = []
        for node in reversed(self.nodes):  # the nodes are in topological order
            if any(out and out in needed for out in node.output):
                kept.append(node)
                needed.update(node.input)
                for g in subgraphs(node):
                    needed.update(outer_names(g))
        removed = len(self.nodes) - len(kept)
        if removed:
            kept.reverse()
            del self.nodes[:]
            self.nodes.extend(kept)
        return removed

    def _graph(self, what: str, main: bool = False) -> onnx.GraphProto:
        if self.graph is None:
            raise RewriteError(f"{what}: a function body's inputs and outputs are its callers'", hint=_INTERFACE_HINT)
        if main and not self.main:
            raise RewriteError(f"{what}: only the main graph's interface can change (this is a subgraph, whose "
                               f"inputs and outputs are its node's)", hint=_INTERFACE_HINT)
        return self.graph

    def _type(self, what: str, name: str, elem_type: int | None, shape: Sequence[Any] | None) -> onnx.TypeProto:
        if elem_type is None:
            elem_type = self.types.elem_type(name)
            if elem_type is None:
                raise RewriteError(f"{what}: the element type of '{name}' is unknown",
                                   hint="pass elem_type= (an onnx.TensorProto type) and shape=")
            if shape is None:
                shape = self.types.shape(name)
        tp = helper.make_tensor_type_proto(elem_type, None if shape is None else list(shape))
        self.types.set(name, tp)
        return tp

    @staticmethod
    def _defined(graph: onnx.GraphProto) -> set[str]:
        names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
        names.update(o for n in graph.node for o in n.output)
        names.discard("")
        return names

    def _names(self) -> Any:
        """The rewrite's NameGenerator (every name of the model), where the builder has one."""
        return getattr(self.make_builder(onnx.NodeProto(), "interface"), "_names", None)

    def _fresh(self, base: str) -> str:
        names = self._names()
        if names is not None:
            return names.fresh(base)
        taken = self._defined(self.graph)
        name, i = base, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        return name


def _replace(field: Any, old: str, new: str) -> None:
    for i, name in enumerate(field):
        if name == old:
            field[i] = new


def _drop_value_info(graph: onnx.GraphProto, name: str) -> None:
    if any(v.name == name for v in graph.value_info):
        kept = [v for v in graph.value_info if v.name != name]
        del graph.value_info[:]
        graph.value_info.extend(kept)


def model_scopes(model: onnx.ModelProto, types: TypeTable, make_builder: Callable, base_dir: str | None,
                 tree: list[tuple[onnx.GraphProto, int, list[str] | None]] | None = None) -> list[Scope]:
    """Every scope, outer before inner, the main graph first (callers go through it reversed:
    rebuilding a node list copies its nodes, subgraphs included). ``tree``: the main graph and
    its subgraphs as ModelIndex.tree has them, where the caller has them (their nodes are not
    walked again; their op types, where read, go to the scopes' first views).

    No nested functions: a recursive closure is a reference cycle, and it would keep every
    scope (and through their type tables the model) alive until the cyclic collector runs."""
    model_opset = next((i.version for i in model.opset_import if i.domain in AI_ONNX), 1)
    out: list[Scope] = []
    if tree is None:
        _walk_scopes(out, model.graph, model_opset, types, make_builder, base_dir)
    else:
        for graph, parent, ops in tree:
            if parent < 0:
                made = _scope(graph, [], model_opset, types, make_builder, base_dir)
            else:
                up = out[parent]
                made = _scope(graph, up.initializers, model_opset, up.types.scope(graph, lazy=True), make_builder,
                              base_dir)
            made.ops = ops
            out.append(made)
    out[0].main = True
    for fn in model.functions:
        opset = next((i.version for i in fn.opset_import if i.domain in AI_ONNX), model_opset)
        out.append(Scope(fn.node, set(fn.output), [], None, TypeTable(), opset, make_builder, base_dir))
        _walk_scopes(out, fn, opset, None, make_builder, base_dir)
    return out


def _scope(graph: onnx.GraphProto, outer: list[onnx.TensorProto], opset: int, tt: Any, make_builder: Callable,
           base_dir: str | None) -> Scope:
    visible = list(outer)  # a list of the scope's own: add_initializers() extends it
    if graph.initializer:
        # An initializer that is also a graph input may be fed at run time: not a constant.
        fed = {i.name for i in graph.input}
        visible += [t for t in graph.initializer if t.name not in fed]
    return Scope(graph.node, {o.name for o in graph.output}, visible, graph, tt, opset, make_builder, base_dir)


def _walk_scopes(out: list[Scope], root: onnx.GraphProto | onnx.FunctionProto, opset: int, tt: Any,
                 make_builder: Callable, base_dir: str | None) -> None:
    """The scopes of ``root`` (a graph: its own, typed by ``tt``; a function: none, its body's
    is the caller's) and of the graphs nested in it, depth first, onto ``out``: a subgraph
    sees its graph's initializers and its types (a graph right in a function body: a table
    of its own)."""
    for _, v in walk(root):
        if v.graph is None:
            continue
        up = v.parent.data if v.parent is not None else None
        if up is None:
            made = _scope(v.graph, [], opset, tt if v.parent is None else TypeTable(), make_builder, base_dir)
        else:
            made = _scope(v.graph, up.initializers, opset, up.types.scope(v.graph, lazy=True), make_builder, base_dir)
        v.data = made
        out.append(made)

