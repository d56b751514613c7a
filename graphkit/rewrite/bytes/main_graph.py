"""The main graph's byte writer: replacements spliced into the serialized model.

One of the writers of graphkit.rewrite.writers (:func:`write` is its side of their one
interface; the placeholders become standard ops in ``LoweringPlan.lower``, as in every
writer). The objects writer (``rewrite_model``) copies the model, indexes every name, runs a dtype
pass over every node and rebuilds the node list: Python work on every node. Here the
serialized bytes are kept: the ModelProto's top-level fields and the GraphProto's node
entries are located by decoding tags and lengths, every node that is not a custom::
placeholder stays the byte range it was, and each placeholder's entry is replaced by
the serialized replacement nodes. The parsed model (protobuf's C parser) is read in
bulk, one field of every node at a time, for what needs field values: op counts, the
element types of the placeholders' inputs, the placeholders themselves.

The result is the objects writer's, field for field (tests/test_fastpath.py compares both):

* The lowering chosen, decompositions, templates, constants and first-instance names
  come from the public plan every writer uses: ``LoweringPlan.lower`` (graphkit.rewrite.lowering.plan)
  lowers the first node of each kind. A later node of the same kind (op, attributes,
  arity, input/output aliasing, input types: finer than the plan's template key) repeats
  the ``LoweringTemplate`` it returned as ``LoweringTemplate.instantiate`` would (same renaming, same
  names), compiled to code that writes the serialized nodes (``bytes.common.LoweringTemplateWriter``);
  a bound node reuses the first one's attributes (``bytes.common.BoundWriter``);
  ``LoweringPlan.count`` counts the repeats.
* Generated names: the engine makes them unique against every name of the model, and
  all of them start with ``<prefix>/`` (``prefix``: a placeholder's name, else its op).
  When no ``<prefix>/`` occurs where the input keeps names, no input name can be taken,
  so the generator starts empty; otherwise it gets the model's full name index, as the
  engine's. When, besides, every prefix belongs to one kind, names made for different
  prefixes cannot meet, so template instances are written kind by kind, their names made
  by the generator's own rule (see ``_grouped``).
* Element types: ``TypeTable``'s forward pass (same declarations, rules and order), run
  over pre-read fields and stopped at the last placeholder (``bytes.common.forward_types``).
* Check: ``check_replacement`` per replacement built, then the ONNX checker's verdict on
  the output (``check_model`` on the parsed output where the engine's needs more: small
  models, subgraphs, shapeless graph inputs or outputs, external data). Otherwise that
  verdict is found from parts (``bytes.common.check_parts``), for about the cost of checking the
  input: the checker on the input model as it is, and on a small model of replacements
  under the output's top-level fields: every replacement the plan built and, per kind
  repeated, the first repeat with each pattern of empty names. What the checker asks of a
  node (schema, arity, attributes, which names are empty) depends on its fields and its
  domain's opset, never on its names, and a repeat differs from the one checked in names
  only; the rest is about names: kept nodes and placeholders are in the input (topological
  order and SSA checked there), each checked replacement reads only its placeholder's
  inputs and names made before it and makes its placeholder's outputs, and the names a
  replacement generates are unique against every name of the model and each other: the
  name generator's construction, not checked again here (tests/test_fastpath.py compares
  the output with the objects writer's, whose check sees the whole output). Preconditions,
  else the whole output is checked: every domain both import has the same version before
  and after, no replacement node holds a subgraph. A part that fails sends the check to
  the whole output, so an error is the checker's own words about the output; the
  report's ``writer_reason`` says which check ran. Where
  ``check_replacement`` asks for a shape nothing declares, the engine infers shapes
  over the whole rewritten model; here over its nodes up to where those names are made,
  which gives them the same types (inference goes through the nodes in order).
  Memory: the checker's part on the input runs first, before the lowering reads the
  nodes' names (its own parse of the model, handed back to the system after, and the
  lowering's lists are never held at once; where the lowering then steps aside, the
  objects writer checks its own output and that check was for nothing); the output is
  kept as the pieces it is made of (``writers.Pieces``) and written to the file from them.

The steps are :class:`_MainGraph`'s methods, in :meth:`_MainGraph.run`'s order.

Its preconditions, each an ``Unsupported`` naming it (the report's ``writer_reason``
when the objects writer runs instead; ``InBodies`` where the bodies' byte writer,
graphkit.rewrite.bytes.bodies, takes the model): custom nodes only in the main graph, no model-local
functions or training info, every placeholder input typed by the forward pass (else the
engine would run ONNX shape inference), every type or shape a decomposition or a kernel's
binding asks for known without ONNX shape inference (asked inside the plan, that one is
found when the plan returns: the writer steps aside there, never through the op's code;
``WriterTyping.serving``), and with a target opset other than the model's, a
conversion that moves only the imports (no standard op of the model has a new version
between the two opsets) or converts by steps on the nodes' own fields, nodes converted in
the main graph only (graphkit.rewrite.bytes.conversions: converted nodes are spliced like
replacements, the constants they read put after the graph's initializers, going down those
no longer read removed; the check by parts then checks a converted node of each kind too,
and a kept node's op has the same schema at both opsets or, going up, a newer version that
takes it as it is: the step kinds "types", "attributes" and "optional-input"), and something
to lower. An error while lowering is the plan's, raised as
it is: every writer reports it in the same words.
"""

