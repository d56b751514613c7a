"""The steps between two ai.onnx opsets, op by op: each schema version change between them
is a step of a kind decided from ONNX's changelog (:data:`STEP_KINDS`; the tables below,
checked against the schemas by tests/test_convert.py), each kind done by one adapter
(:mod:`graphkit.rewrite.convert.adapters`):

- ``types``: the same inputs, outputs and attributes (types were added: bfloat16, int4, ...).
  Up: nothing changes. Down: the node's known element types must be ones the older op takes,
  and it must not use an attribute value the newer version added (:data:`NEW_VALUES`), nor
  one it made legal beyond integers (:data:`NEW_FOR_FLOATS`: Mod-28's fmod=0 on floats);
- ``attributes``: the newer version added attributes whose default is what the older op does
  (:data:`ADDED_ATTRIBUTES`). Down: each must be absent or at that default, then dropped
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
  shape at run time where it is not declared). Down: refused (:data:`MEANING_CHANGED`);
- ``num-outputs``: Split-18's ``num_outputs``. Up: set where no split sizes are given. Down:
  dropped where the parts are even, else the sizes opset 18 gives become the split input;
  where the axis' length is unknown (declared neither in the node's scope nor, in a
  function body, in the function's value_info), nodes before the Split compute them from the input's shape at run time (the older
  Splits' even split would refuse an uneven length), and below opset 13, where the sizes are
  an attribute, the node is refused.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import onnx

__all__ = ["ABSENT", "ACTIVE_UP", "ADDED_ATTRIBUTES", "INTEGERS", "MEANING_CHANGED", "NEW_FOR_FLOATS", "NEW_VALUES",
           "ONES", "OPTIONAL_INPUT", "SOFTMAX_LIKE", "STEP_KINDS", "Step", "TO_INPUT", "node_steps", "steps"]

_REDUCE = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
           "ReduceProd", "ReduceSumSquare")
ONES = "all ones"  # an ints attribute whose every value is 1 (dilations)
ABSENT = None      # the attribute must be absent

# (op, version that made the change) -> the attribute that became input 1.
TO_INPUT = {("ReduceSum", 13): "axes", ("Squeeze", 13): "axes", ("Unsqueeze", 13): "axes", ("Split", 13): "split",
            **{(op, 18): "axes" for op in _REDUCE}}
# (op, version) -> {added attribute: the value that does what the older version did}.
ADDED_ATTRIBUTES: dict[tuple[str, int], dict[str, Any]] = {
    ("ArgMax", 12): {"select_last_index": 0}, ("ArgMin", 12): {"select_last_index": 0},
    ("AveragePool", 19): {"dilations": ONES},
    ("Cast", 19): {"saturate": 1}, ("CastLike", 19): {"saturate": 1},
    ("Constant", 11): {"sparse_value": ABSENT},  # (and value no longer required: one of them is)
    ("Constant", 12): {n: ABSENT for n in ("value_float", "value_floats", "value_int", "value_ints",
                                           "value_string", "value_strings")},
    ("DepthToSpace", 11): {"mode": b"DCR"},
    ("GatherND", 12): {"batch_dims": 0},
    ("LpPool", 18): {"ceil_mode": 0, "dilations": ONES},
    ("MaxPool", 10): {"ceil_mode": 0, "dilations": ONES},
    ("QuantizeLinear", 19): {"saturate": 1},
    ("Reshape", 14): {"allowzero": 0},
    ("Resize", 18): {"antialias": 0, "axes": ABSENT, "keep_aspect_ratio_policy": b"stretch"},
    ("ScatterElements", 16): {"reduction": b"none"}, ("ScatterND", 16): {"reduction": b"none"},
    ("Shape", 15): {"start": 0, "end": ABSENT},
    ("TopK", 11): {"largest": 1, "sorted": 1},
    **{(op, 14): {"layout": 0} for op in ("GRU", "LSTM", "RNN")},
}
# (op, version) -> index of the optional input it added at the end.
OPTIONAL_INPUT = {("Pad", 18): 3}
# (op, version) -> (attribute, values that version added), for steps of kind "types".
NEW_VALUES = {("Pad", 19): ("mode", {b"wrap"}),
              ("Resize", 19): ("coordinate_transformation_mode", {b"half_pixel_symmetric"}),
              ("ScatterElements", 18): ("reduction", {b"max", b"min"}),
              ("ScatterND", 18): ("reduction", {b"max", b"min"})}
# (op, version) -> (attribute, its value (also when absent)) that version made legal on other
# than integer inputs, for steps of kind "types": Mod-28's fmod=0 on floats (floor modulo).
NEW_FOR_FLOATS = {("Mod", 28): ("fmod", 0)}
INTEGERS = frozenset(getattr(onnx.TensorProto, t) for t in (
    "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"))
# (op, version) where an op over "axis" stopped flattening the input to 2-D there (and its
# default axis went from 1 to -1): the same where the axis is the last one.
_LAST_AXIS = {("Softmax", 13), ("LogSoftmax", 13), ("Hardmax", 13)}
SOFTMAX_LIKE = frozenset(op for op, _ in _LAST_AXIS)
# (op, version) whose meaning changed with no adapter down here nor in onnx's converter
# (which leaves the node as it is): a conversion down across it makes the node ONNX's
# function body for the op where it has one (functions.expand_functions), else is refused, with why.
MEANING_CHANGED = {("GroupNormalization", 21): "its scale and bias went from one value per group to one "
                                               "per channel at opset 21, and no converter rewrites them"}
# (op, version) whose per-group scale and bias became per channel there: up, each is repeated
# over its group's channels.
_PER_CHANNEL = {("GroupNormalization", 21)}
# Deprecated ops onnx's converter replaces by others: never "types".
_DEPRECATED = frozenset({"Upsample", "Scatter"})
# Below this, "types" steps also added negative axes and broadcasting: down is onnx's.
_TYPES_DOWN_FROM = 12

STEP_KINDS = ("types", "attributes", "optional-input", "to-input", "num-outputs", "last-axis", "per-channel")
# Step kinds that change a node going up (the others only check going down).
ACTIVE_UP = frozenset({"to-input", "num-outputs", "last-axis", "per-channel"})


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
    if key in TO_INPUT:
        return "to-input"
    if key == ("Split", 18):
        return "num-outputs"
    if key in ADDED_ATTRIBUTES:
        return "attributes"
    if key in OPTIONAL_INPUT:
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
        active = tuple(s for s in found if s.kind in ACTIVE_UP) if up else found
        other = next((s for s in active if s.kind not in kinds), None)
        if other is not None:
            raise ValueError(f"{op}-{other.new}'s step ({other.kind}) makes nodes or reads the model's types "
                             f"going {'up' if up else 'down'}")
        if active:
            out[op] = active
    return out
