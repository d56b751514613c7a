"""ai.onnx opset conversion by graphkit's own adapters: one pass over every scope, linear.

Why not onnx's version converter: ``onnx.version_converter.convert_version`` runs ONNX shape
inference on the whole model first (``InferShapes`` in onnx's cpp2py_export.cc), and shape
inference gives every subgraph a copy of its enclosing scope's map of value types
(``ShapeInferenceImplBase``'s ``value_types_by_name(outer_scope_value_types_by_name)``): the
cost is the number of If/Loop/Scan bodies times the number of values around them (2000 If
nodes: 1.05 s; the same after 20000 Relus: 24 s; import and export alone, 17 -> 17, already
grow 6.8x per 2x If nodes). Its IR (onnx/common/ir.h up to onnx 1.23) besides names every
new value after a scan of all nodes, subgraphs included (``Graph::isNameUnique``).

Here each node is looked at once. For each standard op, the schema versions between the two
opsets are steps, each of a kind decided from ONNX's changelog (:data:`STEP_KINDS`, checked
against the schemas by the tests):

- ``types``: the same inputs, outputs and attributes (types were added: bfloat16, int4, ...).
  Up: nothing changes. Down: the node's known element types must be ones the older op takes,
  and it must not use an attribute value the newer version added (:data:`_NEW_VALUES`), nor
  one it made legal beyond integers (:data:`_NEW_FOR_FLOATS`: Mod-28's fmod=0 on floats);
- ``attributes``: the newer version added attributes whose default is what the older op does
  (:data:`_ADDED_ATTRIBUTES`). Down: each must be absent or at that default, then dropped
  (also Reshape's allowzero=1 where the shape is a constant without a 0: it changes nothing);
- ``optional-input``: an optional input was added at the end (Pad-18's axes). Down: absent;
- ``to-input``: an attribute became an input (ReduceX axes at 13/18, Squeeze/Unsqueeze axes
  and Split's split at 13). Up: the attribute's value as an int64 initializer of the main
  graph, one per distinct value, which every subgraph reads from the outer scope (no node
  list is copied or reordered); below IR 4 (where an initializer must be a graph input) and
  in a function body (no initializers there) a Constant node first in the graph or body, ``value_ints = @attr`` where the attribute referred to the function's.
  Down: the input must be a constant (Constant node or initializer, from IR 4 on not also a
  graph input: a value fed would replace it); it becomes the
  attribute again, and a Constant or initializer nothing else reads is removed, as onnx's
  converter does;
- ``last-axis``: Softmax, LogSoftmax and Hardmax at 13 no longer flatten to 2-D and default
  to axis -1 (was 1): the same op where the axis is the last one (-1, or rank - 1 where the
  rank is declared), whose value is then written out; any other axis going up is onnx's (it
  adds a Flatten and a Reshape); going below 13, where the older op would flatten to 2-D at
  it (onnx's converter keeps the axis: a wrong result), a Transpose moves it last and one
  moves it back, where the input's rank is declared (else the node is refused);
- ``per-channel``: GroupNormalization-21's scale and bias are one value per channel, one per
  group before. Up: each is repeated over its group's channels (Unsqueeze, Expand to
  [groups, channels / groups], Reshape to [channels]; the channel count from the input's
  shape at run time where it is not declared). Down: refused (:data:`_MEANING_CHANGED`);
- ``num-outputs``: Split-18's ``num_outputs``. Up: set where no split sizes are given. Down:
  dropped where the parts are even, else the sizes opset 18 gives become the split input;
  where the axis' length is unknown (declared neither in the node's scope nor, in a
  function body, in the function's value_info), nodes before the Split compute them from the input's shape at run time (the older
  Splits' even split would refuse an uneven length), and below opset 13, where the sizes are
  an attribute, the node is refused.

Going down, a node of an op the target opset lacks (LayerNormalization below 17,
GroupNormalization below 18, Gelu below 20, RMSNormalization below 23: any op ONNX gives a
function body built for the node), or whose meaning changed in between
(GroupNormalization across 21), is first replaced by the nodes of ONNX's own function body
for it (made for its attributes and its inputs' declared element types, its values named
apart), which the steps above then take down like any other node. An op whose meaning
changed with neither (:data:`_MEANING_CHANGED`) is refused going down. A node whose op has a step of no kind here (Resize at 11, Softmax over a middle axis at 13,
anything before opset 12 going down, ...) is converted by onnx's converter, all such nodes
in batches of :data:`_BATCH` per call, each node on its own in the batch's model (inputs
typed as declared in its scope), and the nodes it makes put in its place. Only such a node
holding subgraphs (If/Loop/Scan going below 12) leaves the whole model to onnx's converter:
:func:`convert` says so (``Converted.fallback``), having changed nothing. A node our
adapters, or onnx's converter on its own, refuse (axes that are not constants, a type or
attribute value the older op lacks) is a :class:`~graphkit.errors.RewriteError`
naming the node, the op and what to do.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import onnx
from onnx import helper, numpy_helper

from graphkit.errors import RewriteError
from graphkit.rewrite.graph.walk import AI_ONNX, ModelIndex, ScopedTypes, graphs, subgraphs, value_types
from graphkit.rewrite.lowering.builder import NameGenerator

__all__ = ["STEP_KINDS", "NodeConverter", "convert", "int64_initializer", "node_steps", "split_18_runtime_sizes",
           "split_18_sizes", "steps"]

_REDUCE = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
           "ReduceProd", "ReduceSumSquare")
_ONES = "all ones"  # an ints attribute whose every value is 1 (dilations)
_ABSENT = None      # the attribute must be absent

# (op, version that made the change) -> the attribute that became input 1.
_TO_INPUT = {("ReduceSum", 13): "axes", ("Squeeze", 13): "axes", ("Unsqueeze", 13): "axes", ("Split", 13): "split",
             **{(op, 18): "axes" for op in _REDUCE}}
# (op, version) -> {added attribute: the value that does what the older version did}.
_ADDED_ATTRIBUTES: dict[tuple[str, int], dict[str, Any]] = {
    ("ArgMax", 12): {"select_last_index": 0}, ("ArgMin", 12): {"select_last_index": 0},
    ("AveragePool", 19): {"dilations": _ONES},
    ("Cast", 19): {"saturate": 1}, ("CastLike", 19): {"saturate": 1},
    ("Constant", 11): {"sparse_value": _ABSENT},  # (and value no longer required: one of them is)
    ("Constant", 12): {n: _ABSENT for n in ("value_float", "value_floats", "value_int", "value_ints",
                                            "value_string", "value_strings")},
    ("DepthToSpace", 11): {"mode": b"DCR"},
    ("GatherND", 12): {"batch_dims": 0},
    ("LpPool", 18): {"ceil_mode": 0, "dilations": _ONES},
    ("MaxPool", 10): {"ceil_mode": 0, "dilations": _ONES},
    ("QuantizeLinear", 19): {"saturate": 1},
    ("Reshape", 14): {"allowzero": 0},
    ("Resize", 18): {"antialias": 0, "axes": _ABSENT, "keep_aspect_ratio_policy": b"stretch"},
    ("ScatterElements", 16): {"reduction": b"none"}, ("ScatterND", 16): {"reduction": b"none"},
    ("Shape", 15): {"start": 0, "end": _ABSENT},
    ("TopK", 11): {"largest": 1, "sorted": 1},
    **{(op, 14): {"layout": 0} for op in ("GRU", "LSTM", "RNN")},
}
# (op, version) -> index of the optional input it added at the end.
_OPTIONAL_INPUT = {("Pad", 18): 3}
# (op, version) -> (attribute, values that version added), for steps of kind "types".
_NEW_VALUES = {("Pad", 19): ("mode", {b"wrap"}),
               ("Resize", 19): ("coordinate_transformation_mode", {b"half_pixel_symmetric"}),
               ("ScatterElements", 18): ("reduction", {b"max", b"min"}),
               ("ScatterND", 18): ("reduction", {b"max", b"min"})}
# (op, version) -> (attribute, its value (also when absent)) that version made legal on other
# than integer inputs, for steps of kind "types": Mod-28's fmod=0 on floats (floor modulo).
_NEW_FOR_FLOATS = {("Mod", 28): ("fmod", 0)}
_INTEGERS = frozenset(getattr(onnx.TensorProto, t) for t in (
    "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"))
# (op, version) where an op over "axis" stopped flattening the input to 2-D there (and its
# default axis went from 1 to -1): the same where the axis is the last one.
_LAST_AXIS = {("Softmax", 13), ("LogSoftmax", 13), ("Hardmax", 13)}
# (op, version) whose meaning changed with no adapter down here nor in onnx's converter
# (which leaves the node as it is): a conversion down across it makes the node ONNX's
# function body for the op where it has one (_expand_functions), else is refused, with why.
_MEANING_CHANGED = {("GroupNormalization", 21): "its scale and bias went from one value per group to one "
                                                "per channel at opset 21, and no converter rewrites them"}
# (op, version) whose per-group scale and bias became per channel there: up, each is repeated
# over its group's channels.
_PER_CHANNEL = {("GroupNormalization", 21)}
# Deprecated ops onnx's converter replaces by others: never "types".
_DEPRECATED = frozenset({"Upsample", "Scatter"})
# Below this, "types" steps also added negative axes and broadcasting: down is onnx's.
_TYPES_DOWN_FROM = 12

STEP_KINDS = ("types", "attributes", "optional-input", "to-input", "num-outputs", "last-axis", "per-channel")


@dataclass(frozen=True)
class Step:
    """One version change of an op: ``old`` and ``new`` are consecutive schema versions."""

    op: str
    old: int
    new: int
    kind: str

    @property
    def schema_old(self) -> onnx.defs.OpSchema:
        return onnx.defs.get_schema(self.op, self.old, "")


def _interface(s: onnx.defs.OpSchema) -> tuple:
    return ([(f.name, f.option) for f in s.inputs], [(f.name, f.option) for f in s.outputs],
            {n: (a.type, a.required, a.default_value.SerializeToString()) for n, a in s.attributes.items()})


def _kind(op: str, old: onnx.defs.OpSchema, new: onnx.defs.OpSchema) -> str | None:
    key = (op, new.since_version)
    if key in _TO_INPUT:
        return "to-input"
    if key == ("Split", 18):
        return "num-outputs"
    if key in _ADDED_ATTRIBUTES:
        return "attributes"
    if key in _OPTIONAL_INPUT:
        return "optional-input"
    if key in _LAST_AXIS:
        return "last-axis"
    if key in _PER_CHANNEL:
        return "per-channel"
    if op not in _DEPRECATED and _interface(old) == _interface(new):
        return "types"
    return None


@functools.lru_cache(maxsize=None)
def steps(op: str, a: int, b: int) -> tuple[Step, ...] | None:
    """The steps taking ai.onnx ``op`` from opset ``a`` to ``b``, in the order they apply
    (newest first going down); None when one of them has no adapter here."""
    low, high = sorted((a, b))
    try:
        first = onnx.defs.get_schema(op, low, "")
        last = onnx.defs.get_schema(op, high, "")
    except onnx.defs.SchemaError:
        return None
    if last.deprecated or (first.deprecated and not any(op == o for o, _ in _PER_CHANNEL)):  # GN-18: per group
        return None
    chain = [first]
    while chain[-1].since_version != last.since_version:
        # the schema right after chain[-1]: the one in force at last's version, searched down
        version, nxt = last.since_version, last
        while True:
            prev = onnx.defs.get_schema(op, version - 1, "")
            if prev.since_version == chain[-1].since_version:
                break
            version, nxt = prev.since_version, prev
        chain.append(nxt)
    out = []
    for old, new in zip(chain, chain[1:]):
        kind = _kind(op, old, new)
        if kind is None or (a > b and kind == "types" and new.since_version < _TYPES_DOWN_FROM):
            return None
        out.append(Step(op, old.since_version, new.since_version, kind))
    return tuple(out if a < b else reversed(out))


# Nodes no adapter covers given to onnx's converter per call: a call costs ~14 ms whatever
# the model (it builds its tables), and its IR costs the square of a graph's inputs (each new
# value's name is checked against every node's outputs, the inputs' node's included).
_BATCH = 200
# Step kinds that change a node going up (the others only check going down).
_ACTIVE_UP = frozenset({"to-input", "num-outputs", "last-axis", "per-channel"})
_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


@dataclass
class _Conversion:
    target: int
    path: str | None
    model: onnx.ModelProto
    taken: set[str] | None = None  # the model's names, where the caller knows them
    up: bool = True
    function: onnx.FunctionProto | None = None  # the node's, None in the main graph
    graph: onnx.GraphProto | None = None  # the node's subgraph, None in the main graph (or a function's body)
    nodes: Any = None  # the node list holding the node
    made: list[str] = field(default_factory=list)  # names of the values made
    released: list[tuple[Any, Any]] = field(default_factory=list)  # (constant, its list): read no more here
    pick: str = "pick a --target-opset"  # how a hint asks for another target: "<pick> of at least 13"
    keep: str = "keep the model's opset"  # how a hint asks for none
    _names: NameGenerator | None = None
    _types: ScopedTypes | None = None
    _constants: dict[int, _Constants] = field(default_factory=dict)
    _function_types: dict[int, dict[str, onnx.TypeProto]] = field(default_factory=dict)
    shared: dict[tuple, str] = field(default_factory=dict)  # (namespace, input, values) -> constant made
    values: dict[int, list[int]] = field(default_factory=dict)  # id of a constant read -> its ints
    new_constants: dict[int, tuple[Any, list[tuple[str, Any]]]] = field(default_factory=dict)
    replaced: dict[int, Any] = field(default_factory=dict)  # id -> a node list to rebuild, in walk order
    placed: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)  # id(node) -> the nodes in its place
    wrapped: dict[int, tuple[onnx.NodeProto, onnx.NodeProto]] = field(default_factory=dict)  # id -> Transposes around it

    def put_before(self, node: onnx.NodeProto, made: list[onnx.NodeProto]) -> None:
        """Put ``made`` before ``node`` in its node list (when the lists are rebuilt, once each)."""
        self.replaced.setdefault(id(self.nodes), self.nodes)
        self.placed[id(node)] = [*made, node]

    @property
    def names(self) -> NameGenerator:
        """Names that clash with none of the model's (made on first use: most conversions need none)."""
        if self._names is None:
            self._names = NameGenerator(ModelIndex(self.model).names if self.taken is None else self.taken)
        return self._names

    @property
    def types(self) -> Mapping[str, onnx.TypeProto] | None:
        """The declared types of the values the node sees (its subgraph's, then the graphs'
        around it: sibling subgraphs may each define one name); in a function body, its
        value_info's."""
        if self.function is not None:
            if id(self.function) not in self._function_types:
                self._function_types[id(self.function)] = _function_types(self.function)
            return self._function_types[id(self.function)]
        if self._types is None:
            self._types = value_types(self.model, infer=False)
        return self._types if self.graph is None else self._types.scope(self.graph)

    def constant(self, name: str) -> tuple[Any, Any] | None:
        """The constant (Constant node or initializer, with the list holding it) ``name`` is
        where the node is: its subgraph's, else the graphs' around it (sibling subgraphs may
        each define one name), in the node's namespace (the main graph's or its function's)."""
        holder = self.model.graph if self.function is None else self.function
        if id(holder) not in self._constants:
            self._constants[id(holder)] = _Constants(holder, overridable=self.model.ir_version >= 4)
        return self._constants[id(holder)].get(name, self.graph)

    def error(self, node: onnx.NodeProto, message: str, hint: str) -> RewriteError:
        where = f" (in function {self.function.name})" if self.function is not None else ""
        return RewriteError(f"cannot convert {node.op_type} to ai.onnx opset {self.target}{where}: {message}",
                            path=self.path, node=node.name or (node.output[0] if node.output else ""),
                            op=f"ai.onnx::{node.op_type}", hint=hint)


