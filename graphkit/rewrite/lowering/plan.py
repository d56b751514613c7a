"""The lowering plan: what each custom:: placeholder becomes, decided once per kind of node.

This is where a placeholder becomes standard ops (or a kernel binding), whichever writer runs.
A :class:`LoweringPlan` is made once per rewrite (registry, preference order, opset,
name generator). Each node list it lowers is a :class:`LoweringScope` (its own type table,
constants and templates). :meth:`LoweringPlan.lower` turns one placeholder into its
replacement and says how (:class:`Lowered`): the action taken, and the
:class:`LoweringTemplate` later nodes of the same kind repeat. Every writer (graphkit.rewrite.writers)
uses this one interface: the objects writer (``rewrite_model``'s lower pass) and the byte
writers (graphkit.rewrite.bytes.main_graph, bytes.bodies), which repeat templates on serialized nodes.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx

from graphkit._invocation import wording
from graphkit.errors import OpDefinitionError, RewriteError, UnsupportedOpError
from graphkit.ops import Decomposition, OpDef, OpRegistry
from graphkit.ops._opdef import PLACEHOLDER_DOMAIN
from graphkit.ops.tensor_types import type_string
from graphkit.rewrite.lowering.selection import Probe, Selection
from graphkit.rewrite.lowering.binding import bind_node
from graphkit.rewrite.lowering.standard_ops import as_placeholder, attribute_values, label
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.lowering.builder import Builder, NameGenerator

__all__ = ["Lowered", "Lowering", "LoweringPlan", "LoweringScope", "LoweringTemplate", "node_attrs", "unknown_op_hint"]



def unknown_op_hint() -> str:
    """How to make an unknown op known, in the caller's words (the command's or the API's)."""
    return wording("make the op known: pass --ops PACKAGE (a module or .py file defining an "
                   "OpPackage), list it in $GRAPHKIT_OPS, or install the package that defines it; "
                   "`graphkit ops` lists the known ops",
                   "make the op known: pass registry=graphkit.ops.discover(['PACKAGE']) (a module or .py "
                   "file defining an OpPackage), list it in $GRAPHKIT_OPS, or install the package that "
                   "defines it; list(discover()) holds the known ops")


class Lowering(enum.Enum):
    """What to turn a custom:: node into (KEEP leaves it a placeholder)."""

    DECOMPOSE = "decompose"
    NATIVE = "native"
    PYTHON = "python"
    KEEP = "keep"


def node_attrs(op: OpDef, node: onnx.NodeProto, path: str | None) -> dict[str, Any]:
    """The node's attributes checked against ``op`` with defaults filled in; RewriteError if bad."""
    where = dict(path=path, node=node.name or "<unnamed>", op=f"{node.domain}::{node.op_type}")
    for a in node.attribute:
        if a.ref_attr_name:
            raise RewriteError(f"attribute '{a.name}' refers to '{a.ref_attr_name}' outside a function",
                               hint="give the attribute a value", **where)
    given = attribute_values(node, where)
    try:
        return op.resolve_attrs(given, where=node.name)
    except OpDefinitionError as exc:
        raise RewriteError(exc.message, hint=exc.hint or "fix the node", **where) from exc


@dataclass
class LoweringTemplate:
    """A replacement later nodes of the same kind repeat with their own names.

    ``nodes`` were made for the node whose ``inputs``/``outputs`` (inputs padded to the
    op's arity) and name ``prefix`` they use; constants they share are not among them.
    """

    nodes: list[onnx.NodeProto]
    inputs: list[str]
    outputs: list[str]
    prefix: str
    constants: dict[str, str] = field(default_factory=dict)  # another scope's constant -> this scope's
    _compiled: list | None = field(default=None, repr=False, compare=False)  # shared by adopted copies

    def instantiate(self, inputs: list[str], outputs: list[str], prefix: str,
                    fresh: Callable[[str], str]) -> list[onnx.NodeProto]:
        """The template's nodes for a node with these values and name prefix.

        Names made from the template's prefix are made from ``prefix`` by ``fresh``, in
        node order (each node's name, then the outputs it makes).
        """
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = self._compile()
        rename = dict(self.constants)
        rename.update(zip(self.inputs, inputs))
        rename.update(zip(self.outputs, outputs))
        out = []
        for tpl, name, outs, ins in compiled:
            node = onnx.NodeProto()
            node.CopyFrom(tpl)
            node.name = fresh(prefix + name[1]) if name[0] else fresh(name[1])
            for i, (o, made) in enumerate(outs):
                if o not in rename:
                    rename[o] = fresh(prefix + made[1]) if made[0] else fresh(made[1])
                node.output[i] = rename[o]
            for i, name_in in ins:
                if name_in in rename:
                    node.input[i] = rename[name_in]
            out.append(node)
        return out

    def _compile(self) -> list[tuple]:
        """Per template node: the node, its name and output names as (made from the prefix,
        the rest), and the inputs that may be renamed (index, name): read once, not per instance."""
        tpl_prefix = self.prefix
        cut = len(tpl_prefix)

        def part(name: str) -> tuple[bool, str]:
            return (True, name[cut:]) if name.startswith(tpl_prefix) else (False, name)

        return [(tpl, part(tpl.name), [(o, part(o)) for o in tpl.output], list(enumerate(tpl.input)))
                for tpl in self.nodes]


