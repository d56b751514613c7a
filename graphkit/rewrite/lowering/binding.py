"""Binding custom:: placeholders to kernels: the one place a bound node is made.

- :func:`bind_node` is the rewrite's binding (``--bind native`` / ``--bind python``): the
  node moves to its kernel domain with every attribute written out (a Python kernel's in
  its kernel encoding, graphkit.ops._encoding), and, for a Python kernel, each omitted
  optional input becomes an empty tensor (onnxruntime-extensions passes every input).
- :func:`bind_python_nodes` is the same binding for a model's graphkit.python nodes that
  are not ready to run: attributes brought to the kernel encoding (defaults filled in,
  natural encodings accepted) and float16 nodes pointed at their float32 declaration with
  exact Casts around them. ``open_session`` runs it on its own copy of the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from graphkit.errors import GraphkitError, KernelError
from graphkit.ops import AttrType, OpDef, OpRegistry
from graphkit.ops._encoding import F16_TAG, decode_kernel_attr, encode_kernel_attr, encode_kernel_attrs, kernel_attr_type
from graphkit.ops.tensor_types import type_string
from graphkit.rewrite.graph.walk import ModelIndex
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.lowering.builder import Builder, NameGenerator

__all__ = ["PythonNode", "bind_node", "bind_python_nodes", "kernel_attribute"]

_F16 = type_string(onnx.TensorProto.FLOAT16)


def kernel_attribute(op: OpDef, name: str, value: Any, *, python: bool) -> onnx.AttributeProto:
    """Attribute ``name`` of a bound node: of the declared type (an empty list has no type
    of its own), in the kernel encoding for a Python kernel (``value`` already encoded)."""
    attr_type = op.attr(name).type
    if python:
        attr_type = kernel_attr_type(attr_type)
    return helper.make_attribute(name, value, attr_type=getattr(onnx.AttributeProto, attr_type.onnx_name))


def bind_node(op: OpDef, node: onnx.NodeProto, attrs: Mapping[str, Any], kind: str, *, domain: str,
              types: TypeTable, make_builder: Callable[[], Builder],
              fail: Callable[[str], Exception]) -> list[onnx.NodeProto]:
    """``node`` bound to its ``kind`` ("native" or "python") kernel in ``domain``, with
    ``attrs`` (resolved, defaults in) written out; nodes it needs go first.

    ``make_builder()`` makes the constants of omitted optional inputs (Python kernels);
    ``fail(message)`` is the error for an input whose element type cannot be told.
    """
    python = kind == "python"
    values = encode_kernel_attrs(op, attrs) if python else attrs
    bound = onnx.NodeProto()
    bound.CopyFrom(node)
    bound.domain = domain
    del bound.attribute[:]
    # Every attribute is written out: kernels read them without knowing defaults.
    bound.attribute.extend(kernel_attribute(op, k, v, python=python) for k, v in values.items())
    extra = _empty_optional_inputs(op, bound, types, make_builder, fail) if python else []
    return [*extra, bound]


def _empty_optional_inputs(op: OpDef, node: onnx.NodeProto, types: TypeTable, make_builder: Callable[[], Builder],
                           fail: Callable[[str], Exception]) -> list[onnx.NodeProto]:
    """onnxruntime-extensions needs every input: an omitted optional one becomes an empty
    tensor, which Python kernels read as absent."""
    missing = [k for k, p in enumerate(op.inputs) if p.optional and (k >= len(node.input) or not node.input[k])]
    if not missing:
        return []
    bound_types = {p.type: types.elem_type(name) for p, name in zip(op.inputs, node.input) if name}
    builder = make_builder()
    while len(node.input) < len(op.inputs):
        node.input.append("")
    for k in missing:
        elem = bound_types.get(op.inputs[k].type)
        if elem is None:
            raise fail(f"cannot tell the element type of omitted input '{op.inputs[k].name}'")
        node.input[k] = builder.constant(np.zeros((0,), helper.tensor_dtype_to_np_dtype(elem)), dtype=elem)
    return builder.nodes


@dataclass
class PythonNode:
    """A graphkit.python node and where it lives.

    ``graph`` is None inside a model-local function; ``index`` is the node's position in
    ``graph.node`` and ``depth`` the graph's nesting depth (0 for the main graph).
    """

    node: onnx.NodeProto
    graph: onnx.GraphProto | None
    index: int
    depth: int
    display: str


def _given_attrs(op: OpDef, node: onnx.NodeProto) -> dict[str, Any]:
    """The node's attributes as Python values, accepting the kernel and the natural encodings."""
    from onnx import AttributeProto

    given: dict[str, Any] = {}
    for a in node.attribute:
        decl = op._attr_index.get(a.name)
        if decl is None:
            given[a.name] = None  # resolve_attrs names it as unknown
            continue
        if a.type == AttributeProto.STRING and decl.type is not AttrType.STRING:
            given[a.name] = decode_kernel_attr(a.s, decl.type)
        elif a.type == AttributeProto.STRING:
            given[a.name] = a.s.decode()
        else:
            if decl.type is AttrType.FLOAT and a.type == AttributeProto.INT:
                raise TypeError(f"attribute '{a.name}' is an INT, expected FLOAT")
            value = helper.get_attribute_value(a)
            given[a.name] = list(value) if isinstance(value, (list, tuple)) else value
    return given


