"""The passes that remove what computes nothing: Constant nodes lifted to initializers,
no-op nodes, duplicate constants and subexpressions, and dead nodes, initializers,
functions and function inputs. None changes a graph input's or output's name."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx

from graphkit.rewrite.graph.walk import AI_ONNX, graphs, subgraphs, walk
from graphkit.rewrite.simplify._context import SimplifyContext
from graphkit.rewrite.simplify._evaluate import NONDETERMINISTIC
from graphkit.rewrite.graph.view import constant_node_value
from graphkit.rewrite.simplify._graph import SimplifyScope, attribute_key

__all__ = ["cancel_reshapes", "eliminate_dead", "eliminate_common", "lift_constants", "merge_constants",
           "remove_no_ops"]

_REDUCE = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"})
# Ops that compute each output element from the same element of each input (or a scalar)
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Relu", "Tanh", "Sigmoid", "Erf", "Exp", "Log", "Sqrt",
                          "Neg", "Abs", "Gelu", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "HardSwish", "Softplus",
                          "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Clip", "Max", "Min"})


def lift_constants(ctx: SimplifyContext, model: onnx.ModelProto) -> int:
    """Constant nodes of graphs become initializers (function bodies keep theirs, and so does
    a Constant writing an output of its graph)."""
    lifted = 0
    for scope in ctx.scopes(model):
        if not scope.is_graph or scope.in_function:
            continue
        for k, node in scope.live():
            if node.op_type != "Constant" or node.domain not in AI_ONNX or node.output[0] in scope.output_set:
                continue
            value = constant_node_value(node)
            if value is None:
                continue
            scope.remove(k)
            scope.add_constant(node.output[0], value)
            lifted += 1
        scope.commit()
    return lifted


def _is_false(scope: SimplifyScope, name: str) -> bool:
    if not name:
        return True
    value = scope.value(name)
    return value is not None and value.size == 1 and not bool(value.reshape(-1)[0])


def _no_op_input(ctx: SimplifyContext, scope: SimplifyScope, node: onnx.NodeProto) -> str | None:
    """The input ``node`` passes through unchanged, or None."""
    op, types = node.op_type, ctx.types
    if node.domain not in AI_ONNX or not node.input or not node.input[0] or not node.output:
        return None
    src, out = node.input[0], node.output[0]
    if op == "Identity":
        return src
    if op == "Dropout":
        mask_used = len(node.output) > 1 and node.output[1] and scope.used(node.output[1])
        training = node.input[2] if len(node.input) > 2 else ""
        if mask_used or not _is_false(scope, training):
            return None
        return src
    if types is None:
        return None
    if op == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        return src if to is not None and types.elem_type(src) == to else None
    keeps_dims = op in _REDUCE and not any(a.name == "keepdims" and a.i == 0 for a in node.attribute)
    if op in ("Reshape", "Expand", "Squeeze", "Unsqueeze", "Flatten") or keeps_dims:
        # (a reduction keeping its dims, over axes of size 1, returns its input)
        before, after = types.dims(src), types.dims(out)
        same_type = types.elem_type(src) is not None and types.elem_type(src) == types.elem_type(out)
        if same_type and before is not None and after is not None and before == after and all(
                isinstance(d, int) for d in before):
            return src
        return None
    if op == "Transpose":
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        return src if perm is not None and perm == list(range(len(perm))) else None
    if op == "Concat" and len([i for i in node.input if i]) == 1:
        return src
    if op == "Where" and len(node.input) == 3 and scope.is_constant(src):
        cond = scope.value(src, limit=1 << 16)
        if cond is not None and cond.size and (np.all(cond) or not np.any(cond)):
            chosen = node.input[1] if np.all(cond) else node.input[2]
            dims, out_dims = types.dims(chosen), types.dims(node.output[0])
            if dims is not None and dims == out_dims and types.elem_type(chosen) == types.elem_type(node.output[0]):
                return chosen
    if op in ("Add", "Sub", "Mul", "Div", "And", "Or") and len(node.input) == 2:
        return _neutral_operand(scope, types, node)
    return None


def _neutral_operand(scope: SimplifyScope, types, node: onnx.NodeProto) -> str | None:
    """The input of x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1, x and True, x or False where
    the constant neither widens x by broadcasting nor changes its type (only -0.0 + 0 = +0.0
    differs, a value equal to it)."""
    op, (a, b) = node.op_type, node.input
    for x, c in ((a, b), (b, a)):
        if c == b or op in ("Add", "Mul", "And", "Or"):
            value = scope.value(c, limit=1 << 16) if scope.is_constant(c) else None
            if value is None or value.dtype.kind not in ("b" if op in ("And", "Or") else "fiu"):
                continue
            neutral = {"Add": 0, "Sub": 0, "Mul": 1, "Div": 1, "And": True, "Or": False}[op]
            if not np.all(value == neutral):
                continue
            dims = types.dims(x)
            if dims is None or types.elem_type(x) != types.elem_type(node.output[0]) or value.ndim > len(dims):
                continue
            tail = dims[len(dims) - value.ndim:]
            if all(v == 1 or v == d for v, d in zip(value.shape, tail)):
                return x
    return None


def _merge_pair(ctx: SimplifyContext, scope: SimplifyScope, k: int, node: onnx.NodeProto) -> bool:
    """Unsqueeze(Unsqueeze(x)) -> one Unsqueeze, Reshape(Reshape(x)) -> one Reshape: the outer
    node reads x (each reader of a shared inner node does)."""
    if node.domain not in AI_ONNX or node.op_type not in ("Unsqueeze", "Reshape") or len(node.input) < 2:
        return False
    inner_k = scope.producer.get(node.input[0])
    inner = scope.nodes[inner_k] if inner_k is not None else None
    if inner is None or inner.op_type != node.op_type or inner.domain not in AI_ONNX or len(inner.input) < 2:
        return False
    if node.op_type == "Reshape":
        shape = scope.value(node.input[1], limit=1 << 12)
        if shape is None or np.any(shape == 0) or any(a.name == "allowzero" and a.i for a in node.attribute):
            return False
        scope.set_input(k, 0, inner.input[0])
    else:
        outer_axes, inner_axes = scope.value(node.input[1], limit=1 << 12), scope.value(inner.input[1], limit=1 << 12)
        dims = ctx.types.dims(node.output[0]) if ctx.types is not None else None
        if outer_axes is None or inner_axes is None or dims is None:
            return False
        rank = len(dims)
        mid = rank - outer_axes.size
        first = [int(a) + mid if a < 0 else int(a) for a in inner_axes.reshape(-1)]
        second = sorted(int(a) + rank if a < 0 else int(a) for a in outer_axes.reshape(-1))
        for a in second:  # axes of the first insert shift past each axis the second inserts before them
            first = [f + 1 if f >= a else f for f in first]
        axes = sorted(first + second)
        name = ctx.fresh(node.input[1] + "_merged")
        made = scope.add_constant(name, np.array(axes, dtype=np.int64))
        if made is not None:
            scope.placed.setdefault(k, []).append(made)
        scope.set_input(k, 0, inner.input[0])
        scope.set_input(k, 1, name)
    return True  # (the inner node goes with eliminate-dead once no other node reads it)


def remove_no_ops(ctx: SimplifyContext, model: onnx.ModelProto) -> int:
    """Identity, inference Dropout, Cast to the same type, Reshape/Expand/Squeeze/Unsqueeze/
    Flatten to the same static shape, reductions over axes of size 1, Transpose by the identity, one-input Concat, adding 0
    or multiplying by 1; two Unsqueezes or two Reshapes in a row become one."""
    removed = 0
    for scope in ctx.scopes(model):
        for k, node in scope.live():
            src = _no_op_input(ctx, scope, node)
            if src is not None and scope.bypass(k, node.output[0], src):
                removed += 1
            elif ctx.opset >= 13 and _merge_pair(ctx, scope, k, node):
                removed += 1
        scope.commit()
    return removed


def eliminate_common(ctx: SimplifyContext, model: onnx.ModelProto) -> int:
    """Nodes computing the same op on the same inputs with the same attributes become one."""
    merged = 0
    for scope in ctx.scopes(model):
        seen: dict[tuple, int] = {}
        for k, node in scope.live():
            if node.op_type in NONDETERMINISTIC or any(True for _ in subgraphs(node)):
                continue
            key = (node.domain, node.op_type, tuple(node.input), len(node.output), attribute_key(node))
            first = seen.setdefault(key, k)
            if first == k:
                continue
            if any(o in scope.output_set for o in node.output):
                continue
            earlier = scope.nodes[first].output
            scope.remove(k)
            for mine, theirs in zip(node.output, earlier):
                if mine:
                    scope.replace_uses(mine, theirs)
            merged += 1
        scope.commit()
    return merged


def _tensor_key(t: onnx.TensorProto, scope: SimplifyScope) -> tuple | None:
    """(type, dims): tensors that may be equal; their bytes are compared only within a group.
    External weights are never read, but those of the model's own file (inline weights)."""
    if (t.data_location == onnx.TensorProto.EXTERNAL and not scope.in_model_file(t)) or \
            t.data_type == onnx.TensorProto.STRING:
        return None
    return t.data_type, tuple(t.dims)