@dataclass
class Converted:
    """What :func:`convert` did: ``fallback``, the ops that leave the whole model to onnx's
    converter (nothing was changed); ``by_onnx``, the ops of nodes onnx's converter converted
    one at a time (no adapter here)."""

    fallback: list[str] = field(default_factory=list)
    by_onnx: list[str] = field(default_factory=list)
    expanded: list[str] = field(default_factory=list)  # "LayerNormalization 17": ops made their function bodies


def convert(model: onnx.ModelProto, target: int, *, path: str | None = None, taken: set[str] | None = None,
            ops: set[str] | None = None,
            pick: str = "pick a --target-opset", keep: str = "keep the model's opset") -> Converted:
    """Convert ``model``'s standard ops, in place, to ai.onnx opset ``target`` with graphkit's
    adapters: every graph, subgraph and model-local function (each from its own import). A
    node no adapter covers is converted by onnx's converter (all such nodes in one call, each
    on its own: :func:`_by_onnx`), its nodes put in its place; one that holds
    subgraphs (If/Loop/Scan going below 12) leaves the whole model to onnx's converter:
    ``fallback`` names it and nothing was changed but the nodes of ops the target lacks,
    made ONNX's function bodies for them (``expanded``; standard ops, which onnx's converter
    takes too, where it takes none of the ops they stand for). Raises RewriteError where an adapter, or
    onnx's converter on one node, refuses a node. ``taken``: every name in ``model``, where
    the caller has them; the names made are added. The constants made (axes, split sizes)
    are shared by the nodes of one graph or function body that read the same values.
    ``pick`` and ``keep``: how the errors' hints ask for another target opset (``"<pick> of
    at least 13"``) and for none (the export side asks for an export opset). ``ops``: the
    model's ai.onnx op types (any scope), where the caller knows them (the walk for ops to
    make function bodies of is skipped where none of them can need one)."""
    down = [a for a, _, _ in _roots(model) if a > target]
    if down and (ops is None or any(_expandable(op, a, target) is not None for op in ops for a in set(down))):
        expanded = _expand_functions(model, target, path=path, taken=taken, pick=pick, keep=keep)
    else:
        expanded = []
    work: list[tuple] = []
    uncovered: set[str] = set()
    declared: list[ScopedTypes] = []
    moves: list[tuple] = []  # (node, fn, graph, nodes, rank or None): a Softmax-like over a middle axis, down below 13
    refused: list[tuple] = []  # (node, fn, graph, (version, why))

    def types() -> ScopedTypes:
        if not declared:
            declared.append(value_types(model, infer=False))
        return declared[0]

    for a, fn, nodes in _roots(model):
        if a != target:
            _collect(nodes, fn, a, target, work, uncovered, types, moves, refused)
    if refused or (moves and (uncovered or any(rank is None for *_, rank in moves))):
        conv = _Conversion(target, path, model, taken, pick=pick, keep=keep)
        for node, fn, graph, (version, why) in refused:
            conv.function, conv.graph = fn, graph
            other = f"below {version}" if target >= version else f"of at least {version}"
            raise conv.error(node, why, f"{conv.pick} {other}, or {conv.keep}")
        node, fn, graph, _, rank = next(m for m in moves if uncovered or m[-1] is None)
        conv.function, conv.graph = fn, graph
        axis = _attr(node, "axis")
        if axis is not None and axis.ref_attr_name:
            raise conv.error(node, f"its axis is the function's attribute {axis.ref_attr_name}, which may not be "
                             f"the last one, and before opset 13 {node.op_type} flattens its input to 2-D there",
                             f"inline the function, or {conv.pick} of at least 13")
        why = (f"its axis ({axis.i if axis is not None else -1}) is not the last one, and before opset 13 "
               f"{node.op_type} flattens its input to 2-D there")
        if rank is None:
            raise conv.error(node, f"{why}; the rank of its input '{node.input[0]}' is not declared, so graphkit "
                             "cannot move that axis last", f"declare the rank of '{node.input[0]}' (a shape in "
                             f"the model), or {conv.pick} of at least 13")
        raise conv.error(node, f"{why}; {', '.join(sorted(uncovered))} leave(s) the whole model to onnx's "
                         "converter, which keeps the axis (a wrong result)", f"{conv.pick} of at least 13")
    if uncovered:
        return Converted(fallback=sorted(uncovered))
    conv = _Conversion(target, path, model, taken, pick=pick, keep=keep, _types=declared[0] if declared else None)
    for node, fn, graph, nodes, rank in moves:
        conv.nodes = nodes
        _move_axis_last(conv, node, rank)
    replaced = conv.replaced  # id -> a node list holding nodes replaced or preceded by made ones
    left: dict[int, list[tuple[onnx.NodeProto, Any, Any]]] = {}  # opset -> nodes no adapter covers
    for node, node_steps, fn, up, graph, nodes, a in work:
        if node_steps is None:
            left.setdefault(a, []).append((node, fn, graph))
            replaced.setdefault(id(nodes), nodes)
            continue
        conv.function, conv.up, conv.graph, conv.nodes = fn, up, graph, nodes
        for step in node_steps:
            _ADAPT[step.kind](conv, step, node)
    by_onnx = sorted({f"{n.op_type} {a}->{target}" for a, items in left.items() for n, _, _ in items})
    made = conv.placed
    for a, items in left.items():
        for start in range(0, len(items), _BATCH):
            made.update(_by_onnx(conv, items[start:start + _BATCH], a))
    # A list's subgraphs' lists first (the walk met them after it): rebuilding a list copies
    # the subgraphs its nodes hold, which would lose changes made to them after.
    for nodes in reversed(replaced.values()):
        ordered = []
        wrapped = conv.wrapped
        for node in nodes:
            around = wrapped.get(id(node)) if wrapped else None
            if around is None:
                ordered.extend(made.get(id(node), (node,)))
            else:
                ordered.append(around[0])
                ordered.extend(made.get(id(node), (node,)))
                ordered.append(around[1])
        del nodes[:]
        nodes.extend(ordered)
    # after the lists are rebuilt: prepending to one copies the nodes (and their subgraphs) the
    # rebuilding above finds by id
    _place_constants(model, conv.new_constants)
    _drop_unread(model, conv)
    if taken is not None:
        taken.update(conv.made)
    for imports in (model.opset_import, *(fn.opset_import for fn in model.functions)):
        for imp in imports:
            if imp.domain in AI_ONNX:
                imp.version = target
    return Converted(by_onnx=by_onnx, expanded=expanded)


