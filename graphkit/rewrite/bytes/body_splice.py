"""The bodies writer's output: the graphs holding placeholders written again around their new
entries, and the main graph's nodes holding those graphs.

A graph's value is its bytes with each placeholder's entry replaced and each nested graph
holding placeholders written again, their length prefixes new (:func:`graph_bytes`). The
main-graph nodes holding such graphs are written again without being parsed where they are
as protobuf writes them: each field of a block of them read at once with numpy, their
placeholders' entries replaced and the length prefixes around them written again
(:func:`holder_entries`); any other node is parsed alone, giving the same bytes. Where every
graph is listed (a conversion in bodies, the graph-by-graph pass), :func:`graph_bytes` writes
the main graph's nodes whose graphs hold none with placeholders by the same block splice, and
any other (or one not as protobuf writes it) by splicing its bytes node by node: the input's
bytes either way. graphkit.rewrite.bytes.bodies lowers the placeholders and hands the
replacements here.
"""

from __future__ import annotations

import itertools
from array import array
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np
import onnx

from graphkit.rewrite.bytes import wire
from graphkit.rewrite.bytes.wire import Unsupported

__all__ = ["BLOCK", "SpliceGraph", "graph_bytes", "holder_entries"]

_GRAPH = onnx.AttributeProto.GRAPH
BLOCK = 1 << 14  # graphs (and placeholders written a field at a time) the lowering holds the lists of at once
# main-graph nodes written again at once (_holders_in_blocks): the columns of small pieces a block is written
# from are what the writer's peak memory grows by (16384 of them: about 25 MB more, 4096: 6 MB)
_HOLDER_BLOCK = 1 << 12


class SpliceGraph:
    """One graph: its parsed message, its path from the main graph, the placeholders' indices
    and the nested graphs (``subs``: per node holding graphs, (node index, [(attribute index,
    [(position among the attribute's graphs, SpliceGraph)])]))."""

    __slots__ = ("graph", "path", "size", "custom", "subs", "dirty", "nodes", "fields")

    def __init__(self, graph: onnx.GraphProto | None, path: tuple[int, ...], custom: list[int] | None = None,
                 nodes: list[bytes] | None = None, fields: list[tuple] | None = None) -> None:
        self.graph = graph
        self.path = path  # (node, attribute, graph) indices down from the main graph: tuples sort in output order
        self.custom: list[int] = [] if custom is None else custom
        self.nodes = nodes  # its placeholders serialized (body_scopes.BodyScopes._declared_bulk), or None: graph.node[i] for i in custom
        # per placeholder, as _declared_bulk read them: (inputs, outputs, name or op type, op type,
        # its attributes' bytes); None: read again from ``nodes`` where the lowering needs them
        self.fields = fields
        self.size = 0  # nodes
        # per node holding graphs: (node index, its attribute count, whether a graph it holds is dirty,
        # [(attribute index, its graphs' field number, [(position among them, SpliceGraph)])])
        self.subs: list[tuple[int, int, bool, list[tuple[int, int, list[tuple[int, SpliceGraph]]]]]] = []
        self.dirty = False  # it or a graph nested in it holds a placeholder


# Not walk(): it recurses over serialized bytes (wire spans), following SpliceGraph.subs, not GraphProtos.
def graph_bytes(data: bytes, scope: SpliceGraph, v0: int, v1: int, slots: dict[int, list[bytes]],
                entries: tuple[list[int], list[int]] | None = None, joined: bool = True) -> Any:
    """The value of ``scope``'s graph (at ``data[v0:v1]``; ``entries``: its node entries' starts
    and ends where known) with its placeholders replaced (``slots``: by scope id, in the
    placeholders' order, taken out of it: each written once) and its nested graphs holding
    placeholders written again, their length prefixes new. ``joined=False``: as its pieces, in order.
    In the main graph, the nodes whose graphs with placeholders hold none that do are written a
    block at a time where every message on the way down is as protobuf writes it
    (_holders_in_blocks: the same bytes); the others node by node (_holder_entry)."""
    starts, ends = entries if entries is not None else wire.node_spans(data, v0, v1)
    if len(starts) != scope.size:
        raise Unsupported("a graph's node entries do not match the parsed model")
    key = id(scope)
    edits = list(zip(map(starts.__getitem__, scope.custom), map(ends.__getitem__, scope.custom), slots.pop(key, ())))
    dirty = [(index, n_attributes, held) for index, n_attributes, is_dirty, held in scope.subs if is_dirty]
    if not scope.path and dirty:
        edits += _main_holders(data, (starts, ends), dirty, slots)
    else:
        edits += [(starts[index], ends[index], _holder_entry(data, starts[index], ends[index], n_attributes, held,
                                                            slots)) for index, n_attributes, held in dirty]
    if scope.custom and dirty:
        edits.sort(key=itemgetter(0))
    return wire.splice(data, v0, v1, edits) if joined else wire.spliced(data, v0, v1, edits)


