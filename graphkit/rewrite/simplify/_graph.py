"""One scope (a graph, a subgraph or a function body) as the simplify passes edit it.

A :class:`SimplifyScope` reads its node list once into a Python list, indexes producers and
consumers, and writes the list back once when :meth:`SimplifyScope.commit` is called: removing a
node is setting its slot to None, so a pass stays linear however many nodes it removes.
A node holding subgraphs counts as a consumer of every outer name they read, and renaming
a value renames it inside those subgraphs too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphkit.rewrite.graph.held import PLAIN_TYPES, held, held_value, plain
from graphkit.rewrite.graph.view import constant_node_value
from graphkit.rewrite.graph.walk import AI_ONNX, outer_reads, subgraphs, walk

__all__ = ["SimplifyScope", "scopes_of"]

_EXTERNAL = onnx.TensorProto.EXTERNAL
_MANY = 16  # inputs past which a node's input positions are indexed


def _rename_inside(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Rename the outer value ``old`` to ``new`` wherever ``graph`` (or a graph in it) reads it."""
    for _, v in walk(graph):
        g = v.graph
        if any(i.name == old for i in g.input) or any(t.name == old for t in g.initializer):
            v.children = []  # shadowed here: not in the graphs nested in it either
            continue
        for node in g.node:
            for k, name in enumerate(node.input):
                if name == old:
                    node.input[k] = new
        for o in g.output:
            if o.name == old:
                o.name = new