# Step kinds whose adapter changes only the node's own fields: going up, it adds int64
# constants shared by value, and nothing else of the model is looked up; going down, it
# reads the declared types of the node's values and the constant its input 1 names, which
# it may leave unread (removed then). No node is made or moved. A writer that keeps every
# other node as its bytes (graphkit.rewrite.bytes.conversions) applies them node by node.
_OWN_FIELDS_UP = frozenset({"to-input", "num-outputs"})
_OWN_FIELDS_DOWN = frozenset({"types", "attributes", "optional-input", "to-input"})


def node_steps(ops: Iterable[str], a: int, b: int) -> dict[str, tuple[Step, ...]]:
    """The steps converting each ai.onnx op of ``ops`` from opset ``a`` to ``b`` where each
    changes only a node's own fields (going up, ops whose nodes stay as they are, types,
    attributes or optional inputs added, are left out). ValueError saying why where a node
    needs more: an op no adapter covers (onnx's converter), a step that makes nodes or reads
    the model's types going up (last-axis, per-channel), or one that makes nodes going down
    (num-outputs: the sizes computed at run time where a length is unknown)."""
    up = a < b
    kinds = _OWN_FIELDS_UP if up else _OWN_FIELDS_DOWN
    out = {}
    for op in sorted(ops):
        found = steps(op, a, b)
        if found is None:
            raise ValueError(f"no adapter converts {op} from {a} to {b} (onnx's converter does)")
        active = tuple(s for s in found if s.kind in _ACTIVE_UP) if up else found
        other = next((s for s in active if s.kind not in kinds), None)
        if other is not None:
            raise ValueError(f"{op}-{other.new}'s step ({other.kind}) makes nodes or reads the model's types "
                             f"going {'up' if up else 'down'}")
        if active:
            out[op] = active
    return out


