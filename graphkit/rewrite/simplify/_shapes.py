"""Tensor types and shapes for the simplify passes: ONNX shape inference, with every custom
op's shape function (its OpDef's ``infer_shapes``) known, run on a copy of the model without
its large weights.

A dim is an int, a symbol (str: the model's dim_param, the "unk__N" ONNX inference gives a
dim it cannot tell, or a name made here for a dim with no name at all) or None. Two dims with
the same symbol are equal: dim_params are the model's own statement that two dims agree, as
ONNX Runtime and every simplifier read them, and inference copies an unk__ name with its dim;
a dim with no name gets a symbol of its own tensor and axis.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from graphkit.ops import OpRegistry

__all__ = ["Types", "infer_types", "skeleton"]

Dim = "int | str | None"
_SMALL = 1024  # initializers up to this many bytes stay for inference (shape inputs); larger ones become inputs


class Types:
    """name -> (elem type, dims or None) over the whole model (names are unique across scopes)."""

    def __init__(self, table: dict[str, tuple[int, list[Any] | None]]) -> None:
        self._table = table

    def elem(self, name: str) -> int | None:
        got = self._table.get(name)
        return None if got is None or not got[0] else got[0]

    def dims(self, name: str) -> list[Any] | None:
        got = self._table.get(name)
        return None if got is None else got[1]

    def static(self, name: str) -> list[int] | None:
        dims = self.dims(name)
        return dims if dims is not None and all(isinstance(d, int) for d in dims) else None


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without its large initializers (typed graph inputs instead) nor functions' docs."""
    g = model.graph
    small, large = [], []
    for t in g.initializer:
        count = 1
        for d in t.dims:
            count *= d
        # (from the dims: reading raw_data would copy the bytes of every weight)
        (large if t.data_location == onnx.TensorProto.EXTERNAL or count * 8 > _SMALL else small).append(t)
    graph = onnx.GraphProto(name=g.name)
    graph.node.extend(g.node)
    graph.input.extend(g.input)
    declared = {i.name for i in g.input}
    graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
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


def _dims(tt: onnx.TypeProto.Tensor, name: str) -> list[Any] | None:
    if not tt.HasField("shape"):
        return None
    dims: list[Any] = []
    for axis, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            # (inference names a dim it cannot tell "unk__N" when it makes it, and copies that
            # name wherever the dim goes: within one inference, one name is one dim)
            dims.append(d.dim_param)
        else:
            dims.append(f"?{name}#{axis}")  # unknown: equal only to itself
    return dims


def infer_types(model: onnx.ModelProto, registry: OpRegistry) -> Types:
    """Types and shapes of every value of ``model`` that inference can tell (best effort:
    where inference fails, only what the model declares)."""
    skeleton_model = skeleton(model)
    try:
        with registry.onnx_schemas():
            inferred = onnx.shape_inference.infer_shapes(skeleton_model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is an aid here: fall back to what is declared
        inferred = skeleton_model
    table: dict[str, tuple[int, list[Any] | None]] = {}
    stack = [inferred.graph]
    while stack:
        g = stack.pop()
        for vi in (*g.input, *g.output, *g.value_info):
            if vi.type.HasField("tensor_type"):
                tt = vi.type.tensor_type
                table[vi.name] = (tt.elem_type, _dims(tt, vi.name))
        for t in g.initializer:
            table[t.name] = (t.data_type, [int(d) for d in t.dims])
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(a.graphs)
    for t in model.graph.initializer:
        table[t.name] = (t.data_type, [int(d) for d in t.dims])
    return Types(table)
