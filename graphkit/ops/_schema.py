"""ONNX OpSchemas derived from op definitions, with type and shape inference."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import onnx
import onnx.defs
from onnx import helper

from graphkit.ops.tensor_types import elem_type

if TYPE_CHECKING:
    from graphkit.ops._opdef import OpDef

_ATTR_TYPES = {
    "INT": onnx.defs.OpSchema.AttrType.INT,
    "FLOAT": onnx.defs.OpSchema.AttrType.FLOAT,
    "STRING": onnx.defs.OpSchema.AttrType.STRING,
    "INTS": onnx.defs.OpSchema.AttrType.INTS,
    "FLOATS": onnx.defs.OpSchema.AttrType.FLOATS,
}


def _shape_of(tp: onnx.TypeProto) -> list[Any] | None:
    if not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    dims: list[Any] = []
    for d in tp.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


def _attr_value(attr: onnx.AttributeProto | None) -> Any:
    return None if attr is None else helper.get_attribute_value(attr)


def _make_inference(op: "OpDef", kernel_encoded: bool):
    from graphkit.ops._encoding import decode_kernel_attr, kernel_attr_type

    def infer(ctx) -> None:
        types = []
        for i in range(ctx.get_num_inputs()):
            types.append(ctx.get_input_type(i) if ctx.has_input(i) else None)
        # Element type of each type variable: taken from the first input that binds it.
        bound: dict[str, int] = {}
        for p, tp in zip(op.inputs, types):
            if tp is not None and tp.HasField("tensor_type") and tp.tensor_type.elem_type:
                elem = tp.tensor_type.elem_type
                if bound.setdefault(p.type, elem) != elem:
                    raise onnx.shape_inference.InferenceError(
                        f"[{op.qualified_name}] inputs bound to type {p.type} have different "
                        f"element types ({bound[p.type]} vs {elem})")
        given = {}
        for a in op.attributes:
            value = _attr_value(ctx.get_attribute(a.name))
            if value is not None and kernel_encoded and kernel_attr_type(a.type) is not a.type:
                value = decode_kernel_attr(value, a.type)
            if value is not None:
                given[a.name] = value
        attrs = {a.name: given.get(a.name, None if a.required else a.default) for a in op.attributes}
        shapes = [None if tp is None else _shape_of(tp) for tp in types]
        if kernel_encoded:  # an empty tensor stands for an omitted optional input (see the engine)
            shapes = [None if p.optional and s == [0] else s for p, s in zip(op.inputs, shapes)]
        try:
            out_shapes = op.infer_shapes(shapes, attrs)
        except ValueError as exc:
            raise onnx.shape_inference.InferenceError(f"[{op.qualified_name}] {exc}") from exc
        for i, p in enumerate(op.outputs[: ctx.get_num_outputs()]):
            elem = bound.get(p.type)
            allowed = op.type_constraints[p.type]
            if elem is None and len(allowed) == 1:
                elem = elem_type(allowed[0])
            if elem is None:
                continue
            shape = out_shapes[i] if i < len(out_shapes) else None
            ctx.set_output_type(i, helper.make_tensor_type_proto(elem, shape))

    return infer


def build_schema(op: "OpDef", domain: str) -> onnx.defs.OpSchema:
    fp = onnx.defs.OpSchema.FormalParameter
    opt = onnx.defs.OpSchema.FormalParameterOption
    inputs = [fp(p.name, p.type, p.doc, param_option=opt.Optional if p.optional else opt.Single)
              for p in op.inputs]
    outputs = [fp(p.name, p.type, p.doc, param_option=opt.Optional if p.optional else opt.Single)
               for p in op.outputs]
    from graphkit.ops._encoding import encode_kernel_attr, kernel_attr_type
    from graphkit.ops._opdef import split_kernel_domain

    kind = split_kernel_domain(domain)
    kernel_encoded = kind is not None and kind[0] == "python"  # see graphkit/ops/_encoding.py
    attributes = []
    for a in op.attributes:
        attr_type = kernel_attr_type(a.type) if kernel_encoded else a.type
        if a.required:
            attributes.append(onnx.defs.OpSchema.Attribute(a.name, _ATTR_TYPES[attr_type.onnx_name], a.doc))
        else:
            default = encode_kernel_attr(a.default, a.type) if kernel_encoded else a.default
            proto = helper.make_attribute(a.name, default, attr_type=getattr(
                onnx.AttributeProto, attr_type.onnx_name))
            attributes.append(onnx.defs.OpSchema.Attribute(a.name, proto, a.doc))
    schema = onnx.defs.OpSchema(
        op.name, domain, op.since_version, op.doc,
        inputs=inputs, outputs=outputs,
        type_constraints=[(k, list(v), "") for k, v in op.type_constraints.items()],
        attributes=attributes,
    )
    schema.set_type_and_shape_inference_function(_make_inference(op, kernel_encoded))
    return schema