class NodeConverter:
    """The adapters on main-graph nodes one at a time, by :func:`node_steps` (``up``, or
    down): the same code, the same constants made (one per distinct value, named after the
    first node that asks for it), and read, as :func:`convert` where the nodes are converted
    in the same order. ``names`` must clash with no name of ``model``."""

    def __init__(self, model: onnx.ModelProto, target: int, names: NameGenerator, path: str | None = None,
                 up: bool = True) -> None:
        self._conv = _Conversion(target, path, model, _names=names, up=up)
        graph = self._conv.model.graph  # its nodes look up the main graph's own constants only
        self._conv._constants[id(graph)] = _Constants(graph, nested=False, overridable=model.ir_version >= 4)
        self._declared: Callable[[str], Any] | None = None
        self._sources: dict[str, int | None] = {}  # input 1's name -> its constant's id (reads)

    def convert(self, node: onnx.NodeProto, node_steps: tuple[Step, ...]) -> None:
        """Convert the main graph's ``node`` (or a copy of it) in place."""
        for step in node_steps:
            _ADAPT[step.kind](self._conv, step, node)

    @property
    def made(self) -> list[str]:
        """The names of the constants made, in order."""
        return self._conv.made

    def reads(self, inputs: list[str], outputs: list[str]) -> tuple:
        """What the adapters read of a main-graph node going down besides its own fields: the
        declared element types of its values (None: not a declared tensor) and the constant
        its input 1 names (by identity; None: none). Nodes alike in their fields but names,
        and in this, are converted alike."""
        if self._declared is None:  # what a main-graph node sees (conv.types' own lookup), read once
            self._declared = next(self._conv.types.by_graph())[1].get
        declared, elems = self._declared, []
        for name in (*inputs, *outputs):
            tp = declared(name) if name else None
            elems.append(tp.tensor_type.elem_type if tp is not None and tp.HasField("tensor_type") else None)
        source = None
        if len(inputs) > 1 and inputs[1]:
            source = self._sources.get(inputs[1], self)
            if source is self:
                found = self._conv.constant(inputs[1])
                source = self._sources[inputs[1]] = None if found is None else id(found[0])
        return tuple(elems), source

    @property
    def released(self) -> list[str]:
        """The names of the constants (initializers, Constant nodes) converted nodes stopped
        reading (going down): :func:`convert` removes those nothing else reads."""
        return [h.name if isinstance(h, onnx.TensorProto) else h.output[0] for h, _ in self._conv.released]

    @property
    def released_initializers(self) -> set[str]:
        """Those of :attr:`released` that are initializers (the others are Constant nodes)."""
        return {h.name for h, _ in self._conv.released if isinstance(h, onnx.TensorProto)}

    def initializers(self) -> list[onnx.TensorProto]:
        """The constants made, as :func:`convert` adds them to the main graph (after its own)."""
        return [int64_initializer(name, values) for _, made in self._conv.new_constants.values()
                for name, values in made]


def _by_onnx(conv: _Conversion, items: list[tuple[onnx.NodeProto, Any, Any]], a: int
             ) -> dict[int, list[onnx.NodeProto]]:
    """Nodes of ai.onnx opset ``a`` (with their function and subgraph) converted by onnx's
    version converter in one call (see _BATCH): one model holding them all, each node's inputs and outputs
    renamed apart (graph inputs typed as declared in the node's scope), so that no node reads
    another and sibling subgraphs' names cannot clash. Returns id(node) -> the nodes to put
    in its place, the values they make named anew."""
    from onnx import version_converter

    inputs: list[onnx.ValueInfoProto] = []
    copies: list[onnx.NodeProto] = []
    for k, (node, fn, graph) in enumerate(items):
        conv.function, conv.graph = fn, graph
        if any(attr.ref_attr_name for attr in node.attribute):
            raise conv.error(node, "no adapter here, and onnx's converter cannot see the function attribute it "
                             "refers to", f"inline the function, or {conv.keep}")
        types = conv.types or {}
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        for j, name in enumerate(node.input):
            if name:
                copy.input[j] = f"gk{k}i{j}"
                vi = onnx.ValueInfoProto(name=copy.input[j])
                if name in types:
                    vi.type.CopyFrom(types[name])
                inputs.append(vi)
        for j, name in enumerate(node.output):
            if name:
                copy.output[j] = f"gk{k}o{j}"
        copies.append(copy)
    outputs = [onnx.ValueInfoProto(name=o) for c in copies for o in c.output if o]
    mini = helper.make_model(helper.make_graph(copies, "nodes", inputs, outputs), opset_imports=[
        helper.make_opsetid("", a)], ir_version=conv.model.ir_version or 10)
    try:
        converted = version_converter.convert_version(mini, conv.target).graph
    except Exception as exc:  # noqa: BLE001 - the converter raises bare RuntimeErrors / its own types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        node = next((n for n, _, _ in items if n.op_type in first), items[0][0])
        conv.function, conv.graph = next((fn, g) for n, fn, g in items if n is node)
        raise conv.error(node, f"no adapter here, and onnx's version converter refuses it: {first}",
                         f"{conv.pick} other than {conv.target}, or {conv.keep}") from exc
    made = [helper.make_node("Constant", [], [t.name], value=t) for t in converted.initializer]
    made.extend(converted.node)
    # which item each made node belongs to: by the renamed names it reads or writes, or the
    # values a node of the item makes (in order: the converter's nodes are topologically
    # sorted); else (a Constant, an intermediate) by a node of the item reading what it makes
    # (in reverse order, readers before what they read: chains of any length)
    owner: dict[str, int] = {}
    for k, c in enumerate(copies):
        owner.update((n, k) for n in (*c.input, *c.output) if n)
    group: list[int | None] = [None] * len(made)
    for i, n in enumerate(made):
        k = next((owner[x] for x in (*n.input, *n.output) if x in owner), None)
        if k is not None:
            group[i] = k
            owner.update((x, k) for x in n.output if x)
    for i in range(len(made) - 1, -1, -1):
        n = made[i]
        if group[i] is None:
            group[i] = next((owner[x] for x in n.output if x in owner), None)
        if group[i] is not None:
            owner.update((x, group[i]) for x in n.input if x and x not in owner)
    out: dict[int, list[onnx.NodeProto]] = {}
    for k, (node, _, _) in enumerate(items):
        rename = {f"gk{k}i{j}": name for j, name in enumerate(node.input) if name}
        rename.update({f"gk{k}o{j}": name for j, name in enumerate(node.output) if name})
        base = node.name or node.output[0]
        nodes = [n for i, n in enumerate(made) if group[i] == k]
        for n in nodes:
            for j, name in enumerate(n.output):
                if name and name not in rename:
                    rename[name] = conv.names.fresh(f"{base}_{name.lstrip('_')}")
                    conv.made.append(rename[name])
        for n in nodes:
            n.input[:] = [rename.get(x, x) for x in n.input]
            n.output[:] = [rename.get(x, x) for x in n.output]
            n.name = node.name if n.op_type == node.op_type else (conv.names.fresh(f"{base}_{n.op_type}")
                                                                   if node.name else "")
        out[id(node)] = nodes
    if any(g is None for g in group):
        raise RewriteError(f"onnx's version converter made nodes graphkit cannot place (converting "
                           f"{', '.join(sorted({n.op_type for n, _, _ in items}))} to opset {conv.target})",
                           path=conv.path, hint=conv.keep)
    return out


def _roots(model: onnx.ModelProto) -> list[tuple[int, Any, Any]]:
    """(ai.onnx opset, function or None, node list) of the main graph and of each function
    importing ai.onnx."""
    def opset(imports: Any) -> int | None:
        return next((i.version for i in imports if i.domain in AI_ONNX), None)

    out = []
    if (main := opset(model.opset_import)) is not None:
        out.append((main, None, model.graph.node))
    for fn in model.functions:
        if (version := opset(fn.opset_import)) is not None:
            out.append((version, fn, fn.node))
    return out


def _expandable(op: str, a: int, target: int) -> int | None:
    """The opset of the ONNX function body standing for ai.onnx ``op`` (at opset ``a``) going
    down to ``target``, where the older opset lacks the op or its meaning (LayerNormalization
    below 17, GroupNormalization below 18 or across 21, Gelu below 20, RMSNormalization below
    23...), else None: the newest body up to ``a`` (:func:`_function_nodes` refuses one whose ops
    do not mean at ``a`` what they meant at its opset)."""
    try:
        schema = onnx.defs.get_schema(op, a, "")
    except onnx.defs.SchemaError:
        return None
    if not schema.has_context_dependent_function:
        return None
    try:
        older = onnx.defs.get_schema(op, target, "").since_version
    except onnx.defs.SchemaError:
        older = None
    changed = any(o == op and target < v <= a for o, v in _MEANING_CHANGED)
    if older is not None and not changed:
        return None
    versions = [v for v in schema.context_dependent_function_opset_versions if v <= a]
    return max(versions) if versions else None