@dataclass
class LoweringScope:
    """One node list being lowered: its tensors' types, and what its replacements share.

    A model-local function's body has an empty type table (types are the caller's).
    """

    types: TypeTable
    constants: dict = field(default_factory=dict)   # (dtype, shape, bytes) -> constant name
    templates: dict = field(default_factory=dict)   # kind key -> LoweringTemplate
    constant_nodes: dict = field(default_factory=dict)  # constant name -> its Constant node


@dataclass
class Lowered:
    """One placeholder lowered: its replacement ``nodes`` and how.

    ``action`` is ``(op, "decompose:<name>" | "bind:native" | "bind:python")``;
    ``template`` is set when later nodes with the same op, attributes, input types and
    aliasing get the same replacement with their own names (None when the decomposition
    read shapes: each such node is planned again).
    """

    op: OpDef
    how: Lowering
    action: tuple[str, str]
    nodes: list[onnx.NodeProto]
    template: LoweringTemplate | None = None
    # Set where ``nodes`` are these constants then ``template``'s instance (what count() needs).
    constants: list[onnx.NodeProto] | None = None
    # A decomposition's template key: in one scope, nodes of one key share one template.
    key: tuple | None = None


@dataclass
class Replacement:
    """A distinct replacement to check: the node it replaced, by what, typed by ``types``."""

    original: onnx.NodeProto
    nodes: list[onnx.NodeProto]
    rule: str
    types: TypeTable


