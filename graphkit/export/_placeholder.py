"""The placeholder node of an op, written by either torch exporter.

Shared by :mod:`graphkit.export.torch_ops` (graphkit's ops called in a model) and
:mod:`graphkit.export.aten` (ATen ops written as placeholders), so neither imports the
other:

- the calling convention of every op: inputs (declared order), then attributes (declared
  order) (:func:`params`, :func:`bind`);
- :func:`emit_placeholder` - the TorchScript exporter's ``g.op("<domain>::<name>", ...)``;
- :func:`onnxscript_translation` - the dynamo exporter's ``custom_translation_table`` entry
  (:func:`placeholder_call` writes its node); :func:`signed_translation` makes such an entry
  for any signature (the foreign ops' translations are made with it too).

The node's domain is the op's own (``OpDef.domain``), never a fixed one.
"""

from __future__ import annotations

import contextlib
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any

import torch

from graphkit.ops import AttrType, OpDef
from graphkit.ops._schema import build_schema as onnx_schema

__all__ = ["params", "bind", "emit_placeholder", "onnxscript_translation", "placeholder_call",
           "signed_translation"]

_PY_TYPES: dict[AttrType, Any] = {
    AttrType.INT: int,
    AttrType.FLOAT: float,
    AttrType.STRING: str,
    AttrType.INTS: Sequence[int],
    AttrType.FLOATS: Sequence[float],
}


def params(op: OpDef) -> list[tuple[str, Any, bool]]:
    """(name, default, has_default) for every positional parameter: inputs then attributes.

    A parameter keeps its default only when every later one has one too (Python's and
    torch's rule), so an optional input before a required attribute must be passed (None).
    """
    raw: list[tuple[str, Any, bool]] = [(p.name, None, p.optional) for p in op.inputs]
    raw += [(a.name, None if a.required else a.type.coerce(a.default), not a.required)
            for a in op.attributes]
    out: list[tuple[str, Any, bool]] = []
    suffix_ok = True
    for name, default, has in reversed(raw):
        suffix_ok = suffix_ok and has
        out.append((name, default, has and suffix_ok))
    return out[::-1]


def bind(op: OpDef, args: Sequence[Any], kwargs: dict[str, Any] | None = None) -> tuple[list, dict]:
    """Split a call into (inputs, attributes with defaults filled and types coerced)."""
    plist = params(op)
    kwargs = dict(kwargs or {})
    if len(args) > len(plist):
        raise TypeError(f"{op.name}() takes {len(plist)} arguments but {len(args)} were given")
    values: dict[str, Any] = {}
    for (name, _default, _has), value in zip(plist, args):
        values[name] = value
    for name, default, has in plist[len(args):]:
        if name in kwargs:
            values[name] = kwargs.pop(name)
        elif has:
            values[name] = default
        elif name in {p.name for p in op.inputs if p.optional}:
            values[name] = None
        elif any(a.name == name and not a.required for a in op.attributes):
            values[name] = op.attr(name).default
        else:
            raise TypeError(f"{op.name}() missing required argument '{name}'")
    if kwargs:
        raise TypeError(f"{op.name}() got unexpected argument(s) {sorted(kwargs)}")
    inputs = [values[p.name] for p in op.inputs]
    for p, v in zip(op.inputs, inputs):
        if v is None and not p.optional:
            raise TypeError(f"{op.name}() input '{p.name}' is required")
    attrs = {}
    for a in op.attributes:
        try:
            attrs[a.name] = a.type.coerce(values[a.name])
        except TypeError as exc:
            raise TypeError(f"{op.name}() attribute '{a.name}' must be {a.type.onnx_name}: {exc}") from exc
    return inputs, attrs


# --------------------------------------------------------------------------- dynamo=False


def emit_placeholder(g, op: OpDef, inputs: Sequence[Any], attrs: dict[str, Any]):
    """``g.op("<op.domain>::<name>", ...)`` with typed outputs; a missing optional input is
    an empty name. ``attrs`` maps attribute names to (coerced) values."""
    from torch.onnx import symbolic_helper

    values = list(inputs)
    while values and symbolic_helper._is_none(values[-1]):
        values.pop()
    values = [symbolic_helper._optional_input_placeholder_tensor(g) if symbolic_helper._is_none(v)
              else v for v in values]
    n_out = len(op.outputs)
    kwargs = {f"{name}_{op.attr(name).type.symbolic_suffix}": v for name, v in attrs.items()}
    out = g.op(f"{op.domain}::{op.name}", *values, **kwargs,
               **({"outputs": n_out} if n_out != 1 else {}))
    _set_output_types(op, inputs, attrs, out if n_out != 1 else (out,))
    return out