from __future__ import annotations

import collections
import functools
import heapq
import itertools
import operator
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter, itemgetter
from typing import Any

import onnx

from graphkit.ops._opdef import PLACEHOLDER_DOMAIN
from graphkit.rewrite.bytes import conversions
from graphkit.rewrite.bytes import wire
from graphkit.rewrite import engine as _engine
from graphkit.rewrite.bytes.common import (BoundWriter, LoweringTemplateWriter, assemble, check_output, conversion,
                                          count_after, forward_types, input_refused, lower_first, lowering_plan,
                                          node_names, nothing_to_lower, placeholder_domains, progress_of, read_top,
                                          run_writer, seed_names, spliced_conversion)
from graphkit.rewrite.engine import RewriteReport
from graphkit.rewrite.lowering.plan import Lowering, LoweringScope
from graphkit.rewrite.writers import InBodies, Pieces, Request, Unsupported

__all__ = ["WHY", "write"]

_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS
# Byte probes for AttributeProto.type (field 20, varint) = GRAPH (5) / GRAPHS (10). Every
# encoding of one holds a probe: the key's minimal bytes then the value's first (5, 10, or
# with a continuation bit where a writer pads the value), or a padded key, whose first bytes
# are ``_PADDED_GRAPH``. Where only that one occurs, the input is still trusted if it is
# canonical (as protobuf writes it: nothing padded).
_PROBE_GRAPH = (b"\xa0\x01\x05", b"\xa0\x01\x0a", b"\xa0\x01\x85", b"\xa0\x01\x8a")
_PADDED_GRAPH = b"\xa0\x81"
_EMIT_BLOCK = 1 << 15  # repeats of a kind written at a time


# Why the byte writer runs where it can (the report's writer_reason).
WHY = ("lowering only, custom nodes in the main graph only, no model-local functions: "
       "the replacements are spliced into the serialized model")


# -- the model around the nodes -----------------------------------------------------------


def _subgraph_info(nodes: Sequence[onnx.NodeProto], data: bytes, g0: int, g1: int,
                   canonical: Callable[[], bool]) -> tuple[collections.Counter, set[str], set[int]]:
    """Op counts and names of the main graph's nodes' subgraphs, and those nodes' indices.

    Fails on custom nodes in (or holding) a subgraph.
    """
    counts: collections.Counter = collections.Counter()
    names: set[str] = set()
    holders: set[int] = set()
    if not any(data.find(p, g0, g1) >= 0 for p in _PROBE_GRAPH) and (
            data.find(_PADDED_GRAPH, g0, g1) < 0 or canonical()):
        return counts, names, holders
    from graphkit.rewrite.graph.walk import graphs

    for index, node in enumerate(nodes):
        if not node.attribute:
            continue
        for attr in node.attribute:
            if attr.type == _GRAPH:
                subs = [attr.g]
            elif attr.type == _GRAPHS:
                subs = list(attr.graphs)
            else:
                continue
            holders.add(index)
            if node.domain == PLACEHOLDER_DOMAIN:
                raise Unsupported("a custom node with a subgraph")
            for sub in subs:
                for g in graphs(sub):
                    for vi in (*g.input, *g.output, *g.value_info):
                        names.add(vi.name)
                    names.update(t.name for t in g.initializer)
                    for n in g.node:
                        if n.domain == PLACEHOLDER_DOMAIN:
                            raise InBodies("custom nodes inside a subgraph")
                        counts[(n.domain, n.op_type)] += 1
                        names.update(n.output)
    return counts, names, holders



