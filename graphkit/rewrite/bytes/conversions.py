"""--target-opset conversions spliced into the serialized model: the byte writers' share.

Where converting a model to another ai.onnx opset changes nodes only by steps that touch a
node's own fields (``opset.node_steps``; up: an attribute that became an input, read from
an int64 initializer shared by value, Split-18's ``num_outputs``; down: the input made an
attribute again, attributes and optional inputs dropped at their defaults, types checked),
the byte writer (graphkit.rewrite.bytes.main_graph) keeps every other node as the bytes it was and
puts converted nodes in place of the ones the conversion changes, as it puts replacements in
place of placeholders; going down, the constants they no longer read are removed where
nothing else reads them, as ``opset.convert`` removes them. The conversion is the
adapters' own code (``opset.NodeConverter``), run once per kind of node. A node's kind:
the bytes of its entry after its inputs, outputs and name (op, domain, attributes, doc
string: everything but those names, where the entry is canonical), its arity, whether it
has a name field, and going down what the adapters read by name (the declared element types
of its values, the constant its input 1 names). The first node of a kind is converted (going
up with its inputs renamed apart: an adapter reads no name there but the node's own name or
first output, which names a constant only on the first node asking for its value, the first
of its kind); the others are written as it was, with their own names, or left as they were
where it was. Nodes whose entry is not canonical, with an empty input, or whose names are
not ASCII or longer than 127 bytes are each converted on their own. The constants are named
by the same generator rule, against every name of the model, and added after the main
graph's initializers in the order the nodes asking for them come: ``opset.convert`` on
the whole model, field for field (tests/test_fastpath.py compares the writers).

:func:`splice_scopes` does the same going up in every graph for the bodies' writer
(graphkit.rewrite.bytes.bodies), the nodes in the order ``opset.convert`` walks the graphs,
a node's kind there its canonical serialization but its names (read from the parsed node).

Preconditions, each a :class:`NotSpliced` naming it (the objects writer converts then):
every op of the model covered by such steps (:func:`opset.node_steps`), IR version 4 or
more (initializers need not be graph inputs), the converted ops typed from their input 0
(the byte writers' type pass reads the nodes before they are converted), going down no
converted node in a subgraph nor in the bodies' writer (a constant read may be another
graph's), and for :func:`splice`, none of the ops it changes in a subgraph
(:class:`InSubgraphs`: the bodies' writer's), the main graph's initializers before its
other entries but its nodes.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

import onnx

from graphkit.rewrite.convert import opset
from graphkit.rewrite.bytes import wire
from graphkit.rewrite.graph.walk import AI_ONNX, ModelIndex, graphs, subgraphs
from graphkit.rewrite.graph.type_rules import SAME_AS_INPUT0
from graphkit.rewrite.lowering.builder import NameGenerator

__all__ = ["InSubgraphs", "NotSpliced", "ScopedSplice", "Spliced", "plan", "splice", "splice_scopes"]


class NotSpliced(Exception):
    """The conversion needs more than nodes converted in place: the objects writer does it."""


class InSubgraphs(NotSpliced):
    """Nodes to convert inside subgraphs: :func:`splice_scopes`' business (the bodies' writer)."""


@dataclass
class Spliced:
    """The main graph's nodes the conversion changes, converted.

    ``positions``: their indices in the main graph, increasing; ``entries``: each one's
    converted node entry (graph field 1; None: the node as it was); ``initializers``: the
    constants made, as graph field 5 entries; ``made``: their names; ``checked``: (entry,
    inputs, outputs) of a converted node of each kind and of each node converted on its own
    with other fields than those before it (the others differ from one of them in names
    only), for the check by parts."""

    positions: list[int]
    entries: list[bytes]
    initializers: bytes
    made: list[str]
    checked: list[tuple[bytes, list[str], list[str]]] = field(default_factory=list)
    checked_at: list[int] = field(default_factory=list)  # the index in ``positions`` of each
    removed_nodes: list[int] = field(default_factory=list)  # Constant nodes nothing reads any more
    removed_initializers: list[int] = field(default_factory=list)  # indices of initializers nothing reads


class _DataNames(NameGenerator):
    """A NameGenerator over every name of ``model`` (as ``opset.convert`` is given), which
    reads the model's names only when a name it would make occurs in the serialized model:
    a name that occurs nowhere in it is no name of the model."""

    def __init__(self, data: bytes, model: onnx.ModelProto) -> None:
        super().__init__()
        self._data: bytes | None = data
        self._model = model

    def fresh(self, base: str) -> str:
        if self._data is not None and (base in self._taken or base.encode() in self._data):
            self._taken |= ModelIndex(self._model).names
            self._data = None
        return super().fresh(base)


_SENTINEL = "\x00in"


class _Kind:
    """How the nodes of one kind are written converted: the converted first node's inputs
    (an int: the node's own input at that index; a str: a constant made), its outputs and
    name are each node's own, then the converted first node's other fields (``rest``)."""

    def __init__(self, converted: onnx.NodeProto, made: set[str], n_outputs: int, outputs: Sequence[str],
                 name: str, has_name: bool) -> None:
        inputs: list[int | str] = []
        for x in converted.input:
            if x.startswith(_SENTINEL):
                inputs.append(int(x[len(_SENTINEL):]))
            elif x in made or not x:  # a constant made, or an input left empty
                inputs.append(x)
            else:
                raise NotSpliced(f"an adapter gave {converted.op_type} the input '{x}'")
        if list(converted.output) != list(outputs) or converted.name != name or converted.HasField("name") != has_name:
            raise NotSpliced(f"an adapter renamed a {converted.op_type}'s outputs")
        rest = onnx.NodeProto()
        rest.CopyFrom(converted)
        for f in ("input", "output", "name"):
            rest.ClearField(f)
        self.inputs, self.n_outputs, self.has_name = inputs, n_outputs, has_name
        self.rest = rest.SerializeToString()
        self.same = False  # the conversion left the nodes of the kind as they were

    def emit_one(self, ins: Sequence[str], outs: Sequence[str], name: str) -> bytes:
        parts = [wire.field(b"\x0a", ins[x] if x.__class__ is int else x) for x in self.inputs]
        parts += [wire.field(b"\x12", o) for o in outs]
        if self.has_name:
            parts.append(wire.field(b"\x1a", name))
        parts.append(self.rest)
        body = b"".join(parts)
        return b"\x0a" + wire.encode_varint(len(body)) + body

    def emit_ascii(self, ins: list, outs: list, names: list) -> list[bytes]:
        """emit_one for many nodes whose names are ASCII and under 128 bytes, a column at a
        time (the loops run in C), as latin-1 text (one character per byte)."""
        repeat, add = itertools.repeat, operator.add
        pieces: list[Any] = []
        for x in self.inputs:
            if x.__class__ is str:
                pieces.append(repeat(wire.field(b"\x0a", x).decode("latin-1")))
            else:
                column = list(map(itemgetter(x), ins))
                pieces += (repeat("\n"), map(chr, map(len, column)), column)
        for j in range(self.n_outputs):
            column = list(map(itemgetter(j), outs))
            pieces += (repeat("\x12"), map(chr, map(len, column)), column)
        if self.has_name:
            pieces += (repeat("\x1a"), map(chr, map(len, names)), names)
        pieces.append(repeat(self.rest.decode("latin-1")))
        if all(p.__class__ is repeat for p in pieces):  # nothing of a node's own: all alike
            return [self.emit_one([], [], "")] * len(names)
        bodies = list(map("".join, zip(*pieces)))
        heads = map(add, repeat("\n"), map(wire.text_varint, map(len, bodies)))
        return list(map(str.encode, map(add, heads, bodies), repeat("latin-1")))


Steps = dict  # op -> the steps converting its nodes (opset.node_steps)


def plan(model: onnx.ModelProto, ops: set[tuple[str, str]], sub_ops: set[tuple[str, str]], current: int,
         target: int, bodies: bool = False) -> Steps:
    """The steps converting the ops of the nodes :func:`splice` (``bodies``:
    :func:`splice_scopes`) converts, from ai.onnx opset ``current`` to ``target``; ``ops``:
    the (domain, op) of every node of ``model``, subgraphs' included, ``sub_ops`` those in
    subgraphs. Raises NotSpliced where a precondition (module docstring) does not hold."""
    if bodies and target < current:
        raise NotSpliced(f"a conversion down ({current} -> {target}) in the bodies' writer (constants it reads "
                         "may be another graph's)")
    standard = {op for d, op in ops if d in AI_ONNX}
    try:
        changed = opset.node_steps(standard, current, target)
    except ValueError as exc:
        raise NotSpliced(str(exc)) from exc
    inside = sorted(op for d, op in sub_ops if d in AI_ONNX and op in changed)
    if inside and target < current:
        raise NotSpliced(f"{inside[0]} nodes in a subgraph convert down")
    if inside:
        raise InSubgraphs(f"{inside[0]} nodes in a subgraph convert")
    if 0 < model.ir_version < 4:
        raise NotSpliced("IR version below 4 (the constants would be Constant nodes)")
    untyped = sorted(set(changed) - SAME_AS_INPUT0)
    if untyped:
        raise NotSpliced(f"{untyped[0]} is not typed from its input 0")
    return changed


def splice(data: bytes, model: onnx.ModelProto, domains: list[str], op_types: list[str], starts: Sequence[int],
           ends: Sequence[int], changed: Steps, target: int, path: str | None = None, up: bool = True,
           holders: Sequence[int] = (), read_names: tuple[list[list[str]], list[list[str]]] | None = None) -> Spliced:
    """Convert, by the steps of :func:`plan`, the main graph's nodes of ``model``
    (serialized: ``data``; its node entries from ``starts`` to ``ends``) to ai.onnx opset
    ``target``, ``up`` or down; ``domains`` and ``op_types``: its nodes', ``holders``: the
    indices of those holding subgraphs; ``read_names``: the inputs and the outputs of the
    first nodes, where the caller read them already. Going down, each node is converted on its own (the
    adapters read its values' declared types and the constant its input 1 names); an entry
    None is a node the conversion left as it was; the constants converted nodes stopped
    reading that nothing else reads are removed (``removed_nodes``, ``removed_initializers``)."""
    nodes = model.graph.node
    flags = map(operator.and_, map(changed.__contains__, op_types), map(AI_ONNX.__contains__, domains))
    positions = list(itertools.compress(range(len(op_types)), flags))
    node_at = nodes.__getitem__
    everything = itemgetter(slice(None))
    known = bisect.bisect_left(positions, len(read_names[0])) if read_names is not None else 0  # read already
    ins = list(map(read_names[0].__getitem__, positions[:known])) if known else []
    outs = list(map(read_names[1].__getitem__, positions[:known])) if known else []
    ins += map(everything, map(attrgetter("input"), map(node_at, positions[known:])))
    outs += map(everything, map(attrgetter("output"), map(node_at, positions[known:])))
    names = list(map(attrgetter("name"), map(node_at, positions)))
    has_name = list(map(operator.methodcaller("HasField", "name"), map(node_at, positions)))
    n_ins = list(map(len, ins))
    n_outs = list(map(len, outs))
    text = "".join(itertools.chain(itertools.chain.from_iterable(ins), itertools.chain.from_iterable(outs), names))
    longest = max(itertools.chain(map(len, itertools.chain.from_iterable(ins)),
                                  map(len, itertools.chain.from_iterable(outs)), map(len, names)), default=0)
    ascii_names = text.isascii() and longest < 0x80
    del text
    converter = opset.NodeConverter(model, target, _DataNames(data, model), path, up=up, flat=not holders,
                                    op_types=op_types)
    empty = list(map(operator.contains, ins, itertools.repeat("")))
    kind_keys: list[Any]
    if ascii_names:
        # Where each entry is canonical, its inputs, outputs and name come first: what follows
        # them is the kind (checked on the first of each kind; see the module docstring).
        at = list(map(starts.__getitem__, positions))
        to = list(map(ends.__getitem__, positions))
        own = map(operator.add, map(sum, map(map, itertools.repeat(len), ins)), map(operator.mul, n_ins,
                                                                                     itertools.repeat(2)))
        own = map(operator.add, own, map(sum, map(map, itertools.repeat(len), outs)))
        own = map(operator.add, own, map(operator.mul, n_outs, itertools.repeat(2)))
        own = map(operator.add, own, map(operator.mul, has_name, map(operator.add, map(len, names),
                                                                     itertools.repeat(2))))
        rest_at = map(operator.add, map(operator.add, at, map(wire.header, map(operator.sub, to, at))), own)
        rests = map(data.__getitem__, map(slice, rest_at, to))
        numbers: dict[tuple, int] = {}
        # going down, the adapters read the values' declared types and input 1's constant too
        reads = itertools.repeat(None) if up else converter.reads(ins, outs)
        kind_keys = list(map(numbers.setdefault, zip(rests, n_ins, n_outs, has_name, empty, reads),
                             itertools.count()))
        del at, to, numbers
    else:
        kind_keys = list(range(len(positions)))  # each node on its own
    out = Spliced(positions, [None] * len(positions), b"", converter.made)
    read: set[str] = set()  # going down: what the converted nodes read
    seen: set[tuple] = set()  # the checked nodes converted on their own, but their names
    entries = out.entries
    kinds: dict[int, _Kind | None] = {}  # None: each node of the kind converted on its own
    members: dict[int, list[int]] = {}
    for k, key in enumerate(kind_keys):  # in the nodes' order: constants named as convert names them
        kind = kinds.get(key, False)
        if kind:
            members[key].append(k)
            continue
        node = onnx.NodeProto()
        node.CopyFrom(node_at(positions[k]))
        op_steps = changed[node.op_type]
        if kind is False and ascii_names and not empty[k] and _canonical(data, starts[positions[k]],
                                                                         ends[positions[k]], node):
            if up:  # the adapters read no input name: the inputs renamed apart show where each goes
                for j in range(len(node.input)):
                    node.input[j] = f"{_SENTINEL}{j}"
                converter.convert(node, op_steps)
            else:  # down, they read the names: converted as it is, its inputs kept a prefix of its own
                converter.convert(node, op_steps)
                kept = len(node.input)
                if node.input[:] != ins[k][:kept]:
                    raise NotSpliced(f"an adapter gave {node.op_type} inputs of its own")
                for j in range(kept):
                    node.input[j] = f"{_SENTINEL}{j}"
            kind = kinds[key] = _Kind(node, set(converter.made), n_outs[k], outs[k], names[k], has_name[k])
            members[key] = []
            entries[k] = kind.emit_one(ins[k], outs[k], names[k])
            p = positions[k]
            kind.same = data[starts[p]:ends[p]] == entries[k]  # the node left as it was: so are the others
            inputs = [ins[k][x] if x.__class__ is int else x for x in kind.inputs]
            read.update(inputs)
            if kind.same:
                out.checked.append((entries[k], inputs, outs[k]))
                out.checked_at.append(k)
                entries[k] = None
                continue
        else:
            kinds[key] = None
            converter.convert(node, op_steps)
            entry = wire.field(b"\x0a", node.SerializeToString())
            p = positions[k]
            entries[k] = None if data[starts[p]:ends[p]] == entry else entry  # None: left as it was
            inputs = list(node.input)
            read.update(inputs)
            bare = onnx.NodeProto()
            bare.CopyFrom(node)
            for f in ("input", "output", "name"):
                bare.ClearField(f)
            pattern = (bare.SerializeToString(), tuple(map(operator.not_, inputs)), len(node.output),
                       node.HasField("name"))
            if pattern in seen:  # the checker sees in a node its fields but its names: one of each is checked
                continue
            seen.add(pattern)
            entry = entry if entries[k] is None else entries[k]
        out.checked.append((entries[k] if entries[k] is not None else entry, inputs, outs[k]))
        out.checked_at.append(k)
    released = set(converter.released)
    for key, kind in kinds.items():
        block = members.get(key)
        if not kind or not block:
            continue
        if released:  # what they still read (kinds keep a prefix of the inputs)
            read.update(itertools.chain.from_iterable(map(itemgetter(slice(len(kind.inputs))),
                                                          map(ins.__getitem__, block))))
        if kind.same:  # entries None: left as they were
            continue
        results = kind.emit_ascii(list(map(ins.__getitem__, block)), list(map(outs.__getitem__, block)),
                                  list(map(names.__getitem__, block)))
        for k, entry in zip(block, results):
            entries[k] = entry
    out.initializers = b"".join(wire.field(b"\x2a", t.SerializeToString()) for t in converter.initializers())
    if released:  # _convert's _drop_unread: what nothing reads any more is removed
        if _read_elsewhere(data, released, ins):
            kept = bytearray(b"\x01") * len(op_types)
            for p in positions:
                kept[p] = 0
            read.update(itertools.chain.from_iterable(map(attrgetter("input"), itertools.compress(nodes, kept))))
            read.update(map(attrgetter("name"), model.graph.output))
            for p in holders:
                for sub in subgraphs(nodes[p]):
                    for g in graphs(sub):
                        read.update(itertools.chain.from_iterable(map(attrgetter("input"), g.node)))
                        read.update(map(attrgetter("name"), g.output))
        unread = released - read
        tensors = converter.released_initializers & unread
        out.removed_initializers = [i for i, name in enumerate(map(attrgetter("name"), model.graph.initializer))
                                    if name in tensors]
        constants = unread - converter.released_initializers
        if constants:
            out.removed_nodes = [p for p in itertools.compress(range(len(op_types)), map(
                operator.eq, op_types, itertools.repeat("Constant"))) if nodes[p].output[0] in constants]
    return out


def _read_elsewhere(data: bytes, names: set[str], inputs_of: list[list[str]]) -> bool:
    """Whether a node other than the converted ones (inputs ``inputs_of``), in any graph, or a
    graph output may name one of ``names``; False only where it surely does not. A node input
    and a graph output are each a field 1 holding the name, so the name held by field 1
    occurs in ``data`` as often as the converted nodes read it where nothing else does (a
    match elsewhere, say in a tensor's bytes, only counts more: then the caller looks)."""
    flat = list(itertools.chain.from_iterable(inputs_of))
    for name in names:
        text = name.encode()
        if data.count(b"\x0a" + wire.encode_varint(len(text)) + text) != flat.count(name):
            return True
    return False


def _canonical(data: bytes, start: int, end: int, node: onnx.NodeProto) -> bool:
    """Whether the node entry ``data[start:end]`` is ``node`` as protobuf writes it."""
    body = node.SerializeToString()
    return end - start == 1 + len(wire.encode_varint(len(body))) + len(body) and data.endswith(body, start, end)


@dataclass
class ScopedSplice:
    """The nodes the conversion changes in every graph of the model (the bodies' writer's
    share): ``scopes`` (those holding such nodes, in :func:`splice_scopes`' order), per scope
    ``at`` (its converted nodes' indices, increasing) and ``entries`` (their converted node
    entries), the constants' ``initializers`` and ``made`` names, ``checked``: (path of the
    node, entry, inputs, outputs) of each kind's first node."""

    scopes: list[Any]
    at: list[list[int]]
    entries: list[list[bytes]]
    initializers: bytes
    made: list[str]
    checked: list[tuple[tuple, bytes, list[str], list[str]]]
    insert_at: int  # where the initializers go in the serialized model: after the main graph's own

    def merge(self, scopes: list[Any], slots: dict[int, list[bytes]]) -> None:
        """Put the converted nodes among each scope's placeholders (``scope.custom``, its
        replacements in ``slots``), then mark dirty every graph holding one, as the listing
        marks those holding placeholders (``scopes``: a graph before the graphs in it). A
        column of _MERGE_BLOCK scopes at a time (the lists they had freed as it goes)."""
        clean = False  # a graph holding converted nodes only: the graphs around it are marked again
        for at in range(0, len(self.scopes), _MERGE_BLOCK):
            end = at + _MERGE_BLOCK
            clean = _merged(self.scopes[at:end], self.at[at:end], self.entries[at:end], slots) or clean
        if clean:
            for scope in reversed(scopes):
                scope.subs = [(index, n, any(s.dirty for _, _, subs in held for _, s in subs), held)
                              for index, n, _, held in scope.subs]
                scope.dirty = bool(scope.custom) or any(dirty for _, _, dirty, _ in scope.subs)

    def insert(self, pieces: list[Any], data: bytes, g1: int) -> list[Any]:
        """The main graph's serialized ``pieces`` (ending at ``g1`` of ``data``) with the
        initializers after the graph's own."""
        if not self.initializers:
            return pieces
        last = g1 - len(pieces[-1])  # the last piece is the input's bytes from there on
        view = memoryview(data)
        return [*pieces[:-1], view[last:self.insert_at], self.initializers, view[self.insert_at:g1]]


_MERGE_BLOCK = 1 << 14


def _merged(converted: list[Any], ats: list[list[int]], entries: list[list[bytes]],
            slots: dict[int, list[bytes]]) -> bool:
    """ScopedSplice.merge for the scopes ``converted`` (their converted nodes' indices ``ats``
    and entries): whether one of them holds no placeholder and was not dirty."""
    customs = list(map(attrgetter("custom"), converted))
    keys = list(map(id, converted))
    bare = list(map(operator.not_, customs))  # no placeholder: the converted nodes alone
    clean = False
    if any(bare):
        these = list(itertools.compress(converted, bare))
        clean = not all(map(attrgetter("dirty"), these))
        list(map(setattr, these, itertools.repeat("custom"), itertools.compress(ats, bare)))
        slots.update(zip(itertools.compress(keys, bare), itertools.compress(entries, bare)))
    mixed = list(itertools.compress(range(len(converted)), map(operator.not_, bare)))
    # the converted nodes after the placeholders (each list increasing): the lists joined
    after = list(map(operator.lt, map(itemgetter(-1), map(customs.__getitem__, mixed)),
                     map(itemgetter(0), map(ats.__getitem__, mixed))))
    joined = list(itertools.compress(mixed, after))
    if joined:
        list(map(setattr, map(converted.__getitem__, joined), itertools.repeat("custom"),
                 map(operator.add, map(customs.__getitem__, joined), map(ats.__getitem__, joined))))
        joined_keys = list(map(keys.__getitem__, joined))
        slots.update(zip(joined_keys, map(operator.add, map(slots.__getitem__, joined_keys),
                                          map(entries.__getitem__, joined))))
    for j in itertools.compress(mixed, map(operator.not_, after)):
        scope, key = converted[j], keys[j]
        positions = customs[j] + ats[j]
        written = slots[key] + entries[j]
        order = sorted(range(len(positions)), key=positions.__getitem__)
        scope.custom = list(map(positions.__getitem__, order))
        slots[key] = list(map(written.__getitem__, order))
    return clean


def splice_scopes(data: bytes, model: onnx.ModelProto, main: Any, changed: Steps, target: int,
                  others: list[tuple[int, int, int]], ends: Sequence[int], g1: int,
                  path: str | None = None) -> ScopedSplice:
    """Convert, by the steps of :func:`plan`, the nodes of every graph of ``model`` (``main``:
    its main graph's scope, ``subs`` the graphs nested in each; ``others`` and ``ends``: the
    main graph's entries but its nodes, and its node entries' ends, in ``data``), in the order
    ``opset.convert`` walks them: a graph's nodes, then the graphs nested in them, the last
    one first. A node's kind is its canonical serialization but its inputs, outputs and name,
    its arity, which inputs are empty and whether it has a name field; each kind's first node
    is converted, the others written from it (canonical, as the objects writer serializes)."""
    insert_at = max((end for field, _, end in others if field == 5), default=None)
    if insert_at is None:
        insert_at = min((start for field, start, _ in others if field > 5), default=g1)
    if len(ends) and insert_at < ends[-1]:
        raise NotSpliced("initializers before the main graph's last node")
    converter = opset.NodeConverter(model, target, _DataNames(data, model), path)
    kinds: dict[tuple, _Kind] = {}
    members: dict[tuple, list[tuple[int, int, list[str], list[str], str]]] = {}
    out = ScopedSplice([], [], [], b"", converter.made, [], insert_at)
    stack = [main]
    op_type, wanted, count = attrgetter("op_type"), changed.__contains__, itertools.count
    while stack:
        scope = stack.pop()
        nodes = scope.graph.node
        hits = list(itertools.compress(count(), map(wanted, map(op_type, nodes))))
        at, entries = [], []
        for i in hits:
            node = nodes[i]
            if node.domain not in AI_ONNX:
                continue
            ins, outs, name, has_name = node.input[:], node.output[:], node.name, node.HasField("name")
            whole = node.SerializeToString()
            text_in, text_out = "".join(ins), "".join(outs)
            if len(text_in) < 0x80 and len(text_out) < 0x80 and len(name) < 0x80 and (
                    text_in + text_out + name).isascii():  # each field: key, one-byte length, the name
                own = len(text_in) + len(text_out) + 2 * (len(ins) + len(outs)) + (len(name) + 2 if has_name else 0)
            else:
                own = sum(map(_field_size, ins)) + sum(map(_field_size, outs)) + (
                    _field_size(name) if has_name else 0)
            key = (whole[own:], len(ins), len(outs), "" in ins and tuple(map(operator.not_, ins)), has_name)
            at.append(i)
            kind = kinds.get(key)
            if kind is None:
                copy = onnx.NodeProto()
                copy.CopyFrom(node)
                for j, x in enumerate(ins):
                    if x:
                        copy.input[j] = f"{_SENTINEL}{j}"
                converter.convert(copy, changed[node.op_type])
                kind = kinds[key] = _Kind(copy, set(converter.made), len(outs), outs, name, has_name)
                members[key] = []
                entries.append(entry := kind.emit_one(ins, outs, name))
                out.checked.append(((*scope.path, i), entry, [ins[x] if x.__class__ is int else x
                                                              for x in kind.inputs], outs))
            else:
                members[key].append((len(out.scopes), len(entries), ins, outs, name))
                entries.append(None)
        if at:
            out.scopes.append(scope)
            out.at.append(at)
            out.entries.append(entries)
        for _, _, _, held in scope.subs:
            for _, _, subs in held:
                stack.extend(s for _, s in subs)
    for key, block in members.items():
        if not block:
            continue
        kind = kinds[key]
        ins, outs, names = (list(map(itemgetter(j), block)) for j in (2, 3, 4))
        text = "".join(itertools.chain(itertools.chain.from_iterable(ins), itertools.chain.from_iterable(outs),
                                       names))
        longest = max(map(len, itertools.chain(itertools.chain.from_iterable(ins),
                                               itertools.chain.from_iterable(outs), names)), default=0)
        if text.isascii() and longest < 0x80:
            written = kind.emit_ascii(ins, outs, names)
        else:
            written = list(map(kind.emit_one, ins, outs, names))
        for (s, k, *_), entry in zip(block, written):
            out.entries[s][k] = entry
    out.initializers = b"".join(wire.field(b"\x2a", t.SerializeToString()) for t in converter.initializers())
    return out


def _field_size(name: str) -> int:
    """The bytes of a string field holding ``name``: key, length, UTF-8."""
    n = len(name) if name.isascii() else len(name.encode())
    return 2 + n if n < 0x80 else 1 + len(wire.encode_varint(n)) + n