def _main_holders(data: bytes, spans: tuple[Any, Any], dirty: list[tuple[int, int, list]],
                  slots: dict[int, list[bytes]]) -> list[tuple[int, int, bytes]]:
    """(start, end, new entry) of each main-graph node of ``dirty`` ((index, attribute count,
    held)), in the input's order, _HOLDER_BLOCK nodes at a time: those whose dirty graphs hold
    none dirty at once, the others and those _spliced_holders leaves node by node
    (:func:`_holder_entry`)."""
    starts, ends = spans
    edits: list[tuple[int, int, bytes]] = []
    for at in range(0, len(dirty), _HOLDER_BLOCK):
        block = dirty[at:at + _HOLDER_BLOCK]
        flat = [sub for _, _, held in block for _, _, subs in held for _, sub in subs if sub.dirty]
        inside: set[int] = set()  # nodes holding a graph that holds graphs with placeholders
        if any(map(_dirty_inside, flat)):
            inside = {scope.path[0] for scope in flat if _dirty_inside(scope)}
            flat = [scope for scope in flat if scope.path[0] not in inside]
        indices: list[int] = []
        entries: list[bytes | None] = []
        if flat:
            expected = dict(map(itemgetter(0, 1), block))  # each node's attribute count
            indices, entries, _ = _holders_in_blocks(data, spans, flat, slots, expected)
        done = list(zip(map(starts.__getitem__, indices), map(ends.__getitem__, indices), entries))
        if inside or None in entries:
            by_index = {index: (n_attributes, held) for index, n_attributes, held in block}
            for k in [k for k, entry in enumerate(entries) if entry is None]:
                start, end = done[k][:2]
                done[k] = (start, end, _holder_entry(data, start, end, *by_index[indices[k]], slots))
            done += [(starts[index], ends[index], _holder_entry(data, starts[index], ends[index], *by_index[index],
                                                                slots)) for index in inside]
        edits += done
    edits.sort(key=itemgetter(0))  # (in order already where ``dirty`` is: a sort of sorted runs)
    return edits


def _dirty_inside(scope: SpliceGraph) -> bool:
    """Whether a graph in ``scope`` holds placeholders."""
    return any(map(itemgetter(2), scope.subs)) if scope.subs else False