def _representatives(planned: list[int], kinds: dict[Any, Any], values_of: list[list[str]]) -> list[int]:
    """The placeholders whose replacements ``check_parts`` looks at, in order: every one the
    plan lowered, and per repeated kind the first repeat with each pattern of empty names
    (a repeat's nodes differ from that one's in names only)."""
    chosen = set(planned)
    for kind in kinds.values():
        if kind is None or not kind.members:
            continue
        members = kind.members
        chosen.add(members[0])
        first = next((k for k in members if "" not in values_of[k]), None)
        if first is not None:
            chosen.add(first)
        by_pattern: dict[tuple, int] = {}
        for k in [k for k in members if "" in values_of[k]]:
            by_pattern.setdefault(tuple(map(operator.not_, values_of[k])), k)
        chosen.update(by_pattern.values())
    return sorted(chosen)




def _whole_check(request: Request, holders: set[int], full: bool) -> bool:
    """Whether the output is checked whole, not by parts (see the module docstring): ``full``
    (a small output, or asked for), subgraphs, a shapeless graph input or output, external data."""
    graph = request.model.graph
    shapeless = any(vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")
                    for vi in (*graph.input, *graph.output))
    return full or bool(holders) or shapeless or request.has_external_data()


def _inference_prefix(model: onnx.ModelProto, names: set[str]) -> onnx.ModelProto:
    """``model``, cut (in place) after the last node making one of ``names`` (whole if a name is made twice).

    ONNX shape inference goes through the nodes in order, each typed from what its inputs
    have at that point, the declarations and its attributes: the nodes after that one
    change nothing ``names`` get.
    """
    graph = model.graph
    pending = set(names) - {t.name for t in graph.initializer} - {i.name for i in graph.input}
    made: set[str] = set()
    end = 0
    for end, outputs in enumerate(map(attrgetter("output"), graph.node), 1):
        if not made.isdisjoint(outputs):
            return model
        made.update(outputs)
        pending.difference_update(outputs)
        if not pending:
            break
    del graph.node[end:]
    return model


def _grouped(prefixes: list[str], kind_keys: list[Any]) -> bool:
    """Whether repeats can be written kind by kind, after every first node: every prefix is
    of one kind. With ``scoped`` templates (checked as kinds are made) and no input name
    starting with a '<prefix>/' (the caller's condition), names made for different
    prefixes never meet, so the name generator's calls for one prefix may be made apart
    from the others', in their own order; for a ``plain`` template the c-th node of a
    prefix gets each base + '_<c>' without asking the generator.
    """
    if len(set(prefixes)) == len(prefixes):
        return True
    kind_of: dict[str, tuple] = {}
    setdefault = kind_of.setdefault
    return all(setdefault(p, key) == key for p, key in zip(prefixes, kind_keys))


def _tails(prefixes: list[str]) -> list[str]:
    """'' for the first node of each prefix, '_<c>' for its c-th repeat."""
    distinct = len(set(prefixes))
    if distinct == len(prefixes):  # named nodes: no repeat
        return [""] * distinct
    if distinct == 1:  # unnamed nodes of one op
        return ["", *map("_{}".format, range(1, len(prefixes)))]
    seen: collections.Counter = collections.Counter()
    out = []
    for p in prefixes:
        c = seen[p]
        seen[p] = c + 1
        out.append(f"_{c}" if c else "")
    return out


