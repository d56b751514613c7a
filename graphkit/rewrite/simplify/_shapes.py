"""Symbolic dims past ONNX inference, for the simplify passes: the model's types and shapes are
the engine's type table (graph/types.py: ``TypeTable.inferred(model, registry,
without_weights=True, data_prop=True)``, ONNX shape inference with every custom op's shape
function known, run on a copy of the model without its large weights), read through
``TypeTable.dims`` / ``static_shape`` / ``elem_type``; :func:`refine` is the step run on it.

A dim is an int, a symbol (str: the model's dim_param, the "unk__N" ONNX inference gives a
dim it cannot tell, or a name made for a dim with no name at all) or None. Two dims with
the same symbol are equal: dim_params are the model's own statement that two dims agree, as
ONNX Runtime and every simplifier read them, and inference copies an unk__ name with its dim;
a dim with no name gets a symbol of its own tensor and axis.

Where inference makes up an unk__N (out of a Range, a broadcast, a MatMul, an Expand, a
Reshape's -1, a Concat), the dim is computed again from the inputs' dims and the values of
the shape arithmetic feeding it, and an unk__N proved equal to another dim is read as that
dim everywhere (a light symbolic shape inference; see ``refine``).
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper, numpy_helper

from graphkit.ops import OpRegistry
from graphkit.rewrite.graph.inference import small_initializer
from graphkit.rewrite.graph.types import TypeTable

__all__ = ["refine", "simplify_types"]


def simplify_types(model: onnx.ModelProto, registry: OpRegistry) -> TypeTable:
    """The table the simplify passes read: ONNX inference on ``model`` without its large
    weights, with data propagation, then :func:`refine` (best effort: where inference fails,
    what the model declares)."""
    types = TypeTable.inferred(model, registry, without_weights=True, data_prop=True)
    refine(model, types)
    return types


# -- symbolic dims past what ONNX inference tells ------------------------------------------
# ONNX inference gives a fresh unk__N where a dim comes out of a Range, a broadcast of two
# different symbols, a Reshape's -1, a Concat's sum or an Expand. _refine recomputes those
# dims from their inputs (each rule below holds for every input the op accepts) and, where it
# proves an unk__N (or an unnamed dim) equal to another dim, reads that name as the other dim
# everywhere: inference copies one unk__N wherever its dim goes.

_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "Greater", "LessOrEqual",
                        "GreaterOrEqual", "And", "Or", "Xor", "BitShift", "Max", "Min", "Sum", "Mean", "Where"})
_VALUE_OPS = frozenset({"Constant", "Shape", "Identity", "Cast", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice",
                        "Where"})
_INT_ELEMS = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def _rank(d: Any) -> int:
    """How much a dim says: a number, a name of the model's, a name inference made, no name."""
    if isinstance(d, int):
        return 0
    return 3 if d.startswith("?") else 2 if d.startswith("unk__") else 1


class _Dims:
    """Names proved equal to another dim (a union-find over the unk__N and unnamed dims)."""

    def __init__(self) -> None:
        self.parent: dict[str, Any] = {}

    def find(self, d: Any) -> Any:
        seen = []
        while isinstance(d, str) and d in self.parent:
            seen.append(d)
            d = self.parent[d]
        for s in seen[:-1]:
            self.parent[s] = d
        return d

    def resolve(self, dims: list[Any] | None) -> list[Any] | None:
        return None if dims is None or not self.parent else [self.find(d) for d in dims]

    def learn(self, told: Any, proved: Any) -> Any:
        """``told`` (inference's dim) is ``proved``: the dim to record."""
        told, proved = self.find(told), self.find(proved)
        if proved is None or told == proved or isinstance(told, int) or _rank(told) == 1:
            return told
        if _rank(proved) <= _rank(told):
            self.parent[told] = proved
            return proved
        return told


def _broadcast_dim(a: Any, b: Any) -> Any:
    """The dim of a multidirectional broadcast of dims ``a`` and ``b`` (None: not known)."""
    if a == b or b == 1:
        return a
    if a == 1:
        return b
    if isinstance(a, int):  # b is 1 or a
        return a
    if isinstance(b, int):
        return b
    return None


def _broadcast_dims(shapes: list[list[Any]]) -> list[Any]:
    rank = max(len(s) for s in shapes)
    out: list[Any] = []
    for axis in range(rank):
        d: Any = 1
        for s in shapes:
            k = axis - (rank - len(s))
            if k >= 0:
                d = None if d is None else _broadcast_dim(d, s[k])
        out.append(d)
    return out