def _holder_entry(data: bytes, start: int, end: int, n_attributes: int, held: list,
                  slots: dict[int, list[bytes]]) -> bytes:
    """The node entry at ``data[start:end]`` (its ``n_attributes`` attributes, ``held``: its graphs,
    as SpliceGraph.subs has them) with the graphs holding placeholders written again."""
    L = wire.LENGTHS
    n0 = start + 2 if data[start + 1] < 0x80 else wire.read_varint(data, start + 1)[1]
    attributes = wire.fields(data, n0, end, 5)
    if len(attributes) != n_attributes:
        raise Unsupported("a node's attribute entries do not match the parsed model")
    node_edits = []
    for a, field, subs in held:
        a_start, a0, a1 = attributes[a]
        graphs = wire.fields(data, a0, a1, field)
        if len(graphs) != len(subs):
            raise Unsupported("an attribute's graph entries do not match the parsed model")
        tag = b"\x32" if field == 6 else b"\x5a"
        attr_edits = []
        for k, sub in subs:
            if not sub.dirty:
                continue
            e_start, s0, s1 = graphs[k]
            if sub.subs:
                graph = graph_bytes(data, sub, s0, s1, slots)
            else:  # a graph holding none: its placeholders' entries replaced, inline
                sub_starts, sub_ends = wire.node_spans(data, s0, s1)
                if len(sub_starts) != sub.size:
                    raise Unsupported("a graph's node entries do not match the parsed model")
                pieces = []
                at = s0
                for i, new in zip(sub.custom, slots.pop(id(sub))):
                    pieces += (data[at:sub_starts[i]], new)
                    at = sub_ends[i]
                pieces.append(data[at:s1])
                graph = b"".join(pieces)
            attr_edits.append((e_start, s1, tag + L[len(graph)] + graph))
        if attr_edits:
            body = wire.splice(data, a0, a1, attr_edits)
            node_edits.append((a_start, a1, b"\x2a" + L[len(body)] + body))
    body = wire.splice(data, n0, end, node_edits)
    return b"\x0a" + L[len(body)] + body


class _Edits:
    """What changes under one node of the main graph: the placeholders of its graphs (by path
    below it) and where they are, as a tree: (attribute, graph) -> [placeholder indices and
    their entries, {node index: the _Edits of a node in that graph holding graphs}]."""

    __slots__ = ("graphs",)

    def __init__(self) -> None:
        self.graphs: dict[tuple[int, int], list] = {}

    def add(self, path: tuple[int, ...], custom: list[int], entries: list[bytes]) -> None:
        edits = self
        while True:
            place = edits.graphs.get(path[:2])
            if place is None:
                place = edits.graphs[path[:2]] = [None, None, {}]
            if len(path) == 2:
                place[0], place[1] = custom, entries
                return
            inner = place[2].get(path[2])
            if inner is None:
                inner = place[2][path[2]] = _Edits()
            edits, path = inner, path[3:]

    # Not walk(): node() and _graph() recurse over serialized messages (wire.Skeletons), not GraphProtos.
    def node(self, value: bytes) -> bytes:
        """The serialized node ``value`` (a NodeProto's bytes) with these edits made."""
        sk = wire.Skeletons.load()
        node = sk.node.FromString(value)
        attributes = node.attribute
        for a in sorted({a for a, _ in self.graphs}):
            attr = sk.attribute.FromString(attributes[a])
            many = attr.type != _GRAPH
            for (b, k), place in self.graphs.items():
                if b == a:
                    field = attr.graphs if many else attr.g
                    field[k] = self._graph(field[k], *place)
            attributes[a] = attr.SerializeToString()
        return node.SerializeToString()

    @staticmethod
    def _graph(value: bytes, custom: list[int] | None, entries: list[bytes] | None, inner: dict) -> bytes:
        """The serialized graph ``value`` with the graphs in its nodes edited, then each
        placeholder ``custom[j]`` replaced by the serialized nodes ``entries[j]`` (the nodes
        after the first placeholder written again: a repeated field is added to at its end)."""
        graph = wire.Skeletons.load().graph.FromString(value)
        nodes = graph.node
        for i, edits in inner.items():
            nodes[i] = edits.node(nodes[i])
        if custom:
            first = custom[0]
            if len(custom) == 1 and first == len(nodes) - 1:
                pieces = entries
            else:
                new = dict(zip(custom, entries))
                entry = wire.entry
                pieces = [new[i] if i in new else entry(nodes[i]) for i in range(first, len(nodes))]
            del nodes[first:]
            graph.MergeFromString(b"".join(pieces))
        return graph.SerializeToString()


