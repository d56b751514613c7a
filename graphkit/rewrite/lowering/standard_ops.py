"""Standard ONNX nodes that are graphkit ops (``OpDef.standard_ops``): ai.onnx DeformConv is
deform_conv2d. The lowering plan treats them as the op's placeholders; here is how one
becomes a placeholder node (attributes mapped by the op's own StandardOp)."""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from graphkit.errors import RewriteError
from graphkit.ops import OpDef, OpRegistry, StandardOp
from graphkit.rewrite.graph.walk import scopes

__all__ = ["as_placeholder", "label", "recognise"]


def label(op: OpDef, std: StandardOp) -> str:
    """How the report names nodes of ``std`` lowered as ``op``: 'DeformConv as custom::deform_conv2d'."""
    return f"{std} as {op.qualified_name}"


def attribute_values(node: onnx.NodeProto, where: dict[str, Any]) -> dict[str, Any]:
    """The node's attributes as Python values; RewriteError (at ``where``) for a malformed one."""
    values: dict[str, Any] = {}
    for a in node.attribute:
        try:
            values[a.name] = helper.get_attribute_value(a)
        except (ValueError, TypeError) as exc:
            raise RewriteError(f"attribute '{a.name}' is malformed: {exc}", hint="re-export the model",
                               **where) from exc
    return values


def as_placeholder(node: onnx.NodeProto, op: OpDef, std: StandardOp, path: str | None) -> onnx.NodeProto:
    """The placeholder node ``op`` has for the standard node ``node`` (same name, inputs in
    the op's order, same outputs); RewriteError where its attributes have no equivalent."""
    where = dict(path=path, node=node.name or "<unnamed>", op=f"{node.domain or 'ai.onnx'}::{node.op_type}")
    given = attribute_values(node, where)
    try:
        attrs = dict(std.to_op(given))
    except (ValueError, TypeError, KeyError) as exc:
        raise RewriteError(f"{std} node has no {op.qualified_name} equivalent: {exc}",
                           hint=f"keep it as {std} (opset {std.since_opset} or later, default lowering)",
                           **where) from exc
    inputs = list(node.input)
    if std.inputs is not None:
        inputs = [inputs[i] if i < len(inputs) else "" for i in std.inputs]
        while inputs and not inputs[-1]:
            inputs.pop()
    placeholder = onnx.NodeProto(op_type=op.name, domain=op.domain, name=node.name, input=inputs,
                                 output=node.output)
    for name, value in attrs.items():
        if name not in {a.name for a in op.attributes}:
            raise RewriteError(f"{std}'s mapping gives attribute '{name}', which {op.qualified_name} lacks",
                               hint=f"fix the StandardOp of {op.qualified_name}", **where)
        attr_type = getattr(onnx.AttributeProto, op.attr(name).type.onnx_name)
        placeholder.attribute.append(helper.make_attribute(name, value, attr_type=attr_type))
    return placeholder


def recognise(model: onnx.ModelProto, registry: OpRegistry, path: str | None,
              target_opset: int | None = None) -> dict[str, int]:
    """Turn every standard node an op of ``registry`` computes into that op's placeholder, in
    every scope, in place; returns how many per label. A node the op cannot express (e.g.
    asymmetric pads) stays as it is where ``target_opset`` still has the standard op."""
    made: dict[str, int] = {}
    types = registry.standard_op_types()
    for nodes, _, _ in scopes(model):
        for i, node in enumerate(nodes):
            if (node.domain, node.op_type) not in types:
                continue
            op, std = registry.standard_op(node.domain, node.op_type)
            try:
                placeholder = as_placeholder(node, op, std, path)
            except RewriteError:
                if target_opset is not None and target_opset >= std.since_opset:
                    continue  # valid as it is at the target: the version converter keeps it
                raise
            nodes[i].CopyFrom(placeholder)
            made[label(op, std)] = made.get(label(op, std), 0) + 1
    return made