def _expand_functions(model: onnx.ModelProto, target: int, *, path: str | None, taken: set[str] | None,
                      pick: str, keep: str) -> list[str]:
    """Going down, each node of an op the target opset lacks (or whose meaning changed across
    it) replaced, where it is, by the nodes of ONNX's own function body for it: standard ops
    that the conversion then takes down as any other (LayerNormalization-17 to 13 becomes
    Flatten, ReduceMean, Sub, Div... at 13). The body is made for the node's attributes and
    its inputs' declared element types; its values get names of their own. Returns the ops
    expanded, as "<op> <opset of the body>"."""
    done: set[str] = set()
    conv = _Conversion(target, path, model, taken, pick=pick, keep=keep)
    for a, fn, root in _roots(model):
        if a <= target:
            continue
        found: dict[str, int | None] = {}
        lists: list[tuple[Any, onnx.GraphProto | None]] = []  # every node list, a graph's before its subgraphs'
        stack: list[tuple[Any, onnx.GraphProto | None]] = [(root, None)]
        while stack:
            nodes, graph = stack.pop()
            lists.append((nodes, graph))
            stack.extend((sub.node, sub) for node in nodes for sub in subgraphs(node))
        # Subgraphs' lists first: rebuilding a list copies the subgraphs its nodes hold, which
        # would lose changes made to them after.
        for nodes, graph in reversed(lists):
            placed: list[list[onnx.NodeProto]] = []
            expanded = False
            for node in nodes:
                version = None
                if node.domain in AI_ONNX:
                    if node.op_type not in found:
                        found[node.op_type] = _expandable(node.op_type, a, target)
                    version = found[node.op_type]
                if version is None:
                    placed.append([node])
                    continue
                conv.function, conv.graph = fn, graph
                placed.append(_function_nodes(conv, node, version, a, conv.types))
                done.add(f"{node.op_type} {version}")
                expanded = True
            if expanded:
                made = [n for group in placed for n in group]
                del nodes[:]
                nodes.extend(made)
    if taken is not None:
        taken.update(conv.made)
    return sorted(done)


def _function_nodes(conv: _Conversion, node: onnx.NodeProto, version: int, a: int,
                    scope: Mapping[str, onnx.TypeProto] | None) -> list[onnx.NodeProto]:
    """ONNX's function body (opset ``version``) for ``node``, its values renamed apart."""
    ref = next((at for at in node.attribute if at.ref_attr_name), None)
    if ref is not None:
        raise conv.error(node, f"it does not exist at that opset, and its attribute {ref.name} is the function's "
                         f"attribute {ref.ref_attr_name}, which the nodes standing for it need the value of",
                         f"inline the function, or {conv.keep}")
    inputs = []
    for name in node.input:
        tp = scope.get(name) if name and scope is not None else None
        if name and (tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.elem_type):
            raise conv.error(node, f"it does not exist at that opset, and the element type of its input '{name}' "
                             "(which the nodes standing for it depend on) is not declared",
                             f"declare the type of '{name}' in the model, or {conv.keep}")
        inputs.append(helper.make_tensor_type_proto(tp.tensor_type.elem_type, None).SerializeToString()
                      if name else onnx.TypeProto().SerializeToString())
    schema = onnx.defs.get_schema(node.op_type, a, "")
    try:
        body = onnx.FunctionProto.FromString(
            schema.get_context_dependent_function_with_opset_version(version, node.SerializeToString(), inputs))
    except Exception as exc:  # onnx raises bare errors from its function builders
        raise conv.error(node, f"it does not exist at that opset, and ONNX's function body for it fails: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", conv.keep) from exc
    for n in body.node:  # the body's ops must mean at ``a`` what they meant at ``version``
        if n.domain not in AI_ONNX or onnx.defs.get_schema(n.op_type, a, "").since_version > version:
            raise conv.error(node, f"it does not exist at that opset, and ONNX's function body for it (opset "
                             f"{version}) uses {n.domain or 'ai.onnx'}::{n.op_type}, which changed by opset {a}",
                             conv.keep)
    rename = {formal: actual for formal, actual in zip(body.input, node.input)}
    rename.update({formal: actual for formal, actual in zip(body.output, node.output) if actual})
    base = node.name or node.op_type
    out = []
    for n in body.node:
        for k, name in enumerate(n.input):
            if name:
                n.input[k] = rename[name]  # (a value the body reads is an input or made before)
        for k, name in enumerate(n.output):
            if name and name not in rename:
                rename[name] = conv.names.fresh(f"{base}/{name}")
                conv.made.append(rename[name])
            if name:
                n.output[k] = rename[name]
        n.name = conv.names.fresh(f"{base}/{n.op_type}")
        conv.made.append(n.name)
        out.append(n)
    return out


def _function_types(fn: onnx.FunctionProto) -> dict[str, onnx.TypeProto]:
    """The types ``fn``'s value_info declares (names are unique in a body and its subgraphs)."""
    return {vi.name: vi.type for vi in fn.value_info if vi.HasField("type")}


def _collect(nodes: Any, fn: onnx.FunctionProto | None, a: int, target: int, work: list,
             uncovered: set[str], types: Callable[[], ScopedTypes], moves: list, refused: list) -> None:
    """One walk over ``nodes`` and the subgraphs in them: the standard nodes an adapter changes
    or checks, with their steps (None: no adapter covers them, onnx's converter does the
    node), function (None: the main graph), subgraph, node list and opset, into ``work``;
    the ops no adapter covers that hold subgraphs into ``uncovered``; Softmax-like nodes over
    a middle axis going below 13 into ``moves`` (with their input's rank, None where unknown),
    and nodes whose op changed meaning across the conversion into ``refused``."""
    up = a < target
    low, high = sorted((a, target))
    meaning = {op: (v, why) for (op, v), why in _MEANING_CHANGED.items() if not up and low < v <= high}
    middle = not up and a >= 13 > target  # Softmax-likes over a middle axis flatten below 13
    plan: dict[str, tuple[Step, ...] | None] = {}
    fn_types = _function_types(fn) if fn is not None else None
    stack: list[tuple[Any, onnx.GraphProto | None]] = [(nodes, None)]  # (nodes, their subgraph; None: the root's)
    while stack:
        nodes, graph = stack.pop()
        for node in nodes:
            domain = node.domain
            if domain == "" or domain == "ai.onnx":
                op = node.op_type
                if op in plan:
                    found = plan[op]
                else:
                    found = steps(op, a, target)
                    if found is not None and up:
                        found = tuple(s for s in found if s.kind in _ACTIVE_UP)
                    plan[op] = found
                if op in meaning:
                    refused.append((node, fn, graph, meaning[op]))
                    continue
                if middle and op in _SOFTMAX_LIKE:
                    scope = fn_types if fn else types() if graph is None else types().scope(graph)
                    ref = (axis := _attr(node, "axis")) is not None and axis.ref_attr_name
                    if ref or _last_axis(node, False, scope) is None:
                        # onnx's converter keeps the axis, and the older op flattens there
                        moves.append((node, fn, graph, nodes, None if ref else _rank(scope, node.input[0])))
                elif found and any(s.kind == "last-axis" for s in found) and _last_axis(
                        node, up, fn_types if fn else types() if graph is None else types().scope(graph)) is None:
                    found = None  # not over the last axis: onnx's (a Flatten and a Reshape)
                if found is None and any(at.type in (_GRAPH, _GRAPHS) for at in node.attribute):
                    uncovered.add(f"{op} {a}->{target}")
                elif found is None:
                    work.append((node, None, fn, up, graph, nodes, a))
                elif found:
                    work.append((node, found, fn, up, graph, nodes, a))
            if node.attribute:
                for attr in node.attribute:
                    if attr.type == _GRAPH:
                        stack.append((attr.g.node, attr.g))
                    elif attr.type == _GRAPHS:
                        stack.extend((g.node, g) for g in attr.graphs)