def holder_entries(data: bytes, spans: tuple[Any, Any], scopes: list[SpliceGraph],
                    slots: dict[int, list[bytes]]) -> list[tuple[int, bytes]]:
    """(index, new node entry) of each main-graph node holding graphs with placeholders, in
    index order: its bytes with every placeholder replaced, each message around them written
    again (as wire.Skeletons, so every other field's bytes are as they were): protobuf's own bytes
    for the edited node, where the input is written as protobuf writes (the objects writer's).
    A node whose graphs with placeholders are its own is written a block at a time without
    parsing where the messages on the way down come back as they are (_spliced_holders)."""
    starts, ends = spans
    paths = list(map(attrgetter("path"), scopes))
    # nodes holding a placeholder deeper down
    deep = {path[0] for path in paths if len(path) != 3} if max(map(len, paths), default=3) != 3 else set()
    by_holder: dict[int, _Edits] = {}
    if deep:
        shallow = []
        for scope, path in zip(scopes, paths):
            if path[0] not in deep:
                shallow.append(scope)
                continue
            edits = by_holder.get(path[0])
            if edits is None:
                edits = by_holder[path[0]] = _Edits()
            edits.add(path[1:], scope.custom, slots.pop(id(scope)))
        scopes = shallow
        paths = list(map(attrgetter("path"), scopes))
    out: list[tuple[int, bytes]] = []
    if scopes:
        indices, entries, left = _holders_in_blocks(data, spans, scopes, slots)
        out = list(zip(indices, entries))
        for k in [k for k, entry in enumerate(entries) if entry is None]:  # parsed and written again
            v0, v1, held = left[indices[k]]
            out[k] = (indices[k], wire.entry(_shallow_node(data[v0:v1], held, slots)))
        del indices, entries
    for index, edits in by_holder.items():
        start = starts[index]
        value = data[start + 2 if data[start + 1] < 0x80 else wire.read_varint(data, start + 1)[1]:ends[index]]
        out.append((index, wire.entry(edits.node(value))))
    if by_holder:
        out.sort(key=itemgetter(0))
    return out


def _holders_in_blocks(data: bytes, spans: tuple[Any, Any], scopes: list[SpliceGraph], slots: dict[int, list[bytes]],
                       expected: dict[int, int] | None = None) -> tuple[list[int], list[bytes | None], dict]:
    """The main-graph nodes holding ``scopes`` (graphs with placeholders, their paths (node,
    attribute, graph)), in index order, a block at a time: their indices, their new entries
    (None where _spliced_holders leaves one), and per node left, (its value's start and end,
    its scopes). ``expected``: each node's attribute count (by index), a graph's node count its
    scope's ``size``; a node where either differs is left too."""
    starts, ends = spans
    paths = list(map(attrgetter("path"), scopes))
    holder = np.fromiter(map(itemgetter(0), paths), np.int64, len(paths))
    del paths
    if (holder[1:] < holder[:-1]).any():
        order = np.argsort(holder, kind="stable")
        holder = holder[order]
        scopes = list(map(scopes.__getitem__, order.tolist()))
    indices, first = np.unique(holder, return_index=True)
    bounds = np.append(first, len(holder))
    buf = np.frombuffer(data, np.uint8)
    all_starts, all_ends = _offsets(starts), _offsets(ends)
    sizes = None if expected is None else np.fromiter(map(attrgetter("size"), scopes), np.int64, len(scopes))
    entries: list[bytes | None] = []
    left: dict[int, tuple[int, int, list[SpliceGraph]]] = {}
    for at in range(0, len(indices), _HOLDER_BLOCK):
        block = indices[at:at + _HOLDER_BLOCK]
        s0, s1 = int(bounds[at]), int(bounds[at + len(block)])
        h_start = all_starts[block]
        _, size, short = wire.varints(buf, h_start + 1)
        v0 = h_start + 1 + size
        for j in np.flatnonzero(~short).tolist():  # a length padded past 5 bytes
            v0[j] = wire.read_varint(data, int(h_start[j]) + 1)[1]
        v1 = all_ends[block]
        own = np.searchsorted(block, holder[s0:s1])  # the block's scopes: their node's place in the block
        if expected is None:
            written = _spliced_holders(data, buf, v0, v1, scopes[s0:s1], own, slots)
        else:
            counts = np.fromiter(map(expected.__getitem__, block.tolist()), np.int64, len(block))
            written = _spliced_holders(data, buf, v0, v1, scopes[s0:s1], own, slots, (counts, sizes[s0:s1]))
        for j in [j for j, entry in enumerate(written) if entry is None]:
            left[int(block[j])] = (int(v0[j]), int(v1[j]), scopes[int(bounds[at + j]):int(bounds[at + j + 1])])
        entries += written
    return indices.tolist(), entries, left