def _repeater(lowered: Any, n_given: int, batched: bool) -> Any:
    """What repeats a lowering the plan made for the first node of a kind (``n_given``
    inputs): a LoweringTemplateWriter, a BoundWriter, or None where the plan lowers each node of the kind."""
    if lowered.how is Lowering.DECOMPOSE:
        if lowered.template is None:
            return None  # shape-dependent: the plan lowers every such node
        made: Any = LoweringTemplateWriter(lowered.template)
        made.pad = _padding(n_given, made.n_inputs)
        if batched and not made.scoped:
            raise Unsupported("a decomposition makes names with '/' of its own")
        return made
    return BoundWriter(lowered.nodes[0]) if len(lowered.nodes) == 1 else None


def _groups(kind_keys: list[int]) -> dict[int, list[int]]:
    """Each kind's placeholders, in order (a few kinds: found a kind at a time, in C)."""
    distinct = set(kind_keys)
    everything = range(len(kind_keys))
    if len(distinct) == 1:
        return {kind_keys[0]: list(everything)}
    if len(distinct) <= 16:
        return {key: list(itertools.compress(everything, map(operator.eq, kind_keys, itertools.repeat(key))))
                for key in distinct}
    groups: dict[int, list[int]] = collections.defaultdict(list)
    for k, key in enumerate(kind_keys):
        groups[key].append(k)
    return groups


class _Positions:
    """Positions in increasing order, more added while they are gone through."""

    def __init__(self, positions: Iterable[int]) -> None:
        self._heap = list(positions)
        heapq.heapify(self._heap)

    def __iter__(self) -> Iterator[int]:
        while self._heap:
            yield heapq.heappop(self._heap)

    def extend(self, positions: Iterable[int]) -> None:
        for p in positions:
            heapq.heappush(self._heap, p)


def _padding(n_given: int, n_inputs: int) -> Callable[[list], list]:
    """values (inputs + outputs) -> the same with the inputs padded to n_inputs, as the engine pads."""
    if n_given >= n_inputs:
        return _same
    pad = [""] * (n_inputs - n_given)
    return lambda values: values[:n_given] + pad + values[n_given:]


def _same(values: list) -> list:
    return values



def write(request: Request) -> tuple[Pieces, RewriteReport]:
    """The main graph's byte writer (graphkit.rewrite.writers' interface): the request's model
    with its placeholders lowered, as the pieces of the serialized output, and the report
    ``rewrite_model`` gives for the same input and options. Unsupported where the objects
    writer must do it; InBodies where the placeholders (or the nodes a conversion changes)
    are inside subgraphs. A ``target_opset`` is already validated."""
    return run_writer(_MainGraph, request)