class _Constants:
    """The tensors Constant nodes and initializers of a namespace (the main graph, or a
    function body, and their subgraphs) hold, by name, with the list holding each, per graph:
    a name is looked up in the node's graph, then the graphs around it (sibling subgraphs,
    then and else branches, may each define one name). ``nested=False``: the holder's own
    only, for lookups from its own nodes (a subgraph's constants are not theirs to see)."""

    def __init__(self, holder: onnx.GraphProto | onnx.FunctionProto, nested: bool = True,
                 overridable: bool = True) -> None:
        self._root = id(holder)
        self._graphs: list[Any] = []  # held: their ids stay theirs
        self._own: dict[int, dict[str, tuple[Any, Any]]] = {}
        self._parent: dict[int, int | None] = {}
        if not nested:
            self._graphs.append(holder)
            self._parent[id(holder)] = None
            own: dict[str, tuple[Any, Any]] = {}
            if isinstance(holder, onnx.GraphProto):
                _own_initializers(holder, own, overridable)
            nodes = holder.node
            is_constant = map(operator.eq, map(attrgetter("op_type"), nodes), itertools.repeat("Constant"))
            for node in map(nodes.__getitem__, itertools.compress(itertools.count(), is_constant)):
                if node.domain in AI_ONNX and len(node.output) == 1:
                    own[node.output[0]] = (node, nodes)
            self._own[id(holder)] = own
            return
        stack: list[tuple[Any, int | None]] = [(holder, None)]
        while stack:
            g, parent = stack.pop()
            self._graphs.append(g)
            self._parent[id(g)] = parent
            own: dict[str, tuple[Any, Any]] = {}
            if isinstance(g, onnx.GraphProto):
                _own_initializers(g, own, overridable)
            for node in g.node:
                if node.op_type == "Constant" and node.domain in AI_ONNX and len(node.output) == 1:
                    own[node.output[0]] = (node, g.node)
                elif node.attribute:
                    stack.extend((sub, id(g)) for sub in subgraphs(node))
            if own:
                self._own[id(g)] = own

    def get(self, name: str, graph: onnx.GraphProto | None) -> tuple[Any, Any] | None:
        """What ``name`` is for a node of ``graph`` (None: the namespace's own node list)."""
        at: int | None = self._root if graph is None else id(graph)
        if at not in self._parent:  # not a graph of this namespace: nothing is known there
            return None
        while at is not None:
            found = self._own.get(at)
            if found is not None and name in found:
                return found[name]
            at = self._parent[at]
        return None


def _own_initializers(graph: onnx.GraphProto, own: dict[str, tuple[Any, Any]], overridable: bool) -> None:
    """``graph``'s initializers into ``own``, but, where ``overridable`` (IR 4 and up), those that
    are also its inputs: a value fed at run time may replace one, so it is no constant (an
    adapter going down would bake the default into an attribute). Below IR 4 every
    initializer is a graph input and none can be replaced (ONNX Runtime's rule too)."""
    inits = graph.initializer
    if not inits:
        return
    fed = {i.name for i in graph.input} if overridable and graph.input else ()
    for init in inits:
        if init.name not in fed:
            own[init.name] = (init, inits)


def _place_constants(model: onnx.ModelProto, made: dict[int, tuple[Any, list[tuple[str, Any]]]]) -> None:
    """The int64 constants adapters asked for, where every node of their namespace sees them:
    the main graph's initializers (its subgraphs read them from the outer scope; no node
    list is reordered or copied), Constant nodes first in a function body (it has no
    initializers) and in the main graph below IR 4 (where an initializer must be a graph input)."""
    for holder, constants in made.values():
        if holder is model.graph and not 0 < model.ir_version < 4:
            holder.initializer.extend(int64_initializer(name, values) for name, values in constants)
            continue
        ordered = [_constant_node(name, values) for name, values in constants]
        ordered.extend(holder.node)
        del holder.node[:]
        holder.node.extend(ordered)


def int64_initializer(name: str, values: tuple[int, ...]) -> onnx.TensorProto:
    """The main graph's initializer holding the int64 ``values`` an adapter made (axes, split sizes)."""
    return onnx.TensorProto(name=name, data_type=onnx.TensorProto.INT64, dims=[len(values)], int64_data=values)


def _constant_node(name: str, values: tuple[int, ...] | str) -> onnx.NodeProto:
    """A Constant of int64 ``values``, or of the ints the function's attribute ``values`` holds."""
    if not isinstance(values, str):
        return helper.make_node("Constant", [], [name], name=name,
                                value=helper.make_tensor(name, onnx.TensorProto.INT64, [len(values)], values))
    node = helper.make_node("Constant", [], [name], name=name)
    node.attribute.append(onnx.AttributeProto(name="value_ints", ref_attr_name=values,
                                              type=onnx.AttributeProto.INTS))
    return node


# ------------------------------------------------------------------------------- adapters


