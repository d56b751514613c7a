"""The bodies' byte writer: custom:: placeholders in If branches, Loop and Scan bodies.

One of the writers of graphkit.rewrite.writers (:func:`write` is its side of their one
interface; the placeholders become standard ops in ``LoweringPlan.lower``, as in every
writer). graphkit.rewrite.bytes.main_graph splices replacements into the main graph's serialized node
list. Here every graph nested in a node's attributes (``g``, ``graphs``, at any depth) is
a scope of its own: each main-graph node holding graphs with placeholders is written
again from its serialized bytes, each message on the way down to the placeholders parsed
as a wire.Skeletons message (every message-typed field kept as its bytes) and serialized
again with the placeholders' entries replaced; every other main-graph byte stays as it was.

Reading thousands of subgraphs field by field through protobuf's Python objects costs a
wrapper object per message and per repeated field read; here the subgraphs are read from
the serialized model instead, a field of a block of them at a time: messages of one kind
are parsed together as one message whose fields are all repeated (bytes.columns: protobuf
appends a repeated field's values as they come, an end value after each message tells
them apart), and the placeholders' replacements of one template are written together
(bytes.body_repeats.Layout), a field of all of them at a time.

Where each step is: this module holds the rewrite (:class:`_Bodies`, its steps in order);
bytes.body_scopes the pass that types the model and lists the graphs holding placeholders;
bytes.body_repeats the repeats and adoptions written many at a time; bytes.body_splice the
graphs written again around their new entries; bytes.common what the main graph's writer
shares (the steps both take, the type table's policy, the check).

The result is the objects writer's, byte for byte (tests/test_fastpath.py's corpus):

* Order: ``rewrite_model``'s lower pass visits the node lists in reverse of ModelIndex's
  order (a graph before the graphs nested in it), each in node order; here the same
  order, so the name generator is asked for the same names in the same order.
* Lowering: one ``LoweringPlan`` with one ``LoweringScope`` per node list, as the pass
  has. The first node of each kind is lowered by ``LoweringPlan.lower``. A later node of
  the kind, in a scope holding the kind's template (``LoweringScope.templates``),
  repeats it (``bytes.common.LoweringTemplateWriter``, with the names the template reads from its scope,
  an adopted template's constants, as slots); in a scope without one, where the plan
  would adopt another scope's template, ``LoweringPlan.adopt`` does (its constants made
  in this scope) and the instance is written from it, or, for a body whose one
  placeholder this is (nothing else in the scope could see what adopt() leaves there),
  the same constants and instance are written from ``LoweringPlan.adoption``; anything
  else (shape-dependent decompositions, bindings of several nodes, a template the plan
  builds again) is lowered by the plan. ``LoweringPlan.count`` counts the repeats.
* Names: the generator starts empty where no name of the model starts with a
  placeholder's ``<prefix>/`` (every generated name does; bodies' names and the outer
  names they read are in the bytes searched), else with every name of the model, as the
  engine's (``bytes.common.name_seed``); it is asked in the lowering's order, the bytes
  written afterwards.
* Element types: the engine's ``TypeTable`` (``bytes.common.forward_types`` over the main
  graph, subgraphs through TypeTable's own pass), whose pass also lists the scopes
  (``bytes.body_scopes.BodyScopes``, the pass's watch). Where every placeholder input is
  declared with a type (or is an output of a main-graph If/Loop/Scan whose body output is),
  the declarations alone give the whole pass's answer for them (a forward rule never changes
  a declared name's type) and the nodes are not typed; those are read from the serialized
  subgraphs at once where every name a subgraph defines or declares is its own
  (``BodyScopes._declared_bulk`` lists the conditions), else graph by graph. Otherwise the
  whole pass runs. Where sibling subgraphs define one name (the engine then keeps a table
  per scope) or a placeholder input stays unknown (the engine would run ONNX shape
  inference), the objects writer runs.
* Check: as ``bytes.main_graph``'s, by parts where its conditions hold (see its docstring). They
  hold in bodies: a replacement reads its placeholder's inputs (visible where the
  placeholder is: the input passed the checker) and names made before it in its scope,
  makes its placeholder's outputs (a body's outputs among them), holds no subgraph, and
  the names generated are unique against every name of every scope (no shadowing of an
  outer name). Checked besides the input: every replacement the plan built, and the
  first adoption and the first repeat of each template with each pattern of empty names.
  External data, a small model or ``full_check`` send the check to the whole output, and
  so does a part the checker refuses (graph inputs or outputs without a shape, in any
  scope, among the reasons: the whole check gives them an empty shape, as the engine's).
* Bytes: a message written again is protobuf's serialization of it (fields in number
  order), so where the input is as protobuf writes it, the output is the objects
  writer's byte for byte; where not, it is the same model (field for field). A main-graph
  node holding its own graphs is not parsed where the messages written again (it, the
  attributes and graphs on the way down) are as protobuf writes them back, read a field
  of many at a time (graphkit.rewrite.bytes.body_splice, which writes every graph holding
  placeholders again): its bytes are the input's with the placeholders' entries replaced
  and the length prefixes around them written again, the same bytes.

Preconditions (each an ``Unsupported``, the report's ``writer_reason`` when the objects
writer runs instead): no model-local functions or training info, no custom node holding
a subgraph, placeholders only in the ``custom`` domain, the main graph's node entries
where the parsed model has them, every placeholder input typed by the forward pass, every
type a decomposition or a kernel's binding asks for known without shape inference (found
when the plan returns, as in bytes.main_graph), one
type table for every scope (no two sibling graphs define a name); a target opset only
where the conversion moves the imports alone or changes nodes by steps on their own fields, which
graphkit's adapters make here (graphkit.rewrite.bytes.conversions.splice_scopes: in every graph,
spliced like the replacements, every graph listed and written as its serialized entries
spliced: ``graph_bytes``).

The steps are :class:`_Bodies`' methods, in :meth:`_Bodies.run`'s order.
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
from collections.abc import Callable, Iterator
from operator import attrgetter, itemgetter
from typing import Any

import onnx

from graphkit.ops._opdef import PLACEHOLDER_DOMAIN
from graphkit.rewrite.bytes import conversions
from graphkit.rewrite.bytes import wire
from graphkit.rewrite.bytes import body_splice
from graphkit.rewrite.bytes.body_repeats import Adoption, Emitter, Layout, bound, bound_all
from graphkit.rewrite.bytes.body_bulk import MainNodes, main_nodes
from graphkit.rewrite.bytes.body_scopes import BodyScopes, Undeclared
from graphkit.rewrite.bytes.body_splice import SpliceGraph, graph_bytes, holder_entries
from graphkit.rewrite.bytes.columns import PLACEHOLDER_FIELDS, PREFIX_FIELDS, read_columns, split
from graphkit.rewrite.bytes.common import (BoundWriter, assemble, check_output, conversion, count_after,
                                          input_refused, lower_first, lowering_plan, nothing_to_lower,
                                          placeholder_domains, progress_of, read_top, run_writer, seed_names,
                                          spliced_conversion)
from graphkit.rewrite import engine as _engine
from graphkit.rewrite.graph.walk import count_ops
from graphkit.rewrite.bytes.wire import Unsupported
from graphkit.rewrite.engine import RewriteReport
from graphkit.rewrite.lowering.plan import Lowered, Lowering, LoweringScope, LoweringTemplate
from graphkit.rewrite.writers import Pieces, Request

__all__ = ["WHY", "write"]

WHY = ("lowering only, custom nodes in subgraphs, no model-local functions: the replacements are spliced "
       "into the serialized subgraphs, their nested length prefixes written again")
_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS


def _serialized(scopes: list[SpliceGraph]) -> Iterator[bytes]:
    """The placeholders of ``scopes``, in order, serialized."""
    for s in scopes:
        yield from s.nodes if s.nodes is not None else map(onnx.NodeProto.SerializeToString,
                                                           map(s.graph.node.__getitem__, s.custom))


def _real(node: bytes) -> onnx.NodeProto:
    """The serialized node ``node``, parsed."""
    return onnx.NodeProto.FromString(node)


def _run_end(block: list, start: int, kinds_of: list[int], offset: int, kind: int) -> int:
    """Where the run of bodies from ``block[start]`` on ends: bodies with one placeholder each,
    of ``kind`` (``kinds_of[offset + i]`` is the kind of ``block[i]``'s placeholder)."""
    end = start
    while end < len(block) and len(block[end].custom) == 1 and kinds_of[offset + end] == kind:
        end += 1
    return end


def write(request: Request) -> tuple[Pieces, RewriteReport]:
    """The bodies' byte writer (graphkit.rewrite.writers' interface): the request's model with
    the placeholders of every graph lowered, as the pieces of the serialized output, and the
    report ``rewrite_model`` gives; Unsupported where the objects writer must run."""
    return run_writer(_Bodies, request)


class _Bodies:
    """One rewrite by the bodies' byte writer, a step a method, in :meth:`run`'s order: read the
    main graph around its nodes (the preconditions), check the input, make the type table (its
    pass lists the graphs holding placeholders), seed the names (and splice the conversion),
    lower every graph's placeholders a block of graphs at a time (:meth:`lower_block`: the
    first of each kind by the plan, the others repeated or adopted, written a field of many at
    a time by Layout), count, splice the graphs and assemble the output, check it."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.data, self.model, self.registry = request.data, request.model, request.registry

    def run(self) -> tuple[Pieces, Callable[[], None] | None]:
        """The output, and the check to run on it (None: no check)."""
        if not self.read():
            return Pieces([self.data]), None
        self.check_input()
        if not self.type_table():
            return Pieces([self.data]), None
        self.seed_and_convert()
        self.start_lowering()
        order = self.order
        for at in range(0, len(order), body_splice.BLOCK):
            self.lower_block(order[at:at + body_splice.BLOCK])
            if self.pending >= body_splice.BLOCK:
                self.flush()
        self.flush()
        self.count()
        out = self.splice()
        return out, (self.checker(out) if self.request.check else None)

    def read(self) -> bool:
        """The model's top-level entries and the preconditions on them; False: nothing to lower
        (``Lowering.KEEP``)."""
        data, model, request = self.data, self.model, self.request
        self.top, self.graph_span = read_top(data)
        if request.prefer == (Lowering.KEEP,):
            if request.target_opset is not None and request.target_opset != _engine.ai_onnx_opset(model):
                raise Unsupported("--target-opset with nothing to lower (the objects writer moves the imports)")
            self.report = RewriteReport(ops_before=count_ops(model), ops_after=count_ops(model))
            return False
        return True

    def check_input(self) -> None:
        """The checker's part on the input, before the lists below are made (bytes.main_graph's
        docstring: its parse of the model and those lists are never held at once), where the
        output will surely be checked by parts: more main-graph nodes than a full check takes."""
        request = self.request
        self.input_refused = None
        if request.check and not request.full_check and len(self.model.graph.node) > _engine.FULL_CHECK_NODES \
                and not request.has_external_data():
            self.input_refused = input_refused(self.data, self.registry)

    def type_table(self) -> bool:
        """The main graph's fields, the engine's type table (its pass lists the scopes: every node
        is read once here) and the preconditions; False: no graph holds a placeholder."""
        data, model, registry, request = self.data, self.model, self.registry, self.request
        nodes = model.graph.node
        g0, g1 = self.graph_span
        starts, ends, others = wire.node_entries(data, g0, g1)
        if len(starts) != len(nodes):
            raise Unsupported("node entries do not match the parsed graph")
        self.starts, self.ends, self.others = starts, ends, others
        read = main_nodes(data, (starts, ends))  # domains, op types, holders, names made: from the bytes
        if read is None:
            domains, op_types = list(map(attrgetter("domain"), nodes)), list(map(attrgetter("op_type"), nodes))
            holders = [i for i, node in enumerate(nodes) if node.attribute and any(
                a.type == _GRAPH or a.type == _GRAPHS for a in node.attribute)]
        else:
            domains, op_types, holders = read.domains, read.op_types, read.holders
        custom = [i for i, d in enumerate(domains) if d == PLACEHOLDER_DOMAIN] if PLACEHOLDER_DOMAIN in domains else []
        listing, main = self._listing(nodes, domains, op_types, custom, holders, True, read)
        del read
        report = self.report = RewriteReport(ops_before=listing.counts)
        self.placeholders = placeholder_domains(registry, report.ops_before)
        self.current, self.converting, changed = conversion(request, report.ops_before, collections.Counter(),
                                                            bodies=True)
        self.changed = changed
        if changed is not None and listing.bulk:  # the conversion splices into every graph: their scopes listed
            listing.list_every_graph(nodes, holders)
        listing.counts = collections.Counter()
        self.listing, self.types, self.typing, self.main = listing, listing.table, listing.typing, main
        self.lists = [s for s in listing.scopes if s.custom]
        if not self.lists:
            nothing_to_lower(report, self.converting)
            return False
        return True

    def _listing(self, nodes: Any, domains: list[str], op_types: list[str], custom: list[int], holders: list[int],
                 bulk: bool, read: MainNodes | None = None) -> tuple[BodyScopes, SpliceGraph]:
        """The pass (its type table, the scopes it lists) and the main graph's scope; ``bulk``: the subgraphs' declarations may be read
        at once (where a placeholder reads a name no graph declares with a type, the whole pass); ``read``: the
        main graph's nodes, where body_bulk.main_nodes read them."""
        model = self.model
        main = SpliceGraph(model.graph, (), list(custom))
        main.size, main.dirty = len(nodes), bool(custom)
        try:
            listing = BodyScopes(model, self.registry, main, domains, op_types, holders, forward=False,
                                  data=self.data, spans=(self.starts, self.ends) if bulk else None, read=read)
            # A subgraph's placeholders were checked as the pass reached them (types are only
            # added to): the main graph's are left.
            declared = listing.table.elem_types.keys()
            if not all(x in declared for i in custom for x in nodes[i].input if x):
                raise Undeclared
        except Undeclared:  # a placeholder reads a name no graph declares with a type: the forward rules'
            main = SpliceGraph(model.graph, (), list(custom))
            main.size, main.dirty = len(nodes), bool(custom)
            listing = BodyScopes(model, self.registry, main, domains, op_types, holders)
        return listing, main

    def seed_and_convert(self) -> None:
        """The names the generator starts with (the placeholders' prefixes: those the bulk read
        kept, the others read now), the conversion spliced into every graph (before the
        lowering, as in the objects writer), and the lowering plan."""
        data, model, request = self.data, self.model, self.request
        prefixes: set[str] = set(self.listing.prefixes)  # those _declared_bulk read
        unread = [s for s in self.lists if s.fields is None]
        block = body_splice.BLOCK
        for at in range(0, len(unread), block):
            columns = read_columns(wire.Skeletons.load().nodes, list(_serialized(unread[at:at + block])), PREFIX_FIELDS)
            prefixes.update([name or op for name, op in zip(columns["name"], columns["op_type"])])
        del unread
        seed = seed_names(data, model, self.top, self.others, self.starts, self.ends, self.graph_span, prefixes)
        target = request.target_opset
        self.spliced = None
        if self.changed is not None:  # graphkit's adapters, before the lowering as in the objects writer
            with spliced_conversion(target):
                self.spliced = conversions.splice_scopes(data, model, self.main, self.changed, target, self.others,
                                                           self.ends, self.graph_span[1], request.path)
            if seed is not None:
                seed.update(self.spliced.made)
        self.opset, self.plan = lowering_plan(request, self.current, seed)

    def start_lowering(self) -> None:
        """What the lowering fills in and looks up, graph after graph."""
        self.slots: dict[int, list[Any]] = {}  # scope id -> its placeholders' replacements, in order
        self.kinds: dict[int, Any] = {}  # kind of node (its number) -> the first such node's Lowered
        self.bound: dict[tuple, BoundWriter] = {}
        self.emitters: dict[int, Emitter] = {}
        self.repeats: collections.Counter = collections.Counter()  # (kind, template nodes' id) -> nodes repeated
        self.repeated: dict[tuple, Lowered] = {}
        self.checked: list[list] = []  # what the check by parts reads: [path, entries, inputs, outputs]
        self.seen: set[tuple] = set()
        self.adoptions: dict[tuple, Adoption] = {}
        self.adopted: collections.Counter = collections.Counter()  # (kind, template nodes' id) -> adoptions written
        self.adopted_as: dict[tuple, Lowered] = {}
        # Repeats and adoptions are written a block at a time, a field of all of them at once
        # (Layout): per layout, each one's values, the names the generator gave it (asked in
        # the order the one-by-one writer asks), and where its entries go.
        self.rows: dict[int, tuple[Layout, list, list, list]] = {}
        # id(LoweringTemplateWriter) -> it (kept: ids stay its), its layout
        self.layouts: dict[int, tuple[Any, Layout]] = {}
        # kind number -> what writes a body's one placeholder of that kind, adopted (while its rows are kept)
        self.alone_rows: dict[int, tuple] = {}
        self.pending = 0
        self.order = list(reversed(self.lists))  # the objects writer's order: a graph before those nested in it
        self.count_lowered = sum(map(len, map(attrgetter("custom"), self.order)))
        self.kind_numbers: dict[tuple, int] = {}
        self.numbers = itertools.count()
        self.total = sum(self.report.ops_before.values())
        self.progress, self.step = progress_of(self.request, self.total)
        self.next_report = 0
        self.done_scopes = 0

    def emitter(self, template: LoweringTemplate) -> Emitter:
        """The writer of ``template`` for any scope (one per template's nodes and constants read)."""
        made = self.emitters.get(id(template.nodes))
        if made is None or list(template.constants) != made.reads:
            made = self.emitters[id(template.nodes)] = Emitter(template)
        return made

    def layout_of(self, written: Any, tails: list[bytes], n_inputs: int) -> tuple[Layout, list, list, list]:
        """The rows of the layout writing ``written`` (the template writer), made where there are none."""
        got = self.rows.get(id(written))
        if got is None:
            known = self.layouts.get(id(written))
            if known is None:
                known = self.layouts[id(written)] = (written, Layout(written, tails, n_inputs))
            got = self.rows[id(written)] = (known[1], [], [], [])
        return got

    def flush(self) -> None:
        """The rows kept so far written, each where its entries go (and where the check reads them)."""
        self.alone_rows.clear()
        for layout, values, asked, targets in self.rows.values():
            written = layout.emit(values, asked)
            wheres, places, checks = zip(*targets)
            list(map(list.__setitem__, wheres, places, written))
            for check_entry, entries in zip(itertools.compress(checks, checks), itertools.compress(written, checks)):
                check_entry[1] = entries
        self.rows.clear()
        self.pending = 0

    def read_block(self, block: list[SpliceGraph]) -> _Block:
        """The block's placeholders (serialized) and a field of all of them at a time: inputs,
        outputs, prefixes, op types, values, and each one's kind (op, attributes, arity,
        aliasing among inputs and outputs, input types) as a number."""
        elem, declared = self.types.elem_type, self.types.elem_types.get  # elem_type's first look: declared
        nodes = list(map(attrgetter("nodes"), block))
        ph = list(itertools.chain.from_iterable(nodes)) if None not in nodes else list(_serialized(block))
        del nodes
        if all(map(attrgetter("fields"), block)):  # as _declared_bulk read them
            read = list(itertools.chain.from_iterable(map(attrgetter("fields"), block)))
            ins_of, outs_of, prefixes, ops_of, attr_keys = map(list, zip(*read))
            del read
            list(map(setattr, block, itertools.repeat("fields"), itertools.repeat(None)))  # read once: freed as it goes
        else:
            columns = read_columns(wire.Skeletons.load().nodes, ph, PLACEHOLDER_FIELDS)
            ins_of, outs_of = split(*columns["input"]), split(*columns["output"])
            ops_of = columns["op_type"]
            prefixes = [name or op for name, op in zip(columns["name"], ops_of)]
            attributes, n_attributes = columns["attribute"]
            attr_keys = [b""] * len(ph)
            if attributes:  # a kind's attributes: their bytes
                for k, key in zip(itertools.compress(range(len(ph)), n_attributes),
                                  map(b"".join, split(attributes, [n for n in n_attributes if n]))):
                    attr_keys[k] = key
            del columns, attributes, n_attributes
        values_of = list(map(operator.add, ins_of, outs_of))
        aliasing: list[Any] = list(map(operator.eq, map(len, map(set, values_of)), map(len, values_of)))
        for k in itertools.compress(range(len(ph)), map(operator.not_, aliasing)):
            aliasing[k] = tuple(map(values_of[k].index, values_of[k]))
        input_at = list(itertools.accumulate(map(len, ins_of), initial=0))
        all_types = tuple(map(declared, itertools.chain.from_iterable(ins_of)))
        in_types = list(map(all_types.__getitem__, map(slice, input_at, input_at[1:])))  # tuples, one a node
        del input_at, all_types
        for k in itertools.compress(range(len(ph)), map(operator.or_, map(operator.contains, in_types,
                                                                         itertools.repeat(None)),
                                                       map(operator.contains, ins_of, itertools.repeat("")))):
            in_types[k] = tuple([(declared(x) or elem(x)) if x else None for x in ins_of[k]])
        # each kind as a number (hashed once here, not at every lookup)
        kinds_of = list(map(self.kind_numbers.setdefault, zip(ops_of, attr_keys, map(len, ins_of), aliasing,
                                                               map(len, outs_of), in_types), self.numbers))
        return _Block(block, ph, ins_of, outs_of, prefixes, ops_of, values_of, kinds_of)

    def lower_block(self, scopes: list[SpliceGraph]) -> None:
        """Every placeholder of a block of graphs, in order: a run of bodies whose one placeholder
        is of a kind bound or adopted before, all at once (:meth:`bound_run`, :meth:`adopted_run`);
        any other graph's placeholders one by one (:meth:`lower_scope`)."""
        b = self.read_block(scopes)
        kinds_of, bound, alone_rows, progress = b.kinds_of, self.bound, self.alone_rows, self.progress
        n_lists = len(self.lists)
        k = -1  # the last placeholder lowered, in the block
        n_scopes = len(scopes)
        at_scope = 0
        while at_scope < n_scopes:
            scope = scopes[at_scope]
            at_scope += 1
            if progress is not None and self.done_scopes >= self.next_report:
                progress("lowering", self.done_scopes * self.total // n_lists, self.total)
                self.next_report = self.done_scopes + max(1, self.step * n_lists // self.total)
            self.done_scopes += 1
            if len(scope.custom) == 1 and ((kind := kinds_of[k + 1]) in bound or kind in alone_rows):
                # Bodies whose one placeholder is of a kind bound or adopted before, one after the
                # other: what lower_scope does for each, for all of them at once.
                run_end = _run_end(scopes, at_scope, kinds_of, k + 2 - at_scope, kind)
                run = scopes[at_scope - 1:run_end]
                self.done_scopes += len(run) - 1
                at_scope = run_end
                first_k, k = k + 1, k + len(run)
                if kind in bound:
                    self.bound_run(b, run, first_k, kind)
                else:
                    self.adopted_run(b, run, first_k, kind)
                continue
            k = self.lower_scope(b, scope, k)

    def bound_run(self, b: _Block, run: list[SpliceGraph], first_k: int, kind: int) -> None:
        """Bodies (``run``, from the block's placeholder ``first_k`` on) whose one placeholder is of
        a kind bound before: each the node with the bound one's domain and attributes."""
        n = len(run)
        last = first_k + n
        written = bound_all(self.bound[kind], b.ph[first_k:last])
        self.slots.update(zip(map(id, run), map(list, zip(written))))
        self.repeats[(kind, 0)] += n
        self.repeated.setdefault((kind, 0), self.kinds[kind])
        if self.request.check:
            values_r = b.values_of[first_k:last]
            empty = list(map(operator.contains, values_r, itertools.repeat("")))
            for j in (range(n) if any(empty) else range(1)):
                pattern = ("bound", kind, empty[j] and tuple(map(operator.not_, values_r[j])))
                if pattern not in self.seen:
                    self.seen.add(pattern)
                    self.checked.append([(*run[j].path, run[j].custom[0]), written[j], b.ins_of[first_k + j],
                                         b.outs_of[first_k + j]])

    def adopted_run(self, b: _Block, run: list[SpliceGraph], first_k: int, kind: int) -> None:
        """Bodies whose one placeholder is of a kind adopted before (another scope's template, its
        constants made in each body): their rows added to that adoption's layout, the names asked
        of the generator a grid at a time."""
        v_rows, a_rows, targets, asks, n_made, n_inputs, group, pattern_of = self.alone_rows[kind]
        n = len(run)
        last = first_k + n
        asked = ["/const"] * n_made + asks
        m = len(asked)
        names = self.plan.names.fresh_grid(b.prefixes[first_k:last], asked)
        row_at = range(0, n * m, m)
        ins_r, outs_r = b.ins_of[first_k:last], b.outs_of[first_k:last]
        pad = n_inputs - len(ins_r[0])
        if pad or n_made:
            made = map(names.__getitem__, map(slice, row_at, map(operator.add, row_at, itertools.repeat(n_made))))
            padded = map(list.__add__, ins_r, itertools.repeat([""] * pad)) if pad else ins_r
            v_rows += map(list.__add__, map(list.__add__, padded, made), outs_r)
        else:
            v_rows += b.values_of[first_k:last]
        a_rows += map(names.__getitem__, map(slice, map(operator.add, row_at, itertools.repeat(n_made)),
                                             map(operator.add, row_at, itertools.repeat(m))))
        del names
        self.adopted[group] += n
        heres = [[None] for _ in range(n)]
        self.slots.update(zip(map(id, run), heres))
        checks: list[Any] = [None] * n
        if self.request.check:
            values_r = b.values_of[first_k:last]
            empty = list(map(operator.contains, values_r, itertools.repeat("")))
            for j in (range(n) if any(empty) else range(1)):
                pattern = (*pattern_of, empty[j] and tuple(map(operator.not_, values_r[j])))
                if pattern not in self.seen:
                    self.seen.add(pattern)
                    checks[j] = [(*run[j].path, run[j].custom[0]), None, ins_r[j], outs_r[j]]
                    self.checked.append(checks[j])
        targets += zip(heres, itertools.repeat(0), checks)
        self.pending += n

    def lower_scope(self, b: _Block, scope: SpliceGraph, k: int) -> int:
        """The placeholders of one graph, one by one (``k``: the block's placeholder before its
        first; returns its last): what LoweringPlan.lower does for each, in bytes where a kind's
        first node was lowered before (a repeat of this scope's template, an adoption of
        another's, a binding), else by the plan. Returns the last placeholder's index."""
        plan, types, fresh, kinds, check = self.plan, self.types, self.plan.names.fresh, self.kinds, self.request.check
        lscope = None  # the scope's LoweringScope, made where the plan needs it
        alone = len(scope.custom) == 1
        made_here = self.slots[id(scope)] = [None] * len(scope.custom)
        for j, i in enumerate(scope.custom):
            k += 1
            node = b.ph[k]
            kind = b.kinds_of[k]
            inputs, outputs, values = b.ins_of[k], b.outs_of[k], b.values_of[k]
            first = kinds.get(kind)
            mode = None
            entries = None
            if first is None:
                lscope = lscope or LoweringScope(types)
                lowered = lower_first(plan, _real(node), lscope, self.typing)
                kinds[kind] = lowered
            elif first.how is Lowering.DECOMPOSE:  # what LoweringPlan._decompose does, in bytes
                key = first.key
                template = None if lscope is None else lscope.templates.get(key)
                prefix = b.prefixes[k]
                if template is not None:  # a repeat in this scope
                    made = self.emitter(template)
                    layout, v_rows, a_rows, targets = self.layout_of(made.written, [], made.n_inputs)
                    pad = made.n_inputs - len(inputs)
                    v_rows.append([*inputs, *[""] * pad, *map(template.constants.__getitem__, made.reads),
                                   *outputs] if pad or made.reads else values)
                    a_rows.append([fresh(prefix + a) for a in layout.asks])
                    group = (kind, id(made.nodes))
                    self.repeats[group] += 1
                    if group not in self.repeated:
                        self.repeated[group] = Lowered(first.op, first.how, first.action, [], template)
                    mode = ("repeat", *group)
                elif alone and plan.adoptable(key):  # a body's one placeholder: adopted, in bytes
                    adoption = self.adoptions.get(key)
                    if adoption is None:
                        adoption = self.adoptions[key] = Adoption(plan, key)
                    written = adoption.emitter.written
                    layout, v_rows, a_rows, targets = self.layout_of(written, adoption.tails,
                                                                     adoption.emitter.n_inputs)
                    made_names = [fresh(prefix + "/const") for _ in adoption.tails]
                    pad = adoption.emitter.n_inputs - len(inputs)
                    v_rows.append([*inputs, *[""] * pad, *made_names, *outputs] if pad or made_names else values)
                    a_rows.append([fresh(prefix + a) for a in layout.asks])
                    group = (kind, id(adoption.template.nodes))
                    self.adopted[group] += 1
                    if group not in self.adopted_as:
                        self.adopted_as[group] = Lowered(first.op, first.how, first.action, [], adoption.template,
                                                         adoption.constants)
                    mode = ("adopt", *group)
                    self.alone_rows[kind] = (v_rows, a_rows, targets, layout.asks, len(adoption.tails),
                                             adoption.emitter.n_inputs, group, mode)
                elif plan.adoptable(key):  # the first in this scope: another scope's template adopted
                    lscope = lscope or LoweringScope(types)
                    template, constants = plan.adopt(key, prefix, lscope)
                    made = self.emitter(template)
                    entries = b"".join(wire.entry(c.SerializeToString()) for c in constants)
                    entries += made.emit(template, inputs, outputs, prefix, fresh)
                    plan.count(Lowered(first.op, first.how, first.action, [], template, constants),
                               PLACEHOLDER_DOMAIN, b.ops_of[k])
                    mode = ("adopt", kind, id(made.nodes))
                else:
                    lscope = lscope or LoweringScope(types)
                    lowered = lower_first(plan, _real(node), lscope, self.typing)
            elif len(first.nodes) == 1:  # bound: the node with the first one's domain and attributes
                writer = self.bound.get(kind)
                if writer is None:
                    writer = self.bound[kind] = BoundWriter(first.nodes[0])
                entries = bound(writer, wire.Skeletons.load().node.FromString(node))
                self.repeats[(kind, 0)] += 1
                self.repeated.setdefault((kind, 0), first)
                mode = ("bound", kind)
            else:
                lscope = lscope or LoweringScope(types)
                lowered = lower_first(plan, _real(node), lscope, self.typing)
            if mode is None:
                made_here[j] = entries = b"".join(wire.entry(r.SerializeToString()) for r in lowered.nodes)
                self.checked.append([(*scope.path, i), entries, inputs, outputs])
                continue
            check_entry = None
            if check:
                pattern = (*mode, "" in values and tuple(map(operator.not_, values)))
                if pattern not in self.seen:
                    self.seen.add(pattern)
                    check_entry = [(*scope.path, i), entries, inputs, outputs]
                    self.checked.append(check_entry)
            if entries is None:
                targets.append((made_here, j, check_entry))
                self.pending += 1
            else:
                made_here[j] = entries
        return k

    def count(self) -> None:
        """The repeats and adoptions counted in the plan; the report's counts after."""
        if self.progress is not None:
            self.progress("lowering", self.total, self.total)
        plan = self.plan
        op_of_kind = {number: key[0] for key, number in self.kind_numbers.items()}
        for (kind, _), n in self.repeats.items():
            plan.count(self.repeated[(kind, _)], PLACEHOLDER_DOMAIN, op_of_kind[kind], n, repeated=True)
        for group, n in self.adopted.items():
            plan.count(self.adopted_as[group], PLACEHOLDER_DOMAIN, op_of_kind[group[0]], n)
        count_after(self.report, plan)

    def splice(self) -> Pieces:
        """The graphs holding placeholders written again around their new entries, and the
        output assembled around the main graph."""
        data, slots, spliced, starts, ends = self.data, self.slots, self.spliced, self.starts, self.ends
        g0, g1 = self.graph_span
        if spliced is not None:  # the converted nodes spliced like the replacements
            spliced.merge(self.listing.scopes, slots)
            self.checked += spliced.checked
        if not self.listing.bulk:  # every graph listed, the graphs in each (scope.subs): spliced in place, nested
            graph = graph_bytes(data, self.main, g0, g1, slots, (starts, ends), joined=False)  # pieces
            if spliced is not None:
                graph = spliced.insert(graph, data, g1)
        else:  # the graphs holding placeholders only: their main-graph nodes written again from skeletons
            edits = holder_entries(data, (starts, ends), [s for s in self.lists if s.path], slots)
            if self.main.custom:
                edits += zip(self.main.custom, slots.pop(id(self.main)))
                edits.sort(key=itemgetter(0))
            view = memoryview(data)  # big slices without a copy
            graph = []
            at = g0
            for index, entries in edits:
                start = starts[index]
                graph += (view[at:start] if start - at > 4096 else data[at:start], entries)
                at = ends[index]
            graph.append(view[at:g1])
            del edits, view
        del self.slots, self.spliced
        changed = self.changed
        out, self.header, self.import_entries = assemble(
            data, self.model, self.top, graph, self.report, opset=self.opset, placeholders=self.placeholders,
            target_opset=self.request.target_opset, current=self.current, lowered=self.count_lowered, why=WHY,
            converted=None if changed is None else sorted(changed))
        return out

    def checker(self, out: Pieces) -> Callable[[], None]:
        """The check of the output ``out``, as a function holding only what it reads (the rest is
        freed before it runs): each replacement the plan built, then the ONNX checker's verdict,
        by parts where bytes.main_graph's conditions hold, else on the whole output."""
        request, checked = self.request, self.checked

        def replaced() -> list:
            # In the output's order (a subgraph where its node is): a name is made before it is read.
            checked.sort(key=itemgetter(0))
            return [c[1:] for c in checked]

        return functools.partial(check_output, out, request, self.report, self.plan, self.types, self.typing,
                                 header=self.header, import_entries=self.import_entries, refused=self.input_refused,
                                 converting=self.converting, whole=lambda full: full or request.has_external_data(),
                                 replaced=replaced)


class _Block:
    """A block of graphs' placeholders, a field of all of them at a time (:meth:`_Bodies.read_block`)."""

    __slots__ = ("scopes", "ph", "ins_of", "outs_of", "prefixes", "ops_of", "values_of", "kinds_of")

    def __init__(self, scopes: list[SpliceGraph], ph: list[bytes], ins_of: list, outs_of: list, prefixes: list[str],
                 ops_of: list[str], values_of: list, kinds_of: list[int]) -> None:
        self.scopes, self.ph, self.ins_of, self.outs_of = scopes, ph, ins_of, outs_of
        self.prefixes, self.ops_of, self.values_of, self.kinds_of = prefixes, ops_of, values_of, kinds_of