def _set_output_types(op: OpDef, inputs: Sequence[Any], attrs: dict[str, Any], outs: Sequence[Any]) -> None:
    """Give the placeholder's outputs dtype and shape (the exporter cannot infer them for a
    custom domain): dtype from the first input bound to the same type variable, shape
    from the OpDef's ``infer_shapes``. Best effort: anything unknown stays unknown."""
    shapes = []
    for v in inputs:
        try:
            sizes = v.type().varyingSizes() if isinstance(v, torch._C.Value) else None
        except RuntimeError:
            sizes = None
        shapes.append(None if sizes is None else list(sizes))
    try:
        out_shapes = op.infer_shapes(shapes, attrs)
    except Exception:  # noqa: BLE001 - a shape function may not handle unknown dims
        out_shapes = []
    for i, (p, out) in enumerate(zip(op.outputs, outs)):
        src = next((v for q, v in zip(op.inputs, inputs)
                    if q.type == p.type and isinstance(v, torch._C.Value)
                    and isinstance(v.type(), torch._C.TensorType) and v.type().scalarType() is not None),
                   None)
        if src is None:
            continue
        shape = out_shapes[i] if i < len(out_shapes) else None
        dims = None if shape is None else [d if isinstance(d, int) else None for d in shape]
        try:
            out.setType(src.type().with_sizes(dims))
        except (RuntimeError, TypeError):
            with contextlib.suppress(RuntimeError, TypeError):
                out.setType(src.type().with_sizes(None))


# --------------------------------------------------------------------------- dynamo=True


def placeholder_call(op: OpDef, domain: str | None = None) -> Callable[[Sequence[Any], dict[str, Any]], Any]:
    """``emit(inputs, attrs)`` writing the ``<domain>::<name>`` node in an onnxscript
    translation (``domain`` defaults to ``op.domain``); ``attrs`` are coerced values by name."""
    import onnx_ir as ir
    import onnxscript

    domain = op.domain if domain is None else domain
    schema = onnx_schema(op, domain)
    onnx_op = onnxscript.values.Op(onnxscript.values.Opset(domain, op.since_version), op.name, schema)
    ir_types = {AttrType.INT: ir.AttributeType.INT, AttrType.FLOAT: ir.AttributeType.FLOAT,
                AttrType.STRING: ir.AttributeType.STRING, AttrType.INTS: ir.AttributeType.INTS,
                AttrType.FLOATS: ir.AttributeType.FLOATS}

    def emit(inputs: Sequence[Any], attrs: dict[str, Any]) -> Any:
        return onnx_op(*inputs, **{name: ir.Attr(name, ir_types[op.attr(name).type], value)
                                   for name, value in attrs.items()})

    return emit


def onnxscript_translation(op: OpDef, domain: str | None = None) -> Callable[..., Any]:
    """The ``custom_translation_table`` function writing the ``<domain>::<name>`` node
    (``domain`` defaults to the op's own, ``op.domain``).

    torch's exporter calls it as ``fn(*fx_args, **fx_kwargs)`` and infers an ONNX signature
    from ``inspect.signature`` + ``typing.get_type_hints``: a parameter annotated with
    int/float/str/Sequence[int]/Sequence[float] is an attribute, any other one an input. The
    generated function therefore carries a real ``__signature__`` and ``__annotations__``
    (inputs typed by a TypeVar per type constraint, attributes by their Python type).
    """
    domain = op.domain if domain is None else domain
    type_vars = {name: typing.TypeVar(name) for name in op.type_constraints}
    P = inspect.Parameter
    plist = []
    defaults = {name: (default, has) for name, default, has in params(op)}
    for p in op.inputs:
        tv = type_vars[p.type]
        ann = typing.Optional[tv] if p.optional else tv
        _, has = defaults[p.name]
        plist.append(P(p.name, P.POSITIONAL_OR_KEYWORD, default=None if has else P.empty, annotation=ann))
    for a in op.attributes:
        default, has = defaults[a.name]
        ann = _PY_TYPES[a.type]
        plist.append(P(a.name, P.POSITIONAL_OR_KEYWORD, default=default if has else P.empty,
                       annotation=ann))
    outs = [type_vars[p.type] for p in op.outputs]
    ret = outs[0] if len(outs) == 1 else tuple.__class_getitem__(tuple(outs))
    translation = signed_translation(
        op, inspect.Signature(plist, return_annotation=ret), lambda *args, **kwargs: bind(op, args, kwargs),
        name=op.name, doc=f"{domain}::{op.name} placeholder node for {op.torch_namespace}::{op.name}.",
        domain=domain)
    translation.op = op  # type: ignore[attr-defined]
    return translation


def signed_translation(op: OpDef, signature: inspect.Signature,
                       to_call: Callable[..., tuple[list[Any], dict[str, Any]]], *, name: str, doc: str,
                       domain: str | None = None) -> Callable[..., Any]:
    """A ``custom_translation_table`` function with ``signature`` writing ``op``'s placeholder
    node: ``to_call(*args, **kwargs)`` splits a call into (inputs, coerced attributes).

    torch's exporter infers the ONNX signature from ``__signature__`` and the annotations (see
    :func:`onnxscript_translation`), so every parameter of ``signature`` is annotated."""
    emit = placeholder_call(op, domain)

    def translation(*args: Any, **kwargs: Any) -> Any:
        inputs, attrs = to_call(*args, **kwargs)
        return emit(inputs, attrs)

    translation.__name__ = translation.__qualname__ = name
    translation.__doc__ = doc
    translation.__signature__ = signature  # type: ignore[attr-defined]
    translation.__annotations__ = {**{p.name: p.annotation for p in signature.parameters.values()},
                                   "return": signature.return_annotation}
    return translation
