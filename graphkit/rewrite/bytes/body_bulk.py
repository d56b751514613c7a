"""The bodies' declarations read from the serialized model a field of a block of graphs at a
time (bytes.columns), for the bodies' byte writer's pass (body_scopes.BodyScopes._declared_bulk,
whose docstring says when its result is the graph-by-graph pass's): :class:`BulkRead` reads every
subgraph level by level; :func:`main_nodes` reads the main graph's nodes so first (which hold
graphs, the names they make, the holders' fields the bulk read starts from).
"""

from __future__ import annotations

import collections
import itertools
import operator
import sys
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np
import onnx

from graphkit.ops._opdef import PLACEHOLDER_DOMAIN
from graphkit.rewrite.bytes import body_splice
from graphkit.rewrite.bytes import wire
from graphkit.rewrite.bytes.body_splice import SpliceGraph
from graphkit.rewrite.bytes.columns import (ATTRIBUTE_FIELDS, ATTRIBUTE_TYPE, HOLDER_FIELDS, NODE_FIELDS, NotBulk,
                                           graph_columns, read_columns)
from graphkit.rewrite.graph.type_rules import CONTROL_FLOW_BODY
from graphkit.rewrite.graph.walk import AI_ONNX

__all__ = ["BulkRead", "MainNodes", "main_nodes"]

_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS
_NAME, _TYPE = attrgetter("name"), attrgetter("type")
BULK_DEPTH = 8  # BulkRead reads graphs nested this deep; deeper ones go graph by graph
_EVERYTHING = itemgetter(slice(None))  # a repeated field's values as a list, in one call
_CHAIN, _REPEAT = itertools.chain.from_iterable, itertools.repeat
_MAIN_FIELDS = (*HOLDER_FIELDS, ("domain", 7, str, True))  # what main_nodes reads (columns.read_columns' fields)


def _vi_sizes(names: list[str], types: list[bytes]) -> list[int]:
    """The size of each ValueInfoProto holding just a name of ``names`` and a type of ``types``."""
    name_sizes = list(map(len, map(str.encode, names)))
    type_sizes = list(map(len, types))
    if max(name_sizes, default=0) < 0x80 and max(type_sizes, default=0) < 0x80:  # one-byte lengths
        return list(map(operator.add, map(operator.add, name_sizes, type_sizes), itertools.repeat(4)))
    return list(map(_field_sizes, name_sizes, type_sizes))


def _field_sizes(a: int, b: int) -> int:
    """The size of two length-delimited fields with one-byte keys, of values ``a`` and ``b`` bytes long."""
    return 2 + len(wire.LENGTHS[a]) + a + len(wire.LENGTHS[b]) + b


class MainNodes:
    """The main graph's nodes as :func:`main_nodes` reads them from the serialized model."""

    __slots__ = ("domains", "op_types", "holders", "made", "held")

    def __init__(self, domains: list[str], op_types: list[str], holders: list[int], made: collections.Counter,
                 held: dict[str, Any]) -> None:
        self.domains, self.op_types = domains, op_types  # each node's
        self.holders = holders  # the nodes holding graphs (an attribute of type GRAPH or GRAPHS), in order
        self.made = made  # every name their outputs make (empty ones too), counted
        self.held = held  # the holders' columns.HOLDER_FIELDS, as read_columns gives them


