"""Other libraries' torch ops written as graphkit placeholders (``OpDef.foreign_ops``).

An op that stands for a torch op of another library (graphkit's ``deform_conv2d`` for
``torchvision::deform_conv2d``) lists it as a :class:`~graphkit.ops.ForeignOp`: its torch
name, schema and a mapping of its arguments to the op's. From that one entry graphkit
derives, for the duration of one export:

- :func:`foreign_translations` - ``custom_translation_table`` entries for the dynamo
  exporter (they take precedence over torch's own translations, such as torch's
  ``torchvision::deform_conv2d`` -> ``DeformConv``, which is valid only from opset 19);
- :func:`scoped_foreign_symbolics` - TorchScript symbolics (``dynamo=False``), registered
  for the block only.

Both write the op's ``<domain>::<name>`` placeholder. A foreign op no library has defined
in this process is skipped (the model cannot call it); one defined under another schema
than the OpDef declares is an ExportError, so a changed library never exports garbage.
"""

from __future__ import annotations

import contextlib
import inspect
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from graphkit.errors import ExportError
from graphkit.export._placeholder import emit_placeholder, signed_translation
from graphkit.export._symbolic_registry import SYMBOLIC_OPSET, forget_empty_group, symbolic_registry
from graphkit.ops import ForeignOp, OpDef

__all__ = ["foreign_ops", "foreign_symbolic", "foreign_translations", "scoped_foreign_symbolics"]


def foreign_ops(ops: Iterable[OpDef], skip: Iterable[str] = ()) -> list[tuple[OpDef, ForeignOp]]:
    """(op, foreign op) for every foreign op of ``ops`` not named in ``skip``; ExportError when
    two ops claim one foreign op."""
    skip = set(skip)
    seen: dict[str, OpDef] = {}
    out = []
    for op in ops:
        for f in op.foreign_ops:
            if f.name in skip:
                continue
            other = seen.setdefault(f.name, op)
            if other is not op and other != op:
                raise ExportError(f"{f.name} is claimed by two ops: {other.qualified_name} and "
                                  f"{op.qualified_name}", op=op.qualified_name,
                                  hint="load only one of the packages, or drop the foreign op "
                                       "from one OpDef")
            if other is op and (op, f) not in out:
                out.append((op, f))
    return out


def _declared(f: ForeignOp) -> torch.FunctionSchema:
    return torch._C.parse_schema(f"{f.namespace}::{f.schema}")


def _overload(f: ForeignOp) -> torch._ops.OpOverload | None:
    """The foreign op's overload in torch's dispatcher, or None where nothing defines it."""
    declared = _declared(f)
    try:
        packet = getattr(getattr(torch.ops, f.namespace), f.op_name)
        overload = getattr(packet, declared.overload_name or "default")
    except (AttributeError, RuntimeError):
        return None
    return overload


def _signature(schema: torch.FunctionSchema) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments] + [("->", str(r.type)) for r in schema.returns]


def _checked(op: OpDef, f: ForeignOp) -> torch._ops.OpOverload | None:
    overload = _overload(f)
    if overload is None:
        return None
    declared, live = _declared(f), overload._schema
    if _signature(declared) != _signature(live):
        raise ExportError(
            f"{f.name} is defined in this process as '{live}', but {op.qualified_name} maps "
            f"'{f.namespace}::{f.schema}'", op=op.qualified_name,
            hint=f"update the ForeignOp entry of {op.qualified_name} to the library's schema, or "
                 f"export with torch_translations=['{f.name}'] to leave the op to torch")
    return overload


def _annotation(arg: Any, f: ForeignOp) -> Any:
    kind = arg.type.kind()
    inner = arg.type.getElementType() if kind in ("OptionalType", "ListType") else None
    if kind == "TensorType" or (kind == "OptionalType" and inner.kind() == "TensorType"):
        tv = typing.TypeVar(f"T_{arg.name}")
        return typing.Optional[tv] if kind == "OptionalType" else tv
    scalars = {"IntType": int, "SymIntType": int, "FloatType": float, "BoolType": bool,
               "StringType": str}
    if kind in scalars:
        return scalars[kind]
    if kind == "ListType" and inner.kind() in ("IntType", "SymIntType"):
        return Sequence[int]
    if kind == "ListType" and inner.kind() == "FloatType":
        return Sequence[float]
    raise ExportError(f"{f.name}: argument '{arg.name}' has type {arg.type}, which graphkit cannot "
                      "map to an ONNX input or attribute",
                      hint="map ops whose arguments are tensors, ints, floats, bools, strings or "
                           "lists of ints/floats")