class SimplifyScope:
    """Nodes, producers, consumers and constants of one graph or function body.

    ``outer`` is the enclosing scope (a subgraph reads its constants); ``base_dir`` is where
    external weights are read from when a pass needs a value (None: never read);
    ``model_file``, the model's own file name there: a tensor stored in it is an inline
    weight left unparsed (graphkit.rewrite.simplify._splice), read as an inline one is.
    """

    def __init__(self, owner: onnx.GraphProto | onnx.FunctionProto, *, outer: SimplifyScope | None = None,
                 base_dir: str | None = None, in_function: bool = False, model_file: str | None = None) -> None:
        self.owner = owner
        self.outer = outer
        self.base_dir = base_dir
        self.model_file = model_file
        self.in_function = in_function
        self.is_graph = isinstance(owner, onnx.GraphProto)
        self.nodes: list[onnx.NodeProto | None] = list(owner.node)
        if self.is_graph:
            self.inputs = [i.name for i in owner.input]
            self.outputs = [o.name for o in owner.output]
            self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in owner.initializer}
        else:
            self.inputs = list(owner.input)
            self.outputs = list(owner.output)
            self.initializers = {}
        self.output_set = frozenset(self.outputs)
        self.input_set = frozenset(self.inputs)
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        self._reads: dict[int, set[str]] = {}  # per node holding subgraphs: the outer names they read
        self._input_positions: dict[int, dict[str, list[int]]] = {}  # per node of many inputs: name -> positions
        for k, node in enumerate(self.nodes):
            for o in node.output:
                if o:
                    self.producer[o] = k
            self._add_uses(k, node)
        self.values: dict[str, np.ndarray] = {}  # values read or made by the passes
        self.placed: dict[int, list[onnx.NodeProto]] = {}  # nodes written in a removed node's place
        self.new_initializers: list[onnx.TensorProto] = []
        self.dropped_initializers: set[str] = set()
        self.changed = False

    # -- reading ---------------------------------------------------------------------------
    def _add_uses(self, k: int, node: onnx.NodeProto) -> None:
        names = [i for i in node.input if i]
        if node.attribute and any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                  for a in node.attribute):
            reads: set[str] = set()
            for sub in subgraphs(node):
                reads |= outer_reads(sub)
            self._reads[k] = reads
            names.extend(reads)
        for name in dict.fromkeys(names):
            self.consumers.setdefault(name, []).append(k)

    def live(self) -> Iterator[tuple[int, onnx.NodeProto]]:
        """(index, node) of every node not removed, in order."""
        for k, node in enumerate(self.nodes):
            if node is not None:
                yield k, node

    def used(self, name: str) -> bool:
        """Whether a node, a subgraph or the scope's outputs read ``name``."""
        return name in self.output_set or any(self.nodes[k] is not None for k in self.consumers.get(name, ()))

    def readers(self, name: str) -> list[int]:
        """The live nodes reading ``name`` (each once)."""
        return [k for k in dict.fromkeys(self.consumers.get(name, ())) if self.nodes[k] is not None]

    def defined_here(self, name: str) -> bool:
        return name in self.producer or name in self.initializers or name in self.input_set

    def is_overridable(self, name: str) -> bool:
        """An initializer that is also a graph input: a caller may feed another value."""
        return name in self.input_set

    def is_constant(self, name: str) -> bool:
        """Whether ``name`` has a constant value, told without reading it."""
        scope: SimplifyScope | None = self
        while scope is not None:
            if name in scope.values:
                return True
            if name in scope.initializers:
                return name not in scope.input_set
            k = scope.producer.get(name)
            if k is not None:
                node = scope.nodes[k]
                return node is not None and node.op_type == "Constant" and node.domain in AI_ONNX
            if name in scope.input_set:
                return False
            scope = scope.outer
        return False

    def value(self, name: str, *, limit: int | None = None) -> np.ndarray | None:
        """The constant value of ``name`` (an initializer, a Constant node's output, or a value a
        pass made), looked up in enclosing scopes too; None where it is not constant. External
        weights are read only where ``base_dir`` is set and they hold at most ``limit`` bytes."""
        scope: SimplifyScope | None = self
        while scope is not None:
            got = scope._own_value(name, limit)
            if got is not None or scope.defined_here(name):
                return got
            scope = scope.outer
        return None

    def _own_value(self, name: str, limit: int | None) -> np.ndarray | None:
        if name in self.values:
            return self.values[name]
        value = None
        tensor = self.initializers.get(name)
        if tensor is not None:
            if name in self.input_set:
                return None  # overridable: not a constant
            if tensor.data_location != _EXTERNAL:
                value = numpy_helper.to_array(tensor)
            elif (value := held_value(tensor)) is not None:
                pass  # a weight a pass made, held by the splice
            elif self.base_dir is not None and (limit is None or self.in_model_file(tensor)
                                                or _external_size(tensor) <= limit):
                try:
                    value = numpy_helper.to_array(tensor, self.base_dir)  # reads; never modifies
                except (OSError, ValueError, onnx.checker.ValidationError):
                    value = None
        elif name in self.producer:
            node = self.nodes[self.producer[name]]
            if node is not None and node.op_type == "Constant" and node.domain in AI_ONNX:
                value = constant_node_value(node)
        if value is not None:
            self.values[name] = value
        return value

    def in_model_file(self, tensor: onnx.TensorProto) -> bool:
        """Whether ``tensor`` is external data stored in the model's own file: an inline weight
        the passes see unparsed (no size limit keeps it from being read)."""
        if self.model_file is None or tensor.data_location != _EXTERNAL:
            return False
        return any(e.key == "location" and e.value == self.model_file for e in tensor.external_data)

    def raw_length(self, tensor: onnx.TensorProto) -> int:
        return int(next((e.value for e in tensor.external_data if e.key == "length"), -1))

    def raw_bytes(self, tensor: onnx.TensorProto, *, ends: int = 0) -> Any:
        """The raw bytes of a tensor stored in the model's own file (None: unreadable);
        ``ends``: only its first and last ``ends`` bytes, a pair."""
        got = held_value(tensor)
        if got is not None:
            data = memoryview(got).cast("B")
            return (bytes(data[:ends]), bytes(data[-ends:])) if ends else data
        info = {e.key: e.value for e in tensor.external_data}
        try:
            offset, length = int(info.get("offset", 0)), int(info["length"])
            with open(os.path.join(self.base_dir, self.model_file), "rb") as fh:
                if ends:
                    head = os.pread(fh.fileno(), min(ends, length), offset)
                    tail = os.pread(fh.fileno(), min(ends, length), offset + max(length - ends, 0))
                    return (head, tail) if len(head) == len(tail) == min(ends, length) else None
                fh.seek(offset)
                data = fh.read(length)
        except (OSError, KeyError, ValueError, TypeError):
            return None
        return data if len(data) == length else None

    # -- editing ---------------------------------------------------------------------------
    def remove(self, k: int) -> None:
        self.nodes[k] = None
        self.changed = True

    def replace(self, k: int, nodes: list[onnx.NodeProto]) -> None:
        """Node ``k`` becomes ``nodes`` (written in its place by commit; not indexed)."""
        self.nodes[k] = None
        if nodes:
            self.placed.setdefault(k, []).extend(nodes)
        self.changed = True

    def replace_uses(self, old: str, new: str) -> None:
        """Every reader of ``old`` (nodes, the subgraphs they hold) reads ``new`` instead.
        ``old`` must not be one of the scope's outputs."""
        readers = self.consumers.pop(old, [])
        for k in dict.fromkeys(readers):
            node = self.nodes[k]
            if node is None:
                continue
            if len(node.input) > _MANY:  # (a Sum of n values renamed n times: positions, not a scan)
                positions = self._positions(k)
                for i in positions.pop(old, ()):
                    node.input[i] = new
                    positions.setdefault(new, []).append(i)
            else:
                for i, name in enumerate(node.input):
                    if name == old:
                        node.input[i] = new
            if k in self._reads and old in self._reads[k]:
                for sub in subgraphs(node):
                    _rename_inside(sub, old, new)
                self._reads[k].discard(old)
                self._reads[k].add(new)
        self.consumers.setdefault(new, []).extend(readers)
        self.changed = True

    def _positions(self, k: int) -> dict[str, list[int]]:
        got = self._input_positions.get(k)
        if got is None:
            got = {}
            for i, name in enumerate(self.nodes[k].input):
                got.setdefault(name, []).append(i)
            self._input_positions[k] = got
        return got

    def set_input(self, k: int, i: int, name: str) -> None:
        """Node ``k`` reads ``name`` as its input ``i`` (padding absent inputs with "")."""
        node = self.nodes[k]
        while len(node.input) <= i:
            node.input.append("")
        node.input[i] = name
        self._input_positions.pop(k, None)
        self.consumers.setdefault(name, []).append(k)
        self.changed = True

    def rename_output(self, k: int, old: str, new: str) -> None:
        """Node ``k`` writes ``new`` instead of ``old``, and every reader of ``old`` reads ``new``."""
        node = self.nodes[k]
        for i, name in enumerate(node.output):
            if name == old:
                node.output[i] = new
        del self.producer[old]
        self.producer[new] = k
        self.replace_uses(old, new)

    def bypass(self, k: int, out: str, src: str) -> bool:
        """Remove node ``k``, whose output ``out`` equals its input ``src``: readers of ``out``
        read ``src``. Where ``out`` is an output of the scope, the node making ``src`` writes
        ``out`` instead; False (nothing done) where that cannot be done without changing an
        input's or output's name."""
        if out not in self.output_set:
            self.remove(k)
            self.replace_uses(out, src)
            return True
        maker = self.producer.get(src)
        if maker is None or src in self.output_set or self.nodes[maker] is None:
            return False  # a graph input, an initializer, an outer value or another output
        self.remove(k)
        self.rename_output(maker, src, out)
        return True

    def add_constant(self, name: str, value: np.ndarray, *, like: onnx.NodeProto | None = None) -> onnx.NodeProto | None:
        """Make ``name`` a constant: an initializer in a graph, a Constant node in a function
        body or where ``name`` is an output of the scope (returned: the caller places it)."""
        self.values[name] = value
        value = value if value.flags.c_contiguous else value.copy(order="C")  # (np.ascontiguousarray makes 0-d 1-d)
        if self.is_graph and name not in self.output_set:
            tensor = self.owner.initializer.add()  # (made where it stays: a large weight is not copied again)
            weights = held()
            if weights is None or not weights.hold(tensor, value, name):
                _fill_tensor(tensor, value, name)
            self.new_initializers.append(tensor)
            self.initializers[name] = tensor
            self.producer.pop(name, None)
            return None
        node = helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value),
                                name=(like.name + "_folded") if like is not None and like.name else "")
        return node

    def commit(self) -> bool:
        """Write the edited node list (and initializers) back; whether anything changed."""
        if not self.changed and not self.new_initializers and not self.dropped_initializers:
            return False
        owner = self.owner
        if self.placed:
            kept = []
            for k, n in enumerate(self.nodes):
                kept.extend(self.placed.get(k, ()))
                if n is not None:
                    kept.append(n)
        else:
            kept = [n for n in self.nodes if n is not None]
        del owner.node[:]
        owner.node.extend(kept)
        if self.is_graph and self.dropped_initializers:  # (new ones are in place: add_constant made them there)
            drop = self.dropped_initializers  # deleted where they are: the others' bytes are never copied
            for i in [i for i, t in enumerate(owner.initializer) if t.name in drop][::-1]:
                del owner.initializer[i]
        return True