def _bytes(t: onnx.TensorProto, scope: SimplifyScope) -> bytes | None:
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return scope.raw_bytes(t)
    return t.raw_data if t.HasField("raw_data") else onnx.numpy_helper.to_array(t).tobytes()


def _ends(t: onnx.TensorProto, scope: SimplifyScope) -> tuple[tuple, bytes | None] | None:
    """(length, first and last 32 bytes), and the bytes where they were read whole (an
    inline tensor; a weight of the model's file is read whole only if another has its ends)."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        ends = scope.raw_bytes(t, ends=32)
        return None if ends is None else ((scope.raw_length(t), *ends), None)
    data = _bytes(t, scope)
    return (len(data), data[:32], data[-32:]), data


def _same_bytes(tensors: list[tuple[str, onnx.TensorProto]], scope: SimplifyScope) -> list[list[str]]:
    """Names grouped by equal bytes: ends of each first (weights of one shape rarely share
    them), whole digests only within a group of ends."""
    by_ends: dict[tuple, list[tuple[str, onnx.TensorProto, bytes | None]]] = {}
    for name, t in tensors:
        got = _ends(t, scope)
        if got is not None:
            by_ends.setdefault(got[0], []).append((name, t, got[1]))
    out = []
    for group in by_ends.values():
        if len(group) < 2:
            continue
        by_digest: dict[bytes, list[str]] = {}
        for name, t, data in group:
            data = _bytes(t, scope) if data is None else data
            if data is not None:
                by_digest.setdefault(hashlib.blake2b(data, digest_size=16).digest(), []).append(name)
        out.extend(names for names in by_digest.values() if len(names) > 1)
    return out


def merge_constants(ctx: SimplifyContext, model: onnx.ModelProto) -> int:
    """Initializers of one graph with equal type, shape and bytes become one (not those a
    caller may override as graph inputs)."""
    merged = 0
    for scope in ctx.scopes(model):
        if not scope.is_graph or len(scope.initializers) < 2:
            continue
        groups: dict[tuple, list[str]] = {}
        for name, tensor in scope.initializers.items():
            if not scope.is_overridable(name) and name not in scope.output_set:
                key = _tensor_key(tensor, scope)
                if key is not None:
                    groups.setdefault(key, []).append(name)
        for names in groups.values():
            if len(names) < 2:
                continue  # (a weight of a shape no other has is never read)
            for first, *rest in _same_bytes([(n, scope.initializers[n]) for n in names], scope):
                for name in rest:
                    scope.replace_uses(name, first)
                    scope.dropped_initializers.add(name)
                    del scope.initializers[name]
                    merged += 1
        scope.commit()
    return merged


def eliminate_dead(ctx: SimplifyContext, model: onnx.ModelProto) -> int:
    """Nodes whose outputs nothing reads, initializers nothing reads (graph inputs stay),
    local functions nothing calls and function inputs their bodies do not read."""
    removed = 0
    for scope in ctx.scopes(model):
        for k in range(len(scope.nodes) - 1, -1, -1):
            node = scope.nodes[k]
            if node is None or any(o and scope.used(o) for o in node.output):
                continue
            scope.remove(k)
            removed += 1
        if scope.is_graph:
            for name in list(scope.initializers):
                if name not in scope.input_set and not scope.used(name):
                    scope.dropped_initializers.add(name)
                    removed += 1
        scope.commit()
    removed += _unused_functions(model)
    removed += _unused_function_inputs(ctx, model)
    if removed:
        _drop_stale_value_info(model)
    return removed


def _calls(model: onnx.ModelProto) -> dict[tuple[str, str], list[onnx.NodeProto]]:
    calls: dict[tuple[str, str], list[onnx.NodeProto]] = {}
    local = {(f.domain, f.name) for f in model.functions}
    for _, v in walk(model):
        for node in v.nodes:
            if (node.domain, node.op_type) in local:
                calls.setdefault((node.domain, node.op_type), []).append(node)
    return calls


def _unused_functions(model: onnx.ModelProto) -> int:
    removed = 0
    while True:
        calls = _calls(model)
        keep = [f for f in model.functions if (f.domain, f.name) in calls]
        if len(keep) == len(model.functions):
            return removed
        removed += len(model.functions) - len(keep)
        del model.functions[:]
        model.functions.extend(keep)


def _unused_function_inputs(ctx: SimplifyContext, model: onnx.ModelProto) -> int:
    removed = 0
    calls = _calls(model)
    for fn in model.functions:
        scope = SimplifyScope(fn, in_function=True)
        unused = [i for i, name in enumerate(fn.input) if not scope.used(name)]
        if not unused:
            continue
        keep = [name for i, name in enumerate(fn.input) if i not in unused]
        del fn.input[:]
        fn.input.extend(keep)
        for node in calls.get((fn.domain, fn.name), []):
            given = [name for i, name in enumerate(node.input) if i not in unused]
            while given and not given[-1]:
                given.pop()
            del node.input[:]
            node.input.extend(given)
        removed += len(unused)
    return removed


def _drop_stale_value_info(model: onnx.ModelProto) -> None:
    for g in graphs(model.graph):
        names = {o for n in g.node for o in n.output} | {i.name for i in g.input} | {t.name for t in g.initializer}
        if any(vi.name not in names for vi in g.value_info):
            keep = [vi for vi in g.value_info if vi.name in names]
            del g.value_info[:]
            g.value_info.extend(keep)


def _scalar_like(scope: SimplifyScope, name: str, rank: int) -> bool:
    value = scope.value(name, limit=64) if scope.is_constant(name) else None
    return value is not None and value.size == 1 and value.ndim <= rank


def _returns_to(ctx: SimplifyContext, scope: SimplifyScope, node: onnx.NodeProto, dims: list) -> bool:
    """Whether Reshape ``node`` gives back the shape ``dims`` (that of a tensor with as many
    elements as its input)."""
    after = ctx.types.dims(node.output[0])
    if after is not None and after == dims and all(isinstance(d, int) for d in dims):
        return True
    target = scope.value(node.input[1], limit=1 << 10) if scope.is_constant(node.input[1]) else None
    if target is None or target.ndim != 1 or len(target) != len(dims) or np.any(target == 0):
        return False
    free = [i for i, d in enumerate(target) if d == -1]
    return len(free) <= 1 and all(int(t) == d for i, (t, d) in enumerate(zip(target, dims)) if i not in free)


def cancel_reshapes(ctx: SimplifyContext, model: onnx.ModelProto) -> int:
    """Reshape -> elementwise ops (with scalar constants) -> Reshape back to the first input's
    shape: both Reshapes go, the elementwise ops compute on the input's shape (what a dynamo
    export writes around every Linear: Reshape, Gemm, Reshape, GELU, Reshape, Gemm)."""
    cancelled = 0
    for scope in ctx.scopes(model):
        changed_values: set[str] = set()
        for k, node in scope.live():
            if node.op_type != "Reshape" or node.domain not in AI_ONNX or len(node.input) < 2:
                continue
            region = _sandwich(ctx, scope, node)
            if region is None:
                continue
            nodes, exits = region
            x, y = node.input[0], node.output[0]
            scope.remove(k)
            scope.replace_uses(y, x)
            for e in exits:
                scope.bypass(e, scope.nodes[e].output[0], scope.nodes[e].input[0])
            changed_values.update(o for i in nodes for o in scope.nodes[i].output)
            cancelled += 1
        if changed_values and scope.is_graph:
            keep = [vi for vi in scope.owner.value_info if vi.name not in changed_values]
            del scope.owner.value_info[:]
            scope.owner.value_info.extend(keep)
        scope.commit()
    return cancelled


def _sandwich(ctx: SimplifyContext, scope: SimplifyScope, first: onnx.NodeProto) -> tuple[list[int], list[int]] | None:
    """(elementwise nodes, closing Reshapes) between Reshape ``first`` and the Reshapes that
    undo it, where every value in between is read only there; None otherwise."""
    x, y = first.input[0], first.output[0]
    dx, dy = ctx.types.dims(x), ctx.types.dims(y)
    if dx is None or dy is None or y in scope.output_set or ctx.types.elem_type(x) != ctx.types.elem_type(y):
        return None
    rank = min(len(dx), len(dy))
    inside, exits, queue = {y}, [], [y]
    nodes: list[int] = []
    seen: set[int] = set()
    while queue:
        value = queue.pop()
        for r in scope.readers(value):
            if r in seen:
                continue
            reader = scope.nodes[r]
            if reader.domain not in AI_ONNX:
                return None
            if reader.op_type == "Reshape" and reader.input[0] == value and _returns_to(ctx, scope, reader, dx):
                seen.add(r)
                exits.append(r)
                continue
            if reader.op_type not in _ELEMENTWISE or len(reader.output) != 1 or len(nodes) >= 64:
                return None
            seen.add(r)
            nodes.append(r)
            out = reader.output[0]
            if out in scope.output_set or ctx.types.elem_type(out) != ctx.types.elem_type(y):
                return None
            inside.add(out)
            queue.append(out)
    for r in nodes:  # every other operand is a scalar constant, or made in the region
        for name in scope.nodes[r].input:
            if name and name not in inside and not _scalar_like(scope, name, rank):
                return None
    for r in nodes:  # and nothing else reads what the region makes
        out = scope.nodes[r].output[0]
        if any(reader not in seen for reader in scope.readers(out)):
            return None
    return (nodes, exits) if exits else None