def _call(op: OpDef, f: ForeignOp, values: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    inputs, attrs = f.to_op(values)
    inputs = list(inputs)
    if len(inputs) != len(op.inputs):
        raise ExportError(f"{f.name} -> {op.qualified_name}: to_op returned {len(inputs)} inputs, "
                          f"the op takes {len(op.inputs)}", op=op.qualified_name,
                          hint="fix the ForeignOp's to_op")
    return inputs, op.resolve_attrs(attrs, where=f.name)


def _translation(op: OpDef, f: ForeignOp) -> Callable[..., Any]:
    """The dynamo exporter's translation of ``f``: the op's placeholder node, called with the
    foreign op's arguments (its torch schema's signature)."""
    P = inspect.Parameter
    plist = [P(arg.name, P.KEYWORD_ONLY if arg.kwarg_only else P.POSITIONAL_OR_KEYWORD,
               default=arg.default_value if arg.has_default_value() else P.empty, annotation=_annotation(arg, f))
             for arg in _declared(f).arguments]
    ret = next((p.annotation for p in plist if isinstance(p.annotation, typing.TypeVar)), Any)
    signature = inspect.Signature(plist, return_annotation=ret)

    def to_call(*args: Any, **kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return _call(op, f, dict(bound.arguments))

    return signed_translation(op, signature, to_call, name=f"{f.op_name}_as_{op.name}",
                              doc=f"{op.qualified_name} placeholder node for {f.name}.")


def foreign_translations(ops: Iterable[OpDef], skip: Iterable[str] = ()) -> dict[Any, Callable[..., Any]]:
    """``custom_translation_table`` entries writing each op's placeholder for its foreign
    ops that are defined in torch now (except those named in ``skip``)."""
    table = {}
    for op, f in foreign_ops(ops, skip):
        overload = _checked(op, f)
        if overload is not None:
            table[overload] = _translation(op, f)
    return table


def _scalar(value: Any, arg: Any, f: ForeignOp) -> Any:
    from graphkit.export.torch_ops import _const

    value = _const(value, f"'{arg.name}' of {f.name}")
    kind = arg.type.kind()
    if kind in ("BoolType", "IntType", "SymIntType", "FloatType") and isinstance(value, list) and len(value) == 1:
        value = value[0]  # a 0-d constant tensor
    if kind == "BoolType" and isinstance(value, (int, float)):
        value = bool(value)
    return value


def foreign_symbolic(op: OpDef, f: ForeignOp) -> Callable[..., Any]:
    """The TorchScript symbolic of ``f``: the op's placeholder node (``g.op``)."""
    schema = _declared(f)

    def symbolic(g, *args):
        values = {}
        for arg, value in zip(schema.arguments, args):
            tensor = arg.type.kind() == "TensorType" or (
                arg.type.kind() == "OptionalType" and arg.type.getElementType().kind() == "TensorType")
            values[arg.name] = value if tensor else _scalar(value, arg, f)
        inputs, attrs = _call(op, f, values)
        return emit_placeholder(g, op, inputs, attrs)

    symbolic.__name__ = f"{f.op_name}_as_{op.name}_symbolic"
    return symbolic


@contextlib.contextmanager
def scoped_foreign_symbolics(ops: Iterable[OpDef], skip: Iterable[str] = ()) -> Iterator[list[str]]:
    """Register :func:`foreign_symbolic` for the foreign ops of ``ops`` (except ``skip``) for
    the block only; unregistered on exit, even on error. A symbolic someone else registered
    (e.g. the tutorial's, or a library's own) is left alone. Yields the names registered."""
    reg = symbolic_registry()
    added: list[tuple[str, bool]] = []
    try:
        for op, f in foreign_ops(ops, skip):
            if _checked(op, f) is None:
                continue
            if reg is not None and reg.is_registered_op(f.name, SYMBOLIC_OPSET):
                continue
            existed = reg is not None and reg.get_function_group(f.name) is not None
            torch.onnx.register_custom_op_symbolic(f.name, foreign_symbolic(op, f), SYMBOLIC_OPSET)
            added.append((f.name, existed))
        yield [name for name, _ in added]
    finally:
        for name, existed in reversed(added):
            torch.onnx.unregister_custom_op_symbolic(name, SYMBOLIC_OPSET)
            forget_empty_group(name, existed)