def _quotient(total: list[Any], known: list[Any]) -> Any:
    """prod(total) / prod(known) where it is a number or one symbol (None: not known)."""
    coef, symbols = 1, []
    for d in total:
        if isinstance(d, int):
            coef *= d
        else:
            symbols.append(d)
    div = 1
    for d in known:
        if isinstance(d, int):
            div *= d
        elif d in symbols:
            symbols.remove(d)
        else:
            return None
    if div <= 0 or coef % div:
        return None
    q = coef // div
    if not symbols:
        return q
    return symbols[0] if len(symbols) == 1 and q == 1 else None


def refine(model: onnx.ModelProto, types: TypeTable) -> None:
    """Refine the dims ``types`` (a table of inference only) gives the outputs of ``model``'s
    main graph nodes (in their order); ``types.dims`` answers the refined dims from then on."""
    graph = model.graph
    eq = _Dims()
    overridable = {i.name for i in graph.input}
    consts = {t.name: t for t in graph.initializer if t.name not in overridable and small_initializer(t)}
    values: dict[str, tuple[bool, list[Any]]] = {}  # int tensors of rank <= 1: (scalar?, entries)
    proved: dict[str, list[Any] | None] = {}
    known = types.dims

    def dims_of(name: str) -> list[Any] | None:
        got = proved[name] if name in proved else known(name)
        return None if got is None else (eq.resolve(got) or got)

    def value(name: str) -> tuple[bool, list[Any]] | None:
        if name in values:
            scalar, entries = values[name]
            return scalar, [eq.find(d) for d in entries]
        t = consts.get(name)
        if t is None or t.data_type not in _INT_ELEMS or len(t.dims) > 1:
            return None
        array = numpy_helper.to_array(t)
        got = (array.ndim == 0, [int(v) for v in array.reshape(-1)])
        values[name] = got
        return got

    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        op = node.op_type
        if op in _VALUE_OPS:
            got = _value(op, node, value, dims_of, consts)
            if got is not None:
                values[node.output[0]] = got
            if op != "Where":
                continue
        found = _dims_rule(op, node, value, dims_of)
        if found is None or not node.output or node.output[0] not in types:
            continue
        out = node.output[0]
        told = proved[out] if out in proved else known(out)
        if told is None:
            proved[out] = [f"?{out}#{k}" if d is None else d for k, d in enumerate(found)]
        elif len(told) == len(found):
            proved[out] = [eq.learn(t, p) for t, p in zip(told, found)]
    types.refine_dims(proved, eq.resolve if eq.parent else None)


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _dims_rule(op: str, node: onnx.NodeProto, value, dims_of) -> list[Any] | None:
    """The output dims of ``node`` from its inputs' dims and values, where the rule for
    ``op`` tells them (None: not known; an entry None: that dim not known)."""
    if op in _BROADCAST:
        shapes = [dims_of(i) for i in node.input if i]
        if not shapes or any(s is None for s in shapes):
            return None
        out = _broadcast_dims(shapes)
    elif op == "MatMul":
        a, b = (dims_of(i) for i in node.input[:2])
        if a is None or b is None or len(a) < 2 or len(b) < 2:
            return None
        out = _broadcast_dims([a[:-2], b[:-2]]) + [a[-2], b[-1]]
    elif op == "Expand":
        a, target = dims_of(node.input[0]), value(node.input[1])
        if a is None or target is None or target[0] or any(isinstance(d, int) and d < 0 for d in target[1]):
            return None
        out = _broadcast_dims([a, target[1]])
    elif op == "Reshape":
        return _reshape_dims(node, dims_of(node.input[0]), value(node.input[1]))
    elif op == "Range":
        got = [value(i) for i in node.input[:3]]
        if any(g is None or not g[0] for g in got):
            return None
        start, limit, delta = (g[1][0] for g in got)
        if all(isinstance(v, int) for v in (start, limit, delta)) and delta:
            return [max(0, -((start - limit) // delta))]
        # (a symbol in a value is a dim: never negative)
        return [limit] if start == 0 and delta == 1 else None
    elif op == "Concat":
        shapes = [dims_of(i) for i in node.input if i]
        if not shapes or any(s is None or len(s) != len(shapes[0]) for s in shapes):
            return None
        axis = _attr(node, "axis", 0)
        axis = axis + len(shapes[0]) if axis < 0 else axis
        out = []
        for k in range(len(shapes[0])):
            column = [s[k] for s in shapes]
            if k == axis:
                rest = [d for d in column if d != 0]
                out.append(sum(rest) if all(isinstance(d, int) for d in rest) else rest[0] if len(rest) == 1 else None)
            else:  # (every input has this dim)
                out.append(min(column, key=_rank))
        return out
    else:
        return None
    return out


def _reshape_dims(node: onnx.NodeProto, dims: list[Any] | None, target: tuple[bool, list[Any]] | None) -> list[Any] | None:
    if dims is None or target is None or target[0]:
        return None
    allowzero = _attr(node, "allowzero", 0)
    out: list[Any] = []
    free = None
    for k, d in enumerate(target[1]):
        if d == 0 and not allowzero:
            if k >= len(dims):
                return None
            out.append(dims[k])
        elif d == -1:
            if free is not None:
                return None
            free = k
            out.append(None)
        elif isinstance(d, int) and d < 0:
            return None
        else:
            out.append(d)
    if free is not None:
        if 0 in dims:
            return None  # (-1 with a zero-sized input is ambiguous)
        out[free] = _quotient(dims, [d for k, d in enumerate(out) if k != free])
    return out


def _value(op: str, node: onnx.NodeProto, value, dims_of, consts) -> tuple[bool, list[Any]] | None:
    """The entries of int tensor ``node.output[0]`` of rank <= 1 (ints, or symbols of dims)."""
    if op == "Where":  # on a constant condition (torch's expand writes Where(shape == -1, 1, shape))
        cond = consts.get(node.input[0]) if len(node.input) == 3 else None
        if cond is None or cond.data_type != onnx.TensorProto.BOOL or len(cond.dims) > 1:
            return None
        x, y = value(node.input[1]), value(node.input[2])
        if x is None or y is None:
            return None
        flags = [bool(c) for c in numpy_helper.to_array(cond).reshape(-1)]
        n = max(len(flags), len(x[1]), len(y[1]))
        if any(len(v) not in (1, n) for v in (flags, x[1], y[1])):
            return None
        pick = [(x[1] if len(x[1]) > 1 else x[1] * n)[k] if (flags if len(flags) > 1 else flags * n)[k]
                else (y[1] if len(y[1]) > 1 else y[1] * n)[k] for k in range(n)]
        return len(cond.dims) == 0 and x[0] and y[0], pick
    if op == "Constant":
        t = _attr(node, "value")
        if not isinstance(t, onnx.TensorProto) or t.data_type not in _INT_ELEMS or len(t.dims) > 1:
            return None
        array = numpy_helper.to_array(t)
        return array.ndim == 0, [int(v) for v in array.reshape(-1)]
    if op == "Shape":
        dims = dims_of(node.input[0])
        if dims is None:
            return None
        return False, list(dims[slice(_attr(node, "start", 0), _attr(node, "end"))])
    first = value(node.input[0]) if node.input and node.input[0] else None
    if first is None:
        return None
    if op in ("Identity", "Cast"):
        return first if op == "Identity" or _attr(node, "to") in _INT_ELEMS else None
    if op == "Squeeze":
        return (True, first[1]) if not first[0] and len(first[1]) == 1 else None
    if op == "Unsqueeze":
        return (False, first[1]) if first[0] else None
    if op == "Concat":
        parts = [value(i) for i in node.input]
        if any(p is None or p[0] for p in parts):
            return None
        return False, [d for p in parts for d in p[1]]
    if op == "Gather":
        idx = value(node.input[1]) if len(node.input) > 1 else None
        if first[0] or idx is None or _attr(node, "axis", 0) != 0:
            return None
        n = len(first[1])
        if not all(isinstance(i, int) and -n <= i < n for i in idx[1]):
            return None
        return idx[0], [first[1][i] for i in idx[1]]
    if op == "Slice":
        args = [value(i) if i else None for i in node.input[1:5]]
        if first[0] or len(args) < 2 or any(node.input[1 + k] and a is None for k, a in enumerate(args)):
            return None
        starts, ends = args[0][1], args[1][1]
        axes = args[2][1] if len(args) > 2 and args[2] is not None else [0]
        steps = args[3][1] if len(args) > 3 and args[3] is not None else [1]
        if len(starts) != 1 or axes[0] not in (0, -1) or not all(isinstance(v, int) for v in (*starts, *ends, *steps)):
            return None
        if steps[0] == 0:
            return None
        return False, list(first[1][slice(starts[0], ends[0], steps[0])])
    return None
