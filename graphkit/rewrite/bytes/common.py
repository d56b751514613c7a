"""What the two byte writers share (graphkit.rewrite.bytes.main_graph, the main graph's, and
graphkit.rewrite.bytes.bodies, the bodies'): the steps both take, how a lowering the plan made
is repeated as bytes, the element types the engine's type table gives without ONNX shape
inference, the names the name generator starts with, the output assembled around its graph,
and the check by parts. A change to one of these is made here, once.

* Steps: :func:`run_writer` (a writer's side of the writers' interface), :func:`read_top`,
  :func:`placeholder_domains`, :func:`conversion`, :func:`nothing_to_lower`,
  :func:`spliced_conversion`, :func:`lowering_plan`, :func:`progress_of`, :func:`lower_first`
  (the plan lowering a kind's first node), :func:`check_output` (the output's check).

* Repeats: the plan (``LoweringPlan.lower``, where a placeholder becomes standard ops) lowers
  the first node of each kind; a later node of the same kind repeats the ``LoweringTemplate`` it
  returned as ``LoweringTemplate.instantiate`` would (same renaming, same names), written as
  serialized nodes by :class:`LoweringTemplateWriter`; a bound node reuses the first one's domain and
  attributes (:class:`BoundWriter`).
* Element types: the engine's TypeTable (graph.types) with :class:`WriterTyping` as its
  policy, its forward pass over fields read in bulk and stopped at the last placeholder
  (:func:`forward_types`). What it cannot answer as the engine's would is
  :class:`~graphkit.rewrite.writers.Unsupported` where the writer's own code asked, None
  within :meth:`WriterTyping.serving` (the plan running the op's code: :func:`lower_first`),
  the writer stepping aside when that block ends.
* Names: :func:`name_seed`: the generator starts empty where no name of the model starts
  with a placeholder's ``<prefix>/`` (every generated name does), else with every name.
* Output: :func:`assemble`, the model's top-level fields as they were around the new graph,
  the opset imports fixed as the objects writer's pass fixes them, the report's passes said
  as its passes say them; :func:`count_after`, the report's counts.
* Check: :func:`check_parts`, the ONNX checker's verdict on the output found from the input
  and a small model of replacements (the conditions are in graphkit.rewrite.bytes.main_graph's
  docstring); :func:`input_refused`, the checker on the input.
* Conversions: :func:`conversion_steps`, whether a ``--target-opset`` moves only the imports
  or converts nodes graphkit.rewrite.bytes.conversions splices.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter, itemgetter
from typing import Any

import onnx

from graphkit.errors import ValidationError
from graphkit.ops import OpRegistry
from graphkit.ops._opdef import PLACEHOLDER_DOMAIN
from graphkit.rewrite.bytes import conversions
from graphkit.rewrite.bytes import wire
from graphkit.rewrite import engine as _engine
from graphkit.rewrite._gcpause import gc_paused
from graphkit.rewrite._memory import release_freed_memory
from graphkit.rewrite.graph.walk import AI_ONNX, holds_graphs
from graphkit.rewrite.graph.types import TypeTable, Watch
from graphkit.rewrite.engine import RewriteReport
from graphkit.rewrite.lowering.plan import Lowered, LoweringPlan, LoweringScope, LoweringTemplate
from graphkit.rewrite.lowering.builder import NameGenerator
from graphkit.rewrite.writers import InBodies, Pieces, Request, Unsupported

__all__ = ["ADAPTERS", "CHECKED_BY_PARTS", "IMPORTS_ONLY", "NO_NODE_CHANGES", "BoundWriter", "LoweringTemplateWriter",
           "WriterTyping", "assemble", "check_parts", "conversion_steps", "count_after", "forward_types",
           "input_refused", "lower_first", "name_seed", "node_names", "seed_names", "writer_types"]

# Above this many (slash, prefix length) pairs, seed the name generator instead of probing.
_PROBE_BUDGET = 2_000_000
_PROBE_TAILS = 64  # at most this many distinct prefix endings are searched for one by one

# Added to it where --target-opset moved only the imports.
IMPORTS_ONLY = ("--target-opset: imports only (no standard op of the model has a new version between "
                "opsets {} and {}), the replacements made at the target opset")
# Added to it where graphkit's adapters converted nodes of the main graph (graphkit.rewrite.bytes.conversions).
ADAPTERS = ("--target-opset: graphkit's adapters converted the nodes opsets {} to {} change ({}), spliced "
            "like the replacements")
# Added to it where the ops' newer versions take the model's nodes as they are (types, attributes added).
NO_NODE_CHANGES = ("--target-opset: graphkit's adapters changed no node from opset {} to {} (the ops' newer "
                   "versions take the nodes as they are)")
# Added to it where the output's check was found from parts (see the module docstring).
CHECKED_BY_PARTS = ("checked by parts: the input model, and each kind of replacement under the output's "
                    "opset imports (generated names are unique by construction)")



def conversion_steps(model: onnx.ModelProto, ops: collections.Counter, sub_counts: collections.Counter,
                current: int | None, target: int, bodies: bool = False) -> conversions.Steps | None:
    """Precondition of a --target-opset rewrite: None where the conversion moves only the
    imports, else the steps of the nodes graphkit's adapters convert in the main graph
    (graphkit.rewrite.bytes.conversions: where they only change the nodes' own fields)."""
    try:
        _imports_only(ops, current, target)
        return None
    except Unsupported:
        if current is None:
            raise
    try:
        return conversions.plan(model, set(ops), set(sub_counts), current, target, bodies)
    except conversions.InSubgraphs as exc:  # the bodies' writer converts them
        raise InBodies(str(exc)) from exc
    except conversions.NotSpliced as exc:
        raise Unsupported(f"--target-opset {target} needs the objects writer's conversion: {exc}") from exc


def _imports_only(ops: collections.Counter, current: int | None, target: int) -> None:
    """Precondition of a --target-opset rewrite: converting from ``current`` to ``target``
    moves only the ai.onnx import (engine.convert_opset's "imports only")."""
    if current is None:
        raise Unsupported("--target-opset on a model without an ai.onnx opset import")
    standard = {op for d, op in ops if d in AI_ONNX}
    if standard and not _engine.same_schemas(standard, current, target):
        raise Unsupported(f"--target-opset {target} needs the version converter (a standard op of the model "
                          f"has a new version between opsets {current} and {target})")


# -- the steps both writers take ----------------------------------------------------------

def run_writer(make: Callable[[Request], Any], request: Request) -> tuple[Pieces, RewriteReport]:
    """A byte writer's side of graphkit.rewrite.writers' interface: ``make(request).run()``
    (the output, and the check to run on it or None), the output checked once the rest of the
    rewrite is freed; the output as pieces and the report."""
    with gc_paused():
        rewrite = make(request)
        out, run_check = rewrite.run()
        report = rewrite.report
        del rewrite  # what the check does not read
        if run_check is not None:
            run_check()
        # the rewrite's lists (held by the check) freed while the collector is paused: once it
        # runs again, its first pass walks every object made in the pause that is still alive
        del run_check
    return out, report


def read_top(data: bytes) -> tuple[list, tuple[int, int]]:
    """The model's top-level entries and where its graph's value is; Unsupported where the
    graph is not there exactly once, or there are model-local functions or training info."""
    top = wire.entries(data, 0, len(data))
    fields = [e[0] for e in top]
    if fields.count(wire.MODEL_GRAPH) != 1:
        raise Unsupported("graph field not present exactly once")
    if wire.MODEL_FUNCTIONS in fields or wire.MODEL_TRAINING_INFO in fields:
        raise Unsupported("model-local functions or training info")
    _, _, g0, g1 = top[fields.index(wire.MODEL_GRAPH)]
    return top, (g0, g1)


def placeholder_domains(registry: OpRegistry, ops: collections.Counter, keep: bool = False) -> set[str]:
    """The placeholder domains (``custom`` and the registry's); Unsupported where the model's ops
    (``ops``: (domain, op type) counts) have placeholders in another or, unless ``keep``,
    standard ops the registry lowers as its own."""
    placeholders = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
    if len(placeholders) > 1 and (placeholders - {PLACEHOLDER_DOMAIN}) & {d for d, _ in ops}:
        raise Unsupported("placeholders in op domains other than 'custom'")
    standard = registry.standard_op_types()
    if standard and not keep and not standard.isdisjoint(ops):
        raise Unsupported("standard ops lowered as graphkit ops (" + ", ".join(
            sorted({o for d, o in standard & set(ops)})) + ")")
    return placeholders


def conversion(request: Request, ops: collections.Counter, sub_counts: collections.Counter,
               bodies: bool = False) -> tuple[int | None, bool, conversions.Steps | None]:
    """The model's ai.onnx opset, whether --target-opset converts, and the steps of the nodes
    graphkit's adapters convert (None: the imports only, or no conversion; :func:`conversion_steps`)."""
    target = request.target_opset
    current = _engine.ai_onnx_opset(request.model)
    converting = target is not None and target != current
    changed = conversion_steps(request.model, ops, sub_counts, current, target, bodies) if converting else None
    return current, converting, changed


def nothing_to_lower(report: RewriteReport, converting: bool) -> None:
    """No placeholder to lower: the counts after are the counts before (a conversion alone is
    the objects writer's)."""
    if converting:
        raise Unsupported("--target-opset with nothing to lower (the objects writer moves the imports)")
    report.ops_after = report.ops_before.copy()


@contextlib.contextmanager
def spliced_conversion(target: int) -> Iterator[None]:
    """Around splicing a conversion (graphkit.rewrite.bytes.conversions): what it cannot splice
    is the objects writer's conversion (Unsupported)."""
    try:
        yield
    except conversions.NotSpliced as exc:
        raise Unsupported(f"--target-opset {target} needs the objects writer's conversion: {exc}") from exc


def lowering_plan(request: Request, current: int | None, seed: set[str] | None) -> tuple[int, LoweringPlan]:
    """The opset the replacements are made at (the target's, else the model's) and the lowering
    plan every writer uses, its name generator starting with ``seed`` (see :func:`name_seed`)."""
    target = request.target_opset
    opset = target if target is not None else current or _engine.DEFAULT_OPSET
    return opset, LoweringPlan(request.registry, request.prefer, opset, path=request.path,
                               names=NameGenerator(seed or ()))


def progress_of(request: Request, total: int) -> tuple[Callable[[str, int, int], None] | None, int]:
    """The request's progress callback (None for a model too small to report on) and its step."""
    progress = request.progress
    if progress is not None and total <= getattr(_engine, "PROGRESS_MIN_NODES", 10_000):
        progress = None
    return progress, max(1, getattr(_engine, "PROGRESS_STEP", 2_000))


def check_output(out: Pieces, request: Request, report: RewriteReport, plan: LoweringPlan, types: TypeTable,
                 typing: WriterTyping, *, header: bytes, import_entries: bytes, refused: bool | None,
                 converting: bool, whole: Callable[[bool], bool], replaced: Callable[[], list],
                 inference_model: Callable[[Callable[[], onnx.ModelProto]], Callable[[], onnx.ModelProto]] | None = None,
                 whole_bytes: bool = False) -> None:
    """The check of a byte writer's output ``out``: ``check_replacement`` on each replacement the
    plan built (the table's inference, where needed, on ``inference_model(output_model)``, by
    default the output itself), then the ONNX checker's verdict on the output: on the whole
    output where ``whole(full)``, else found from parts (:func:`check_parts` on ``replaced()``;
    ``refused``: the checker's verdict on the input where it ran already), the whole output
    again where the parts cannot tell (``whole_bytes``: the checker on its bytes, without full
    inference). The report's writer_reason says which check ran."""
    registry, path = request.registry, request.path
    out_model: list[onnx.ModelProto] = []

    def output_model() -> onnx.ModelProto:
        if not out_model:
            out_model.append(onnx.load_model_from_string(out.join()))
        return out_model[0]

    typing.checking(output_model if inference_model is None else inference_model(output_model))
    opset_imports = onnx.ModelProto.FromString(import_entries).opset_import
    for r in plan.replacements:
        _engine.check_replacement(r.original, r.nodes, types, opset_imports, registry, r.rule, path)
    applied = ", ".join(sorted({how for _, how in plan.actions}))
    context, hint = _engine.check_context(applied, report.conversions)
    full = request.full_check or sum(report.ops_after.values()) <= _engine.FULL_CHECK_NODES
    if whole(full):
        _engine.check_model(output_model(), registry, path=path, context=context, full=full, hint=hint)
        return
    same_schemas = frozenset(AI_ONNX) if converting else frozenset()
    why = check_parts(request.data, request.model, header, replaced(), {d for d, _ in report.ops_after}, registry,
                      same_schemas, refused)
    if why is None:
        report.writer_reason += f"; {CHECKED_BY_PARTS}"
        return
    # the checker's verdict on the whole output, in its own words (graph inputs or outputs without a
    # shape, in any scope, refuse the input's part: the engine's check gives them an empty one)
    report.writer_reason += f"; checked whole ({why})"
    if whole_bytes:
        _check_bytes(out.join(), registry, path, context, hint)
    else:
        _engine.check_model(output_model(), registry, path=path, context=context, full=False, hint=hint)


def _check_bytes(out: bytes, registry: OpRegistry, path: str | None, context: str,
                 hint: str = "fix the input model, or skip the check with --no-check") -> None:
    """engine.check_model without full inference, on the serialized model."""
    with registry.onnx_schemas():
        try:
            onnx.checker.check_model(out)
        except onnx.checker.ValidationError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValidationError(f"invalid model{context}: {first}", path=path, hint=hint) from exc


# -- lowerings repeated -------------------------------------------------------------------

class LoweringTemplateWriter:
    """A plan ``LoweringTemplate`` that writes serialized nodes.

    ``emit(values, prefix, fresh)`` is ``template.instantiate(inputs, outputs, prefix,
    fresh)`` with ``values = inputs + outputs`` (inputs padded as the engine pads them):
    the same renaming (a dict of the template's inputs then outputs, later entries
    winning) and the same calls to the name generator in the same order; it returns the
    node entries' bytes. ``emit_all(values, prefixes, tails)`` does the same for many
    nodes whose ``fresh(prefix + suffix)`` is ``prefix + suffix + tail`` (the tail is
    ``""`` for the first node of a prefix, ``"_<c>"`` for its c-th repeat: ``plain``
    templates, see :func:`_grouped`); ``emit_ascii`` is emit_all for ASCII names, working
    on latin-1 text (one character per byte) and encoding once per node.

    The template is turned into a plan once: per node, its name suffix, the suffixes of
    the names it generates, and its fields as fixed bytes or references to name slots
    (the values first, then the generated names).
    """

    def __init__(self, template: LoweringTemplate) -> None:
        if template.constants:
            raise Unsupported("a template adopted from another scope")
        tpl_nodes, tpl_inputs, tpl_outputs, tpl_prefix = (template.nodes, template.inputs, template.outputs,
                                                          template.prefix)
        self.n_inputs = len(tpl_inputs)
        cut = len(tpl_prefix)
        slot: dict[str, int] = {}
        for k, name in enumerate([*tpl_inputs, *tpl_outputs]):
            slot[name] = k  # later entries win, as in the engine's rename dict
        n_values = len(tpl_inputs) + len(tpl_outputs)
        plan = []
        for tpl in tpl_nodes:
            if not tpl.name.startswith(tpl_prefix) or not all(o.startswith(tpl_prefix) for o in tpl.output
                                                              if o not in slot):
                raise Unsupported("a template name outside its prefix")
            generated = []
            out_slots = []
            for o in tpl.output:
                if o not in slot:
                    slot[o] = n_values + sum(len(g) for _, g, _, _ in plan) + len(generated)
                    generated.append(o[cut:])
                out_slots.append(slot[o])
            fields: list[Any] = []  # bytes (fixed) or (tag, slot)
            static = b""
            for tag, ref, name in [(b"\x0a", slot.get(i), i) for i in tpl.input] + [(b"\x12", r, None)
                                                                                      for r in out_slots]:
                if ref is None:  # a name the renaming leaves alone (a shared constant, say)
                    static += wire.field(tag, name)
                    continue
                fields.append(static + tag)
                fields.append(ref)
                static = b""
            rest = onnx.NodeProto()
            rest.CopyFrom(tpl)
            for f in ("input", "output", "name"):
                rest.ClearField(f)
            plan.append((tpl.name[cut:], generated, fields + [static + b"\x1a"], rest.SerializeToString()))
        self._plan = plan
        self._text_plan = [(name, gen, [f.decode("latin-1") if isinstance(f, bytes) else f for f in fields],
                            rest.decode("latin-1")) for name, gen, fields, rest in plan]
        # emit_ascii needs ASCII name pieces; fixed bytes of any value survive latin-1.
        self.ascii = all(name.isascii() and all(g.isascii() for g in gen) for name, gen, _, _ in plan)
        # scoped: every name it makes is '<prefix>/<part without '/'>' (names made for
        # different prefixes never meet). plain, besides: no part is another's followed by
        # '_<digits>', so the c-th repeat of a prefix gets each base + '_<c>'.
        suffixes = [x for name, gen, _, _ in plan for x in (name, *gen)]
        self.scoped = all(x.startswith("/") and "/" not in x[1:] for x in suffixes)
        self.plain = self.scoped and len(set(suffixes)) == len(suffixes) and not any(
            re.fullmatch(re.escape(x) + r"_[0-9]+", y) for x in suffixes for y in suffixes)

    def emit(self, v: Any, prefix: str, fresh: Callable[[str], str]) -> bytes:
        return self._emit(v, prefix, fresh)

    def emit_all(self, values: list, prefixes: list, tails: list) -> list[bytes]:
        return [self._emit(v, prefix, None, tail) for v, prefix, tail in zip(values, prefixes, tails)]

    def _emit(self, v: Any, prefix: str, fresh: Callable[[str], str] | None, tail: str = "") -> bytes:
        names = [x.encode() for x in v]
        L = wire.LENGTHS
        entries = []
        for suffix, generated, fields, rest in self._plan:
            node_name = (prefix + suffix + tail if fresh is None else fresh(prefix + suffix)).encode()
            for g in generated:
                names.append((prefix + g + tail if fresh is None else fresh(prefix + g)).encode())
            parts = []
            for f in fields:
                if f.__class__ is int:
                    x = names[f]
                    parts += (L[len(x)], x)
                else:
                    parts.append(f)
            parts += (L[len(node_name)], node_name, rest)
            body = b"".join(parts)
            entries += (b"\x0a", L[len(body)], body)
        return b"".join(entries)

    def emit_ascii(self, values: list, prefixes: list, tails: list) -> list[bytes]:
        """emit_all for ASCII names, a column at a time: each field of every node is made by
        one map over all of them (the loops run in C), then every node's text is joined once.
        A node's length is summed from its names' (names shorter than 128 take one byte to
        say how long they are; with a longer one, emit_all does it)."""
        length = wire.STR_LENGTHS.__getitem__
        add, repeat = operator.add, itertools.repeat
        columns: list[Any] = list(zip(*values))
        # A value every node has (fan-out: one input read by all) is written as fixed text.
        shared = {j: col[0] for j, col in enumerate(columns) if col.count(col[0]) == len(col)}
        sizes: dict[Any, list[int]] = {}
        pieces: list[Any] = []
        for at, (suffix, generated, fields, rest) in enumerate(self._text_plan):
            node_names = list(map(add, map(add, prefixes, repeat(suffix)), tails))
            for g in generated:
                columns.append(list(map(add, map(add, prefixes, repeat(g)), tails)))
            total: Any = list(map(len, node_names))
            sizes[("name", at)] = total
            fixed = 1 + len(rest)  # the name's length, the fields after it
            node: list[Any] = []
            text = ""
            for f in fields:
                if f.__class__ is not int:
                    text += f
                elif f in shared:
                    text += length(len(shared[f].encode())) + shared[f]
                else:
                    if text:
                        node.append(repeat(text))
                        fixed += len(text)
                        text = ""
                    size = sizes.get(f)
                    if size is None:
                        size = sizes[f] = list(map(len, columns[f]))
                    node += (map(length, size), columns[f])
                    total = map(add, total, size)
                    fixed += 1
            node.append(repeat(text))
            fixed += len(text)
            node += (map(length, sizes[("name", at)]), node_names, repeat(rest))
            pieces += (repeat("\n"), map(length, map(add, total, repeat(fixed))), *node)
        if max(map(max, sizes.values())) >= 0x80:
            return self.emit_all(values, prefixes, tails)
        return list(map(str.encode, map("".join, zip(*pieces)), repeat("latin-1")))


class BoundWriter:
    """A bind lowering: the node with the first bound node's domain and attributes."""

    def __init__(self, bound: onnx.NodeProto) -> None:
        self.domain = bound.domain
        self.attributes = list(bound.attribute)

    def emit(self, node: onnx.NodeProto) -> bytes:
        out = onnx.NodeProto()
        out.CopyFrom(node)
        out.domain = self.domain
        del out.attribute[:]
        out.attribute.extend(self.attributes)
        return wire.entry(out.SerializeToString())


# -- element types ------------------------------------------------------------------------

class WriterTyping:
    """The byte writers' policy for the engine's type table (graph.types.TypePolicy): the
    table answers only what the engine's would, the same way.

    A name in ``avoid`` (declared or made in a subgraph the writer does not read: the pass may
    redeclare it), two sibling graphs defining one name (the engine's table goes per scope),
    a name left unknown while lowering (a later producer types it, or the engine would run
    ONNX shape inference): the object path runs instead. While checking (:meth:`checking`),
    the engine's inference runs over the rewritten model, as the engine's would.

    What the table cannot answer as the engine's would is an ``Unsupported`` (the object
    path runs instead) only where the writer's own code asked. The plan asks from inside
    code that is not the writer's (decompositions, the kernels' binding, the selection
    that takes what they raise for the op's error): it asks within :meth:`serving`, where
    such a query answers None and the block ends in ``Unsupported``.
    """

    def __init__(self, avoid: set[str] | frozenset[str] = frozenset()) -> None:
        self.avoid = avoid
        self.lowering = True
        # While checking: the model the engine's inference would run on (the rewritten one),
        # or one with the same inferred types for every name the check asks about.
        self._inference_model: Callable[[], onnx.ModelProto] | None = None
        self._serving = False
        self._declined: str | None = None  # why a query in serving() went unanswered (the first)

    def checking(self, inference_model: Callable[[], onnx.ModelProto]) -> None:
        """From now on the writer checks its output: inference runs on ``inference_model()``."""
        self.lowering = False
        self._inference_model = inference_model

    def ask(self, query: Callable[..., Any], name: str, *args: Any) -> Any:
        try:
            if self.avoid and name in self.avoid:
                raise Unsupported(f"'{name}' is declared or produced in a subgraph")
            return query(name, *args)
        except Unsupported as exc:
            return self._unanswered(exc)

    def sibling_reuse(self, name: str) -> None:
        raise Unsupported(f"sibling subgraphs both define '{name}'")

    def inference_model(self) -> onnx.ModelProto:
        if self.lowering:
            raise Unsupported("an element type or shape needs ONNX shape inference")
        return self._inference_model()

    def _unanswered(self, exc: Unsupported) -> None:
        """A query the table cannot answer as the engine's would: ``exc`` raised where the
        writer's own code asked; in :meth:`serving`, None, the reason kept for the block's end."""
        if not self._serving:
            raise exc
        if self._declined is None:
            self._declined = str(exc)
        return None

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Around a call that runs code besides the writer's own and may ask the table (the
        plan lowering a node: decompositions, the kernels' binding). An Unsupported raised
        there would pass through that code (which may catch it, or take it for its own
        error: the selection reads it as a bug in the op's decomposition); instead a query
        the table cannot answer answers None, and when the block ends, whatever it
        returned or raised, the writer steps aside here: Unsupported, naming the query."""
        self._serving = True
        try:
            yield
        except Exception:
            if self._declined is not None:  # what it raised followed from an answer that was not the engine's
                raise Unsupported(self._declined) from None
            raise
        finally:
            self._serving = False
        if self._declined is not None:
            raise Unsupported(self._declined)


def writer_types(model: onnx.ModelProto, registry: OpRegistry, avoid: set[str] | frozenset[str] = frozenset(),
                 watch: Watch | None = None) -> tuple[TypeTable, WriterTyping]:
    """The engine's type table for a byte writer (its policy: :class:`WriterTyping`), the main
    graph declared; the caller runs the forward pass (``TypeTable.forward_fields``) or not."""
    typing = WriterTyping(avoid)
    table = TypeTable(model, registry, policy=typing, watch=watch)
    table.declare(model.graph)
    if "" in table.elem_types:
        raise Unsupported("a declared tensor without a name")
    return table, typing


def forward_types(model: onnx.ModelProto, registry: OpRegistry, nodes: Sequence[onnx.NodeProto],
                  domains: list[str], op_types: list[str], ins: list[Any], outs: list[Any], holders: set[int],
                  avoid: set[str] | frozenset[str] = frozenset(), read: Iterable[str] = (),
                  watch: Watch | None = None) -> tuple[TypeTable, WriterTyping]:
    """:func:`writer_types` with the engine's forward pass over the main graph's fields read in
    bulk (up to the last placeholder: the nodes after it only type names no placeholder reads),
    the same declarations, rules and order, so a name typed here has the type the engine gives
    it. It waits where the placeholders ``read`` only declared names (TypeTable.forward_fields);
    the names in ``avoid`` are left to the object path."""
    table, typing = writer_types(model, registry, avoid, watch)
    table.forward_fields(nodes, domains, op_types, ins, outs, holders, None if avoid else read)
    if avoid:
        table.forget(avoid & table.elem_types.keys())
    return table, typing


def lower_first(plan: LoweringPlan, node: onnx.NodeProto, scope: LoweringScope, typing: WriterTyping) -> Lowered:
    """``plan.lower(node, scope)``, where the plan runs the op's code: see WriterTyping.serving."""
    with typing.serving():
        return plan.lower(node, scope)


def node_names(nodes: Sequence[onnx.NodeProto], count: int) -> tuple[list[list[str]], list[list[str]]]:
    """The inputs and the outputs of the first ``count`` nodes, as lists."""
    everything = itemgetter(slice(None))  # a field's values as a list (quicker than tuple())
    return (list(map(everything, map(attrgetter("input"), itertools.islice(nodes, count)))),
            list(map(everything, map(attrgetter("output"), itertools.islice(nodes, count)))))



def name_seed(data: bytes, regions: list[tuple[int, int]], tensor_names: list[str], prefixes: set[str],
               model: onnx.ModelProto) -> set[str] | None:
    """The names the generator starts with: None when no name of the model starts with a
    '<prefix>/', else every name (the engine's ModelIndex).

    ``regions`` of ``data`` hold every name but those of ``tensor_names`` (the top-level
    initializers, whose weights are not searched).
    """
    for name in tensor_names:
        j = name.find("/")
        while j >= 0:
            if name[:j] in prefixes:
                return _all_names(model)
            j = name.find("/", j + 1)
    if not any(data.find(b"/", start, end) >= 0 for start, end in regions):
        return None
    by_len: dict[int, set[bytes]] = collections.defaultdict(set)
    for p in prefixes:
        raw = p.encode()
        by_len[len(raw)].add(raw)
    # Where a '/' follows the last bytes of some prefix (a few searches when prefixes
    # share their endings, as '<scope>/my_add' do), else every '/'.
    tails = {raw[-4:] + b"/" for raws in by_len.values() for raw in raws}
    if len(tails) <= _PROBE_TAILS:
        positions = []
        for tail in tails:
            for start, end in regions:
                at = data.find(tail, start, end)
                while at >= 0:
                    positions.append(at + len(tail) - 1)
                    at = data.find(tail, at + 1, end)
    else:
        slash = re.compile(b"/")
        positions = [m.start() for start, end in regions for m in slash.finditer(data, start, end)]
    if len(positions) * len(by_len) > _PROBE_BUDGET or any(
            not raws.isdisjoint({data[p - length:p] for p in positions if p >= length})
            for length, raws in by_len.items()):
        return _all_names(model)
    return None


def seed_names(data: bytes, model: onnx.ModelProto, top: list, others: list, starts: Sequence[int],
               ends: Sequence[int], graph: tuple[int, int], prefixes: set[str]) -> set[str] | None:
    """:func:`name_seed` for the model ``data`` (its top-level entries ``top``; its main graph
    at ``graph``, holding the node entries from ``starts`` to ``ends`` and the other entries
    ``others``): the names are searched where they can be, the top level but the graph and the
    graph but its initializers' weights."""
    g0, g1 = graph
    regions = [(start, end) for field, start, _, end in top if field != wire.MODEL_GRAPH]
    regions += [(start, end) for field, start, end in others if field not in (5, 15)]
    if starts:
        contiguous = not any(starts[0] <= start < ends[-1] for _, start, _ in others)
        regions.append((starts[0], ends[-1]) if contiguous else (g0, g1))
    initializers = model.graph.initializer
    tensor_names = list(map(attrgetter("name"), initializers)) if any(f == 5 for f, _, _ in others) else []
    if any(f == 15 for f, _, _ in others):
        regions.append((g0, g1))  # sparse initializers: search everything
    return name_seed(data, regions, tensor_names, prefixes, model)


def _all_names(model: onnx.ModelProto) -> set[str]:
    from graphkit.rewrite.graph.walk import ModelIndex

    return ModelIndex(model).names


def _fixed_imports(model: onnx.ModelProto, opset: int, used: set[str], placeholders: frozenset[str],
                   target: int | None = None) -> tuple[bytes, list[tuple[str, int]]]:
    """The model's opset_import entries (field 8) after engine.fix_opset_imports, and the
    imports that pass starts from. With a ``target`` opset, the convert-opset pass's
    imports first: ai.onnx at ``target`` first, the other domains as they were."""
    tiny = onnx.ModelProto()
    if target is None:
        tiny.opset_import.extend(model.opset_import)
    else:
        tiny.opset_import.extend([onnx.helper.make_opsetid("", target),
                                  *(i for i in model.opset_import if i.domain not in AI_ONNX)])
    start = [(i.domain, i.version) for i in tiny.opset_import]
    _engine.fix_opset_imports(tiny, opset, used, placeholders)
    return tiny.SerializeToString(), start




def check_parts(data: bytes, model: onnx.ModelProto, header: bytes,
                 replaced: list[tuple[bytes, Sequence[str], Sequence[str]]], used_domains: set[str],
                 registry: OpRegistry, same_schemas: frozenset[str] = frozenset(),
                 refused: bool | None = None) -> str | None:
    """The ONNX checker's verdict on the output, found from parts (see the module docstring):
    the input model (``data``) and a model of the chosen replacements under the output's
    top-level fields (``header``: its opset imports). None: the output passes. Else why the
    parts cannot tell (a condition of the argument does not hold, or a part fails): then
    the caller checks the whole output.

    ``replaced``: (the serialized replacement nodes, the placeholder's inputs and outputs) in
    the output's order. ``same_schemas``: domains whose version moved where every op the
    model uses has the same schema at both versions (an imports-only conversion), or a
    newer one that takes its older nodes as they are (types, attributes or optional inputs
    added), the nodes of the others converted and among ``replaced`` (a node of each kind):
    a kept node means the same there. ``refused``: the checker's verdict on the input, if it
    ran already (:func:`input_refused`); None: it runs here.
    """
    before = {i.domain: i.version for i in model.opset_import if i.domain not in same_schemas}
    after = {i.domain: i.version for i in onnx.ModelProto.FromString(header).opset_import}
    if any(before[d] != after[d] for d in before.keys() & after.keys()) or not used_domains <= after.keys():
        return "an opset import changed"  # a kept node could mean something else
    graph = onnx.GraphProto(name="replacements")
    made: set[str] = set()
    declared: dict[str, None] = {}
    for entries, inputs, outputs in replaced:
        nodes = onnx.GraphProto.FromString(entries).node
        own = set(inputs)
        for node in nodes:
            if holds_graphs(node):
                return "a replacement with a subgraph"  # it sees the names around it
            for name in node.input:
                if name and name not in made:
                    if name not in own:
                        return f"a replacement reads '{name}', made neither before it nor its placeholder's input"
                    declared[name] = None
            made.update(node.output)
        if not made.issuperset(o for o in outputs if o):
            return "a replacement does not make its placeholder's outputs"
        graph.node.extend(nodes)
    made.discard("")
    for name in declared:
        vi = graph.input.add(name=name)
        vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        vi.type.tensor_type.shape.SetInParent()
    mini = onnx.ModelProto.FromString(header)
    mini.graph.CopyFrom(graph)
    if refused is None:
        refused = input_refused(data, registry)
    if refused:
        return "the checker refuses the input"
    if input_refused(mini.SerializeToString(), registry):
        return "the checker refuses the replacements"
    return None


def input_refused(data: bytes, registry: OpRegistry) -> bool:
    """Whether the ONNX checker refuses the serialized model ``data`` (the registry's schemas known)."""
    with registry.onnx_schemas():
        try:
            onnx.checker.check_model(data)
        except onnx.checker.ValidationError:
            return True
        finally:
            release_freed_memory()  # the checker's parse of the model
    return False



def count_after(report: RewriteReport, plan: LoweringPlan) -> None:
    """The report's actions and op counts after the lowering ``plan`` ran."""
    report.actions = plan.actions
    report.passed_over = plan.selection.passed_over
    after = report.ops_before.copy()
    after.subtract(plan.lowered)
    after.update(plan.emitted)
    report.ops_after = +after


def assemble(data: bytes | memoryview, model: onnx.ModelProto, top: list, graph: list, report: RewriteReport, *,
             opset: int, placeholders: set, target_opset: int | None, current: int | None, lowered: int,
             why: str, converted: list[str] | None = None) -> tuple[Pieces, bytes, bytes]:
    """The byte writers' output: the model's top-level fields (``top``) as they were, the graph
    field made of the pieces ``graph``, the opset imports fixed; the report's passes and writer
    said as the objects writer's passes say them. ``converted``: the ops graphkit's adapters
    converted (None: the conversion moved only the imports). Returns the output, its header
    (all but the graph) and the opset import entries."""
    converting = target_opset is not None and target_opset != current
    import_entries, start_imports = _fixed_imports(model, opset, {d for d, _ in report.ops_after}, placeholders,
                                                   target_opset)
    imports = import_entries
    if converting:  # as the objects writer's convert-opset pass reports it
        report.conversions.append((current, target_opset, "imports only" if converted is None else "adapters"))
        report.passes.append(("convert-opset", f"ai.onnx opset {current} -> {target_opset}"))
    report.passes.append(("lower", f"{lowered} placeholders lowered"))
    fixed = [(i.domain, i.version) for i in onnx.ModelProto.FromString(import_entries).opset_import]
    if fixed != start_imports:
        report.passes.append(("fix-imports", f"opset imports {fixed}"))
    report.writer, report.writer_reason = "bytes", why
    if converting and converted is None:
        report.writer_reason += f"; {IMPORTS_ONLY.format(current, target_opset)}"
    elif converting:
        report.writer_reason += "; " + (ADAPTERS.format(current, target_opset, ", ".join(converted)) if converted
                                        else NO_NODE_CHANGES.format(current, target_opset))
    parts = []
    graph_at = 0
    for field, start, _, end in top:
        if field == wire.MODEL_OPSET_IMPORT:
            if imports:
                parts.append(imports)
                imports = b""
        elif field == wire.MODEL_GRAPH:
            graph_at = len(parts)
            parts += [b"\x3a", wire.LENGTHS[sum(map(len, graph))], *graph]  # field 7, length-delimited
        else:
            parts.append(data[start:end])
    parts.append(imports)
    header = b"".join([*parts[:graph_at], *parts[graph_at + 2 + len(graph):]])  # all but the graph
    return Pieces(parts), header, import_entries  # written to a file as they are; joined only where asked