def _offsets(values: Any) -> Any:
    """Offsets (an array('q'), as wire.node_entries makes them, or a list) as int64s:
    the array's own memory where it is one."""
    if isinstance(values, array) and values.typecode == "q":
        return np.frombuffer(values, np.int64)
    return np.asarray(values, np.int64)


def _shallow_node(value: bytes, held: list[SpliceGraph], slots: dict[int, list[bytes]]) -> bytes:
    """``_Edits.node`` for a node whose graphs with placeholders are its own (``held``: their
    scopes, paths (node, attribute, graph)), without the tree: the same messages parsed,
    edited and serialized in the same order."""
    sk = wire.Skeletons.load()
    node = sk.node.FromString(value)
    attributes = node.attribute
    by_attribute: dict[int, list[SpliceGraph]] = {}
    for scope in held:
        by_attribute.setdefault(scope.path[1], []).append(scope)
    graph_from, serialize = sk.graph.FromString, sk.graph.SerializeToString
    for a in sorted(by_attribute):
        attr = sk.attribute.FromString(attributes[a])
        field = attr.g if attr.type == _GRAPH else attr.graphs
        for scope in by_attribute[a]:
            k = scope.path[2]
            graph = graph_from(field[k])
            nodes = graph.node
            custom, entries = scope.custom, slots.pop(id(scope))
            first = custom[0]
            if len(custom) == 1 and first == len(nodes) - 1:
                pieces = entries
            else:
                new = dict(zip(custom, entries))
                pieces = [new[i] if i in new else wire.entry(nodes[i]) for i in range(first, len(nodes))]
            del nodes[first:]
            graph.MergeFromString(b"".join(pieces))
            field[k] = serialize(graph)
        attributes[a] = attr.SerializeToString()
    return node.SerializeToString()


class _Rules:
    """How protobuf writes back the skeletons holder_entries parses (node, attribute, graph),
    as arrays indexed by a field's key (keys of one or two bytes): ``rank`` (-1: a key it
    never writes back as it came: unknown, another wire type, a packed or signed varint, a
    singular field without presence, which protobuf leaves out where it holds its default),
    ``after`` (the least rank the next field may have: a repeated field's own, the next
    field's for a singular one; fields in number order, each message-typed one repeated
    bytes) and ``varints`` ((key, the values below which it keeps, or a table of them))."""

    made: tuple[_Rules, _Rules, _Rules] | None = None

    def __init__(self, message: Any) -> None:
        from google.protobuf.descriptor import FieldDescriptor as F

        wires = {F.TYPE_STRING: 2, F.TYPE_BYTES: 2, F.TYPE_MESSAGE: 2, F.TYPE_INT64: 0, F.TYPE_UINT64: 0,
                 F.TYPE_UINT32: 0, F.TYPE_BOOL: 0, F.TYPE_ENUM: 0, F.TYPE_FLOAT: 5, F.TYPE_FIXED32: 5,
                 F.TYPE_DOUBLE: 1, F.TYPE_FIXED64: 1}
        below = {F.TYPE_INT64: 1 << 64, F.TYPE_UINT64: 1 << 64, F.TYPE_UINT32: 1 << 32, F.TYPE_BOOL: 2}
        self.rank = np.full(1 << 14, -1, np.int64)
        self.after = np.zeros(1 << 14, np.int64)
        self.varints: list[tuple[int, Any]] = []
        for f in message.DESCRIPTOR.fields:
            wire_type = wires.get(f.type)
            key = f.number << 3 | (wire_type or 0)
            if wire_type is None or key >= 1 << 14 or getattr(f, "is_packed", False) or not (
                    f.is_repeated or f.has_presence):
                continue
            self.rank[key] = rank = 2 * f.number
            self.after[key] = rank if f.is_repeated else rank + 1
            if f.type == F.TYPE_ENUM:  # the values it knows (one below 2**16, as wire.varints reads them)
                known = [v.number for v in f.enum_type.values if 0 <= v.number < 1 << 16]
                table = np.zeros(max(known, default=0) + 1, bool)
                table[known] = True
                self.varints.append((key, table))
            elif wire == 0:  # (wire.varints reads values below 2**35: a bound past that is none)
                self.varints.append((key, min(below[f.type], 1 << 40)))

    @classmethod
    def of(cls) -> tuple[_Rules, _Rules, _Rules]:
        if cls.made is None:  # equal tables whichever thread makes them first
            sk = wire.Skeletons.load()
            cls.made = (cls(sk.node), cls(sk.attribute), cls(sk.graph))
        return cls.made