def main_nodes(data: bytes, spans: tuple[Any, Any]) -> MainNodes | None:
    """The main graph's nodes (``spans``: their entries' starts and ends, as wire.node_entries
    gives them) read from ``data`` a field of body_splice.BLOCK nodes at a time, not as
    NodeProto wrappers; None where they are not read so (a length longer than it needs,
    columns.NotBulk): the caller reads the parsed nodes."""
    starts, ends = spans
    entry_starts = np.frombuffer(starts, np.int64)
    lengths, sizes, _ = wire.varints(np.frombuffer(data, np.uint8), entry_starts + 1)  # after the key (one byte)
    value_starts = entry_starts + 1 + sizes
    if not np.array_equal(value_starts + lengths, np.frombuffer(ends, np.int64)):
        return None
    value_starts = value_starts.tolist()
    del lengths, sizes
    sk = wire.Skeletons.load()
    domains: list[str] = []
    all_op_types: list[str] = []
    holders: list[int] = []
    made: collections.Counter = collections.Counter()
    outputs: list[str] = []
    n_outputs: list[int] = []
    op_types: list[str] = []
    attributes: list[bytes] = []
    n_attributes: list[int] = []
    block = body_splice.BLOCK
    try:
        for at in range(0, len(value_starts), block):
            values = list(map(data.__getitem__, map(slice, value_starts[at:at + block], ends[at:at + block])))
            columns = read_columns(sk.nodes, values, _MAIN_FIELDS)
            del values
            domains += columns["domain"]
            all_op_types += columns["op_type"]
            made.update(columns["output"][0])
            found, n_found = columns["attribute"]
            if not found:
                continue
            types = read_columns(sk.attributes, found, ATTRIBUTE_TYPE)["type"]
            local = list(dict.fromkeys(itertools.compress(_CHAIN(map(_REPEAT, range(len(n_found)), n_found)), map(
                operator.or_, map(_GRAPH.__eq__, types), map(_GRAPHS.__eq__, types)))))
            if not local:
                continue
            holders += map(operator.add, local, _REPEAT(at))
            for (values, counts), (into, n_into) in ((columns["output"], (outputs, n_outputs)),
                                                     (columns["attribute"], (attributes, n_attributes))):
                if len(local) == len(counts):
                    into += values
                    n_into += counts
                else:
                    value_at = list(itertools.accumulate(counts, initial=0))
                    into += _CHAIN(map(values.__getitem__, map(slice, map(value_at.__getitem__, local), map(
                        value_at.__getitem__, map(operator.add, local, _REPEAT(1))))))
                    n_into += map(counts.__getitem__, local)
            op_types += map(columns["op_type"].__getitem__, local)
    except NotBulk:
        return None
    return MainNodes(domains, all_op_types, holders, made, {"output": (outputs, n_outputs), "op_type": op_types,
                                                            "attribute": (attributes, n_attributes)})


