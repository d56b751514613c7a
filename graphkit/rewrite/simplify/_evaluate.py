"""Evaluating one node on constant inputs: numpy for the ops shape arithmetic is made of,
ONNX's reference implementation for the other standard ops, and an op definition's kernel
(or torch reference) for a custom op.

The numpy table exists for speed: building onnx.reference's evaluator for one node costs
about a millisecond, and a TorchScript export has hundreds of Shape/Gather/Unsqueeze/Concat
nodes. Each entry follows the ONNX operator's definition; the rest go to the reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphkit.ops import OpRegistry

__all__ = ["NotFoldable", "NONDETERMINISTIC", "evaluate"]

# Ops whose output is not a function of their inputs: never folded.
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                              "Multinomial", "Bernoulli"})


class NotFoldable(Exception):
    """The node cannot be evaluated here; the message says why (shown by --explain)."""


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _gather(data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    axis = _axis(axis, data.ndim)
    size = data.shape[axis]
    idx = np.asarray(indices, dtype=np.int64)
    if np.any((idx < -size) | (idx >= size)):
        raise NotFoldable("Gather index out of range")
    return np.take(data, np.where(idx < 0, idx + size, idx), axis=axis)


def _unsqueeze(data: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    rank = data.ndim + len(axes)
    out = data
    for a in sorted(_axis(int(x), rank) for x in axes):
        out = np.expand_dims(out, a)
    return out


def _squeeze(data: np.ndarray, axes: Sequence[int] | None) -> np.ndarray:
    if axes is None:
        return np.squeeze(data)
    return np.squeeze(data, axis=tuple(_axis(int(a), data.ndim) for a in axes))


def _slice(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, axes: np.ndarray | None,
           steps: np.ndarray | None) -> np.ndarray:
    index = [slice(None)] * data.ndim
    axes = range(len(starts)) if axes is None else [_axis(int(a), data.ndim) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise NotFoldable("Slice step 0")
        dim = data.shape[a]
        s, e = int(s), int(e)
        # ONNX clamps like Python slicing, with INT_MAX/INT_MIN standing for "to the end"
        s = max(min(s, dim), -dim - 1) if st < 0 else max(min(s, dim), -dim)
        e = max(min(e, dim), -dim - 1)
        if st < 0 and e == -dim - 1:
            e = None
        index[a] = slice(s, e, st)
    return data[tuple(index)]


def _cast(x: np.ndarray, to: int) -> np.ndarray:
    dtype = helper.tensor_dtype_to_np_dtype(to)
    if x.dtype.kind == "f" and np.dtype(dtype).kind in "iub":
        if np.dtype(dtype).kind == "b":
            return x != 0
        if not np.all(np.isfinite(x)):
            raise NotFoldable("Cast of a non-finite float to an integer type")
        return np.trunc(x).astype(dtype)
    if x.dtype.kind in "OSU" or np.dtype(dtype).kind in "OSU":
        raise NotFoldable("Cast from or to strings")
    return x.astype(dtype)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.any(b == 0):
        raise NotFoldable("integer division by zero")
    q = np.abs(a) // np.abs(b)  # ONNX (C) integer division truncates towards zero
    return (np.sign(a) * np.sign(b) * q).astype(np.result_type(a, b))


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return _int_div(a, b)
    with np.errstate(all="ignore"):
        return np.divide(a, b)


def _range(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
    if delta == 0:
        raise NotFoldable("Range with delta 0")
    n = max(int(np.ceil((limit - start) / delta)), 0)
    return (start + np.arange(n, dtype=np.result_type(start, delta)) * delta).astype(start.dtype)


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    def run(a: np.ndarray, b: np.ndarray, **_: Any) -> np.ndarray:
        if a.dtype != b.dtype:
            raise NotFoldable(f"inputs of different types {a.dtype} and {b.dtype}")
        with np.errstate(all="ignore"):
            return np.asarray(fn(a, b)).astype(a.dtype, copy=False)
    return run


def _compare(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    def run(a: np.ndarray, b: np.ndarray, **_: Any) -> np.ndarray:
        return np.asarray(fn(a, b))
    return run


def _constant_of_shape(shape: np.ndarray, value: onnx.TensorProto | None = None) -> np.ndarray:
    fill = np.zeros(1, np.float32) if value is None else numpy_helper.to_array(value).reshape(-1)
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise NotFoldable("ConstantOfShape with a negative dim")
    return np.full(dims, fill[0], dtype=fill.dtype)


def _reshape(data: np.ndarray, shape: np.ndarray, allowzero: int = 0) -> np.ndarray:
    dims = [int(d) for d in shape]
    if not allowzero:
        dims = [data.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    try:
        return data.reshape(dims)
    except ValueError as exc:
        raise NotFoldable(f"Reshape: {exc}") from exc


def _expand(data: np.ndarray, shape: np.ndarray) -> np.ndarray:
    try:
        target = np.broadcast_shapes(data.shape, tuple(int(d) for d in shape))
    except ValueError as exc:
        raise NotFoldable(f"Expand: {exc}") from exc
    return np.broadcast_to(data, target).copy()


def _where(c: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype != y.dtype:
        raise NotFoldable("Where branches of different types")
    return np.where(c, x, y)


def _concat(*xs: np.ndarray, axis: int) -> np.ndarray:
    xs = [x for x in xs]
    if len({x.dtype for x in xs}) != 1:
        raise NotFoldable("Concat of different types")
    return np.concatenate(xs, axis=_axis(axis, xs[0].ndim))


def _flatten(x: np.ndarray, axis: int = 1) -> np.ndarray:
    axis = _axis(axis, x.ndim)
    return x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1) if x.size else x.reshape(
        int(np.prod(x.shape[:axis], dtype=np.int64)), int(np.prod(x.shape[axis:], dtype=np.int64)))


def _cumsum(x: np.ndarray, axis: np.ndarray, exclusive: int = 0, reverse: int = 0) -> np.ndarray:
    a = _axis(int(axis.reshape(-1)[0]), x.ndim)
    y = np.flip(x, a) if reverse else x
    out = np.cumsum(y, axis=a, dtype=x.dtype)
    if exclusive:
        out = np.concatenate([np.zeros_like(np.take(out, [0], axis=a)), np.delete(out, -1, axis=a)], axis=a)
    return np.flip(out, a) if reverse else out


def _gather_elements(data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    axis = _axis(axis, data.ndim)
    size = data.shape[axis]
    if np.any((indices < -size) | (indices >= size)):
        raise NotFoldable("GatherElements index out of range")
    return np.take_along_axis(data, np.where(indices < 0, indices + size, indices).astype(np.int64), axis=axis)


def _float_unary(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    def run(x: np.ndarray) -> np.ndarray:
        if x.dtype.kind != "f":
            raise NotFoldable("a float op on a non-float tensor")
        with np.errstate(all="ignore"):
            return fn(x).astype(x.dtype)
    return run


def _shape(x: np.ndarray, start: int = 0, end: int | None = None) -> np.ndarray:
    dims = list(x.shape)
    return np.array(dims[slice(start, end)], dtype=np.int64)


# op -> function of (inputs..., **attributes), ONNX's definition at the opsets graphkit reads
# (7..28); the ops that moved attributes to inputs are adapted in _numpy_inputs.
_NUMPY: dict[str, Callable[..., np.ndarray]] = {
    "Identity": lambda x: x,
    "Shape": lambda x, start=0, end=None: _shape(x, start, end),
    "Size": lambda x: np.array(x.size, dtype=np.int64),
    "Gather": lambda d, i, axis=0: _gather(d, i, axis),
    "Concat": lambda *xs, axis: _concat(*xs, axis=axis),
    "Cast": lambda x, to, saturate=1, round_mode=None: _cast(x, to),
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply),
    "Div": lambda a, b: _binary(_div)(a, b),
    "Equal": _compare(np.equal), "Less": _compare(np.less), "Greater": _compare(np.greater),
    "LessOrEqual": _compare(np.less_equal), "GreaterOrEqual": _compare(np.greater_equal),
    "Not": lambda x: np.logical_not(x),
    "And": _compare(np.logical_and), "Or": _compare(np.logical_or),
    "Neg": lambda x: np.negative(x),
    "Where": _where,
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "Expand": _expand,
    "Flatten": _flatten,
    "CumSum": _cumsum,
    "GatherElements": _gather_elements,
    "Transpose": lambda x, perm=None: np.transpose(x, perm),
    "Sin": _float_unary(np.sin), "Cos": _float_unary(np.cos), "Sqrt": _float_unary(np.sqrt),
    "Exp": _float_unary(np.exp), "Reciprocal": _float_unary(np.reciprocal),
    "ReduceMax": lambda x, axes, keepdims: np.max(x, axis=axes, keepdims=keepdims),
    "ReduceMin": lambda x, axes, keepdims: np.min(x, axis=axes, keepdims=keepdims),
}


def _numpy_inputs(op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any],
                  opset: int) -> tuple[list[Any], dict[str, Any]] | None:
    """Inputs and keywords for the numpy table, with the ops that moved attributes to
    inputs across opsets handled; None where the table does not cover this form."""
    if op in ("Unsqueeze", "Squeeze"):
        axes = attrs.get("axes") if opset < 13 else (None if len(inputs) < 2 or inputs[1] is None
                                                     else [int(a) for a in inputs[1].reshape(-1)])
        return [inputs[0], axes], {}
    if op == "Slice":
        if opset < 10:
            return None
        axes = inputs[3] if len(inputs) > 3 else None
        steps = inputs[4] if len(inputs) > 4 else None
        return [inputs[0], inputs[1], inputs[2], axes, steps], {}
    if op == "Reshape":
        return [inputs[0], inputs[1]], {"allowzero": attrs.get("allowzero", 0)}
    if op in ("ReduceMax", "ReduceMin"):
        return _reduce_inputs(inputs, attrs, opset)
    if op not in _NUMPY or any(i is None for i in inputs):
        return None
    return list(inputs), attrs


def _reduce_inputs(inputs: list[np.ndarray | None], attrs: dict[str, Any],
                   opset: int) -> tuple[list[Any], dict[str, Any]] | None:
    """ReduceMax/ReduceMin: axes an attribute before opset 18, an input from it. Distinct
    axes over dims that are not empty only (the rest: the reference's)."""
    x = inputs[0]
    if x is None or set(attrs) - {"axes", "keepdims", "noop_with_empty_axes"}:
        return None
    if opset < 18:
        axes = attrs.get("axes")
    else:
        axes = None if len(inputs) < 2 or inputs[1] is None else [int(a) for a in inputs[1].reshape(-1)]
    if not axes:
        if attrs.get("noop_with_empty_axes", 0) and opset >= 18:
            return None  # (the input as it is: the reference's)
        axes = list(range(x.ndim))
    raw = [int(a) for a in axes]
    if any(not -x.ndim <= a < x.ndim for a in raw):
        return None
    axes = sorted({_axis(a, x.ndim) for a in raw})
    if len(axes) != len(raw) or any(x.shape[a] == 0 for a in axes):
        return None
    return [x, tuple(axes)], {"keepdims": bool(attrs.get("keepdims", 1))}


_NUMPY_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                          onnx.TensorProto.BOOL, onnx.TensorProto.INT8, onnx.TensorProto.INT16,
                          onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT8,
                          onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64})