# After this many fields, messages still being read, if fewer than this, go the parsing way (a step of
# _scan costs about as much for a few as for thousands)
_SCAN_MIN = 64
# Fields _scan found, as arrays: (message, which of its fields of that key, entry start, value start
# (a varint's: its value), entry end)
_Hits = tuple


def _scan(buf: Any, pos: Any, end: Any, rules: _Rules, wanted: tuple[int, ...]) -> tuple[Any, dict[int, _Hits]]:
    """Read the messages at ``buf[pos[m]:end[m]]`` together, a field of all of them at a time:
    whether each comes back as it is when parsed as its skeleton and serialized (keys in the
    rules' order with none but a repeated field's twice, every key known with its wire type,
    keys, lengths and values as short as they go, varint values ones the field keeps), and
    the fields of ``wanted`` keys (_Hits arrays, per key)."""
    n = len(pos)
    pos = pos.copy()
    last = np.zeros(n, np.int64)
    ok = np.ones(n, bool)
    seen = {k: np.zeros(n, np.int64) for k in wanted}
    found: dict[int, list] = {k: [] for k in wanted}
    active = np.flatnonzero(pos < end)
    steps = 0
    while active.size:
        steps += 1
        if steps > _SCAN_MIN and active.size < _SCAN_MIN:
            ok[active] = False
            break
        p = pos[active]
        key, size, good = wire.varints(buf, p)
        good &= key < 1 << 14
        key[~good] = 0
        rank = rules.rank[key]
        good &= rank >= last[active]
        last[active] = rules.after[key]
        wire_type = key & 7
        at = p + size
        value, size, short = wire.varints(buf, at)
        good &= short | (wire_type == 1) | (wire_type == 5)
        start = at + size
        stop = np.where(wire_type == 2, start + value, np.where(wire_type == 0, start, at + np.where(wire_type == 5, 4, 8)))
        for k, keeps in rules.varints:
            is_k = key == k
            if is_k.any():
                if isinstance(keeps, int):
                    good &= ~is_k | (value < keeps)
                else:
                    good &= ~is_k | ((value < len(keeps)) & keeps[np.minimum(value, len(keeps) - 1)])
        good &= stop <= end[active]
        for k in wanted:
            is_k = good & (key == k)
            if is_k.any():
                m = active[is_k]
                found[k].append((m, seen[k][m], p[is_k], np.where(wire_type == 0, value, start)[is_k], stop[is_k]))
                seen[k][m] += 1
        ok[active[~good]] = False
        pos[active] = stop
        active = active[good & (stop < end[active])]
    hits = {k: tuple(map(np.concatenate, zip(*v))) if v else tuple(np.zeros(0, np.int64) for _ in range(5))
            for k, v in found.items()}
    return ok, hits


def _lookup(owner: Any, nth: Any, hits: _Hits) -> tuple[Any, Any]:
    """Per (``owner``, ``nth``): the index in ``hits`` of message ``owner``'s ``nth`` field, and
    whether it has one (where not, the index is any)."""
    width = int(max(hits[1].max(initial=0), nth.max(initial=0))) + 1
    keys = hits[0] * width + hits[1]
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    want = owner * width + nth
    at = np.minimum(np.searchsorted(keys, want), max(len(keys) - 1, 0))
    there = (keys[at] == want) if len(keys) else np.zeros(len(want), bool)
    return (order[at] if len(keys) else at), there


