"""Folding: nodes whose inputs are constant become constants (custom ops by their kernel),
shape arithmetic becomes constants where the dims are known, and a Reshape whose target is
computed from symbolic dims gets a constant target (0: copy the input's dim, -1: the rest).

Shape values are followed as tuples of dims (int, or a symbol: see _shapes) through the ops
TorchScript exports write for shape arithmetic: Shape, Gather, Unsqueeze, Squeeze, Concat,
Slice, Cast, Identity and integer Add/Sub/Mul/Div.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from graphkit.rewrite.graph.walk import AI_ONNX
from graphkit.rewrite.simplify._context import SimplifyContext
from graphkit.rewrite.simplify._evaluate import NotFoldable, evaluate
from graphkit.rewrite.simplify._graph import SimplifyScope

__all__ = ["fold_constants", "fold_shapes"]

_INT = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
_SHAPE_OPS = frozenset({"Shape", "Size", "Identity", "Cast", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice",
                        "Add", "Sub", "Mul", "Div", "Equal", "Where"})


def _nonnegative(d: Any) -> bool:
    """A dim, or a sum, product or quotient of dims (a symbol without a difference in it)."""
    return (isinstance(d, int) and d >= 0) or (isinstance(d, str) and "-" not in d)


def _broadcast(a: tuple, sa: bool, b: tuple, sb: bool) -> tuple[tuple, tuple] | None:
    if len(a) == len(b):
        return a, b
    if len(a) == 1 and sa:
        return a * len(b), b
    if len(b) == 1 and sb:
        return a, b * len(a)
    return None


def _has_refs(node: onnx.NodeProto) -> bool:
    return any(a.ref_attr_name for a in node.attribute)


def _too_large(outs: list[np.ndarray], ins: list[np.ndarray | None], limit: int) -> int | None:
    """The bytes of the outputs where folding would store more than ``limit`` bytes and more
    than twice what the constant inputs hold (a transpose of a weight folds; an Expand of a
    scalar into a big tensor does not)."""
    size = sum(o.nbytes for o in outs)
    if size <= limit or size <= 2 * sum(i.nbytes for i in ins if i is not None):
        return None
    return size


def _declared_ok(ctx: SimplifyContext, name: str, value: np.ndarray) -> bool:
    """Whether ``value`` has the element type inference gives ``name`` (where it gives one)."""
    elem = ctx.types.elem_type(name) if ctx.types is not None else None
    if elem is None:
        return True
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem) == value.dtype
    except (KeyError, TypeError, ValueError):
        return False


def fold_constants(ctx: SimplifyContext, model: onnx.ModelProto) -> int:
    """Evaluate every node whose inputs are all constant; returns how many were folded."""
    folded = 0
    limit = ctx.options.size_limit
    for scope in ctx.scopes(model):
        for k, node in scope.live():
            if not node.input or (node.op_type == "Constant" and node.domain in AI_ONNX):
                continue
            if not all(scope.is_constant(name) for name in node.input if name):
                folded += _fold_shape_value(ctx, scope, k, node)
                continue  # (no weight is read for a node that cannot fold)
            inputs: list[np.ndarray | None] = []
            for name in node.input:
                if not name:
                    inputs.append(None)
                    continue
                value = scope.value(name, limit=limit)
                if value is None:
                    break
                inputs.append(value)
            else:
                if _has_refs(node):
                    continue
                folded += _fold_node(ctx, scope, k, node, inputs)
                continue
            folded += _fold_shape_value(ctx, scope, k, node)
        scope.commit()
    return folded


def _fold_node(ctx: SimplifyContext, scope: SimplifyScope, k: int, node: onnx.NodeProto,
               inputs: list[np.ndarray | None]) -> int:
    try:
        outs = evaluate(node, inputs, ctx.opset, ctx.registry, ctx.placeholder_domains, ctx.path)
    except NotFoldable as exc:
        ctx.keep(node, f"inputs are constant but it was not evaluated: {exc}")
        return 0
    if len(outs) < len([o for o in node.output if o]):
        ctx.keep(node, "its evaluation gave fewer outputs than the node has")
        return 0
    size = _too_large(outs, inputs, ctx.options.size_limit)
    if size is not None:
        ctx.keep(node, f"its output would be {size:,} bytes, over the size limit of "
                       f"{ctx.options.size_limit:,} (--size-limit)")
        return 0
    named = [(o, v) for o, v in zip(node.output, outs) if o]
    if not all(_declared_ok(ctx, o, v) for o, v in named):
        ctx.keep(node, "its evaluation gave another element type than the model declares")
        return 0
    return _replace_by_constants(scope, k, node, named)


def _replace_by_constants(scope: SimplifyScope, k: int, node: onnx.NodeProto,
                          named: list[tuple[str, np.ndarray]]) -> int:
    placed = [c for o, v in named if (c := scope.add_constant(o, np.asarray(v), like=node)) is not None]
    scope.replace(k, placed)
    return 1


# -- shape values --------------------------------------------------------------------------
# A shape value: (scalar?, dims). Dims are ints or symbols (str).

def _shape_value(ctx: SimplifyContext, scope: SimplifyScope, name: str) -> tuple[bool, tuple[Any, ...]] | None:
    if name in ctx.shape_values:
        return ctx.shape_values[name]
    if ctx.types is not None:  # told by its type, before any value is read
        dims = ctx.types.dims(name)
        if ctx.types.elem_type(name) not in _INT or dims is None or len(dims) > 1:
            return None
    value = scope.value(name, limit=1024)
    if value is not None and value.dtype.kind in "iu" and value.ndim <= 1:
        return value.ndim == 0, tuple(int(v) for v in value.reshape(-1))
    return None


def _sym(op: str, a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        if op == "Add":
            return a + b
        if op == "Sub":
            return a - b
        if op == "Mul":
            return a * b
        if b == 0:
            return None
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    if op == "Mul" and (a == 1 or b == 1):
        return b if a == 1 else a
    if op in ("Add", "Sub") and b == 0:
        return a
    if op == "Div" and b == 1:
        return a
    if op in ("Add", "Mul") and str(a) > str(b):  # commutative: one spelling
        a, b = b, a
    return f"({a}{ {'Add': '+', 'Sub': '-', 'Mul': '*', 'Div': '/'}[op]}{b})"


def _propagate(ctx: SimplifyContext, scope: SimplifyScope, node: onnx.NodeProto) -> tuple[bool, tuple[Any, ...]] | None:
    op = node.op_type
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if op == "Shape":
        dims = ctx.types.dims(node.input[0]) if ctx.types is not None else None
        if dims is None:
            return None
        start, end = attrs.get("start", 0), attrs.get("end")
        return False, tuple(dims[slice(start, end)])
    if op == "Size":
        dims = ctx.types.static_shape(node.input[0]) if ctx.types is not None else None
        return None if dims is None else (True, (int(np.prod(dims, dtype=np.int64)),))
    values = [_shape_value(ctx, scope, i) if i else None for i in node.input]
    first = values[0] if values else None
    if op in ("Identity", "Cast"):
        if first is None or (op == "Cast" and attrs.get("to") not in _INT):
            return None
        return first
    if op == "Gather":
        if first is None or first[0] or attrs.get("axis", 0) != 0 or len(values) < 2 or values[1] is None:
            return None
        idx = scope.value(node.input[1], limit=1024)
        if idx is None:
            return None
        n = len(first[1])
        picked = []
        for i in idx.reshape(-1):
            i = int(i)
            if not -n <= i < n:
                return None
            picked.append(first[1][i])
        return idx.ndim == 0, tuple(picked)
    if op == "Unsqueeze":
        if first is None or not first[0]:
            return None
        axes = attrs.get("axes") if ctx.opset < 13 else (
            None if len(node.input) < 2 else scope.value(node.input[1], limit=1024))
        if axes is None or [int(a) for a in np.asarray(axes).reshape(-1)] not in ([0], [-1]):
            return None
        return False, first[1]
    if op == "Squeeze":
        if first is None or first[0] or len(first[1]) != 1:
            return None
        return True, first[1]
    if op == "Concat":
        if attrs.get("axis") not in (0, -1) or any(v is None or v[0] for v in values):
            return None
        return False, tuple(d for v in values for d in v[1])
    if op == "Slice":
        if first is None or first[0] or ctx.opset < 10:
            return None
        consts = [scope.value(i, limit=1024) if i else None for i in node.input[1:]]
        if any(c is None for c in consts[:2]) or any(node.input[1 + j] and consts[j] is None for j in range(len(consts))):
            return None
        starts, ends = consts[0].reshape(-1), consts[1].reshape(-1)
        axes = consts[2].reshape(-1) if len(consts) > 2 and consts[2] is not None else np.array([0])
        steps = consts[3].reshape(-1) if len(consts) > 3 and consts[3] is not None else np.array([1])
        if len(starts) != 1 or int(axes[0]) not in (0, -1) or int(steps[0]) == 0:
            return None
        n = len(first[1])
        s, e, st = int(starts[0]), int(ends[0]), int(steps[0])
        s = max(min(s, n), -n - 1) if st < 0 else max(min(s, n), -n)
        e = max(min(e, n), -n - 1)
        return False, tuple(first[1][slice(s, None if st < 0 and e == -n - 1 else e, st)])
    if op in ("Add", "Sub", "Mul", "Div", "Equal"):
        if len(values) != 2 or values[0] is None or values[1] is None:
            return None
        (sa, a), (sb, b) = values
        pair = _broadcast(a, sa, b, sb)
        if pair is None:
            return None
        if op == "Equal":  # a dim is never negative: Equal(shape, -1), as torch's expand writes, is known
            out = []
            for x, y in zip(*pair):
                if x == y:
                    out.append(True)
                elif (isinstance(x, int) and isinstance(y, int)) or (isinstance(y, int) and y < 0 and _nonnegative(x)) \
                        or (isinstance(x, int) and x < 0 and _nonnegative(y)):
                    out.append(False)
                else:
                    return None
            return sa and sb, tuple(out)
        out = tuple(_sym(op, x, y) for x, y in zip(*pair))
        return (None if any(d is None for d in out) else (sa and sb, out))
    if op == "Where":
        cond = scope.value(node.input[0], limit=1024) if scope.is_constant(node.input[0]) else None
        if cond is None or cond.ndim > 1 or len(values) != 3 or values[1] is None or values[2] is None:
            return None
        (sx, x), (sy, y) = values[1], values[2]
        flags = tuple(bool(c) for c in cond.reshape(-1))
        pair = _broadcast(x, sx, y, sy)
        if pair is None:
            return None
        x, y = pair
        if len(flags) == 1:
            flags = flags * len(x)
        if len(flags) != len(x):
            return None
        return sx and sy and cond.ndim == 0, tuple(a if c else b for c, a, b in zip(flags, x, y))
    return None


def _fold_shape_value(ctx: SimplifyContext, scope: SimplifyScope, k: int, node: onnx.NodeProto) -> int:
    """Follow a shape value through ``node``; fold the node where every dim is known."""
    if node.domain not in AI_ONNX or node.op_type not in _SHAPE_OPS or len(node.output) != 1 or not node.output[0]:
        return 0
    got = _propagate(ctx, scope, node)
    if got is None:
        return 0
    out = node.output[0]
    scalar, dims = got
    if all(isinstance(d, int) for d in dims) and not (scalar and len(dims) != 1):
        elem = ctx.types.elem_type(out) if ctx.types is not None else None
        if all(isinstance(d, bool) for d in dims):
            dtype = np.bool_
        else:
            dtype = np.int32 if elem == onnx.TensorProto.INT32 else np.int64
        value = np.array(dims[0] if scalar else list(dims), dtype=dtype)
        if elem is not None and onnx.helper.tensor_dtype_to_np_dtype(elem) != value.dtype:
            return 0  # (a bool where the model has an int, or the reverse: left to evaluation)
        return _replace_by_constants(scope, k, node, [(out, value)])
    ctx.shape_values[out] = got
    return 0


def fold_shapes(ctx: SimplifyContext, model: onnx.ModelProto) -> int:
    """Reshape and Expand targets computed from symbolic dims become constants (Reshape: 0
    where a dim is the input's own, -1 for the one dim left; Expand: 1 where it is the
    input's own); Reshape and Expand to the input's own shape go."""
    done = 0
    for scope in ctx.scopes(model):
        for k, node in scope.live():
            if node.domain not in AI_ONNX or len(node.input) < 2:
                continue
            if node.op_type == "Reshape" and _reshape_keeps_dims(ctx, scope, node):
                done += scope.bypass(k, node.output[0], node.input[0])
            elif node.op_type == "Reshape" and node.input[1] in ctx.shape_values:
                done += _constant_reshape(ctx, scope, k, node)
            elif node.op_type == "Expand" and node.input[1] in ctx.shape_values:
                done += _constant_expand(ctx, scope, k, node)
        scope.commit()
    return done


def _constant_expand(ctx: SimplifyContext, scope: SimplifyScope, k: int, node: onnx.NodeProto) -> int:
    """Expand to a shape computed from symbolic dims: each dim that is the input's own there
    becomes 1 (broadcasting gives the input's dim back), then the target is constant; where
    every entry is 1 and the input has as many dims, the Expand goes."""
    dims = ctx.types.dims(node.input[0]) if ctx.types is not None and scope.is_graph else None
    scalar, target = ctx.shape_values[node.input[1]]
    if dims is None or scalar:
        return 0
    lead = len(target) - len(dims)  # (right-aligned: target entry i is the input's dim i - lead)
    out = []
    for i, d in enumerate(target):
        if isinstance(d, int):
            if d < 0:
                return 0
            out.append(d)
        elif i >= lead and dims[i - lead] == d:
            out.append(1)
        else:
            return 0
    if lead <= 0 and all(d == 1 for d in out):
        return int(scope.bypass(k, node.output[0], node.input[0]))
    name = ctx.fresh(node.input[1] + "_folded")
    made = scope.add_constant(name, np.array(out, dtype=np.int64))
    if made is not None:  # a function body: a Constant node before the Expand
        scope.placed.setdefault(k, []).append(made)
    scope.set_input(k, 1, name)
    return 1


def _reshape_keeps_dims(ctx: SimplifyContext, scope: SimplifyScope, node: onnx.NodeProto) -> bool:
    """Whether Reshape ``node``'s target is its input's dims: each entry the input's dim
    there (0 too, where it copies), but for at most one -1 (then the dim left over)."""
    dims = ctx.types.dims(node.input[0]) if ctx.types is not None and scope.is_graph else None
    if dims is None or ctx.types.elem_type(node.input[0]) != ctx.types.elem_type(node.output[0]):
        return False  # (a function body's names are its own: the model's types are not theirs)
    if node.input[1] in ctx.shape_values:
        scalar, target = ctx.shape_values[node.input[1]]
    elif scope.is_constant(node.input[1]):
        value = scope.value(node.input[1], limit=1024)
        if value is None or value.ndim != 1:
            return False
        scalar, target = False, tuple(int(v) for v in value)
    else:
        return False
    copies = not any(a.name == "allowzero" and a.i for a in node.attribute)
    if scalar or len(target) != len(dims) or 0 in dims:
        return False  # (0 in dims: a -1 would be ambiguous)
    free = [t for t, d in zip(target, dims) if not (t == d or (t == 0 and copies))]
    return free in ([], [-1])


def _sole_copy_as_minus_one(out_dims: Sequence[object] | None, target: list[int]) -> list[int]:
    """``target`` with its one 0 (copy) written -1 where every other entry is a known dim.

    [0, 197, -1, 64] with the output proved [b, 197, 4, 64] becomes [-1, 197, 4, 64]: the
    same Reshape for every input it accepts. ONNX Runtime infers the 0 as the input's own
    symbolic dim and the -1 as a fresh one, and with the 0 its memory planner makes the slower
    plan: ViT TorchScript dynamic ran 1.03-1.05x onnxslim's time with 0, 0.98x with -1 (40
    alternating runs, 1 thread; onnxslim keeps these targets computed). With two copies
    nothing changes (one -1 could not stand for both)."""
    if out_dims is None or len(out_dims) != len(target):
        return target
    known = [d if v == -1 and isinstance(d, int) and d > 0 else v for v, d in zip(target, out_dims)]
    if -1 in known:
        return target
    known[known.index(0)] = -1
    return known


def _constant_reshape(ctx: SimplifyContext, scope: SimplifyScope, k: int, node: onnx.NodeProto) -> int:
    if any(a.name == "allowzero" and a.i for a in node.attribute):
        return 0
    dims = ctx.types.dims(node.input[0]) if ctx.types is not None else None
    scalar, target = ctx.shape_values[node.input[1]]
    if dims is None or scalar:
        return 0
    out, free = [], 0
    for i, d in enumerate(target):
        if isinstance(d, int):
            if d == 0:
                return 0  # a real zero dim: 0 would mean "copy" here
            free += d == -1
            out.append(d)
        elif i < len(dims) and dims[i] == d:
            out.append(0)
        else:
            free += 1
            out.append(-1)
    if free > 1:
        return 0
    if out.count(0) == 1 and scope.is_graph:
        out = _sole_copy_as_minus_one(ctx.types.dims(node.output[0]), out)
    name = ctx.fresh(node.input[1] + "_folded")
    made = scope.add_constant(name, np.array(out, dtype=np.int64))
    if made is not None:  # a function body: a Constant node before the Reshape
        scope.placed.setdefault(k, []).append(made)
    scope.set_input(k, 1, name)
    return 1
