"""Lowering at the protobuf wire level: replacements spliced into the serialized model.

The object path (``rewrite_model``) copies the model, indexes every name, runs a dtype
pass over every node and rebuilds the node list: Python work on every node. Here the
serialized bytes are kept: the ModelProto's top-level fields and the GraphProto's node
entries are located by decoding tags and lengths, every node that is not a custom::
placeholder stays the byte range it was, and each placeholder's entry is replaced by
the serialized replacement nodes. The parsed model (protobuf's C parser) is read in
bulk, one field of every node at a time, for what needs field values: op counts, the
element types of the placeholders' inputs, the placeholders themselves.

The result is the object path's, field for field (tests/test_fastpath.py compares both):

* The lowering chosen, decompositions, templates, constants and first-instance names
  come from the public plan both writers use: ``LoweringPlan.lower`` (graphkit.rewrite.plan)
  lowers the first node of each kind. A later node of the same kind (op, attributes,
  arity, input/output aliasing, input types: finer than the plan's template key) repeats
  the ``Template`` it returned as ``Template.instantiate`` would (same renaming, same
  names), compiled to code that writes the serialized nodes; a bound node reuses the
  first one's attributes; ``LoweringPlan.count`` counts the repeats.
* Generated names: the engine makes them unique against every name of the model, and
  all of them start with ``<prefix>/`` (``prefix``: a placeholder's name, else its op).
  When no ``<prefix>/`` occurs where the input keeps names, no input name can be taken,
  so the generator starts empty; otherwise it gets the model's full name index, as the
  engine's. When, besides, every prefix belongs to one kind, names made for different
  prefixes cannot meet, so template instances are written kind by kind, their names made
  by the generator's own rule (see ``_grouped``).
* Element types: ``TypeTable``'s forward pass (same declarations, rules and order), run
  over pre-read fields and stopped at the last placeholder.
* Check: ``check_replacement`` per replacement built, then the ONNX checker's verdict on
  the output (``check_model`` on the parsed output where the engine's needs more: small
  models, subgraphs, shapeless graph inputs or outputs, external data). Otherwise that
  verdict is found from parts (``_check_parts``), for about the cost of checking the
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
  kept as the pieces it is made of (``Pieces``) and written to the file from them.

Its preconditions, each an ``Unsupported`` naming it (the report's ``writer_reason``
when the object path runs instead): custom nodes only in the main graph, no model-local
functions or training info, every placeholder input typed by the forward pass (else the
engine would run ONNX shape inference), every type or shape a decomposition or a kernel's
binding asks for known without ONNX shape inference (asked inside the plan, that one is
found when the plan returns: the writer steps aside there, never through the op's code;
``_ForwardTypes.serving``), and with a target opset other than the model's, a
conversion that moves only the imports (no standard op of the model has a new version
between the two opsets) or converts by steps on the nodes' own fields, nodes converted in
the main graph only (graphkit.rewrite._convertbytes: converted nodes are spliced like
replacements, the constants they read put after the graph's initializers, going down those
no longer read removed; the check by parts then checks a converted node of each kind too,
and a kept node's op has the same schema at both opsets or, going up, a newer version that
takes it as it is: the step kinds "types", "attributes" and "optional-input"), and something
to lower. An error while lowering is the plan's, raised as
it is: both writers report it in the same words.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import heapq
import itertools
import operator
import re
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter, itemgetter
from typing import Any

import onnx

from graphkit.errors import ValidationError
from graphkit.ops import PLACEHOLDER_DOMAIN, OpRegistry
from graphkit.rewrite import _convertbytes, _wire
from graphkit.rewrite import engine as _engine
from graphkit.rewrite._gcpause import gc_paused
from graphkit.rewrite._memory import release_freed_memory
from graphkit.rewrite.builder import _FIXED, _SAME_AS_INPUT0, NameGenerator, TypeTable
from graphkit.rewrite.engine import RewriteReport
from graphkit.rewrite._walk import AI_ONNX
from graphkit.rewrite._wire import Unsupported
from graphkit.rewrite.plan import Lowering, LoweringPlan, LoweringScope, Template

__all__ = ["Pieces", "Unsupported", "has_external_data", "lower_bytes", "lower_pieces"]

# ModelProto fields
_M_OPSET_IMPORT = 8
_M_GRAPH = 7
_M_TRAINING_INFO = 20
_M_FUNCTIONS = 25
_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS
_TENSOR = onnx.AttributeProto.TENSOR
# Byte probes for AttributeProto.type (field 20, varint) = GRAPH (5) / GRAPHS (10) and
# TensorProto.data_location (field 14, varint) = EXTERNAL (1). Every encoding of one holds
# a probe: the key's minimal bytes then the value's first (5, 10, 1, or with a continuation
# bit where a writer pads the value), or a padded key, whose first bytes are the
# ``_PADDED`` probe. Where only a ``_PADDED`` probe occurs (0xF0 is common in weights),
# the input is still trusted if it is canonical (as protobuf writes it: nothing padded).
_PROBE_GRAPH = (b"\xa0\x01\x05", b"\xa0\x01\x0a", b"\xa0\x01\x85", b"\xa0\x01\x8a")
_PADDED_GRAPH = b"\xa0\x81"
_PROBE_EXTERNAL = (b"\x70\x01", b"\x70\x81")
_PADDED_EXTERNAL = b"\xf0"
# Above this many (slash, prefix length) pairs, seed the name generator instead of probing.
_PROBE_BUDGET = 2_000_000
_PROBE_TAILS = 64  # at most this many distinct prefix endings are searched for one by one
_EMIT_BLOCK = 1 << 15  # repeats of a kind written at a time


# Why the byte writer runs where it can (the report's writer_reason).
WHY = ("lowering only, custom nodes in the main graph only, no model-local functions: "
       "the replacements are spliced into the serialized model")
# Added to it where --target-opset moved only the imports.
IMPORTS_ONLY = ("--target-opset: imports only (no standard op of the model has a new version between "
                "opsets {} and {}), the replacements made at the target opset")
# Added to it where graphkit's adapters converted nodes of the main graph (graphkit.rewrite._convertbytes).
ADAPTERS = ("--target-opset: graphkit's adapters converted the nodes opsets {} to {} change ({}), spliced "
            "like the replacements")
# Added to it where the ops' newer versions take the model's nodes as they are (types, attributes added).
NO_NODE_CHANGES = ("--target-opset: graphkit's adapters changed no node from opset {} to {} (the ops' newer "
                   "versions take the nodes as they are)")
# Added to it where the output's check was found from parts (see the module docstring).
CHECKED_BY_PARTS = ("checked by parts: the input model, and each kind of replacement under the output's "
                    "opset imports (generated names are unique by construction)")


class InBodies(Unsupported):
    """Placeholders inside subgraphs: graphkit.rewrite._bodybytes's business."""