def _spliced_holders(data: bytes, buf: Any, v0: Any, v1: Any, scopes: list[SpliceGraph], own: Any,
                     slots: dict[int, list[bytes]], counts: tuple[Any, Any] | None = None) -> list[bytes | None]:
    """Per main-graph node (its value at ``data[v0[j]:v1[j]]``) whose graphs with placeholders
    are its own (``scopes``, node ``own[i]`` holding ``scopes[i]``), its new entry as
    ``_shallow_node`` writes it, made without parsing: where each message that parses and
    serializes there comes back as it is (_scan: the node, its attributes holding those
    graphs, the graphs), those bytes are the input's with the placeholders' entries replaced
    and the length prefixes around them written again. None for a node where not (its
    scopes' slots are left to _shallow_node; the others' are taken). ``counts``: each node's
    attribute count and each graph's node count as the parsed model has them; a node where the
    bytes have others is None too."""
    node_rules, attribute_rules, graph_rules = _Rules.of()
    n = len(v0)
    good, node_hits = _scan(buf, v0, v1, node_rules, (0x2A,))
    if counts is not None:
        good &= np.bincount(node_hits[0x2A][0], minlength=n) == counts[0]
    paths = list(map(attrgetter("path"), scopes))
    s_attribute = np.fromiter(map(itemgetter(1), paths), np.int64, len(paths))
    s_graph = np.fromiter(map(itemgetter(2), paths), np.int64, len(paths))
    # the attributes holding them: read, each once
    hit, there = _lookup(own, s_attribute, node_hits[0x2A])
    good[own[~there]] = False
    if not good.any():
        return [None] * n
    width = int(s_attribute.max(initial=0)) + 1
    _, first, s_attr = np.unique(own * width + s_attribute, return_index=True, return_inverse=True)
    s_attr = s_attr.reshape(-1)
    a_holder, a_hit = own[first], hit[first]
    a_start, a0, a1 = (node_hits[0x2A][c][a_hit] for c in (2, 3, 4))
    ok, attr_hits = _scan(buf, a0, a1, attribute_rules, (0x32, 0x5A, _TYPE_KEY))
    good[a_holder[~ok]] = False
    kind = np.zeros(len(a0), np.int64)
    kind[attr_hits[_TYPE_KEY][0]] = attr_hits[_TYPE_KEY][3]
    many = (kind != _GRAPH).astype(np.int64)  # as _shallow_node reads it: attr.g if attr.type == GRAPH else attr.graphs
    # the graphs: per attribute, its g entries (0) or its graphs entries (1), in order
    one, several = attr_hits[0x32], attr_hits[0x5A]
    graph_hits = tuple(map(np.concatenate, zip(one, several)))
    graph_hits = (graph_hits[0] * 2 + np.repeat([0, 1], [len(one[0]), len(several[0])]), *graph_hits[1:])
    hit, there = _lookup(s_attr * 2 + many[s_attr], s_graph, graph_hits)
    good[own[~there]] = False
    if not good.any():
        return [None] * n
    g_start, g0, g1 = graph_hits[2][hit], graph_hits[3][hit], graph_hits[4][hit]
    ok, entry_hits = _scan(buf, g0, g1, graph_rules, (0x0A,))
    good[own[~ok]] = False
    if counts is not None:
        good[own[np.bincount(entry_hits[0x0A][0], minlength=len(g0)) != counts[1]]] = False
    # the placeholders' entries, in order in their graph
    customs = list(map(attrgetter("custom"), scopes))
    p_scope = np.repeat(np.arange(len(scopes)), list(map(len, customs)))
    hit, there = _lookup(p_scope, np.fromiter(itertools.chain.from_iterable(customs), np.int64, len(p_scope)),
                         entry_hits[0x0A])
    good[own[p_scope[~there]]] = False
    if not good.any():
        return [None] * n
    p_start, p_end = entry_hits[0x0A][2][hit], entry_hits[0x0A][4][hit]
    twice = (p_scope[1:] == p_scope[:-1]) & (p_start[1:] < p_end[:-1])  # out of order or twice: _shallow_node's
    good[own[p_scope[1:][twice]]] = False
    new = list(itertools.chain.from_iterable(map(slots.pop, map(id, scopes))))
    left = np.flatnonzero(~good[own]).tolist()
    if left:  # the placeholders of nodes parsed and written again: put back
        at = np.concatenate([[0], np.cumsum(list(map(len, customs)))]).tolist()
        for k in left:
            slots[id(scopes[k])] = new[at[k]:at[k + 1]]
    # sizes, from the inside out
    g_size = g1 - g0
    np.add.at(g_size, p_scope, np.fromiter(map(len, new), np.int64, len(new)) - (p_end - p_start))
    a_size = a1 - a0
    np.add.at(a_size, s_attr, 1 + wire.varint_sizes(g_size) + g_size - (g1 - g_start))
    size = v1 - v0
    np.add.at(size, a_holder, 1 + wire.varint_sizes(a_size) + a_size - (a1 - a_start))
    # every cut (a length prefix or a placeholder's entry) with what goes there, in the input's order
    tags = np.concatenate([np.full(len(a0), 0x2A), np.where(many[s_attr], 0x5A, 0x32)])
    heads = tags << 40 | np.concatenate([a_size, g_size])  # the attributes' and graphs' keys and lengths
    n_heads = len(heads)
    c_holder = np.concatenate([a_holder, own, own[p_scope]])
    c_start = np.concatenate([a_start, g_start, p_start])
    c_end = np.concatenate([a0, g0, p_end])
    keep = np.flatnonzero(good[c_holder])
    keep = keep[np.argsort(c_start[keep], kind="stable")]  # the nodes' entries are in order in the input
    c_start, c_end = c_start[keep], c_end[keep]
    done = np.flatnonzero(good)
    out: list[bytes | None] = [None] * n
    if not len(done):
        return out
    cuts = np.bincount(c_holder[keep], minlength=n)[done]  # one at least: the attribute's length prefix
    first_cut = np.cumsum(cuts) - cuts
    gap_from = np.concatenate([[0], c_end[:-1]])
    gap_from[first_cut] = v0[done]
    last_cut = first_cut + cuts - 1
    # per node: its entry's key and length, (the input's bytes up to a cut, what goes there) per cut, the rest;
    # nodes of one count of cuts a column of pieces at a time
    for count in np.unique(cuts).tolist():
        these = np.flatnonzero(cuts == count)
        nodes = done[these]
        columns: list[Any] = [list(map(wire.HEADS.__getitem__, (0x0A << 40 | size[nodes]).tolist()))]
        for t in range(count):
            at = first_cut[these] + t
            if (gap_from[at] != c_start[at]).any():  # input bytes before the cut: not none for all
                columns.append(_gaps(data, buf, gap_from[at], c_start[at]))
            which = keep[at]
            if (which < n_heads).all():
                columns.append(list(map(wire.HEADS.__getitem__, heads[which].tolist())))
            elif (which >= n_heads).all():
                columns.append(list(map(new.__getitem__, (which - n_heads).tolist())))
            else:
                columns.append([wire.HEADS[int(heads[w])] if w < n_heads else new[w - n_heads] for w in which.tolist()])
        columns.append(list(map(data.__getitem__, map(slice, c_end[last_cut[these]].tolist(), v1[nodes].tolist()))))
        for j, entry in zip(nodes.tolist(), map(b"".join, zip(*columns))):
            out[j] = entry
        del columns
    return out


def _gaps(data: bytes, buf: Any, start: Any, end: Any) -> list[bytes]:
    """``data[start[i]:end[i]]`` for each i; one bytes object for all where they are alike
    and short (an attribute's name before its graph, say), read at once."""
    sizes = end - start
    size = int(sizes[0])
    if size <= 64 and (sizes == size).all():
        block = buf[start[:, None] + np.arange(size)]
        if (block == block[0]).all():
            return [data[int(start[0]):int(end[0])]] * len(start)
    return list(map(data.__getitem__, map(slice, start.tolist(), end.tolist())))


_TYPE_KEY = 20 << 3  # AttributeProto.type
