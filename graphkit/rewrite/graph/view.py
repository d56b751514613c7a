"""A light index over one scope's node list: producers, consumers, constants."""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from graphkit.rewrite.graph.held import held_value
from graphkit.rewrite.graph.walk import outer_reads, subgraphs

__all__ = ["GraphView", "constant_node_value"]


class GraphView:
    """Producers and consumers of the tensors of one node list (a graph or function body).

    Built once per rule and round (one pass over the nodes): matching then looks up
    producers, consumers and nodes by op type instead of scanning. ``protected`` names
    (graph outputs) must keep their producers.
    """

    def __init__(self, nodes: Any, *, protected: set[str] = frozenset(),
                 initializers: Any = (), base_dir: str | None = None, ops: list[str] | None = None) -> None:
        """``ops``: the nodes' op types (interned), where the caller has read them (the view
        keeps the list and updates it: see restamp)."""
        # The node list itself, not a list of its nodes: a Python object per node (about 230
        # bytes each) held for the whole rule would be the rewrite's biggest cost in memory.
        self.nodes = nodes
        self.base_dir = base_dir  # where external data lives (None: external tensors are not read)
        self.protected = set(protected)
        by_op: dict[str, list[int]] = {}
        # Op types interned (each read of a field is a new str); the other fields are copied
        # on first use (_index_fields): a single-node rule reads only its candidates' nodes.
        intern = sys.intern
        if ops is None or len(ops) != len(nodes):
            ops = [intern(node.op_type) for node in self.nodes]
        self.ops: list[str] = ops
        for i, op in enumerate(self.ops):
            if op in by_op:
                by_op[op].append(i)
            else:
                by_op[op] = [i]
        self.by_op = by_op
        self._consumers: dict[str, list[int]] | None = None  # built on first use (many rules never ask)
        self._outer_used: set[str] = set()
        self._initializers = {t.name: t for t in initializers}
        self._const_cache: dict[str, np.ndarray | None] = {}
        self._equal_index: dict[tuple[int, ...], dict[Any, list[str]]] = {}

    def __getattr__(self, name: str) -> Any:
        """``domains``, ``inputs``, ``outputs`` and ``producer``, made on first use."""
        if name in ("domains", "inputs", "outputs", "producer"):
            self._index_fields()
            return self.__dict__[name]
        raise AttributeError(name)

    def _index_fields(self) -> None:
        """Plain-Python copies of each node's fields (matching reads them many times) and the
        producer of each tensor. Domains interned; one str per tensor name (its producer's
        and its consumers' reads share it), not one per read."""
        intern = sys.intern
        same = {}.setdefault
        producer: dict[str, int] = {}
        domains: list[str] = []
        inputs: list[tuple[str, ...]] = []
        outputs: list[tuple[str, ...]] = []
        for i, node in enumerate(self.nodes):
            read = node.output[:]
            outs = tuple(map(same, read, read))
            domains.append(intern(node.domain))
            read = node.input[:]
            inputs.append(tuple(map(same, read, read)))
            outputs.append(outs)
            for name in outs:
                producer[name] = i
        producer.pop("", None)
        self.domains, self.inputs, self.outputs, self.producer = domains, inputs, outputs, producer

    def restamp(self, indices: list[int], ops: list[str]) -> bool:
        """The nodes at ``indices`` were overwritten in place, now of the op types ``ops``:
        update the op index and keep this view, if nothing read from the nodes' other fields
        is held yet (else False: build a new view)."""
        if "inputs" in self.__dict__ or self._consumers is not None or self._const_cache:
            return False
        old, by_op = self.ops, self.by_op
        gone: dict[str, list[int]] = {}
        for index in indices:
            gone.setdefault(old[index], []).append(index)
        for op, at in gone.items():
            if len(at) == len(by_op[op]):
                del by_op[op]
            else:
                drop = set(at)
                by_op[op] = [i for i in by_op[op] if i not in drop]
        intern = sys.intern
        added: set[str] = set()
        for index, op in zip(indices, ops):
            op = intern(op)
            added.add(op)
            old[index] = op
            if op in by_op:
                by_op[op].append(index)
            else:
                by_op[op] = [index]
        for op in added:
            if len(by_op[op]) > 1:
                by_op[op].sort()
        return True

    def node_inputs(self, index: int) -> tuple[str, ...]:
        """The inputs of node ``index`` (from the copies where they were made, else the node)."""
        inputs = self.__dict__.get("inputs")
        return inputs[index] if inputs is not None else tuple(self.nodes[index].input)

    @property
    def consumers(self) -> dict[str, list[int]]:
        """Tensor name -> indices of the nodes reading it (subgraphs' reads of outer names included)."""
        if self._consumers is None:
            self._index_consumers()
        return self._consumers

    @property
    def outer_used(self) -> set[str]:
        """Names read from inside a subgraph of some node."""
        if self._consumers is None:
            self._index_consumers()
        return self._outer_used

    def _index_consumers(self) -> None:
        consumers: dict[str, list[int]] = {}
        outer_used = self._outer_used
        for i, (ins, node) in enumerate(zip(self.inputs, self.nodes)):
            for name in ins:
                if name in consumers:
                    consumers[name].append(i)
                else:
                    consumers[name] = [i]
            if node.attribute:
                for g in subgraphs(node):  # outer-scope uses from subgraphs count as consumers
                    for name in outer_reads(g):
                        consumers.setdefault(name, []).append(i)
                        outer_used.add(name)
        consumers.pop("", None)
        self._consumers = consumers

    def constant_value(self, name: str) -> np.ndarray | None:
        """The value of ``name`` if it is an initializer or a Constant node's output."""
        if name in self._const_cache:
            return self._const_cache[name]
        value = None
        if name in self._initializers:
            tensor = self._initializers[name]
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                value = numpy_helper.to_array(tensor)
            elif (value := held_value(tensor)) is not None:
                pass  # a weight a simplify pass made, held by the splice
            elif self.base_dir is not None:
                try:
                    value = numpy_helper.to_array(tensor, self.base_dir)  # reads, never modifies
                except (OSError, ValueError, onnx.checker.ValidationError):
                    value = None  # unreadable, or outside the model's folder: not a known constant
        elif name in self.producer:
            node = self.nodes[self.producer[name]]
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                value = constant_node_value(node)
        self._const_cache[name] = value
        return value

    def equal_constants(self, name: str) -> list[str]:
        """The constants of this scope (initializers, Constant outputs) that may equal ``name``'s
        value, ``name`` among them: same shape and same values as float64, a superset of those
        np.array_equal accepts (the caller compares). Indexed once per shape; [] for a non-constant."""
        value = self.constant_value(name)
        if value is None:
            return []
        index = self._equal_index.get(value.shape)
        if index is None:
            index = self._equal_index[value.shape] = self._index_constants(value.shape)
        return index.get(_value_key(value), [])

    def _index_constants(self, shape: tuple[int, ...]) -> dict[Any, list[str]]:
        """Value key -> the constants of ``shape``, found by their declared dims (a weight of
        another shape is never decoded)."""
        names = [n for n, t in self._initializers.items() if tuple(t.dims) == shape]
        for i in self.by_op.get("Constant", ()):
            node = self.nodes[i]
            if node.output and not any(a.name == "value" and tuple(a.t.dims) != shape for a in node.attribute):
                names.append(node.output[0])
        index: dict[Any, list[str]] = {}
        for n in names:
            value = self.constant_value(n)
            if value is not None and value.shape == shape:
                index.setdefault(_value_key(value), []).append(n)
        return index

    def other_uses(self, name: str, node_index: int) -> bool:
        """Is ``name`` used by anything other than node ``node_index`` (or a graph output)?"""
        if name in self.protected:
            return True
        return any(i != node_index for i in self.consumers.get(name, ()))


def _value_key(value: np.ndarray) -> Any:
    """Equal for any two values np.array_equal calls equal (of one shape): their elements as
    float64, -0.0 as 0.0, digested; values that are no numbers share one key (None)."""
    if value.dtype.kind == "c":
        if np.any(value.imag):
            return None  # equal to no real value; complex ones are compared by the caller
        value = value.real
    try:
        flat = np.asarray(value, dtype=np.float64) + 0.0
    except (TypeError, ValueError):
        return None
    return hashlib.blake2b(flat.tobytes(), digest_size=16).digest()


def constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a Constant node, typed as ONNX types it (``value_float`` is float32,
    ``value_int`` int64); None for sparse, external or attribute-reference values."""
    for attr in node.attribute:
        if attr.ref_attr_name:
            return None
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            if attr.t.data_location == onnx.TensorProto.EXTERNAL:
                return None
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
    return None