def _conversion(model: onnx.ModelProto, ops: collections.Counter, sub_counts: collections.Counter,
                current: int | None, target: int, bodies: bool = False) -> _convertbytes.Steps | None:
    """Precondition of a --target-opset rewrite: None where the conversion moves only the
    imports, else the steps of the nodes graphkit's adapters convert in the main graph
    (graphkit.rewrite._convertbytes: where they only change the nodes' own fields)."""
    try:
        _imports_only(ops, current, target)
        return None
    except Unsupported:
        if current is None:
            raise
    try:
        return _convertbytes.plan(model, set(ops), set(sub_counts), current, target, bodies)
    except _convertbytes.InSubgraphs as exc:  # the bodies' writer converts them
        raise InBodies(str(exc)) from exc
    except _convertbytes.NotSpliced as exc:
        raise Unsupported(f"--target-opset {target} needs the objects writer's conversion: {exc}") from exc


def _imports_only(ops: collections.Counter, current: int | None, target: int) -> None:
    """Precondition of a --target-opset rewrite: converting from ``current`` to ``target``
    moves only the ai.onnx import (engine._convert_opset's "imports only")."""
    if current is None:
        raise Unsupported("--target-opset on a model without an ai.onnx opset import")
    standard = {op for d, op in ops if d in AI_ONNX}
    if standard and not _engine._same_schemas(standard, current, target):
        raise Unsupported(f"--target-opset {target} needs the version converter (a standard op of the model "
                          f"has a new version between opsets {current} and {target})")


class _Canonical:
    """Whether ``data`` is ``model`` serialized canonically (as protobuf writes it).

    Asked only where a byte probe finds what could be a padded key (a writer may encode a
    varint longer than it needs). One ByteSize per model, remembered.
    """

    last: tuple[Any, int, bool] | None = None
    external: tuple[Any, int, bool] | None = None  # has_external_data's last answer (three scans of the bytes)

    @classmethod
    def check(cls, data: bytes, model: onnx.ModelProto) -> bool:
        if cls.last is not None and cls.last[0] is model and cls.last[1] == len(data):
            return cls.last[2]
        result = len(data) == model.ByteSize()
        cls.last = (model, len(data), result)
        return result

    @classmethod
    def forget(cls) -> None:
        cls.last = cls.external = None


def has_external_data(data: bytes, model: onnx.ModelProto) -> bool:
    """Whether any tensor of ``model`` (parsed from ``data``) is stored externally (asked
    again of the same model, the answer remembered until ``_Canonical.forget()``)."""
    last = _Canonical.external
    if last is not None and last[0] is model and last[1] == len(data):
        return last[2]
    if not any(p in data for p in _PROBE_EXTERNAL) and (_PADDED_EXTERNAL not in data
                                                        or _Canonical.check(data, model)):
        result = False
    else:
        from graphkit.external_data import external_tensors

        result = bool(external_tensors(model))
    _Canonical.external = (model, len(data), result)
    return result


# -- lowerings repeated -------------------------------------------------------------------