class BulkRead:
    """BodyScopes._declared_bulk's read of every subgraph, a level of nesting at a time and in each
    level a block of body_splice.BLOCK graphs at a time, each block's steps a method, in
    :meth:`read_block`'s order. It changes nothing of the table (_declared_bulk then does):
    where a condition does not hold, NotBulk leaves the table as it was."""

    def __init__(self, listing: Any, data: bytes, spans: tuple[Any, Any], domains: list[str],
                 holders: list[int], held: dict[str, Any] | None = None) -> None:
        self.listing = listing
        self.sk = wire.Skeletons.load()
        self.data = data
        self.starts, self.ends = spans
        self.elem0 = listing.table.elem_types
        self.paths: list[tuple[int, ...]] = []  # every subgraph's, in the order read (level by level)
        self.graph_sizes: list[int] = []  # and its node count
        self.owners: list[dict[str, int]] = []  # per block, each name its graphs define -> that graph
        self.declared: list[tuple[list[str], list]] = []  # per block and field: names, types
        self.parsed: dict[bytes, tuple[onnx.TypeProto, int]] = {}  # a TypeProto's bytes -> it, its element type
        # The names subgraphs define, each once in the model: typed by their graph's declarations
        # (-> element type) or left untyped (a graph declares only names it defines: checked)
        self.body_elem: dict[str, int] = {}
        self.untyped: set[str] = set()
        # every name of the main graph (made, declared, typed, defined untyped): none a subgraph's
        self.main_names = set(listing.made).union(listing.table.names())
        made = listing.made  # whether every name (but "") is made by one node of the main graph
        self.made_once = sum(made.values()) - made.get("", 0) == len(made) - ("" in made)
        self.flow: dict[str, tuple[int, int]] = {}  # a main-graph If/Loop/Scan output -> its type, the node
        self.found: list[SpliceGraph] = []
        self.counts: collections.Counter = collections.Counter()
        # (serialized holder node, its path, its domain), level by level; the main graph's holders'
        # fields as main_nodes read them where it did (``held``: their bytes not needed then)
        self.held = held
        self.held_at: dict[str, list[int]] | None = None
        self.level: list[tuple[bytes | None, tuple[int, ...], str]] = list(zip(
            map(self._value, holders) if held is None else _REPEAT(None), zip(holders),
            map(domains.__getitem__, holders)))

    def _value(self, index: int) -> bytes:
        """The serialized main-graph node ``index`` (its entry's value)."""
        data, start = self.data, self.starts[index]
        return data[start + 2 if data[start + 1] < 0x80 else wire.read_varint(data, start + 1)[1]:self.ends[index]]

    def _main_held(self, start: int, end: int) -> dict[str, Any]:
        """The HOLDER_FIELDS of the main graph's holders ``start`` to ``end`` (as main_nodes read them)."""
        held = self.held
        if self.held_at is None:  # where each holder's values start, per field
            self.held_at = {name: list(itertools.accumulate(held[name][1], initial=0))
                            for name in ("output", "attribute")}
        out: dict[str, Any] = {"op_type": held["op_type"][start:end]}
        for name, value_at in self.held_at.items():
            values, counts = held[name]
            out[name] = (values[value_at[start]:value_at[end]], counts[start:end])
        return out

    def _typed_before(self, x: str, g: int) -> bool:
        """Whether placeholder input ``x`` of subgraph ``g`` is typed when the pass reaches ``g``."""
        if x in self.elem0:
            return True
        if x in self.flow:
            return self.flow[x][1] < self.paths[g][0]
        o = next((own[x] for own in self.owners if x in own), None)
        return o is not None and x in self.body_elem and (o == g or self.paths[o] <= self.paths[g])

    def run(self) -> None:
        """Every level of nesting, each a block of graphs at a time."""
        level = self.level
        depth = 0
        while level:
            depth += 1
            if depth > BULK_DEPTH:
                raise NotBulk
            below: list[tuple[bytes, tuple[int, ...], str]] = []
            for at in range(0, len(level), body_splice.BLOCK):
                below += self.read_block(level[at:at + body_splice.BLOCK], depth, at)
            level = below

    def read_block(self, block: list[tuple[bytes | None, tuple[int, ...], str]], depth: int, at: int) -> list:
        """The graphs a block of holder nodes hold (``block``: each one's bytes, path, domain; ``at``:
        where it starts in its level):
        their nodes counted, their declarations, the names they define, the main graph's
        control-flow outputs they type, their placeholders listed; returns the next level's
        holders (the nodes of these graphs holding graphs)."""
        first = len(self.paths)
        graph_bytes, control_flow = self.held_graphs(block, depth, at)
        these = graph_columns(graph_bytes)
        del graph_bytes
        ids = range(first, len(self.paths))
        if these["initializer"][0]:
            raise NotBulk
        flat_bytes, sizes = these["node"]
        self.graph_sizes += sizes
        node_columns = read_columns(self.sk.nodes, flat_bytes, NODE_FIELDS)
        owner_of_node = list(_CHAIN(map(_REPEAT, ids, sizes)))
        flat_domains = node_columns["domain"]
        self.counts.update(zip(flat_domains, node_columns["op_type"]))
        names_made, n_made = node_columns["output"]
        made_by = list(_CHAIN(map(_REPEAT, owner_of_node, n_made)))
        del n_made
        block_declared = self.declarations(these, ids, names_made, made_by)
        block_owner, block_elem = self.own_names(names_made, made_by, block_declared)
        del names_made, made_by
        if control_flow:
            self.control_flow_types(control_flow, block_declared, these["output"][1], block_elem, first)
        del block_declared
        offsets = list(itertools.accumulate(sizes, initial=0))
        self.placeholders(node_columns, flat_bytes, flat_domains, owner_of_node, offsets, first, block_owner,
                          block_elem)
        return self.next_level(node_columns, flat_bytes, flat_domains, owner_of_node, offsets, first)

    def held_graphs(self, block: list[tuple[bytes | None, tuple[int, ...], str]], depth: int,
                    at: int) -> tuple[list[bytes], tuple[list, list, list, list] | None]:
        """The graphs the block's nodes hold, serialized, their paths listed; and the main-graph
        If/Loop/Scan nodes (``depth`` 1; else None) as columns: their indices, op types, outputs,
        and their bodies' places in ``paths``."""
        paths = self.paths
        raws, bases, holder_domains = zip(*block)
        if PLACEHOLDER_DOMAIN in holder_domains:
            raise NotBulk  # a custom node holding a graph: the graph-by-graph pass says so
        held = read_columns(self.sk.nodes, raws, HOLDER_FIELDS) if depth > 1 or self.held is None else \
            self._main_held(at, at + len(block))
        del raws
        attributes, n_attributes = held["attribute"]
        attrs = read_columns(self.sk.attributes, attributes, ATTRIBUTE_FIELDS)
        del attributes
        a_types, a_names = attrs["type"], attrs["name"]
        g_values, g_counts = attrs["g"]
        gs_values, gs_counts = attrs["graphs"]
        g_at = list(itertools.accumulate(g_counts, initial=0))
        gs_at = list(itertools.accumulate(gs_counts, initial=0))
        holder_of = list(_CHAIN(map(_REPEAT, range(len(block)), n_attributes)))
        index_of = list(_CHAIN(map(range, n_attributes)))
        # If/Loop/Scan of the main graph: the attribute naming their body (the last, as a dict keeps it)
        if depth != 1:
            wanted = [""] * len(block)
        elif set(holder_domains).issubset(AI_ONNX):
            wanted = list(map(CONTROL_FLOW_BODY.get, held["op_type"], _REPEAT("")))
        else:
            wanted = [CONTROL_FLOW_BODY.get(op, "") if d in AI_ONNX else ""
                      for op, d in zip(held["op_type"], holder_domains)]
        bodies: dict[int, int] = {}
        graph_bytes: list[bytes] = []
        single = list(itertools.compress(range(len(a_types)), map(_GRAPH.__eq__, a_types)))
        if _GRAPHS not in a_types and all(map(operator.eq, map(g_counts.__getitem__, single), _REPEAT(1))):
            # every graph an attribute's one (If, Loop, Scan): their paths and bytes at once
            holder_at = list(map(holder_of.__getitem__, single))
            graph_bytes = list(map(g_values.__getitem__, map(g_at.__getitem__, single)))
            base_paths = len(paths)
            paths += map(operator.add, map(bases.__getitem__, holder_at),
                         zip(map(index_of.__getitem__, single), _REPEAT(0)))
            named = list(map(wanted.__getitem__, holder_at))
            if any(named):  # If/Loop/Scan of the main graph: the attribute naming their body (the last)
                chosen = list(map(operator.and_, map(bool, named),
                                  map(operator.eq, map(a_names.__getitem__, single), named)))
                bodies = dict(zip(itertools.compress(holder_at, chosen),
                                  itertools.compress(range(base_paths, len(paths)), chosen)))
            single = None
        for j in () if single is None else itertools.compress(range(len(a_types)), map(
                operator.or_, map(_GRAPH.__eq__, a_types), map(_GRAPHS.__eq__, a_types))):
            h = holder_of[j]
            base, a = bases[h], index_of[j]
            if a_types[j] == _GRAPH:
                if g_counts[j] != 1:
                    raise NotBulk
                graph_bytes.append(g_values[g_at[j]])
                paths.append((*base, a, 0))
                if wanted[h] and a_names[j] == wanted[h]:
                    bodies[h] = len(paths) - 1
            else:
                for k in range(gs_counts[j]):
                    graph_bytes.append(gs_values[gs_at[j] + k])
                    paths.append((*base, a, k))
        del attrs, a_types, a_names, g_values, gs_values, holder_of, index_of
        outputs, n_outputs = held["output"]
        output_at = list(itertools.accumulate(n_outputs, initial=0))
        at = list(bodies)  # columns: (index, op type, outputs) of each node, its body's place in ``paths``
        control_flow = (list(map(itemgetter(0), map(bases.__getitem__, at))),
                        list(map(held["op_type"].__getitem__, at)),
                        list(map(outputs.__getitem__, map(slice, map(output_at.__getitem__, at), map(
                            output_at.__getitem__, map(operator.add, at, _REPEAT(1)))))),
                        list(bodies.values())) if bodies else None
        return graph_bytes, control_flow

    def declarations(self, these: dict, ids: range, names_made: list[str], made_by: list[int]) -> list[tuple]:
        """Per field (input, output, value_info) of the block's graphs: (field, names, the graph
        declaring each, their TypeProtos, their element types). The inputs' names are added to
        ``names_made`` and ``made_by`` (a graph defines its inputs)."""
        parsed, vi_from = self.parsed, self.sk.value_info.FromString
        block_declared = []
        for field in ("input", "output", "value_info"):
            vis, counts_of = these[field]
            # Their names and types at once: the ValueInfoProtos one after the other parse as
            # one ValueInfoColumns, each field's values in order. Where each holds exactly one
            # name and one type (its size is theirs), they are its own; else one by one.
            columns = self.sk.value_infos.FromString(b"".join(vis))
            names = columns.name[:]
            raw_types = columns.type[:]
            if len(names) != len(vis) or len(raw_types) != len(vis) or columns.doc_string or \
                    columns.metadata_props or list(map(len, vis)) != _vi_sizes(names, raw_types):
                vis = list(map(vi_from, vis))
                names = list(map(_NAME, vis))
                tps = list(map(_EVERYTHING, map(_TYPE, vis)))
                if not all(map(operator.le, map(len, tps), _REPEAT(1))):
                    raise NotBulk
                raw_types = [t[0] if t else b"" for t in tps]
                del tps
            del vis, columns
            for b in set(raw_types).difference(parsed):
                tp = onnx.TypeProto.FromString(b)
                parsed[b] = (tp, tp.tensor_type.elem_type)
            pairs = list(map(parsed.__getitem__, raw_types))
            del raw_types
            by = list(ids) if counts_of.count(1) == len(counts_of) else list(_CHAIN(map(_REPEAT, ids, counts_of)))
            block_declared.append((field, names, by, list(map(itemgetter(0), pairs)),
                                   list(map(itemgetter(1), pairs))))
            if field == "input":
                names_made += names
                made_by += by
        return block_declared

    def own_names(self, names_made: list[str], made_by: list[int], block_declared: list[tuple]) -> tuple[dict, dict]:
        """The names the block's graphs define (each once in the model, none the main graph's, each
        declared only by its own graph): each one's graph, and the element types declared for
        them (the others left untyped); the declarations kept, in order."""
        if "" in names_made:
            keep = list(map(bool, names_made))
            names_made = list(itertools.compress(names_made, keep))
            made_by = list(itertools.compress(made_by, keep))
        # (looked up in the block's own dicts first: the model's are big, slow to look in)
        block_owner = dict(zip(names_made, made_by))
        if len(block_owner) != len(names_made) or not self.main_names.isdisjoint(names_made):
            raise NotBulk
        self.owners.append(block_owner)
        get_owner = block_owner.get
        block_elem: dict[str, int] = {}
        for field, names, by, tps, elems in block_declared:
            # a graph's inputs are names it defines (names_made holds them, each once): only an empty one is not
            if ("" in names) if field == "input" else not all(map(operator.eq, map(get_owner, names), by)):
                raise NotBulk  # a graph declares a name it does not define
            block_elem.update(filter(itemgetter(1), zip(names, elems)))
            self.declared.append((names, tps))
        # a name is typed by its own graph's declarations or not at all (checked just above):
        # the names defined here are block_elem's and block_untyped, none defined before
        block_untyped = [] if len(block_elem) == len(names_made) else list(
            itertools.filterfalse(block_elem.__contains__, names_made))
        body_elem, untyped = self.body_elem, self.untyped
        typed_size, untyped_size = len(body_elem), len(untyped)
        body_elem.update(block_elem)
        untyped.update(block_untyped)
        if len(body_elem) != typed_size + len(block_elem) or len(untyped) != untyped_size + len(
                block_untyped) or not untyped.isdisjoint(block_elem) or not body_elem.keys().isdisjoint(
                block_untyped):
            raise NotBulk
        return block_owner, block_elem

    def control_flow_types(self, control_flow: tuple[list, list, list, list], block_declared: list[tuple],
                           n_outputs: list[int], block_elem: dict[str, int], first: int) -> None:
        """Each output of a main-graph If/Loop/Scan takes its body output's type (a Loop's after
        the condition), every output made once (else the graph-by-graph pass finds which way)."""
        made, elem0 = self.listing.made, self.elem0
        for field, names, by, tps, elems in block_declared:
            if field != "output":
                continue
            at_output = list(itertools.accumulate(n_outputs, initial=0))
            indices, op_types, node_outputs, bodies_at = control_flow
            skip = map(int, map(operator.eq, op_types, _REPEAT("Loop")))
            body_at = list(map(operator.sub, bodies_at, _REPEAT(first)))
            lows = list(map(operator.add, map(at_output.__getitem__, body_at), skip))
            highs = list(map(at_output.__getitem__, map(operator.add, body_at, _REPEAT(1))))
            n_node = list(map(len, node_outputs))
            if n_node == list(map(operator.sub, highs, lows)):  # as many outputs as its body (but a Loop's condition)
                outs = list(_CHAIN(node_outputs))
                ts = list(map(block_elem.get, _CHAIN(map(names.__getitem__, map(slice, lows, highs)))))
                at = list(_CHAIN(map(_REPEAT, indices, n_node)))
            else:
                pairs = list(map(list, map(zip, node_outputs, map(names.__getitem__, map(slice, lows, highs)))))
                outs = list(map(itemgetter(0), _CHAIN(pairs)))
                ts = list(map(block_elem.get, map(itemgetter(1), _CHAIN(pairs))))
                at = list(_CHAIN(map(_REPEAT, indices, map(len, pairs))))
                del pairs
            del body_at, lows, highs, n_node
            if "" in outs:
                keep = list(map(bool, outs))
                outs, ts, at = (list(itertools.compress(c, keep)) for c in (outs, ts, at))
            if None in ts or not (self.made_once or all(map(operator.eq, map(made.__getitem__, outs), _REPEAT(1)))):
                raise NotBulk  # the graph-by-graph pass finds which way (Undeclared)
            new = list(map(operator.not_, map(elem0.__contains__, outs)))
            self.flow.update(zip(itertools.compress(outs, new), zip(itertools.compress(ts, new),
                                                                     itertools.compress(at, new))))

    def placeholders(self, node_columns: dict, flat_bytes: list[bytes], flat_domains: list[str],
                     owner_of_node: list[int], offsets: list[int], first: int, block_owner: dict[str, int],
                     block_elem: dict[str, int]) -> None:
        """The block's placeholders, each input typed when the pass reaches its graph (else
        NotBulk); the graphs holding them listed as scopes, with what the lowering reads of each
        placeholder (``SpliceGraph.fields``: not parsed again there)."""
        at_custom = list(itertools.compress(range(len(flat_bytes)), map(operator.eq, flat_domains,
                                                                       _REPEAT(PLACEHOLDER_DOMAIN))))
        if not at_custom:
            return
        paths, elem0 = self.paths, self.elem0
        owner_of = list(map(owner_of_node.__getitem__, at_custom))
        all_inputs, n_inputs = node_columns["input"]
        input_at = list(itertools.accumulate(n_inputs, initial=0))
        inputs = list(map(all_inputs.__getitem__, map(slice, map(input_at.__getitem__, at_custom),
                                                      map(input_at.__getitem__, map(operator.add, at_custom,
                                                                                    _REPEAT(1))))))
        del all_inputs, n_inputs, input_at
        xs = list(_CHAIN(inputs))
        xg = list(_CHAIN(map(_REPEAT, owner_of, map(len, inputs))))
        # most are typed by their own graph or in the main graph (each looked for among those the
        # one before left); the others one by one
        quick = list(map(operator.and_, map(operator.eq, map(block_owner.get, xs), xg),
                         map(block_elem.__contains__, xs)))
        if not all(quick):
            slow = list(map(operator.not_, quick))
            xs, xg = list(itertools.compress(xs, slow)), list(itertools.compress(xg, slow))
            quick = list(map(operator.or_, map(operator.not_, xs), map(elem0.__contains__, xs)))
        if not all(quick):  # outputs of earlier If/Loop/Scan nodes of the main graph, most likely
            slow = list(map(operator.not_, quick))
            xs, xg = list(itertools.compress(xs, slow)), list(itertools.compress(xg, slow))
            made_at = list(map(self.flow.get, xs, _REPEAT((None, len(self.starts)))))
            quick = list(map(operator.lt, map(itemgetter(1), made_at),
                             map(itemgetter(0), map(paths.__getitem__, xg))))
            if not all(quick):
                slow = list(map(operator.not_, quick))
                if not all(map(self._typed_before, itertools.compress(xs, slow), itertools.compress(xg, slow))):
                    raise NotBulk
        del xs, xg, quick
        # what the lowering reads of each, kept (SpliceGraph.fields): not parsed again there
        all_outputs, n_outputs = node_columns["output"]  # (input names appended after: not reached)
        output_at = list(itertools.accumulate(n_outputs, initial=0))
        outputs = list(map(all_outputs.__getitem__, map(slice, map(output_at.__getitem__, at_custom), map(
            output_at.__getitem__, map(operator.add, at_custom, _REPEAT(1))))))
        del all_outputs, n_outputs, output_at
        op_types = list(map(sys.intern, map(node_columns["op_type"].__getitem__, at_custom)))  # kept: one each
        prefixes = [name or op for name, op in zip(map(node_columns["name"].__getitem__, at_custom), op_types)]
        self.listing.prefixes.update(prefixes)
        keys = [b""] * len(at_custom)
        node_attributes, n_node_attributes = node_columns["attribute"]
        if node_attributes:
            attribute_at = list(itertools.accumulate(n_node_attributes, initial=0))
            keys = [b"".join(node_attributes[attribute_at[p]:attribute_at[p + 1]]) if
                    n_node_attributes[p] else b"" for p in at_custom]
        fields = list(zip(inputs, outputs, prefixes, op_types, keys))
        del inputs, outputs, op_types, prefixes, keys
        index_in = list(map(operator.sub, at_custom, map(offsets.__getitem__, map(
            operator.sub, owner_of, _REPEAT(first)))))
        if len(set(owner_of)) == len(owner_of):  # one placeholder a graph
            self.found += map(SpliceGraph, _REPEAT(None), map(paths.__getitem__, owner_of), map(list, zip(index_in)),
                              map(list, zip(map(flat_bytes.__getitem__, at_custom))), map(list, zip(fields)))
        else:
            by_graph: dict[int, tuple[list[int], list[bytes], list[tuple]]] = {}
            for g, i, p, f in zip(owner_of, index_in, at_custom, fields):
                place = by_graph.get(g)
                if place is None:
                    place = by_graph[g] = ([], [], [])
                place[0].append(i)
                place[1].append(flat_bytes[p])
                place[2].append(f)
            self.found += [SpliceGraph(None, paths[g], custom, placeholders, graph_fields)
                           for g, (custom, placeholders, graph_fields) in by_graph.items()]

    def next_level(self, node_columns: dict, flat_bytes: list[bytes], flat_domains: list[str],
                   owner_of_node: list[int], offsets: list[int], first: int) -> list:
        """The next level: the nodes of the block's graphs holding graphs (bytes, path, domain), in order."""
        below = []
        node_attributes, n_node_attributes = node_columns["attribute"]
        if node_attributes:  # their types a column: the nodes with a graph attribute, in order
            a_types = read_columns(self.sk.attributes, node_attributes, ATTRIBUTE_TYPE)["type"]
            with_graph = list(map(operator.or_, map(_GRAPH.__eq__, a_types), map(_GRAPHS.__eq__, a_types)))
            if any(with_graph):
                of_node = list(_CHAIN(map(_REPEAT, range(len(flat_bytes)), n_node_attributes)))
                paths = self.paths
                for p in dict.fromkeys(itertools.compress(of_node, with_graph)):
                    g = owner_of_node[p]
                    below.append((flat_bytes[p], (*paths[g], p - offsets[g - first]), flat_domains[p]))
        return below