def _numpy(op: str, node: onnx.NodeProto, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    attrs = _attrs(node)
    if op == "Cast" and attrs.get("to") not in _NUMPY_TYPES:
        return None  # bfloat16, float8 (saturation) and strings: the reference's
    call = _numpy_inputs(op, inputs, attrs, opset)
    if call is None:
        return None
    args, kwargs = call
    if op == "Unsqueeze":
        if args[1] is None:
            return None
        return [_unsqueeze(args[0], args[1])]
    if op == "Squeeze":
        return [_squeeze(args[0], args[1])]
    if op == "Slice":
        return [_slice(*args)]
    if op == "Reshape":
        return [_reshape(args[0], args[1], **kwargs)]
    try:
        return [np.asarray(_NUMPY[op](*args, **kwargs))]
    except TypeError:
        return None  # an attribute the table does not take: the reference decides


def _reference(node: onnx.NodeProto, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)]
    feeds = {n: v for n, v in zip(names, inputs) if n}
    one = onnx.NodeProto()
    one.CopyFrom(node)
    del one.input[:]
    one.input.extend(names)
    outs = [f"o{k}" if o else "" for k, o in enumerate(node.output)]
    del one.output[:]
    one.output.extend(outs)
    graph = helper.make_graph([one], "fold", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype),
                                                                           list(v.shape)) for n, v in feeds.items()],
                              [helper.make_value_info(o, onnx.TypeProto()) for o in outs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    try:
        got = ReferenceEvaluator(model).run(None, feeds)
    except Exception as exc:  # the reference raises whatever numpy or its own code raise
        raise NotFoldable(f"ONNX's reference failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    return [np.asarray(g) for g in got]


def _custom(node: onnx.NodeProto, inputs: list[np.ndarray | None], registry: OpRegistry,
            path: str | None) -> list[np.ndarray]:
    from graphkit.errors import GraphkitError
    from graphkit.rewrite.lowering.plan import node_attrs

    op = registry.lookup(node.domain, node.op_type)
    if op is None:
        raise NotFoldable("no op package defines this op")
    try:
        attrs = node_attrs(op, node, path)
    except GraphkitError as exc:
        raise NotFoldable(exc.message) from exc
    arrays = list(inputs) + [None] * (len(op.inputs) - len(inputs))
    if op.python_kernel is not None:
        try:
            out = op.python_kernel(*arrays, **attrs)
        except Exception as exc:  # the op's own kernel: whatever it raises keeps the node
            raise NotFoldable(f"its Python kernel raised {type(exc).__name__}: {exc}") from exc
    else:
        try:
            import torch
        except ImportError as exc:
            raise NotFoldable("the op has no Python kernel and torch (for its reference) is not installed") from exc
        try:
            with torch.no_grad():
                out = op.reference(*[None if a is None else torch.from_numpy(a.copy(order="C"))
                                     for a in arrays], **attrs)
        except Exception as exc:  # the op's own reference
            raise NotFoldable(f"its reference raised {type(exc).__name__}: {exc}") from exc
        out = [o.numpy() for o in out] if isinstance(out, (tuple, list)) else out.numpy()
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(outs) != len(node.output):
        raise NotFoldable(f"its kernel returned {len(outs)} outputs, the node has {len(node.output)}")
    return [np.asarray(o) for o in outs]


def evaluate(node: onnx.NodeProto, inputs: list[np.ndarray | None], opset: int, registry: OpRegistry,
             placeholder_domains: frozenset[str], path: str | None = None) -> list[np.ndarray]:
    """The node's outputs on ``inputs`` (None: an absent optional input); NotFoldable if it
    cannot be evaluated here."""
    domain, op = node.domain, node.op_type
    if op in NONDETERMINISTIC and domain in ("", "ai.onnx"):
        raise NotFoldable("the op is random")
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        raise NotFoldable("the node holds subgraphs")
    if domain in placeholder_domains:
        return _custom(node, inputs, registry, path)
    if domain not in ("", "ai.onnx"):
        raise NotFoldable(f"no evaluator for domain {domain!r}")
    try:
        got = _numpy(op, node, inputs, opset)
    except NotFoldable:
        raise
    except (ValueError, IndexError, TypeError) as exc:
        raise NotFoldable(f"{op}: {exc}") from exc
    if got is not None:
        return got
    return _reference(node, inputs, opset)