class _Template:
    """A plan ``Template`` that writes serialized nodes.

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

    def __init__(self, template: Template) -> None:
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
                    static += _wire.field(tag, name)
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
        L = _wire.LENGTHS
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
        length = _wire.STR_LENGTHS.__getitem__
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


class _Bound:
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
        return _wire.entry(out.SerializeToString())


# -- element types ------------------------------------------------------------------------

class _OpRule:
    """TypeTable's rule for a registry op: outputs take the type bound to their type variable."""

    def __init__(self, opdef: Any) -> None:
        self.in_vars = [p.type for p in opdef.inputs]
        self.out_vars = [p.type for p in opdef.outputs]
        # One type variable for every input and the single output: the output takes the
        # type of the first typed input.
        self.first_input = len(self.out_vars) == 1 and set(self.in_vars) == set(self.out_vars)

    def outputs(self, in_types: tuple) -> list:
        bound: dict[str, int] = {}
        for var, t in zip(self.in_vars, in_types):
            if t is not None:
                bound.setdefault(var, t)
        return [bound.get(var) for var in self.out_vars]


_SAME, _FIRST_INPUT, _NONE, _OP, _GENERAL, _HOLDER = range(6)  # the first two: typed as input 0


class _ForwardTypes(TypeTable):
    """TypeTable whose forward pass runs on pre-read node fields and stops at the last placeholder.

    Same declarations, rules and order as ``TypeTable._forward_graph`` (subgraphs go
    through it), so a name typed here has the type the engine gives it; the nodes after
    the last placeholder only type names no placeholder reads typed. Names declared or
    made in subgraphs are left to the object path (the pass may redeclare them). A name
    left unknown is, while lowering, left to the object path too (a later producer types
    it, or the engine would run ONNX shape inference); while checking, the engine's
    inference runs over the rewritten model as the engine's would.

    What this table cannot answer as the engine's would is an ``Unsupported`` (the object
    path runs instead) only where the writer's own code asked. The plan asks from inside
    code that is not the writer's (decompositions, the kernels' binding, the selection
    that takes what they raise for the op's error): it asks within :meth:`serving`, where
    such a query answers None and the block ends in ``Unsupported``.
    """

    _serving = False
    _declined: str | None = None  # why a query in serving() went unanswered (the first)

    def __init__(self, model: onnx.ModelProto, registry: OpRegistry, nodes: Sequence[onnx.NodeProto],
                 domains: list[str], op_types: list[str], ins: list[Any], outs: list[Any],
                 holders: set[int], avoid: set[str], read: Iterable[str] = ()) -> None:
        super().__init__(model, registry)
        self._avoid = avoid
        self.lowering = True
        # While checking: the model the engine's inference would run on (the rewritten one),
        # or one with the same inferred types for every name the check asks about.
        self.inference_model: Callable[[], onnx.ModelProto] | None = None
        self._declare(model.graph)
        if "" in self._elem:
            raise Unsupported("a declared tensor without a name")
        self._state = "forward"
        # The pass only adds types (setdefault), so a declared name's type is final: where
        # every name the placeholders read is declared (fan-out from a graph input), the
        # pass waits until a name that is not is asked for, and then reads the nodes'
        # inputs and outputs again (holding every node's lists until then costs more
        # memory than the lowering itself).
        if holders or avoid or not self._elem.keys() >= set(read) - {""}:
            self._pending: tuple | None = (nodes, domains, op_types, ins, outs, holders)
            self._run_pending()
        else:
            self._pending = (nodes, domains, op_types, None, None, holders)
        for name in avoid & self._elem.keys():
            del self._elem[name]

    def _sibling_reuse(self, name: str) -> None:
        raise Unsupported(f"sibling subgraphs both define '{name}'")

    def _run_pending(self) -> None:
        if self._pending is not None:
            (nodes, domains, op_types, ins, outs, holders), self._pending = self._pending, None
            if ins is None:
                ins, outs = _node_names(nodes, len(domains))
            self._run(nodes, domains, op_types, ins, outs, holders)

    def elem_type(self, name: str) -> int | None:
        try:
            if self._avoid and name in self._avoid:
                raise Unsupported(f"'{name}' is declared or produced in a subgraph")
            elem = self._elem.get(name)
            if elem is None and self._pending is not None:
                self._run_pending()
                elem = self._elem.get(name)
            return elem if elem is not None else super().elem_type(name)
        except Unsupported as exc:
            return self._unanswered(exc)

    def shape(self, name: str, *, infer: bool = True) -> list[Any] | None:
        try:
            if self._avoid and name in self._avoid:
                raise Unsupported(f"'{name}' is declared or produced in a subgraph")
            return super().shape(name, infer=infer)
        except Unsupported as exc:
            return self._unanswered(exc)

    def _unanswered(self, exc: Unsupported) -> None:
        """A query this table cannot answer as the engine's would: ``exc`` raised where the
        writer's own code asked; in :meth:`serving`, None, the reason kept for the block's end."""
        if not self._serving:
            raise exc
        if self._declined is None:
            self._declined = str(exc)
        return None

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Around a call that runs code besides the writer's own and may ask this table (the
        plan lowering a node: decompositions, the kernels' binding). An Unsupported raised
        there would pass through that code (which may catch it, or take it for its own
        error: the selection reads it as a bug in the op's decomposition); instead a query
        this table cannot answer answers None, and when the block ends, whatever it
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

    def _infer(self) -> None:
        self._run_pending()
        if self.lowering:
            raise Unsupported("an element type or shape needs ONNX shape inference")
        self._model = self.inference_model()
        super()._infer()

    def _code(self, domain: str, op: str) -> tuple[int, Any]:
        std = domain in AI_ONNX
        if std and op in _SAME_AS_INPUT0:
            return _SAME, None
        if std and (op in _FIXED or op in ("Cast", "Constant", "ConstantOfShape", "CastLike", "Where")):
            return _GENERAL, None
        if self._registry is not None:
            opdef = self._registry.lookup(domain, op)
            if opdef:
                rule = _OpRule(opdef)
                return (_FIRST_INPUT if rule.first_input else _OP), rule
        return _NONE, None

    def _run(self, nodes: Sequence[onnx.NodeProto], domains: list[str], op_types: list[str], ins: list[Any],
             outs: list[Any], holders: set[int]) -> None:
        """TypeTable._forward_graph's node loop; the common cases on each node's first input and output."""
        elem = self._elem
        get, setdefault = elem.get, elem.setdefault
        table = {pair: self._code(*pair) for pair in set(zip(domains, op_types))}
        codes = list(map(dict(zip(table, map(itemgetter(0), table.values()))).__getitem__, zip(domains, op_types)))
        in_lens = list(map(len, ins))
        out_lens = list(map(len, outs))
        first_in = list(map(itemgetter(0), ins)) if 0 not in in_lens else [i[0] if i else None for i in ins]
        first_out = list(map(itemgetter(0), outs)) if 0 not in out_lens else [o[0] if o else None for o in outs]
        if out_lens.count(1) != len(out_lens):
            for p, n in enumerate(out_lens):
                if n != 1 and codes[p] <= _FIRST_INPUT:
                    codes[p] = _GENERAL if codes[p] == _SAME else _OP
        for p in holders:
            if p < len(codes):
                codes[p] = _HOLDER
        for p, code, x, o in zip(itertools.count(), codes, first_in, first_out):
            if code <= _FIRST_INPUT:  # one output, typed as input 0 (an op's: when that is typed)
                t = get(x)
                if t is not None:
                    setdefault(o, t)
                    continue
                if code == _SAME:
                    continue
            elif code == _NONE:
                continue
            if code <= _OP:  # a registry op's outputs: the types bound to their variables
                rule = table[(domains[p], op_types[p])][1]
                for out, t in zip(outs[p], rule.outputs(tuple(map(get, ins[p])))):
                    if t is not None:
                        setdefault(out, t)
            else:  # _GENERAL, _HOLDER: TypeTable's rules on the node, then its subgraphs
                self._forward_node(nodes[p], domains[p], op_types[p])
                if code == _HOLDER:
                    self._forward_subgraphs(nodes[p], domains[p])

# -- the model around the nodes -----------------------------------------------------------

def _node_names(nodes: Sequence[onnx.NodeProto], count: int) -> tuple[list[list[str]], list[list[str]]]:
    """The inputs and the outputs of the first ``count`` nodes, as lists."""
    everything = itemgetter(slice(None))  # a field's values as a list (quicker than tuple())
    return (list(map(everything, map(attrgetter("input"), itertools.islice(nodes, count)))),
            list(map(everything, map(attrgetter("output"), itertools.islice(nodes, count)))))


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
    from graphkit.rewrite._walk import graphs

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


def _name_seed(data: bytes, regions: list[tuple[int, int]], tensor_names: list[str], prefixes: set[str],
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


def _all_names(model: onnx.ModelProto) -> set[str]:
    from graphkit.rewrite._walk import ModelIndex

    return ModelIndex(model).names


def _fixed_imports(model: onnx.ModelProto, opset: int, used: set[str], placeholders: frozenset[str],
                   target: int | None = None) -> tuple[bytes, list[tuple[str, int]]]:
    """The model's opset_import entries (field 8) after engine._fix_opset_imports, and the
    imports that pass starts from. With a ``target`` opset, the convert-opset pass's
    imports first: ai.onnx at ``target`` first, the other domains as they were."""
    tiny = onnx.ModelProto()
    if target is None:
        tiny.opset_import.extend(model.opset_import)
    else:
        tiny.opset_import.extend([onnx.helper.make_opsetid("", target),
                                  *(i for i in model.opset_import if i.domain not in AI_ONNX)])
    start = [(i.domain, i.version) for i in tiny.opset_import]
    _engine._fix_opset_imports(tiny, opset, used, placeholders)
    return tiny.SerializeToString(), start


def _representatives(planned: list[int], kinds: dict[Any, Any], values_of: list[list[str]]) -> list[int]:
    """The placeholders whose replacements ``_check_parts`` looks at, in order: every one the
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


def _check_parts(data: bytes, model: onnx.ModelProto, header: bytes,
                 replaced: list[tuple[bytes, Sequence[str], Sequence[str]]], used_domains: set[str],
                 registry: OpRegistry, same_schemas: frozenset[str] = frozenset(),
                 input_refused: bool | None = None) -> str | None:
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
    a kept node means the same there. ``input_refused``: the checker's verdict on the input, if
    it ran already (``_input_refused``); None: it runs here.
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
            if any(a.type in (_GRAPH, _GRAPHS) for a in node.attribute):
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
    if input_refused is None:
        input_refused = _input_refused(data, registry)
    if input_refused:
        return "the checker refuses the input"
    if _input_refused(mini.SerializeToString(), registry):
        return "the checker refuses the replacements"
    return None


def _input_refused(data: bytes, registry: OpRegistry) -> bool:
    """Whether the ONNX checker refuses the serialized model ``data`` (the registry's schemas known)."""
    with registry.onnx_schemas():
        try:
            onnx.checker.check_model(data)
        except onnx.checker.ValidationError:
            return True
        finally:
            release_freed_memory()  # the checker's parse of the model
    return False


def _whole_check(data: bytes, model: onnx.ModelProto, holders: set[int], full: bool) -> bool:
    """Whether the output is checked whole, not by parts (see the module docstring): ``full``
    (a small output, or asked for), subgraphs, a shapeless graph input or output, external data."""
    shapeless = any(vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")
                    for vi in (*model.graph.input, *model.graph.output))
    return full or bool(holders) or shapeless or has_external_data(data, model)


def _check_bytes(out: bytes, registry: OpRegistry, path: str | None, context: str,
                 hint: str = "fix the input model, or skip the check with --no-check") -> None:
    """engine.check_model without full inference, on the serialized model."""
    with registry.onnx_schemas():
        try:
            onnx.checker.check_model(out)
        except onnx.checker.ValidationError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValidationError(f"invalid model{context}: {first}", path=path, hint=hint) from exc


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
    seen: collections.Counter = collections.Counter()
    out = []
    for p in prefixes:
        c = seen[p]
        seen[p] = c + 1
        out.append(f"_{c}" if c else "")
    return out


def _repeater(lowered: Any, n_given: int, batched: bool) -> Any:
    """What repeats a lowering the plan made for the first node of a kind (``n_given``
    inputs): a _Template, a _Bound, or None where the plan lowers each node of the kind."""
    if lowered.how is Lowering.DECOMPOSE:
        if lowered.template is None:
            return None  # shape-dependent: the plan lowers every such node
        made: Any = _Template(lowered.template)
        made.pad = _padding(n_given, made.n_inputs)
        if batched and not made.scoped:
            raise Unsupported("a decomposition makes names with '/' of its own")
        return made
    return _Bound(lowered.nodes[0]) if len(lowered.nodes) == 1 else None


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


# -- the rewrite --------------------------------------------------------------------------

class Pieces:
    """A serialized model as the pieces it is made of (bytes, memoryviews of the input), in
    order: the byte writer's output, written to a file piece by piece (``write``) rather
    than joined into one buffer beside the pieces; ``join`` makes that buffer where bytes
    are asked for."""

    def __init__(self, parts: list[Any]) -> None:
        self._parts = parts
        self.size = sum(map(len, parts))

    def __len__(self) -> int:
        return self.size

    def join(self) -> bytes:
        return b"".join(self._parts)

    def write(self, fh: Any, block: int = 1 << 12) -> None:
        """Write the model to the binary file ``fh``, ``block`` pieces joined at a time
        (a write per piece costs more than joining them)."""
        parts = self._parts
        for at in range(0, len(parts), block):
            fh.write(b"".join(parts[at:at + block]))


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
        if field == _M_OPSET_IMPORT:
            if imports:
                parts.append(imports)
                imports = b""
        elif field == _M_GRAPH:
            graph_at = len(parts)
            parts += [b"\x3a", _wire.LENGTHS[sum(map(len, graph))], *graph]  # field 7, length-delimited
        else:
            parts.append(data[start:end])
    parts.append(imports)
    header = b"".join([*parts[:graph_at], *parts[graph_at + 2 + len(graph):]])  # all but the graph
    return Pieces(parts), header, import_entries  # written to a file as they are; joined only where asked


def lower_bytes(data: bytes, model: onnx.ModelProto, *, registry: OpRegistry,
                prefer: tuple[Lowering, ...], check: bool = True, full_check: bool = False,
                path: str | None = None, progress: Callable[[str, int, int], None] | None = None,
                target_opset: int | None = None) -> tuple[bytes, RewriteReport]:
    """Lower the custom:: nodes of the serialized ``data`` (``model`` is it, parsed).

    Returns the rewritten model's bytes and the report ``rewrite_model`` gives for the
    same input and options; raises Unsupported where the object path must do it.
    ``target_opset`` (already validated) is handled where the conversion moves only the
    imports (no standard op of the model has a new version between the two opsets): the
    nodes are lowered at ``target_opset`` and the new ai.onnx import written.
    """
    out, report = lower_pieces(data, model, registry=registry, prefer=prefer, check=check, full_check=full_check,
                               path=path, progress=progress, target_opset=target_opset)
    return out.join(), report


def lower_pieces(data: bytes, model: onnx.ModelProto, *, registry: OpRegistry,
                 prefer: tuple[Lowering, ...], check: bool = True, full_check: bool = False,
                 path: str | None = None, progress: Callable[[str, int, int], None] | None = None,
                 target_opset: int | None = None) -> tuple[Pieces, RewriteReport]:
    """lower_bytes, the output as its :class:`Pieces`."""
    forget = True
    try:
        with gc_paused():
            out, report, run_check = _lower(data, model, registry, prefer, check, full_check, path, progress,
                                            target_opset)
            if run_check is not None:
                run_check()
            # the rewrite's lists (held by the check) freed while the collector is paused: once it
            # runs again, its first pass walks every object made in the pause that is still alive
            del run_check
        return out, report
    except InBodies:
        forget = False  # the bodies writer goes on with this model: what is remembered of it holds
        raise
    finally:
        if forget:
            _Canonical.forget()


def _lower(data: bytes, model: onnx.ModelProto, registry: OpRegistry, prefer: tuple[Lowering, ...], check: bool,
           full_check: bool, path: str | None, progress: Callable[[str, int, int], None] | None,
           target_opset: int | None = None) -> tuple[Pieces, RewriteReport, Callable[[], None] | None]:
    """The rewritten bytes, the report, and the check to run on them (None: no check)."""
    top = _wire.entries(data, 0, len(data))
    fields = [e[0] for e in top]
    if fields.count(_M_GRAPH) != 1:
        raise Unsupported("graph field not present exactly once")
    if _M_FUNCTIONS in fields or _M_TRAINING_INFO in fields:
        raise Unsupported("model-local functions or training info")
    _, _, g0, g1 = top[fields.index(_M_GRAPH)]
    starts, ends, others = _wire.node_entries(data, g0, g1)
    # Node fields are read a field of every node at a time, straight from the parsed graph:
    # a list of the nodes would keep a Python object per node, and per field read (several
    # hundred bytes a node, which the process pays for again in page faults).
    nodes = model.graph.node
    if len(starts) != len(nodes):
        raise Unsupported("node entries do not match the parsed graph")
    canonical = functools.partial(_Canonical.check, data, model)

    # Interned: every node's domain and op_type read from the parsed graph is a new str
    # (tens of bytes each, a million nodes); the lists keep a few shared ones.
    domains = list(map(sys.intern, map(attrgetter("domain"), nodes)))
    op_types = list(map(sys.intern, map(attrgetter("op_type"), nodes)))
    sub_counts, sub_names, holders = _subgraph_info(nodes, data, g0, g1, canonical)
    report = RewriteReport(ops_before=collections.Counter(zip(domains, op_types)) + sub_counts)
    placeholders = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
    if len(placeholders) > 1 and (placeholders - {PLACEHOLDER_DOMAIN}) & (
            set(domains) | {d for d, _ in sub_counts}):
        raise Unsupported("placeholders in op domains other than 'custom'")
    standard = registry.standard_op_types()
    if standard and prefer != (Lowering.KEEP,) and not standard.isdisjoint(report.ops_before):
        raise Unsupported("standard ops lowered as graphkit ops (" + ", ".join(
            sorted({o for d, o in standard & set(report.ops_before)})) + ")")
    current = _engine.ai_onnx_opset(model)
    converting = target_opset is not None and target_opset != current
    changed = _conversion(model, report.ops_before, sub_counts, current, target_opset) if converting else None
    custom = array("q", itertools.compress(range(len(domains)), map(operator.eq, domains,
                                                                     itertools.repeat(PLACEHOLDER_DOMAIN))))
    if not custom or prefer == (Lowering.KEEP,):
        if converting:
            raise Unsupported("--target-opset with nothing to lower (the objects writer moves the imports)")
        report.ops_after = report.ops_before.copy()
        return Pieces([data]), report, None
    # The checker on the input (a part of the check by parts) runs now, before the
    # lowering's lists exist: its own parse of the model is the biggest thing it makes,
    # and the output is not made yet either.
    input_refused = None
    if check and not _whole_check(data, model, holders, full_check or sum(
            report.ops_before.values()) <= _engine.FULL_CHECK_NODES):
        input_refused = _input_refused(data, registry)

    # Fields of every node up to the last placeholder, read once for all that follows.
    listed = custom[-1] + 1
    ins, outs = _node_names(nodes, listed)
    node_at = nodes.__getitem__
    inputs_of = list(map(ins.__getitem__, custom))
    outputs_of = list(map(outs.__getitem__, custom))
    names = list(map(attrgetter("name"), map(node_at, custom)))
    custom_ops = list(map(op_types.__getitem__, custom))
    prefixes = [name or op for name, op in zip(names, custom_ops)]
    types = _ForwardTypes(model, registry, nodes, domains[:listed], op_types[:listed], ins, outs,
                          holders, sub_names, itertools.chain.from_iterable(inputs_of))
    del ins, outs
    if sub_names and any(not sub_names.isdisjoint(i) for i in inputs_of):
        raise Unsupported("a custom node reads a name a subgraph declares")

    opset = target_opset if target_opset is not None else current or _engine.DEFAULT_OPSET
    # Where names can be: the top level but the graph, the graph but its initializers.
    regions = [(start, end) for field, start, _, end in top if field != _M_GRAPH]
    regions += [(start, end) for field, start, end in others if field not in (5, 15)]
    if starts:
        contiguous = not any(starts[0] <= start < ends[-1] for _, start, _ in others)
        regions.append((starts[0], ends[-1]) if contiguous else (g0, g1))
    initializers = model.graph.initializer
    tensor_names = list(map(attrgetter("name"), initializers)) if any(f == 5 for f, _, _ in others) else []
    if any(f == 15 for f, _, _ in others):
        regions.append((g0, g1))  # sparse initializers: search everything
    seed = _name_seed(data, regions, tensor_names, set(prefixes), model)
    spliced = None
    if changed is not None:
        try:
            spliced = _convertbytes.splice(data, model, domains, op_types, starts, ends, changed, target_opset, path,
                                           up=target_opset > current, holders=sorted(holders))
        except _convertbytes.NotSpliced as exc:
            raise Unsupported(f"--target-opset {target_opset} needs the objects writer's conversion: {exc}") from exc
        if seed is not None:  # the engine lowers after the conversion, its constants' names taken
            seed.update(spliced.made)
        # else no name of the model starts with a '<prefix>/', nor does any constant's (each
        # is a node's name or output, '_<what>' and a number added): the lowering makes only those
    plan = LoweringPlan(registry, prefer, opset, path=path, names=NameGenerator(seed or ()))
    scope = LoweringScope(types)
    fresh = plan.names.fresh
    elem = types._elem

    # A node's kind: op, attributes, arity, aliasing among its inputs and outputs, input
    # types (the forward pass's, as the engine asks for them). Kinds are finer than the
    # engine's template keys, so every node of a kind is lowered the same way: the first
    # by the engine, the others by repeating that (_Template, _Bound).
    attr_keys = [b""] * len(custom)
    for k in itertools.compress(range(len(custom)), list(map(len, map(attrgetter("attribute"),
                                                                       map(node_at, custom))))):
        attr_keys[k] = b"".join(a.SerializeToString() for a in node_at(custom[k]).attribute)
    values_of = list(map(operator.add, inputs_of, outputs_of))
    aliasing: Any = list(map(operator.eq, map(len, map(set, values_of)), map(len, values_of)))
    if not all(aliasing):
        aliasing = (flag or tuple(map(v.index, v)) for flag, v in zip(aliasing, values_of))
    in_types_of = map(tuple, map(map, itertools.repeat(elem.get), inputs_of))
    n_inputs = list(map(len, inputs_of))
    # Each kind as a number (the first of its kind's index in a count): small keys, no tuple kept per node.
    kind_numbers: dict[tuple, int] = {}
    kind_keys = list(map(kind_numbers.setdefault, zip(custom_ops, attr_keys, n_inputs,
                                                      map(len, outputs_of), aliasing, in_types_of),
                         itertools.count()))
    del attr_keys, aliasing, kind_numbers, inputs_of, outputs_of  # values_of holds the names
    batched = seed is None and _grouped(prefixes, kind_keys)
    tails = _tails(prefixes) if batched else None

    kinds: dict[int, Any] = {}  # kind -> _Template, _Bound, or None: the engine lowers each node
    planned: list[int] = []  # the placeholders the plan lowered (the others repeat one of them)
    slots: list[Any] = [None] * len(custom)  # each placeholder's replacement entries
    used: collections.Counter = collections.Counter()
    total = len(nodes)
    if progress is not None and total <= getattr(_engine, "PROGRESS_MIN_NODES", 10_000):
        progress = None
    step = max(1, getattr(_engine, "PROGRESS_STEP", 2_000))
    next_report = 0

    # Batched, the plan lowers the first node of each kind (and every node of a kind it
    # lowers each time) in order, and the repeats are found a kind at a time, not visited.
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
            if kind.__class__ is _Bound:
                slots[k] = kind.emit(node_at(custom[k]))
            else:
                slots[k] = kind.emit(kind.pad(values_of[k]), prefixes[k], fresh)
            continue
        # The first node of its kind (or of a kind the plan lowers each time), by the plan.
        planned.append(k)
        with types.serving():
            lowered = plan.lower(node_at(custom[k]), scope)
        slots[k] = b"".join(_wire.entry(r.SerializeToString()) for r in lowered.nodes)
        if key in kinds:
            continue
        made = kinds[key] = _repeater(lowered, n_inputs[k], batched)
        if made is None:
            if groups is not None:
                order.extend(groups[key][1:])
            continue
        made.lowered, made.op_type = lowered, custom_ops[k]
        made.members = [] if groups is None else groups[key][1:]
    for kind in kinds.values():
        if kind is None or not kind.members:
            continue
        members = kind.members
        used[kind] += len(members)
        if not batched:
            continue  # written in the loop above
        own_names = kind.__class__ is not _Bound and not kind.plain and any(map(tails.__getitem__, members))
        # A block of members at a time: what emitting makes besides the entries (names,
        # texts) stays the size of a block.
        for at in range(0, len(members), _EMIT_BLOCK):
            block = members[at:at + _EMIT_BLOCK]
            if kind.__class__ is _Bound:
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
    if progress is not None:
        progress("lowering", total, total)

    for kind, n in used.items():
        plan.count(kind.lowered, PLACEHOLDER_DOMAIN, kind.op_type, n, repeated=True)
    count_after(report, plan)

    # The graph: the bytes between placeholders as they were, each placeholder replaced
    # (and each node the conversion changed, the constants it no longer reads removed; the
    # constants it made after the graph's initializers).
    spliced_at, entries, tail = custom, slots, []  # tail: (start, end, bytes) after the last node entry
    if spliced is not None:
        if spliced.removed_nodes:
            removed = collections.Counter((domains[p], "Constant") for p in spliced.removed_nodes)
            report.ops_after = +(report.ops_after - removed)
        converted = [(p, e) for p, e in zip(spliced.positions, spliced.entries) if e is not None]
        if spliced.removed_nodes:
            converted = sorted({**dict(converted), **dict.fromkeys(spliced.removed_nodes, b"")}.items())
        if converted:
            merged = sorted(itertools.chain(zip(custom, slots), converted), key=itemgetter(0))
            spliced_at, entries = array("q", map(itemgetter(0), merged)), list(map(itemgetter(1), merged))
            del merged
        del converted
        initializer_entries = [(start, end) for field, start, end in others if field == 5]
        tail = [(*initializer_entries[i], b"") for i in spliced.removed_initializers]
        if spliced.initializers:
            at = max((end for _, end in initializer_entries), default=None)
            if at is None:
                at = min((start for field, start, _ in others if field > 5), default=g1)
            tail.append((at, at, spliced.initializers))
        tail.sort(key=itemgetter(0))
        if tail and starts and tail[0][0] < ends[-1]:
            raise Unsupported("initializers before the graph's last node")
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
    out, header, import_entries = assemble(view, model, top, graph, report, opset=opset, placeholders=placeholders,
                                           target_opset=target_opset, current=current, lowered=len(custom),
                                           why=WHY, converted=None if changed is None else sorted(changed))
    del view, graph

    if not check:
        return out, report, None
    # What the check reads of the lowering, so that the rest is freed before it runs.
    chosen = _representatives(planned, kinds, values_of)
    replaced = [(slots[k], values_of[k][:n_inputs[k]], values_of[k][n_inputs[k]:]) for k in chosen]
    if spliced is not None and spliced.checked:  # with a converted node of each kind, in the output's order
        at = [custom[k] for k in chosen]
        at += [spliced.positions[k] for k in spliced.checked_at]
        replaced = [part for _, part in sorted(zip(at, replaced + spliced.checked), key=itemgetter(0))]
    del spliced
    del slots, values_of, n_inputs, kinds, planned, prefixes, names, kind_keys

    def run_check() -> None:
        out_model: list[onnx.ModelProto] = []

        def output_model() -> onnx.ModelProto:
            if not out_model:
                out_model.append(onnx.load_model_from_string(out.join()))
            return out_model[0]

        def inference_model() -> onnx.ModelProto:
            """The rewritten model, cut where the names the check asks about are all made."""
            if holders:
                return output_model()
            asked: set[str] = set()
            for r in plan.replacements:
                produced = {o for n in r.nodes for o in n.output}
                asked.update(i for n in r.nodes for i in n.input if i and i not in produced)
            return _inference_prefix(onnx.load_model_from_string(out.join()), asked)

        types.lowering = False
        types.inference_model = inference_model
        opset_imports = onnx.ModelProto.FromString(import_entries).opset_import
        for r in plan.replacements:
            _engine.check_replacement(r.original, r.nodes, types, opset_imports, registry, r.rule, path)
        applied = ", ".join(sorted({how for _, how in plan.actions}))
        context, hint = _engine.check_context(applied, report.conversions)
        full = full_check or sum(report.ops_after.values()) <= _engine.FULL_CHECK_NODES
        if _whole_check(data, model, holders, full):
            _engine.check_model(output_model(), registry, path=path, context=context, full=full, hint=hint)
        else:
            why = _check_parts(data, model, header, replaced, {d for d, _ in report.ops_after}, registry,
                               frozenset(AI_ONNX) if converting else frozenset(), input_refused)
            if why is None:
                report.writer_reason += f"; {CHECKED_BY_PARTS}"
            else:  # the whole output: the checker's own verdict, in its words
                report.writer_reason += f"; checked whole ({why})"
                _check_bytes(out.join(), registry, path, context, hint)

    return out, report, run_check