def _attr(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    return next((a for a in node.attribute if a.name == name), None)


def _remove_attr(node: onnx.NodeProto, name: str) -> None:
    for i, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[i]
            return


def _check_types(conv: _Conversion, step: Step, node: onnx.NodeProto) -> None:
    """Down: the node's element types the model declares are among those the older op takes,
    and its values of one type parameter there have one type (Pow-7's base and exponent,
    BatchNormalization-14's X and scale: two parameters in the newer op). A type the model
    does not declare is not checked here: the output's check finds it."""
    types = conv.types
    if types is None:
        return
    allowed, sides = _type_rules(step)
    bound: dict[str, tuple[str, str]] = {}  # type parameter -> (the first value's type, its name)
    for (params, variadic), actuals in zip(sides, (node.input, node.output)):
        if not params:
            continue
        for i, name in enumerate(actuals):
            if i >= len(params) and not variadic:  # an input the older op lacks (to-input steps check it)
                break
            param = params[min(i, len(params) - 1)]
            tp = types.get(name) if name else None
            if tp is None or param not in allowed or not tp.HasField("tensor_type"):
                continue
            text = _type_text(tp.tensor_type.elem_type)
            if text not in allowed[param]:
                raise conv.error(node, f"{node.op_type}-{step.old} does not take {text[7:-1]} ({name})",
                                 f"{conv.pick} of at least {step.new}")
            first = bound.setdefault(param, (text, name))
            if first[0] != text:
                raise conv.error(node, f"{node.op_type}-{step.old} takes one type for '{first[1]}' and '{name}' "
                                 f"({first[0][7:-1]} and {text[7:-1]} here)",
                                 f"{conv.pick} of at least {step.new}, or Cast them to one type")


@functools.lru_cache(maxsize=None)
def _type_rules(step: Step) -> tuple[dict[str, frozenset[str]], tuple[tuple[tuple[str, ...], bool], ...]]:
    """The older op's allowed types per type parameter, and per side (inputs, outputs) each
    formal's type parameter and whether the last one is variadic."""
    schema = step.schema_old
    allowed = {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints}
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    return allowed, tuple((tuple(f.type_str for f in formals), bool(formals) and formals[-1].option == variadic)
                          for formals in (schema.inputs, schema.outputs))


@functools.lru_cache(maxsize=None)
def _type_text(elem: int) -> str:
    """'tensor(float)' for TensorProto.FLOAT, as schemas write their allowed types."""
    return f"tensor({helper.tensor_dtype_to_string(elem)[len('TensorProto.'):].lower()})"


def _types(conv: _Conversion, step: Step, node: onnx.NodeProto) -> None:
    if conv.up:
        return
    _check_types(conv, step, node)
    floats = _NEW_FOR_FLOATS.get((step.op, step.new))
    if floats is not None:
        attr = _attr(node, floats[0])
        if (helper.get_attribute_value(attr) if attr is not None else floats[1]) == floats[1]:
            tp = (conv.types or {}).get(node.input[0]) if node.input else None
            elem = tp.tensor_type.elem_type if tp is not None and tp.HasField("tensor_type") else 0
            if elem not in _INTEGERS:
                what = (f"on {helper.tensor_dtype_to_string(elem)[len('TensorProto.'):].lower()} inputs" if elem
                        else f"where the type of '{node.input[0]}' is not declared (it may be a float)")
                raise conv.error(node, f"{floats[0]}={floats[1]} {what} is new in {step.op}-{step.new} "
                                 f"({step.op}-{step.old} takes it on integers only)",
                                 f"{conv.pick} of at least {step.new}, or {conv.keep}")
    new = _NEW_VALUES.get((step.op, step.new))
    if new is not None:
        attr = _attr(node, new[0])
        if attr is not None and helper.get_attribute_value(attr) in new[1]:
            raise conv.error(node, f"{new[0]}={helper.get_attribute_value(attr).decode()} is new in "
                             f"{step.op}-{step.new}", f"{conv.pick} of at least {step.new}")


def _is_default(attr: onnx.AttributeProto, default: Any) -> bool:
    if default is _ABSENT:
        return False
    value = helper.get_attribute_value(attr)
    if default == _ONES:
        return all(v == 1 for v in value)
    return value == default


def _attributes(conv: _Conversion, step: Step, node: onnx.NodeProto) -> None:
    if conv.up:
        return
    _check_types(conv, step, node)
    for name, default in _ADDED_ATTRIBUTES[(step.op, step.new)].items():
        attr = _attr(node, name)
        if attr is None:
            continue
        if not _is_default(attr, default) and not _allowzero_moot(conv, node, name):
            raise conv.error(node, f"attribute {name} is new in {step.op}-{step.new}",
                             f"{conv.pick} of at least {step.new}, or drop {name}")
        _remove_attr(node, name)


def _allowzero_moot(conv: _Conversion, node: onnx.NodeProto, name: str) -> bool:
    """Reshape's allowzero=1 changes nothing where the shape is a constant without a 0 (the
    dynamo exporter writes it on every Reshape)."""
    if node.op_type != "Reshape" or name != "allowzero" or len(node.input) < 2:
        return False
    source = conv.constant(node.input[1])
    tensor = None
    if source is not None:
        if isinstance(source[0], onnx.TensorProto):
            tensor = source[0]
        elif (value := _attr(source[0], "value")) is not None and value.type == onnx.AttributeProto.TENSOR:
            tensor = value.t
    if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return False
    return 0 not in numpy_helper.to_array(tensor).reshape(-1).tolist()


def _optional_input(conv: _Conversion, step: Step, node: onnx.NodeProto) -> None:
    if conv.up:
        return
    _check_types(conv, step, node)
    index = _OPTIONAL_INPUT[(step.op, step.new)]
    if len(node.input) > index and node.input[index]:
        raise conv.error(node, f"input {index} is new in {step.op}-{step.new}",
                         f"{conv.pick} of at least {step.new}")
    del node.input[index:]


def _int64_constant(conv: _Conversion, node: onnx.NodeProto, what: str, values: tuple[int, ...] | str) -> None:
    """``node`` reads ``values`` as input 1: an int64 constant of its namespace (the main
    graph or its function), one for all the nodes there that read the same values. A str is
    the name of the function's attribute holding them (a Constant whose value_ints refers to it)."""
    holder = conv.model.graph if conv.function is None else conv.function
    key = (id(holder), what, values)
    name = conv.shared.get(key)
    if name is None:
        name = conv.shared[key] = conv.names.fresh(f"{node.name or node.output[0]}_{what}")
        conv.made.append(name)
        conv.new_constants.setdefault(id(holder), (holder, []))[1].append((name, values))
    del node.input[1:]
    node.input.append(name)


def _to_input(conv: _Conversion, step: Step, node: onnx.NodeProto) -> None:
    name = _TO_INPUT[(step.op, step.new)]
    if conv.up:
        attrs = node.attribute
        for i, attr in enumerate(attrs):
            if attr.name == name:
                break
        else:
            return
        values = attr.ref_attr_name or tuple(attr.ints)  # in a function: axes = @its_attribute
        del attrs[i]
        _int64_constant(conv, node, name, values)
        return
    _check_types(conv, step, node)
    if step.new != 13 or step.op == "ReduceSum":  # ReduceX-18 / ReduceSum-13 added noop_with_empty_axes
        noop = _attr(node, "noop_with_empty_axes")
        if noop is not None and noop.i != 0:
            given = len(node.input) > 1 and node.input[1]
            values = _constant_value(conv, step, node, name) if given else []
            if not values:
                raise conv.error(node, "noop_with_empty_axes=1 with no axes (the identity) has no older form",
                                 f"{conv.pick} of at least {step.new}")
        _remove_attr(node, "noop_with_empty_axes")
    if len(node.input) > 1 and node.input[1]:
        source = conv.constant(node.input[1])
        ref = _attr(source[0], "value_ints") if source is not None and not isinstance(
            source[0], onnx.TensorProto) else None
        values = [] if ref is not None and ref.ref_attr_name else _constant_value(conv, step, node, name)
        if ref is not None and ref.ref_attr_name:  # a function's Constant <value_ints = @attr>
            node.attribute.append(onnx.AttributeProto(name=name, ref_attr_name=ref.ref_attr_name,
                                                      type=onnx.AttributeProto.INTS))
        if source is not None:
            conv.released.append(source)
        del node.input[1:]
        if values:  # empty axes of a Reduce: all of them, as no attribute says
            node.attribute.append(_ints_attribute(name, tuple(values)))


@functools.lru_cache(maxsize=4096)
def _ints_attribute(name: str, values: tuple[int, ...]) -> onnx.AttributeProto:
    """An INTS attribute (helper.make_attribute's), made once per value: appending copies it."""
    return onnx.AttributeProto(name=name, type=onnx.AttributeProto.INTS, ints=values)


def _constant_value(conv: _Conversion, step: Step, node: onnx.NodeProto, what: str) -> list[int]:
    """The ints a Constant node or an initializer named by ``node``'s input 1 holds (read once
    per constant: many nodes may read one)."""
    source = conv.constant(node.input[1])
    if source is not None and id(source[0]) in conv.values:
        return conv.values[id(source[0])]
    values = _read_constant(conv, step, node, what, source)
    if source is not None:
        conv.values[id(source[0])] = values
    return values


def _read_constant(conv: _Conversion, step: Step, node: onnx.NodeProto, what: str,
                   source: tuple[Any, Any] | None) -> list[int]:
    tensor = None
    if source is not None:
        holder = source[0]
        if isinstance(holder, onnx.TensorProto):
            tensor = holder
        elif (value := _attr(holder, "value")) is not None and value.type == onnx.AttributeProto.TENSOR:
            tensor = value.t
        elif (ints := _attr(holder, "value_ints")) is not None:
            return list(ints.ints)
    if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise conv.error(node, f"its {what} ({node.input[1]}) are not a constant, and {step.op}-{step.old} "
                         "takes them as an attribute",
                         f"make the {what} a Constant, or {conv.pick} of at least {step.new}")
    return [int(v) for v in numpy_helper.to_array(tensor).reshape(-1)]


def _num_outputs(conv: _Conversion, step: Step, node: onnx.NodeProto) -> None:
    given = len(node.input) > 1 and node.input[1]
    if conv.up:
        if not given and _attr(node, "num_outputs") is None:
            node.attribute.append(helper.make_attribute("num_outputs", len(node.output)))
        return
    _check_types(conv, step, node)
    attr = _attr(node, "num_outputs")
    if attr is None:
        return
    parts = attr.i
    _remove_attr(node, "num_outputs")
    if given:
        return
    axis_attr = _attr(node, "axis")
    axis = axis_attr.i if axis_attr is not None else 0
    length = _axis_length(conv, node, axis)
    if length is None:
        if conv.target < 13:
            raise conv.error(node, f"it splits axis {axis} of unknown length into {parts} parts (Split-18 "
                             f"num_outputs); before opset 13 the part sizes are an attribute, fixed when the "
                             "model is written",
                             f"give '{node.input[0]}' a static length along axis {axis} (a fixed input shape), "
                             f"or {conv.pick} of at least 13")
        made, sizes_name = split_18_runtime_sizes(node, axis, parts, conv.names.fresh)
        conv.made.extend(o for n in made for o in n.output)
        conv.put_before(node, made)
        node.input.append(sizes_name)
        return
    try:
        sizes = split_18_sizes(length, parts)
    except ValueError as exc:
        raise conv.error(node, str(exc), "fix the model's num_outputs") from exc
    if sizes and conv.target < 13:  # the next step's form: the split attribute
        node.attribute.append(helper.make_attribute("split", sizes))
    elif sizes:
        _int64_constant(conv, node, "split", tuple(sizes))


def _axis_length(conv: _Conversion, node: onnx.NodeProto, axis: int) -> int | None:
    """The length of ``node``'s input 0 along ``axis`` as declared in its scope, else None."""
    tp = (conv.types or {}).get(node.input[0])
    shape = tp.tensor_type.shape if tp is not None and tp.tensor_type.HasField("shape") else None
    if shape is None or not -len(shape.dim) <= axis < len(shape.dim) or not shape.dim[axis].HasField("dim_value"):
        return None
    return shape.dim[axis].dim_value


def split_18_runtime_sizes(node: onnx.NodeProto, axis: int, parts: int, fresh: Callable[[str], str]
                           ) -> tuple[list[onnx.NodeProto], str]:
    """Nodes computing, from the shape of Split ``node``'s input at run time, the sizes opset
    18's ``num_outputs=parts`` gives along ``axis`` (ceil(length / parts) each, the last one
    the rest: :func:`split_18_sizes`), for a Split of opset 13 to 17 whose length is unknown;
    and the name of the sizes. ``fresh`` makes a name from a base that clashes with no other."""
    base = node.name or node.output[0]
    made: list[onnx.NodeProto] = []

    def op(op_type: str, *inputs: str, **attrs: Any) -> str:
        out = fresh(f"{base}_split_sizes/{op_type}")
        made.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def const(value: int) -> str:
        out = fresh(f"{base}_split_sizes/const")
        made.append(helper.make_node("Constant", [], [out], name=out,
                                     value=helper.make_tensor(out, onnx.TensorProto.INT64, [1], [value])))
        return out

    length = op("Gather", op("Shape", node.input[0]), const(axis), axis=0)  # [length]
    chunk = op("Div", op("Add", length, const(parts - 1)), const(parts))  # ceil(length / parts)
    last = op("Sub", length, op("Mul", chunk, const(parts - 1)))
    sizes = fresh(f"{base}_split_sizes")
    made.append(helper.make_node("Concat", [chunk] * (parts - 1) + [last], [sizes], name=sizes, axis=0))
    return made, sizes


def split_18_sizes(length: int, parts: int) -> list[int] | None:
    """The part sizes Split-18's ``num_outputs=parts`` gives an axis of ``length``: ceil(length
    / parts) each, the last one the rest; None where they are even (what the older Splits do
    without sizes). ValueError where the last would be negative (opset 18 refuses the node)."""
    chunk = -(-length // parts)
    last = length - chunk * (parts - 1)
    if last < 0:
        raise ValueError(f"num_outputs={parts} on an axis of length {length}: opset 18 refuses it "
                         f"(its last part would have a negative length)")
    return None if length % parts == 0 else [chunk] * (parts - 1) + [last]


def _last_axis(node: onnx.NodeProto, up: bool, types: Mapping[str, onnx.TypeProto] | None) -> int | None:
    """The axis of a Softmax-like ``node`` (at the older version going up, the newer going
    down) where it is the input's last one, else None."""
    attr = _attr(node, "axis")
    axis = attr.i if attr is not None else (1 if up else -1)
    if axis == -1:
        return axis
    tp = (types or {}).get(node.input[0])
    if tp is None or not tp.tensor_type.HasField("shape"):
        return None
    rank = len(tp.tensor_type.shape.dim)
    return axis if axis in (rank - 1, -1) else None


def _last_axis_step(conv: _Conversion, step: Step, node: onnx.NodeProto) -> None:
    """Write the last axis out (the two versions' defaults differ), as onnx's converter does:
    -1 going up (Hardmax keeps a value it has), rank - 1 going down where the rank is declared."""
    if not conv.up:
        _check_types(conv, step, node)
    attr = _attr(node, "axis")
    if conv.up and step.op == "Hardmax" and attr is not None:
        return
    if not conv.up and attr is not None and attr.i >= 0:  # rank - 1 already (the last axis, or moved there)
        return
    axis = -1
    tp = (conv.types or {}).get(node.input[0])
    if not conv.up and tp is not None and tp.tensor_type.HasField("shape"):
        axis = len(tp.tensor_type.shape.dim) - 1
    _remove_attr(node, "axis")
    node.attribute.append(helper.make_attribute("axis", axis))


_SOFTMAX_LIKE = frozenset(op for op, _ in _LAST_AXIS)


def _rank(types: Mapping[str, onnx.TypeProto] | None, name: str) -> int | None:
    tp = (types or {}).get(name)
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    return len(tp.tensor_type.shape.dim)


def _move_axis_last(conv: _Conversion, node: onnx.NodeProto, rank: int) -> None:
    """Down below 13, a Softmax-like over a middle axis: Transpose that axis last, the op over
    the last axis (``rank - 1``), Transpose back (the older ops flatten to 2-D at the axis)."""
    attr = _attr(node, "axis")
    axis = attr.i if attr is not None else -1
    axis += rank if axis < 0 else 0
    perm = [i for i in range(rank) if i != axis] + [axis]
    back = [perm.index(i) for i in range(rank)]
    base = node.name or node.output[0]
    moved, result = conv.names.fresh(f"{base}_axis_last"), conv.names.fresh(f"{base}_over_last")
    conv.made.extend((moved, result))
    before = helper.make_node("Transpose", [node.input[0]], [moved], name=conv.names.fresh(f"{base}_Transpose"),
                              perm=perm)
    after = helper.make_node("Transpose", [result], [node.output[0]], name=conv.names.fresh(f"{base}_Transpose"),
                             perm=back)
    node.input[0], node.output[0] = moved, result
    _remove_attr(node, "axis")
    node.attribute.append(helper.make_attribute("axis", rank - 1))
    conv.replaced.setdefault(id(conv.nodes), conv.nodes)
    conv.wrapped[id(node)] = (before, after)


def _per_channel(conv: _Conversion, step: Step, node: onnx.NodeProto) -> None:
    """Up: the per-group scale and bias repeated over each group's channels (see STEP_KINDS)."""
    if not conv.up:
        raise conv.error(node, _MEANING_CHANGED[(step.op, step.new)], f"{conv.pick} of at least {step.new}")
    groups = _attr(node, "num_groups").i
    base = node.name or node.output[0]
    made: list[onnx.NodeProto] = []

    def op(op_type: str, *inputs: str, **attrs: Any) -> str:
        out = conv.names.fresh(f"{base}_per_channel/{op_type}")
        made.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def const(values: list[int]) -> str:
        out = conv.names.fresh(f"{base}_per_channel/const")
        made.append(helper.make_node("Constant", [], [out], name=out, value=helper.make_tensor(
            out, onnx.TensorProto.INT64, [len(values)], values)))
        return out

    channels = _axis_length(conv, node, 1)
    if channels is not None:
        shape = const([groups, channels // groups])
    else:
        per_group = op("Div", op("Gather", op("Shape", node.input[0]), const([1]), axis=0), const([groups]))
        shape = op("Concat", const([groups]), per_group, axis=0)
    axis, flat = const([1]), const([-1])
    for i in (1, 2):
        node.input[i] = op("Reshape", op("Expand", op("Unsqueeze", node.input[i], axis), shape), flat)
    conv.made.extend(n.output[0] for n in made)
    conv.put_before(node, made)


_ADAPT: dict[str, Callable[[_Conversion, Step, onnx.NodeProto], None]] = {
    "types": _types, "attributes": _attributes, "optional-input": _optional_input, "to-input": _to_input,
    "num-outputs": _num_outputs, "last-axis": _last_axis_step, "per-channel": _per_channel}


def _drop_unread(model: onnx.ModelProto, conv: _Conversion) -> None:
    """Remove the Constants and initializers an adapter stopped reading that nothing else reads."""
    if not conv.released:
        return
    read: set[str] = set()
    holders: list[Any] = [*graphs(model.graph)]
    for fn in model.functions:
        read.update(fn.output)
        holders.append(fn)
        holders.extend(g for node in fn.node for sub in subgraphs(node) for g in graphs(sub))
    for h in holders:
        for node in h.node:
            read.update(node.input)
        if isinstance(h, onnx.GraphProto):
            read.update(o.name for o in h.output)
    by_list: dict[int, tuple[Any, set[str]]] = {}
    for holder, container in conv.released:
        name = holder.name if isinstance(holder, onnx.TensorProto) else holder.output[0]
        if name not in read:
            by_list.setdefault(id(container), (container, set()))[1].add(name)
    for container, names in by_list.values():
        keep = [x for x in container if (x.name if isinstance(x, onnx.TensorProto)
                                         else x.output[0] if x.op_type == "Constant" else "") not in names]
        del container[:]
        container.extend(keep)
