"""Builder: how decompositions add standard ONNX nodes to a graph."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphkit.errors import RewriteError

__all__ = ["Builder", "NameGenerator", "TypeTable"]


class NameGenerator:
    """Unique node and tensor names that clash with nothing already in the model."""

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self._taken = set(taken)

    def reserve(self, name: str) -> None:
        self._taken.add(name)

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self._taken:
            name = f"{base}_{i}"
            i += 1
        self._taken.add(name)
        return name


class TypeTable:
    """Element types and shapes of the model's tensors, as far as inference knows them."""

    def __init__(self, types: Mapping[str, onnx.TypeProto] | None = None) -> None:
        self._types: dict[str, onnx.TypeProto] = dict(types or {})

    def set(self, name: str, tp: onnx.TypeProto) -> None:
        self._types[name] = tp

    def elem_type(self, name: str) -> int | None:
        tp = self._types.get(name)
        if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.elem_type:
            return None
        return tp.tensor_type.elem_type

    def shape(self, name: str) -> list[Any] | None:
        tp = self._types.get(name)
        if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tp.tensor_type.shape.dim]


class Builder:
    """Collects the nodes that replace one node.

    ``op`` adds a node and returns its output name(s); ``constant`` adds a typed
    constant; ``dtype``/``shape`` read what type inference knows about a tensor.
    """

    def __init__(self, *, opset: int, prefix: str, names: NameGenerator, types: TypeTable,
                 node_name: str = "", op_name: str = "") -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self._prefix = prefix
        self._names = names
        self._types = types
        self._node_name = node_name
        self._op_name = op_name

    def op(self, op_type: str, *inputs: str, domain: str = "", outputs: int = 1,
           **attrs: Any) -> Any:
        """Add ``op_type(*inputs, **attrs)``; returns one name, or a tuple if ``outputs > 1``."""
        node_name = self._names.fresh(f"{self._prefix}/{op_type}")
        out_names = [self._names.fresh(f"{node_name}_out{i}" if outputs > 1 else f"{node_name}_out")
                     for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), out_names, name=node_name,
                                           domain=domain, **attrs))
        return out_names[0] if outputs == 1 else tuple(out_names)

    def constant(self, value: Any, *, dtype: int) -> str:
        """A Constant node holding ``value`` with ONNX element type ``dtype``."""
        array = np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(dtype))
        name = self._names.fresh(f"{self._prefix}/const")
        tensor = numpy_helper.from_array(array, name=name)
        self.nodes.append(helper.make_node("Constant", [], [name], name=name, value=tensor))
        return name

    def dtype(self, name: str) -> int:
        """The ONNX element type of tensor ``name``; RewriteError when unknown."""
        elem = self._types.elem_type(name)
        if elem is None:
            raise RewriteError(
                f"element type of input '{name}' is unknown", node=self._node_name, op=self._op_name,
                hint="give the model's inputs a type or make sure shape inference reaches this node")
        return elem

    def shape(self, name: str) -> list[Any] | None:
        return self._types.shape(name)

    def __getattr__(self, op_type: str) -> Any:
        """``b.Mul(x, y)`` is ``b.op("Mul", x, y)``; ``_domain=``/``_outputs=`` as in op()."""
        if op_type.startswith("_"):
            raise AttributeError(op_type)

        def make(*inputs: str, _domain: str = "", _outputs: int = 1, **attrs: Any) -> Any:
            return self.op(op_type, *inputs, domain=_domain, outputs=_outputs, **attrs)

        return make

    def finish(self, results: list[str], outputs: list[str]) -> list[onnx.NodeProto]:
        """The built nodes, renamed so that ``results[i]`` is produced as ``outputs[i]``."""
        if len(results) < len([o for o in outputs if o]):
            raise RewriteError(f"replacement returned {len(results)} outputs for {len(outputs)}",
                               node=self._node_name, op=self._op_name,
                               hint="return one tensor per output of the replaced node")
        nodes = self.nodes
        produced = {o for n in nodes for o in n.output}
        rename: dict[str, str] = {}
        for new, orig in zip(results, outputs):
            if not orig:
                continue
            if new in produced and new not in rename:
                rename[new] = orig
            else:  # the result is an input, or already stands for another output
                nodes.append(helper.make_node("Identity", [rename.get(new, new)], [orig],
                                              name=self._names.fresh(f"{self._prefix}/Identity")))
        for n in nodes:
            for i, name in enumerate(n.input):
                if name in rename:
                    n.input[i] = rename[name]
            for i, name in enumerate(n.output):
                if name in rename:
                    n.output[i] = rename[name]
        return nodes