class LoweringPlan:
    """Lowers custom:: placeholders by one preference order at one opset, counting what it did.

    ``actions`` counts (op, action) pairs, ``lowered`` the placeholders by (domain, op),
    ``emitted`` the nodes made; ``replacements`` holds every distinct replacement for the
    check pass.
    """

    def __init__(self, registry: OpRegistry, prefer: tuple[Lowering, ...], opset: int, *,
                 path: str | None = None, names: NameGenerator | None = None) -> None:
        self.registry = registry
        self.prefer = prefer
        self.opset = opset
        self.path = path
        self.names = names if names is not None else NameGenerator()
        # Domains whose nodes are placeholders to lower: every op domain of the registry,
        # and "custom" even when no op of the registry is there (unknown ops are errors).
        self.domains = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
        # Standard ops an op computes (ai.onnx DeformConv): lowered like its placeholders.
        self.standard = registry.standard_op_types()
        self.actions: collections.Counter = collections.Counter()
        self.lowered: collections.Counter = collections.Counter()
        self.emitted: collections.Counter = collections.Counter()
        self.replacements: list[Replacement] = []
        self._checked: set = set()  # kind keys whose replacement is already queued for checking
        # kind key -> (template, {constant it reads: (value key or None, Constant node)}): a
        # template another scope adopts with constants of its own (thousands of If bodies).
        self._portable: dict = {}
        self._kinds: dict = {}  # kind of node -> (op, attrs, lowering, decomposition, template key)
        self._template_kinds: dict = {}  # id(template nodes) -> (those nodes, their (domain, op) counts)
        self.selection = Selection(registry, prefer, opset, path)

    def fail(self, cls: type, message: str, node: onnx.NodeProto, hint: str) -> Exception:
        """An error of class ``cls`` naming the model file, the node and its op."""
        return cls(message, path=self.path, node=node.name or "<unnamed>",
                   op=f"{node.domain}::{node.op_type}", hint=hint)

    # -- choosing -----------------------------------------------------------------------

    def op_of(self, node: onnx.NodeProto) -> OpDef:
        """The OpDef of a placeholder node; UnsupportedOpError if no op package defines it."""
        op = self.registry.lookup(node.domain, node.op_type)
        if op is None:
            raise self.fail(UnsupportedOpError, "no op package defines this op", node, hint=unknown_op_hint())
        return op

    def choose(self, op: OpDef, node: onnx.NodeProto, attrs: dict[str, Any], in_types: tuple[int | None, ...],
               scope: LoweringScope) -> tuple[Lowering, Decomposition | None]:
        """The first lowering of the preference order that ONNX Runtime can execute for the
        node's dtypes at the plan's opset (graphkit.rewrite.lowering.selection); UnsupportedOpError
        naming why none and what would work."""
        return self.selection.choose(op, node, attrs, in_types, self._probe(op, node, attrs, scope))

    def _probe(self, op: OpDef, node: onnx.NodeProto, attrs: dict[str, Any], scope: LoweringScope) -> Probe:
        """Builds a decomposition of ``node`` at an opset without touching the model or the
        plan's names (for the selection's check of what ONNX Runtime can run)."""
        def probe(dec: Decomposition, opset: int) -> tuple[list[onnx.NodeProto], dict[str, int], bool]:
            inputs = list(node.input) + [""] * (len(op.inputs) - len(node.input))
            builder = Builder(opset=opset, prefix=node.name or op.name, names=NameGenerator([*inputs, *node.output]),
                              types=scope.types, node_name=node.name, op_name=op.qualified_name, constants={})
            nodes = builder.finish(list(dec.build(builder, inputs, attrs)), list(node.output))
            produced = {o for n in nodes for o in n.output}
            reads = {i for n in nodes for i in n.input if i and i not in produced}
            known = {name: t for name in reads if (t := scope.types.elem_type(name))}
            return nodes, known, builder.used_shapes

        return probe

    # -- lowering -----------------------------------------------------------------------

    def is_placeholder(self, node: onnx.NodeProto) -> bool:
        """A node this plan lowers: a placeholder, or a standard op an op computes."""
        return node.domain in self.domains or (bool(self.standard) and (node.domain, node.op_type) in self.standard)

    def placeholders(self, nodes: Any) -> Iterator[int]:
        """Indices of the placeholders in a node list."""
        return (i for i, n in enumerate(nodes) if self.is_placeholder(n))

    def lower_nodes(self, nodes: Any, scope: LoweringScope, *,
                    progress: Callable[[int], None] | None = None) -> int:
        """Lower the placeholders of one node list in place; returns how many there were.

        ``progress(i)`` is called before node ``i`` every so often.
        """
        domains, standard = self.domains, self.standard
        new_nodes: list[onnx.NodeProto] = []
        count = 0
        for i, n in enumerate(nodes):
            if progress is not None:
                progress(i)
            if n.domain in domains or (standard and (n.domain, n.op_type) in standard):
                made = self.lower(n, scope).nodes
                new_nodes.extend(made)
                count += not (len(made) == 1 and made[0] is n)  # a standard node kept as it is
            else:
                new_nodes.append(n)
        if count:
            del nodes[:]
            nodes.extend(new_nodes)
        return count

    def lower(self, node: onnx.NodeProto, scope: LoweringScope) -> Lowered:
        """Lower one placeholder (or standard node an op computes) in ``scope``; the result is
        counted in this plan. A standard node whose chosen lowering is the decomposition that
        writes that standard op comes back as it is, uncounted.

        What to do is decided once per kind of node (op, attributes, arity, input types,
        which inputs and outputs are the same tensor): checks, attributes, the lowering
        chosen and the template key are the first node's for every later one.
        """
        original, std = node, None
        if self.standard and (node.domain, node.op_type) in self.standard:
            op, std = self.registry.standard_op(node.domain, node.op_type)
            try:
                node = as_placeholder(node, op, std, self.path)
            except RewriteError:
                if self.opset >= std.since_opset and Lowering.DECOMPOSE in self.prefer:
                    # valid as it is, and the op has no form for it: the standard op is its decomposition
                    return Lowered(op, Lowering.DECOMPOSE, (label(op, std), f"keep:{std}"), [original])
                raise
        elem_type = scope.types.elem_type
        ins = tuple(node.input)
        values = ins + tuple(node.output)
        attributes = node.attribute
        kind = (node.domain, node.op_type, b"".join([a.SerializeToString() for a in attributes]) if attributes else b"",
                len(ins), tuple(map(values.index, values)), tuple([elem_type(i) if i else None for i in ins]))
        decided = self._kinds.get(kind)
        if decided is None:
            op = self.op_of(node)
            self._check_arity(op, node)
            attrs = node_attrs(op, node, self.path)
            in_types = self._check_input_types(op, node, scope.types)
            try:
                how, dec = self.choose(op, node, attrs, in_types, scope)
            except UnsupportedOpError as exc:
                if std is None:
                    raise
                raise UnsupportedOpError(exc.message, hint=exc.hint, path=exc.path, node=exc.node,
                                         op=label(op, std)) from exc
            key = None
            if how is Lowering.DECOMPOSE:
                inputs = list(node.input) + [""] * (len(op.inputs) - len(node.input))
                # Which inputs are the same tensor matters: my_add(x, x) is no template for my_add(y, x).
                aliasing = tuple(inputs.index(i) for i in inputs)
                key = (op.qualified_name, dec.name, in_types, aliasing, repr(sorted(attrs.items())),
                       len(node.output))
            decided = self._kinds[kind] = (op, attrs, how, dec, key)
        op, attrs, how, dec, key = decided
        if std is not None and dec is not None and dec.name == std.decomposition and self.opset >= std.since_opset:
            return Lowered(op, how, (label(op, std), f"keep:{std}"), [original])
        if how is Lowering.DECOMPOSE:
            lowered = self._decompose(op, node, attrs, dec, key, scope)
        else:
            lowered = self._bind(op, node, attrs, how, scope)
        if std is not None:
            lowered.action = (label(op, std), lowered.action[1])
        self.count(lowered, original.domain, original.op_type)
        return lowered

    def count(self, lowered: Lowered, domain: str, op_type: str, times: int = 1, *,
              repeated: bool = False) -> None:
        """Count ``times`` placeholders ``domain::op_type`` lowered as ``lowered`` was (when
        ``repeated``: as its template is repeated, without the constants it made first)."""
        self.actions[lowered.action] += times
        self.lowered[(domain, op_type)] += times
        template, emitted = lowered.template, self.emitted
        if template is not None and (repeated or lowered.constants is not None):
            kinds = self._template_kinds.get(id(template.nodes))
            if kinds is None:  # the nodes list is shared by the template's adopted copies and kept
                kinds = self._template_kinds[id(template.nodes)] = (
                    template.nodes, collections.Counter((r.domain, r.op_type) for r in template.nodes))
            for k, n in kinds[1].items():
                emitted[k] += n * times
            made = () if repeated else lowered.constants
        else:
            made = lowered.nodes
        for r in made:
            emitted[(r.domain, r.op_type)] += times

    def _check_arity(self, op: OpDef, node: onnx.NodeProto) -> None:
        n_req = sum(not p.optional for p in op.inputs)
        if not n_req <= len(node.input) <= len(op.inputs):
            raise self.fail(RewriteError, f"has {len(node.input)} inputs; {op.name} takes "
                            f"{n_req}..{len(op.inputs)}", node, hint="re-export the model")
        if len(node.output) > len(op.outputs) or not node.output:
            raise self.fail(RewriteError, f"has {len(node.output)} outputs; {op.name} gives "
                            f"{len(op.outputs)}", node, hint="re-export the model")

    def _check_input_types(self, op: OpDef, node: onnx.NodeProto, types: TypeTable) -> tuple[int | None, ...]:
        """Element types of the node's inputs, each checked against the op's type constraints."""
        in_types = tuple(types.elem_type(i) if i else None for i in node.input)
        for param, name, elem in zip(op.inputs, node.input, in_types):
            if elem is None:
                continue
            allowed = op.type_constraints[param.type]
            if type_string(elem) not in allowed:
                raise self.fail(RewriteError, f"input '{name}' ({param.name}) has element type "
                                f"{type_string(elem) or elem}, {op.name} takes {', '.join(allowed)}", node,
                                hint="cast the input or fix the exporter")
        return in_types

    def _decompose(self, op: OpDef, node: onnx.NodeProto, attrs: dict[str, Any], dec: Decomposition,
                   key: tuple, scope: LoweringScope) -> Lowered:
        inputs = list(node.input) + [""] * (len(op.inputs) - len(node.input))
        prefix = node.name or op.name
        action = (op.qualified_name, f"decompose:{dec.name}")
        template = scope.templates.get(key)
        made: list[onnx.NodeProto] = []
        if template is None and key in self._portable:
            template, made = self.adopt(key, prefix, scope)
        if template is not None:
            nodes = template.instantiate(inputs, list(node.output), prefix, self.names.fresh)
            return Lowered(op, Lowering.DECOMPOSE, action, [*made, *nodes], template, made, key)
        builder = Builder(opset=self.opset, prefix=prefix, names=self.names, types=scope.types,
                          node_name=node.name, op_name=op.qualified_name, constants=scope.constants)
        shared = set(scope.constants.values())
        try:
            nodes = builder.finish(list(dec.build(builder, inputs, attrs)), list(node.output))
        except RewriteError as exc:
            raise self.fail(RewriteError, f"decomposition '{dec.name}': {exc.message}", node,
                            exc.hint or "fix the decomposition") from exc
        if not builder.used_shapes:
            # Later nodes with the same op, input types and attributes reuse this replacement
            # with their own names; constants made here are shared by value in this scope.
            reused = [n for n in nodes if not (n.op_type == "Constant" and n.output[0] not in shared)]
            template = scope.templates[key] = LoweringTemplate(reused, inputs, list(node.output), prefix)
            self._keep_portable(key, template, nodes, scope)
        # One strict check per distinct replacement, in any scope (shape-dependent ones each).
        if builder.used_shapes or key not in self._checked:
            self._checked.add(key)
            self.replacements.append(Replacement(node, list(nodes), f"decomposition '{dec.name}' of "
                                                 f"{op.qualified_name}", scope.types))
        return Lowered(op, Lowering.DECOMPOSE, action, nodes, template, key=key)

    def _keep_portable(self, key: tuple, template: LoweringTemplate, nodes: list[onnx.NodeProto],
                       scope: LoweringScope) -> None:
        """Remember ``template`` for other scopes when the only names it reads from its scope
        are constants (whose nodes another scope can make for itself)."""
        for n in nodes:
            if n.op_type == "Constant" and len(n.output) == 1:
                scope.constant_nodes[n.output[0]] = n
        if key in self._portable:
            return
        known = {*template.inputs, *template.outputs, *(o for n in template.nodes for o in n.output)}
        reads = {i for n in template.nodes for i in n.input if i and i not in known}
        if not all(r in scope.constant_nodes for r in reads):
            return
        by_name = {name: value for value, name in scope.constants.items() if name in reads}
        self._portable[key] = (template, {r: (by_name.get(r), scope.constant_nodes[r]) for r in sorted(reads)})

    def adoptable(self, key: tuple) -> bool:
        """Whether a scope without a template of ``key`` adopts another scope's (:meth:`adopt`)."""
        return key in self._portable

    def adoption(self, key: tuple) -> tuple[LoweringTemplate, list[tuple[str, onnx.NodeProto]]]:
        """What :meth:`adopt` adopts for ``key`` (needs :meth:`adoptable`): the template and the
        constants it reads from its scope, (name, Constant node), in the order adopt() goes
        through them. In a scope with no constants, adopt() makes each: a copy of the node
        named and producing ``fresh(prefix + "/const")``, the template reading it."""
        template, reads = self._portable[key]
        return template, [(name, const) for name, (_, const) in reads.items()]

    def adopt(self, key: tuple, prefix: str, scope: LoweringScope) -> tuple[LoweringTemplate, list[onnx.NodeProto]]:
        """Another scope's template of ``key`` for ``scope`` (what :meth:`lower` does for the
        first node of that key there): its constants found in ``scope`` by value or made
        here (returned, to go before the first instance). Needs :meth:`adoptable`."""
        template, reads = self._portable[key]
        rename: dict[str, str] = {}
        made = []
        for name, (value, const) in reads.items():
            local = scope.constants.get(value) if value is not None else None
            if local is None:
                local = self.names.fresh(f"{prefix}/const")
                copy = onnx.NodeProto()
                copy.CopyFrom(const)
                copy.name = copy.output[0] = local
                made.append(copy)
                scope.constant_nodes[local] = copy
                if value is not None:
                    scope.constants[value] = local
            rename[name] = local
        if template._compiled is None:
            template._compiled = template._compile()
        adopted = scope.templates[key] = LoweringTemplate(template.nodes, template.inputs, template.outputs,
                                                  template.prefix, rename, template._compiled)
        return adopted, made

    def _bind(self, op: OpDef, node: onnx.NodeProto, attrs: dict[str, Any], how: Lowering,
              scope: LoweringScope) -> Lowered:
        def make_builder() -> Builder:
            return Builder(opset=self.opset, prefix=node.name or op.name, names=self.names, types=scope.types,
                           node_name=node.name, op_name=op.qualified_name, constants=scope.constants)

        def fail(message: str) -> Exception:
            return self.fail(RewriteError, message, node, hint="give the model's inputs a type")

        nodes = bind_node(op, node, attrs, how.value, domain=self.registry.kernel_domain(op, how.value),
                          types=scope.types, make_builder=make_builder, fail=fail)
        return Lowered(op, how, (op.qualified_name, f"bind:{how.value}"), nodes)