def _resolve_node_attrs(op: OpDef, ref: PythonNode) -> dict[str, Any]:
    try:
        return op.resolve_attrs(_given_attrs(op, ref.node), where=ref.display)
    except GraphkitError as exc:
        raise KernelError(exc.message, node=ref.display, op=f"{ref.node.domain}::{op.name}",
                          hint=exc.hint) from exc
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise KernelError(f"bad attribute: {exc}", node=ref.display, op=f"{ref.node.domain}::{op.name}",
                          hint="re-run `graphkit rewrite --bind python` on the original model") from exc


def _set_attrs(node: onnx.NodeProto, op: OpDef, values: Mapping[str, Any], *, kernel: bool) -> None:
    del node.attribute[:]
    for a in op.attributes:
        if kernel:
            node.attribute.append(helper.make_attribute(a.name, encode_kernel_attr(values[a.name], a.type)))
        else:
            node.attribute.append(kernel_attribute(op, a.name, values[a.name], python=False))


def _f16_vars(op: OpDef, node: onnx.NodeProto, types: TypeTable) -> list[str]:
    bound: dict[str, int] = {}
    for p, name in zip(op.inputs, node.input):
        if name and (elem := types.elem_type(name)) is not None:
            bound.setdefault(p.type, elem)
    return sorted(v for v, t in bound.items() if t == onnx.TensorProto.FLOAT16)


def _wrap_f16(node: onnx.NodeProto, op: OpDef, f16: list[str], names: NameGenerator) -> tuple[list, list]:
    """Point a float16 node at its float32 declaration; return the Casts to put around it."""
    fresh = names.fresh

    tag = node.name or node.output[0]
    before, after = [], []
    for i, p in enumerate(op.inputs):
        if i < len(node.input) and node.input[i] and p.type in f16:
            cast_out = fresh(f"{node.input[i]}/graphkit_f32")
            before.append(helper.make_node("Cast", [node.input[i]], [cast_out], to=onnx.TensorProto.FLOAT,
                                           name=fresh(f"{tag}/graphkit_cast_in{i}")))
            node.input[i] = cast_out
    for i, p in enumerate(op.outputs):
        if i < len(node.output) and node.output[i] and p.type in f16:
            raw = fresh(f"{node.output[i]}/graphkit_f32")
            after.append(helper.make_node("Cast", [raw], [node.output[i]], to=onnx.TensorProto.FLOAT16,
                                          name=fresh(f"{tag}/graphkit_cast_out{i}")))
            node.output[i] = raw
    node.op_type = f"{op.name}{F16_TAG}{'+'.join(f16)}"
    return before, after


def bind_python_nodes(model: onnx.ModelProto, registry: OpRegistry,
                      nodes: Sequence[PythonNode]) -> bool:
    """Make ``model``'s graphkit.python nodes runnable by the declared kernels, in place.

    Attributes are brought to the kernel encoding (defaults filled in, FLOAT/INTS/FLOATS as
    strings) and float16 nodes (element types from ONNX shape inference, in the node's own
    scope: sibling If/Loop bodies may type one name differently) are pointed at their
    float32 declaration with exact Casts around them. Returns whether the model changed.
    Raises KernelError for a node whose attributes are wrong.
    """
    changed = False
    resolved = []
    wants_types = False
    for ref in nodes:
        op = registry.lookup(ref.node.domain, ref.node.op_type)
        assert op is not None
        values = _resolve_node_attrs(op, ref)
        original = [a.SerializeToString() for a in ref.node.attribute]
        resolved.append((ref, op, values, original))
        if ref.graph is not None and any(_F16 in op.type_constraints[p.type] for p in op.inputs):
            wants_types = True
    types: TypeTable | None = None
    if wants_types:
        # Shape inference wants the attributes in their ONNX types.
        for ref, op, values, _ in resolved:
            _set_attrs(ref.node, op, values, kernel=False)
        types = TypeTable.inferred(model, registry)
    for ref, op, values, original in resolved:
        _set_attrs(ref.node, op, values, kernel=True)
        if [a.SerializeToString() for a in ref.node.attribute] != original:
            changed = True
    # Wrap float16 nodes; rebuild the deepest graphs first (rebuilding copies the nodes).
    wraps: dict[int, tuple[onnx.GraphProto, int, dict[int, tuple[list, list]]]] = {}
    names: NameGenerator | None = None
    for ref, op, _, _ in resolved:
        if ref.graph is None:
            continue
        f16 = _f16_vars(op, ref.node, types.scope(ref.graph, missing_ok=True)) if types is not None else []
        if f16:
            names = NameGenerator(ModelIndex(model).names) if names is None else names
            entry = wraps.setdefault(id(ref.graph), (ref.graph, ref.depth, {}))
            entry[2][ref.index] = _wrap_f16(ref.node, op, f16, names)
    for graph, _, around in sorted(wraps.values(), key=lambda w: -w[1]):
        new = []
        for i, n in enumerate(graph.node):
            before, after = around.get(i, ((), ()))
            new.extend(before)
            new.append(n)
            new.extend(after)
        del graph.node[:]
        graph.node.extend(new)
        changed = True
    return changed