def _fill_tensor(tensor: onnx.TensorProto, value: np.ndarray, name: str) -> None:
    """``tensor`` becomes ``numpy_helper.from_array(value, name)``, a plain numeric type's
    bytes copied once (not into a tensor first and then into the graph)."""
    if plain(value):
        tensor.dims.extend(value.shape)
        tensor.name = name
        tensor.data_type = PLAIN_TYPES[value.dtype.type]
        tensor.raw_data = value.tobytes()
    else:
        tensor.CopyFrom(numpy_helper.from_array(value, name))


def _external_size(tensor: onnx.TensorProto) -> int:
    for entry in tensor.external_data:
        if entry.key == "length":
            try:
                return int(entry.value)
            except ValueError:
                break
    count = int(np.prod([int(d) for d in tensor.dims], dtype=np.int64)) if tensor.dims else 1
    return count * max(helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize, 1)


def scopes_of(model: onnx.ModelProto, base_dir: str | None, model_file: str | None = None) -> list[SimplifyScope]:
    """A SimplifyScope per graph, subgraph and function body, each graph before the graphs in it
    (``model_file``: the model's file name in ``base_dir``, SimplifyScope's)."""
    out: list[SimplifyScope] = []
    for _, v in walk(model):
        if v.graph is None:  # a function's own body
            v.data = SimplifyScope(v.function, base_dir=None, in_function=True)
        else:
            v.data = SimplifyScope(v.graph, outer=None if v.parent is None else v.parent.data, base_dir=base_dir,
                           in_function=v.function is not None, model_file=model_file)
        out.append(v.data)
    return out


def base_dir_of(path: str | None) -> str | None:
    return os.path.dirname(os.path.abspath(path)) if path else None


def attribute_key(node: onnx.NodeProto) -> Any:
    """The node's attributes as a hashable key (serialized, name order)."""
    return tuple(sorted((a.name, a.SerializeToString()) for a in node.attribute))
