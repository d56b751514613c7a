"""ai.onnx opset conversion by graphkit's own adapters: one pass over every scope, linear.

Why not onnx's version converter: ``onnx.version_converter.convert_version`` runs ONNX shape
inference on the whole model first (``InferShapes`` in onnx's cpp2py_export.cc), and shape
inference gives every subgraph a copy of its enclosing scope's map of value types
(``ShapeInferenceImplBase``'s ``value_types_by_name(outer_scope_value_types_by_name)``): the
cost is the number of If/Loop/Scan bodies times the number of values around them (2000 If
nodes: 1.05 s; the same after 20000 Relus: 24 s; import and export alone, 17 -> 17, already
grow 6.8x per 2x If nodes). Its IR (onnx/common/ir.h up to onnx 1.23) besides names every
new value after a scan of all nodes, subgraphs included (``Graph::isNameUnique``).

Here each node is looked at once (:func:`convert`). For each standard op, the schema
versions between the two opsets are steps, each of a kind decided from ONNX's changelog
(:mod:`graphkit.rewrite.convert.steps`), each kind done by one adapter
(:mod:`graphkit.rewrite.convert.adapters`).

Going down, a node of an op the target opset lacks (LayerNormalization below 17,
GroupNormalization below 18, Gelu below 20, RMSNormalization below 23: any op ONNX gives a
function body built for the node), or whose meaning changed in between
(GroupNormalization across 21), is first replaced by the nodes of ONNX's own function body
for it (made for its attributes and its inputs' declared element types, its values named
apart: :mod:`graphkit.rewrite.convert.functions`), which the steps then take down like any
other node. An op whose meaning changed with neither
(:data:`~graphkit.rewrite.convert.steps.MEANING_CHANGED`) is refused going down. A node
whose op has a step of no kind here (Resize at 11, Softmax over a middle axis at 13,
anything before opset 12 going down, ...) is converted by onnx's converter
(:mod:`graphkit.rewrite.convert.by_onnx`), all such nodes in batches of
:data:`~graphkit.rewrite.convert.by_onnx.BATCH` per call, each node on its own in the
batch's model (inputs typed as declared in its scope), and the nodes it makes put in its
place. Only such a node holding subgraphs (If/Loop/Scan going below 12) leaves the whole
model to onnx's converter: :func:`convert` says so (``Converted.fallback``), having changed
nothing. A node our adapters, or onnx's converter on its own, refuse (axes that are not
constants, a type or attribute value the older op lacks) is a
:class:`~graphkit.errors.RewriteError` naming the node, the op and what to do.

This module is the pass (:func:`convert`) and the same adapters on main-graph nodes one at a
time (:class:`NodeConverter`, for the byte writer of graphkit.rewrite.bytes.conversions); it
also gives the names callers import from it (:func:`steps`, :func:`node_steps`,
:data:`STEP_KINDS`, :func:`split_18_sizes`, :func:`split_18_runtime_sizes`).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import helper

from graphkit.errors import RewriteError
from graphkit.rewrite.convert.adapters import (ADAPT, declared_rank, last_axis, move_axis_last,
                                               split_18_runtime_sizes, split_18_sizes)
from graphkit.rewrite.convert.by_onnx import BATCH, onnx_converted
from graphkit.rewrite.convert.functions import expand_functions, expandable
from graphkit.rewrite.convert.state import (Constants, Conversion, find_attr, function_types, nested_node_lists,
                                            roots)
from graphkit.rewrite.convert.steps import ACTIVE_UP, MEANING_CHANGED, SOFTMAX_LIKE, STEP_KINDS, Step, node_steps, steps
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.graph.walk import AI_ONNX, holds_graphs, walk
from graphkit.rewrite.lowering.builder import NameGenerator

__all__ = ["STEP_KINDS", "Converted", "NodeConverter", "convert", "int64_initializer", "node_steps",
           "split_18_runtime_sizes", "split_18_sizes", "steps"]


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
    on its own: :func:`~graphkit.rewrite.convert.by_onnx.onnx_converted`), its nodes put in
    its place; one that holds subgraphs (If/Loop/Scan going below 12) leaves the whole model to onnx's converter:
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
    down = [a for a, _, _ in roots(model) if a > target]
    if down and (ops is None or any(expandable(op, a, target) is not None for op in ops for a in set(down))):
        expanded = expand_functions(model, target, path=path, taken=taken, pick=pick, keep=keep)
    else:
        expanded = []
    work: list[tuple] = []
    uncovered: set[str] = set()
    declared: list[TypeTable] = []
    moves: list[tuple] = []  # (node, fn, graph, nodes, rank or None): a Softmax-like over a middle axis, down below 13
    refused: list[tuple] = []  # (node, fn, graph, (version, why))

    def types() -> TypeTable:
        if not declared:
            declared.append(TypeTable.inferred(model, infer=False))
        return declared[0]

    for a, fn, nodes in roots(model):
        if a != target:
            _collect(model.graph if fn is None else fn, fn, a, target, work, uncovered, types, moves, refused)
    if refused or (moves and (uncovered or any(rank is None for *_, rank in moves))):
        raise _refusal(Conversion(target, path, model, taken, pick=pick, keep=keep), refused, moves, uncovered)
    if uncovered:
        return Converted(fallback=sorted(uncovered))
    conv = Conversion(target, path, model, taken, pick=pick, keep=keep, _types=declared[0] if declared else None)
    for node, fn, graph, nodes, rank in moves:
        conv.nodes = nodes
        move_axis_last(conv, node, rank)
    left: dict[int, list[tuple[onnx.NodeProto, Any, Any]]] = {}  # opset -> nodes no adapter covers
    for node, found, fn, up, graph, nodes, a in work:
        if found is None:
            left.setdefault(a, []).append((node, fn, graph))
            conv.replaced.setdefault(id(nodes), nodes)
            continue
        conv.function, conv.up, conv.graph, conv.nodes = fn, up, graph, nodes
        for step in found:
            ADAPT[step.kind](conv, step, node)
    by_onnx = sorted({f"{n.op_type} {a}->{target}" for a, items in left.items() for n, _, _ in items})
    for a, items in left.items():
        for start in range(0, len(items), BATCH):
            conv.placed.update(onnx_converted(conv, items[start:start + BATCH], a))
    _rebuild_lists(conv)
    # after the lists are rebuilt: prepending to one copies the nodes (and their subgraphs) the
    # rebuilding finds by id
    _place_constants(model, conv.new_constants)
    _drop_unread(model, conv)
    if taken is not None:
        taken.update(conv.made)
    for imports in (model.opset_import, *(fn.opset_import for fn in model.functions)):
        for imp in imports:
            if imp.domain in AI_ONNX:
                imp.version = target
    return Converted(by_onnx=by_onnx, expanded=expanded)


def _refusal(conv: Conversion, refused: list[tuple], moves: list[tuple], uncovered: set[str]) -> RewriteError:
    """The error for the first node refused: one whose op changed meaning across the
    conversion, else a Softmax-like over a middle axis going below 13 that cannot be moved
    last (its rank unknown, or onnx's converter takes the whole model)."""
    if refused:
        node, fn, graph, (version, why) = refused[0]
        conv.function, conv.graph = fn, graph
        other = f"below {version}" if conv.target >= version else f"of at least {version}"
        return conv.error(node, why, f"{conv.pick} {other}, or {conv.keep}")
    node, fn, graph, _, rank = next(m for m in moves if uncovered or m[-1] is None)
    conv.function, conv.graph = fn, graph
    axis = find_attr(node, "axis")
    if axis is not None and axis.ref_attr_name:
        return conv.error(node, f"its axis is the function's attribute {axis.ref_attr_name}, which may not be "
                          f"the last one, and before opset 13 {node.op_type} flattens its input to 2-D there",
                          f"inline the function, or {conv.pick} of at least 13")
    why = (f"its axis ({axis.i if axis is not None else -1}) is not the last one, and before opset 13 "
           f"{node.op_type} flattens its input to 2-D there")
    if rank is None:
        return conv.error(node, f"{why}; the rank of its input '{node.input[0]}' is not declared, so graphkit "
                          "cannot move that axis last", f"declare the rank of '{node.input[0]}' (a shape in "
                          f"the model), or {conv.pick} of at least 13")
    return conv.error(node, f"{why}; {', '.join(sorted(uncovered))} leave(s) the whole model to onnx's "
                     "converter, which keeps the axis (a wrong result)", f"{conv.pick} of at least 13")


def _rebuild_lists(conv: Conversion) -> None:
    """Each node list holding nodes replaced, preceded or wrapped by made ones, rebuilt once
    (``conv.placed``: the nodes in a node's place; ``conv.wrapped``: Transposes around it)."""
    made = conv.placed
    # A list's subgraphs' lists first (the walk met them after it): rebuilding a list copies
    # the subgraphs its nodes hold, which would lose changes made to them after.
    for nodes in reversed(conv.replaced.values()):
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


class NodeConverter:
    """The adapters on main-graph nodes one at a time, by :func:`node_steps` (``up``, or
    down): the same code, the same constants made (one per distinct value, named after the
    first node that asks for it), and read, as :func:`convert` where the nodes are converted
    in the same order. ``names`` must clash with no name of ``model``; ``flat``: the caller
    knows no node of the model holds a graph; ``op_types``: the main graph's nodes' op types,
    where the caller read them already."""

    def __init__(self, model: onnx.ModelProto, target: int, names: NameGenerator, path: str | None = None,
                 up: bool = True, flat: bool = False, op_types: list[str] | None = None) -> None:
        self._conv = Conversion(target, path, model, _names=names, up=up,
                                _types=TypeTable.inferred(model, infer=False, flat=True) if flat else None)
        graph = self._conv.model.graph  # its nodes look up the main graph's own constants only
        self._conv._constants[id(graph)] = Constants(graph, nested=False, overridable=model.ir_version >= 4,
                                                     op_types=op_types)
        self._declared: Callable[[str], Any] | None = None
        self._sources: dict[str, int | None] = {}  # input 1's name -> its constant's id (reads)

    def convert(self, node: onnx.NodeProto, node_steps: tuple[Step, ...]) -> None:
        """Convert the main graph's ``node`` (or a copy of it) in place."""
        for step in node_steps:
            ADAPT[step.kind](self._conv, step, node)

    @property
    def made(self) -> list[str]:
        """The names of the constants made, in order."""
        return self._conv.made

    def reads(self, inputs_of: list[list[str]], outputs_of: list[list[str]]) -> list[tuple]:
        """What the adapters read of each main-graph node going down besides its own fields
        (its inputs ``inputs_of[k]``, outputs ``outputs_of[k]``): the declared element types of
        its values (None: not a declared tensor) and the constant its input 1 names (by
        identity; None: none). Nodes alike in their fields but names, and in this, are
        converted alike."""
        if self._declared is None:  # what a main-graph node sees, read once
            self._declared = self._conv.types.getter()
        declared = self._declared
        # Every value's type in one map over the names (most are declared nowhere), then each
        # node's as a slice: no Python call a node.
        values_of = list(map(operator.add, inputs_of, outputs_of))
        flat = list(itertools.chain.from_iterable(values_of))
        found = list(map(declared, flat))
        elems: list[int | None] = [None] * len(flat)
        for i in itertools.compress(range(len(found)), map(operator.is_not, found, itertools.repeat(None))):
            tp = found[i]
            if flat[i] and tp.HasField("tensor_type"):  # an empty name (an input left out) is no value
                elems[i] = tp.tensor_type.elem_type
        del found
        typed = tuple(elems)
        at = list(itertools.accumulate(map(len, values_of), initial=0))
        second = [ins[1] if len(ins) > 1 else "" for ins in inputs_of]
        for name in dict.fromkeys(second):
            if name and name not in self._sources:
                constant = self._conv.constant(name)
                self._sources[name] = None if constant is None else id(constant[0])
        sources = map(self._sources.get, second)  # "" (no input 1): None
        return list(zip(map(typed.__getitem__, map(slice, at, at[1:])), sources))

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


def _collect(root: onnx.GraphProto | onnx.FunctionProto, fn: onnx.FunctionProto | None, a: int, target: int,
             work: list, uncovered: set[str], types: Callable[[], TypeTable], moves: list, refused: list) -> None:
    """One walk over ``root`` (the main graph or function ``fn``) and the subgraphs in it: the
    standard nodes an adapter changes or checks, with their steps (None: no adapter covers them, onnx's
    converter does the node), function (None: the main graph), subgraph, node list and opset,
    into ``work``;
    the ops no adapter covers that hold subgraphs into ``uncovered``; Softmax-like nodes over
    a middle axis going below 13 into ``moves`` (with their input's rank, None where unknown),
    and nodes whose op changed meaning across the conversion into ``refused``."""
    up = a < target
    low, high = sorted((a, target))
    meaning = {op: (v, why) for (op, v), why in MEANING_CHANGED.items() if not up and low < v <= high}
    middle = not up and a >= 13 > target  # Softmax-likes over a middle axis flatten below 13
    plan: dict[str, tuple[Step, ...] | None] = {}
    fn_types = function_types(fn) if fn is not None else None
    for nodes, graph in nested_node_lists(root):  # (nodes, their subgraph; None: the root's)
        for node in nodes:
            domain = node.domain
            if domain == "" or domain == "ai.onnx":
                op = node.op_type
                if op in plan:
                    found = plan[op]
                else:
                    found = steps(op, a, target)
                    if found is not None and up:
                        found = tuple(s for s in found if s.kind in ACTIVE_UP)
                    plan[op] = found
                if op in meaning:
                    refused.append((node, fn, graph, meaning[op]))
                    continue
                if middle and op in SOFTMAX_LIKE:
                    scope = fn_types if fn else types() if graph is None else types().scope(graph)
                    ref = (axis := find_attr(node, "axis")) is not None and axis.ref_attr_name
                    if ref or last_axis(node, False, scope) is None:
                        # onnx's converter keeps the axis, and the older op flattens there
                        moves.append((node, fn, graph, nodes, None if ref else declared_rank(scope, node.input[0])))
                elif found and any(s.kind == "last-axis" for s in found) and last_axis(
                        node, up, fn_types if fn else types() if graph is None else types().scope(graph)) is None:
                    found = None  # not over the last axis: onnx's (a Flatten and a Reshape)
                if found is None and holds_graphs(node):
                    uncovered.add(f"{op} {a}->{target}")
                elif found is None:
                    work.append((node, None, fn, up, graph, nodes, a))
                elif found:
                    work.append((node, found, fn, up, graph, nodes, a))


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


def _drop_unread(model: onnx.ModelProto, conv: Conversion) -> None:
    """Remove the Constants and initializers an adapter stopped reading that nothing else reads."""
    if not conv.released:
        return
    read: set[str] = set()
    holders: list[Any] = []
    for _, v in walk(model):
        if v.graph is None:  # a function's own body
            read.update(v.function.output)
        holders.append(v.function if v.graph is None else v.graph)
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