class _MainGraph:
    """One rewrite by the main graph's byte writer, a step a method, in :meth:`run`'s order:
    read the model around its nodes (the preconditions), check the input, type the
    placeholders' inputs, seed the names (and splice the conversion), sort the placeholders
    into kinds, lower the first of each kind by the plan and repeat it on the others, splice
    the graph and assemble the output, check the output. A step drops what no later one
    reads: the lists are as long as the graph."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.data, self.model, self.registry = request.data, request.model, request.registry

    def run(self) -> tuple[Pieces, Callable[[], None] | None]:
        """The output, and the check to run on it (None: no check)."""
        if not self.read():
            return Pieces([self.data]), None
        self.check_input()
        self.type_placeholders()
        self.seed_and_convert()
        self.sort_into_kinds()
        self.lower()
        self.write_repeats()
        out = self.splice()
        return out, (self.checker(out) if self.request.check else None)

    def read(self) -> bool:
        """The model's top-level entries, the main graph's node entries and the fields of every
        node, the report's counts before, and the preconditions. False: nothing to lower."""
        data, model, registry, request = self.data, self.model, self.registry, self.request
        top, (g0, g1) = read_top(data)
        starts, ends, others = wire.node_entries(data, g0, g1)
        # Node fields are read a field of every node at a time, straight from the parsed graph:
        # a list of the nodes would keep a Python object per node, and per field read (several
        # hundred bytes a node, which the process pays for again in page faults).
        nodes = model.graph.node
        if len(starts) != len(nodes):
            raise Unsupported("node entries do not match the parsed graph")
        # Interned: every node's domain and op_type read from the parsed graph is a new str
        # (tens of bytes each, a million nodes); the lists keep a few shared ones.
        domains = list(map(sys.intern, map(attrgetter("domain"), nodes)))
        op_types = list(map(sys.intern, map(attrgetter("op_type"), nodes)))
        sub_counts, self.sub_names, self.holders = _subgraph_info(nodes, data, g0, g1, request.canonical)
        report = self.report = RewriteReport(ops_before=collections.Counter(zip(domains, op_types)) + sub_counts)
        keep = request.prefer == (Lowering.KEEP,)
        self.placeholders = placeholder_domains(registry, report.ops_before, keep)
        self.current, self.converting, self.changed = conversion(request, report.ops_before, sub_counts)
        custom = array("q", itertools.compress(range(len(domains)), map(operator.eq, domains,
                                                                         itertools.repeat(PLACEHOLDER_DOMAIN))))
        if not custom or keep:
            nothing_to_lower(report, self.converting)
            return False
        self.top, self.graph_span, self.starts, self.ends, self.others = top, (g0, g1), starts, ends, others
        self.nodes, self.domains, self.op_types, self.custom = nodes, domains, op_types, custom
        return True

    def check_input(self) -> None:
        """The checker on the input (a part of the check by parts), where the output will be
        checked by parts: now, before the lowering's lists exist (its own parse of the model is
        the biggest thing it makes, and the output is not made yet either)."""
        request = self.request
        self.input_refused = None
        if request.check and not _whole_check(request, self.holders, request.full_check or sum(
                self.report.ops_before.values()) <= _engine.FULL_CHECK_NODES):
            self.input_refused = input_refused(self.data, self.registry)

    def type_placeholders(self) -> None:
        """Each placeholder's inputs, outputs and name prefix, and the type table (the forward
        pass over the fields of every node up to the last placeholder, read once)."""
        nodes, custom, op_types = self.nodes, self.custom, self.op_types
        listed = custom[-1] + 1
        ins, outs = node_names(nodes, listed)
        inputs_of = self.inputs_of = list(map(ins.__getitem__, custom))
        self.outputs_of = list(map(outs.__getitem__, custom))
        names = list(map(attrgetter("name"), map(nodes.__getitem__, custom)))
        custom_ops = self.custom_ops = list(map(op_types.__getitem__, custom))
        self.prefixes = [name or op for name, op in zip(names, custom_ops)]
        self.types, self.typing = forward_types(self.model, self.registry, nodes, self.domains[:listed],
                                                op_types[:listed], ins, outs, self.holders, self.sub_names,
                                                itertools.chain.from_iterable(inputs_of))
        self.read_names = None
        if self.changed is not None:  # the conversion reads the converted ops' again: theirs alone kept
            converted = set(self.changed)
            for p in itertools.compress(range(listed), map(operator.not_, map(converted.__contains__, op_types))):
                ins[p] = outs[p] = None
            self.read_names = (ins, outs)
        del ins, outs
        sub_names = self.sub_names
        if sub_names and any(not sub_names.isdisjoint(i) for i in inputs_of):
            raise Unsupported("a custom node reads a name a subgraph declares")

    def seed_and_convert(self) -> None:
        """The names the generator starts with (graphkit.rewrite.bytes.common.seed_names), the
        conversion's nodes spliced (graphkit.rewrite.bytes.conversions: before the lowering, as in
        the objects writer), and the lowering plan."""
        request, data, model = self.request, self.data, self.model
        target = request.target_opset
        seed = self.seed = seed_names(data, model, self.top, self.others, self.starts, self.ends, self.graph_span,
                                      set(self.prefixes))
        self.spliced = None
        if self.changed is not None:
            with spliced_conversion(target):
                self.spliced = conversions.splice(data, model, self.domains, self.op_types, self.starts, self.ends,
                                                    self.changed, target, request.path, up=target > self.current,
                                                    holders=sorted(self.holders), read_names=self.read_names)
            self.read_names = None
            if seed is not None:  # the engine lowers after the conversion, its constants' names taken
                seed.update(self.spliced.made)
            # else no name of the model starts with a '<prefix>/', nor does any constant's (each
            # is a node's name or output, '_<what>' and a number added): the lowering makes only those
        self.opset, self.plan = lowering_plan(request, self.current, seed)

    def sort_into_kinds(self) -> None:
        """Each placeholder's kind: op, attributes, arity, aliasing among its inputs and outputs,
        input types (the forward pass's, as the engine asks for them). Kinds are finer than the
        plan's template keys, so every node of a kind is lowered the same way: the first by the
        plan, the others by repeating that (LoweringTemplateWriter, BoundWriter)."""
        custom, node_at = self.custom, self.nodes.__getitem__
        inputs_of, outputs_of = self.inputs_of, self.outputs_of
        attr_keys = [b""] * len(custom)
        for k in itertools.compress(range(len(custom)), list(map(len, map(attrgetter("attribute"),
                                                                           map(node_at, custom))))):
            attr_keys[k] = b"".join(a.SerializeToString() for a in node_at(custom[k]).attribute)
        values_of = self.values_of = list(map(operator.add, inputs_of, outputs_of))
        aliasing: Any = list(map(operator.eq, map(len, map(set, values_of)), map(len, values_of)))
        if not all(aliasing):
            aliasing = (flag or tuple(map(v.index, v)) for flag, v in zip(aliasing, values_of))
        n_inputs = self.n_inputs = list(map(len, inputs_of))
        # Every input's type in one map, then each node's as a slice of them (no map object a node).
        all_types = tuple(map(self.types.elem_types.get, itertools.chain.from_iterable(inputs_of)))
        input_at = list(itertools.accumulate(n_inputs, initial=0))
        in_types_of = map(all_types.__getitem__, map(slice, input_at, input_at[1:]))
        del input_at
        # Each kind as a number (the first of its kind's index in a count): small keys, no tuple kept per node.
        kind_numbers: dict[tuple, int] = {}
        self.kind_keys = list(map(kind_numbers.setdefault, zip(self.custom_ops, attr_keys, n_inputs,
                                                               map(len, outputs_of), aliasing, in_types_of),
                                  itertools.count()))
        del attr_keys, aliasing, kind_numbers
        del self.inputs_of, self.outputs_of  # values_of holds the names
        self.batched = self.seed is None and _grouped(self.prefixes, self.kind_keys)
        self.tails = _tails(self.prefixes) if self.batched else None

    def lower(self) -> None:
        """The first node of each kind (and every node of a kind the plan lowers each time) by
        the plan; the others repeat it. Batched (``_grouped``), the firsts are lowered in order
        and the repeats found a kind at a time, written by :meth:`write_repeats`; else each
        repeat is written here, in order."""
        custom, node_at, kind_keys, values_of = self.custom, self.nodes.__getitem__, self.kind_keys, self.values_of
        prefixes, n_inputs, custom_ops, batched = self.prefixes, self.n_inputs, self.custom_ops, self.batched
        plan, types = self.plan, self.types
        scope = LoweringScope(types)
        fresh = plan.names.fresh
        kinds = self.kinds = {}  # kind -> LoweringTemplateWriter, BoundWriter, or None: the plan lowers each node
        planned = self.planned = []  # the placeholders the plan lowered (the others repeat one of them)
        slots = self.slots = [None] * len(custom)  # each placeholder's replacement entries
        total = len(self.nodes)
        progress, step = progress_of(self.request, total)
        self.progress = progress
        next_report = 0
        groups = _groups(kind_keys) if batched and progress is None else None
        order: Any = range(len(custom)) if groups is None else _Positions(g[0] for g in groups.values())
        for k in order:
            key = kind_keys[k]
            if progress is not None and custom[k] >= next_report:
                progress("lowering", custom[k], total)
                next_report = custom[k] - custom[k] % step + step
            kind = kinds.get(key)
            if kind is not None:
                kind.members.append(k)
                if batched:
                    continue
                if kind.__class__ is BoundWriter:
                    slots[k] = kind.emit(node_at(custom[k]))
                else:
                    slots[k] = kind.emit(kind.pad(values_of[k]), prefixes[k], fresh)
                continue
            # The first node of its kind (or of a kind the plan lowers each time), by the plan.
            planned.append(k)
            lowered = lower_first(plan, node_at(custom[k]), scope, self.typing)
            slots[k] = b"".join(wire.entry(r.SerializeToString()) for r in lowered.nodes)
            if key in kinds:
                continue
            made = kinds[key] = _repeater(lowered, n_inputs[k], batched)
            if made is None:
                if groups is not None:
                    order.extend(groups[key][1:])
                continue
            made.lowered, made.op_type = lowered, custom_ops[k]
            made.members = [] if groups is None else groups[key][1:]

    def write_repeats(self) -> None:
        """Batched, each kind's repeats written together, a block at a time; then every repeat
        counted in the plan, and the report's counts after."""
        custom, node_at, values_of, prefixes, tails = (self.custom, self.nodes.__getitem__, self.values_of,
                                                       self.prefixes, self.tails)
        slots, fresh, plan = self.slots, self.plan.names.fresh, self.plan
        used: collections.Counter = collections.Counter()
        for kind in self.kinds.values():
            if kind is None or not kind.members:
                continue
            members = kind.members
            used[kind] += len(members)
            if not self.batched:
                continue  # written by lower()
            own_names = kind.__class__ is not BoundWriter and not kind.plain and any(map(tails.__getitem__, members))
            # A block of members at a time: what emitting makes besides the entries (names,
            # texts) stays the size of a block.
            for at in range(0, len(members), _EMIT_BLOCK):
                block = members[at:at + _EMIT_BLOCK]
                if kind.__class__ is BoundWriter:
                    results = list(map(kind.emit, map(node_at, map(custom.__getitem__, block))))
                else:
                    values = list(map(kind.pad, map(values_of.__getitem__, block)))
                    names_ = list(map(prefixes.__getitem__, block))
                    tails_ = list(map(tails.__getitem__, block))
                    if own_names:  # the generator's own names, in this prefix's order
                        results = [kind.emit(v, p, fresh) for v, p in zip(values, names_)]
                    elif kind.ascii and "".join(names_).isascii() and "".join(
                            itertools.chain.from_iterable(values)).isascii():
                        results = kind.emit_ascii(values, names_, tails_)
                    else:
                        results = kind.emit_all(values, names_, tails_)
                for k, entries in zip(block, results):
                    slots[k] = entries
        if self.progress is not None:
            self.progress("lowering", len(self.nodes), len(self.nodes))
        for kind, n in used.items():
            plan.count(kind.lowered, PLACEHOLDER_DOMAIN, kind.op_type, n, repeated=True)
        count_after(self.report, plan)

    def splice(self) -> Pieces:
        """The graph: the bytes between placeholders as they were, each placeholder replaced (and
        each node the conversion changed, the constants it no longer reads removed; the
        constants it made after the graph's initializers); the output assembled around it."""
        data, report, spliced, starts, ends = self.data, self.report, self.spliced, self.starts, self.ends
        g0, g1 = self.graph_span
        spliced_at, entries, tail = self.custom, self.slots, []  # tail: (start, end, bytes) after the last node entry
        if spliced is not None:
            spliced_at, entries, tail = self._with_conversion(spliced)
        entry_starts = array("q", map(starts.__getitem__, spliced_at))
        entry_ends = array("q", map(ends.__getitem__, spliced_at))
        view = memoryview(data)  # big slices without a copy (small ones are cheaper as bytes)
        gaps = [view[g0:entry_starts[0]], *map(data.__getitem__, map(slice, entry_ends[:-1], entry_starts[1:]))]
        # The graph's pieces go into the output as they are: one copy of the graph, not two.
        graph = [*itertools.chain.from_iterable(zip(gaps, entries))]
        last = entry_ends[-1]
        for start, end, written in tail:
            graph += [view[last:start], written]
            last = end
        graph.append(view[last:g1])
        del gaps, entry_starts, entry_ends, spliced_at, entries
        target, changed = self.request.target_opset, self.changed
        out, self.header, self.import_entries = assemble(
            view, self.model, self.top, graph, report, opset=self.opset, placeholders=self.placeholders,
            target_opset=target, current=self.current, lowered=len(self.custom), why=WHY,
            converted=None if changed is None else sorted(changed))
        return out

    def _with_conversion(self, spliced: conversions.Spliced) -> tuple[Any, list, list]:
        """The node entries to splice (their indices, their new entries) with the conversion's
        among the replacements, and what goes after the last node entry (start, end, bytes):
        initializers removed, the constants made."""
        report, domains, others = self.report, self.domains, self.others
        spliced_at, entries = self.custom, self.slots
        if spliced.removed_nodes:
            removed = collections.Counter((domains[p], "Constant") for p in spliced.removed_nodes)
            report.ops_after = +(report.ops_after - removed)
        converted = [(p, e) for p, e in zip(spliced.positions, spliced.entries) if e is not None]
        if spliced.removed_nodes:
            converted = sorted({**dict(converted), **dict.fromkeys(spliced.removed_nodes, b"")}.items())
        if converted:
            merged = sorted(itertools.chain(zip(self.custom, self.slots), converted), key=itemgetter(0))
            spliced_at, entries = array("q", map(itemgetter(0), merged)), list(map(itemgetter(1), merged))
            del merged
        del converted
        initializer_entries = [(start, end) for field, start, end in others if field == 5]
        tail = [(*initializer_entries[i], b"") for i in spliced.removed_initializers]
        if spliced.initializers:
            at = max((end for _, end in initializer_entries), default=None)
            if at is None:
                at = min((start for field, start, _ in others if field > 5), default=self.graph_span[1])
            tail.append((at, at, spliced.initializers))
        tail.sort(key=itemgetter(0))
        if tail and self.starts and tail[0][0] < self.ends[-1]:
            raise Unsupported("initializers before the graph's last node")
        return spliced_at, entries, tail

    def checker(self, out: Pieces) -> Callable[[], None]:
        """The check of the output ``out``, as a function holding only what it reads of the
        lowering (the rest is freed before it runs): each replacement the plan built, then the
        ONNX checker's verdict on the output, by parts where the module docstring's conditions
        hold, else on the whole output."""
        slots, values_of, n_inputs, custom, spliced = self.slots, self.values_of, self.n_inputs, self.custom, self.spliced
        chosen = _representatives(self.planned, self.kinds, values_of)
        replaced = [(slots[k], values_of[k][:n_inputs[k]], values_of[k][n_inputs[k]:]) for k in chosen]
        if spliced is not None and spliced.checked:  # with a converted node of each kind, in the output's order
            at = [custom[k] for k in chosen]
            at += [spliced.positions[k] for k in spliced.checked_at]
            replaced = [part for _, part in sorted(zip(at, replaced + spliced.checked), key=itemgetter(0))]
        del slots, values_of, n_inputs, custom, spliced, chosen
        request, plan, holders = self.request, self.plan, self.holders

        def inference_model(output_model: Callable[[], onnx.ModelProto]) -> Callable[[], onnx.ModelProto]:
            def cut() -> onnx.ModelProto:
                """The rewritten model, cut where the names the check asks about are all made."""
                if holders:
                    return output_model()
                asked: set[str] = set()
                for r in plan.replacements:
                    produced = {o for n in r.nodes for o in n.output}
                    asked.update(i for n in r.nodes for i in n.input if i and i not in produced)
                return _inference_prefix(onnx.load_model_from_string(out.join()), asked)

            return cut

        return functools.partial(check_output, out, request, self.report, plan, self.types, self.typing,
                                 header=self.header, import_entries=self.import_entries, refused=self.input_refused,
                                 converting=self.converting, whole=lambda full: _whole_check(request, holders, full),
                                 replaced=lambda: replaced, inference_model=inference_model, whole_bytes=True)
