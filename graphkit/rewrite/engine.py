"""Lowering custom:: placeholder nodes: decompose them or bind them to kernels.

Works on the protobuf directly: untouched nodes keep their order, names and fields,
and every scope (subgraphs of If/Loop/Scan, model-local functions) is visited.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from graphkit.errors import ModelLoadError, OpDefinitionError, RewriteError, UnsupportedOpError, ValidationError
from graphkit.ops import (
    PLACEHOLDER_DOMAIN,
    OpDef,
    OpRegistry,
    default_registry,
)
from graphkit.ops._encoding import encode_kernel_attrs
from graphkit.ops.tensor_types import type_string
from graphkit.rewrite._gsrules import GraphSurgeonRule, apply_graphsurgeon_rules
from graphkit.rewrite._rules import Rule, RuleReport, RuleSet, apply_rules
from graphkit.rewrite._walk import ModelIndex, count_ops, graphs, scopes
from graphkit.rewrite.builder import Builder, NameGenerator, TypeTable

__all__ = ["DEFAULT_PREFERENCE", "Lowering", "RewriteReport", "rewrite_model", "ai_onnx_opset"]

# Opset written into models that hold no ai.onnx import before a decomposition adds one.
_DEFAULT_OPSET = 17
_STANDARD_DOMAINS = ("", "ai.onnx")
UNKNOWN_OP_HINT = ("make the op known: pass --ops PACKAGE (a module or .py file defining an "
                   "OpPackage), list it in $GRAPHKIT_OPS, or install the package that defines it; "
                   "`graphkit ops` lists the known ops")
FULL_CHECK_NODES = 20_000
PROGRESS_MIN_NODES = 10_000  # smaller models finish before a progress bar would help
PROGRESS_STEP = 2_000


class Lowering(enum.Enum):
    """What to turn a custom:: node into (KEEP leaves it a placeholder)."""

    DECOMPOSE = "decompose"
    NATIVE = "native"
    PYTHON = "python"
    KEEP = "keep"


@dataclass
class RewriteReport:
    """What a rewrite did: op counts before/after and per-op actions."""

    ops_before: collections.Counter = field(default_factory=collections.Counter)
    ops_after: collections.Counter = field(default_factory=collections.Counter)
    actions: collections.Counter = field(default_factory=collections.Counter)
    rules: RuleReport = field(default_factory=RuleReport)

    @property
    def changed(self) -> bool:
        return sum(self.actions.values()) > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ops_before": {f"{d}::{o}" if d else o: n for (d, o), n in sorted(self.ops_before.items())},
            "ops_after": {f"{d}::{o}" if d else o: n for (d, o), n in sorted(self.ops_after.items())},
            "actions": [{"op": op, "lowering": how, "nodes": n}
                        for (op, how), n in sorted(self.actions.items())],
            "rules": {name: {"applied": self.rules.applied.get(name, 0),
                             "not_matched": self.rules.reasons.get(name, [])}
                      for name in sorted(set(self.rules.applied) | set(self.rules.reasons))},
        }


def ai_onnx_opset(model: onnx.ModelProto) -> int | None:
    for imp in model.opset_import:
        if imp.domain in _STANDARD_DOMAINS:
            return imp.version
    return None


def node_attrs(op: OpDef, node: onnx.NodeProto, path: str | None) -> dict[str, Any]:
    """The node's attributes checked against ``op`` with defaults filled in; RewriteError if bad."""
    where = dict(path=path, node=node.name or "<unnamed>", op=f"{node.domain}::{node.op_type}")
    given = {}
    for a in node.attribute:
        if a.ref_attr_name:
            raise RewriteError(f"attribute '{a.name}' refers to '{a.ref_attr_name}' outside a function",
                               hint="give the attribute a value", **where)
        try:
            given[a.name] = helper.get_attribute_value(a)
        except (ValueError, TypeError) as exc:
            raise RewriteError(f"attribute '{a.name}' is malformed: {exc}", hint="re-export the model",
                               **where) from exc
    try:
        return op.resolve_attrs(given, where=node.name)
    except OpDefinitionError as exc:
        raise RewriteError(exc.message, hint=exc.hint or "fix the node", **where) from exc


def _make_attribute(op: OpDef, name: str, value: Any, how: Lowering) -> onnx.AttributeProto:
    """An attribute of the declared type (an empty list has no type of its own)."""
    from graphkit.ops._encoding import kernel_attr_type

    attr_type = op.attr(name).type
    if how is Lowering.PYTHON:
        attr_type = kernel_attr_type(attr_type)
    return helper.make_attribute(name, value, attr_type=getattr(onnx.AttributeProto, attr_type.onnx_name))


class _Lowerer:
    def __init__(self, model: onnx.ModelProto, registry: OpRegistry, prefer: tuple[Lowering, ...],
                 opset: int, path: str | None, names: set[str]) -> None:
        self.registry = registry
        self.prefer = prefer
        self.opset = opset
        self.path = path
        self.names = NameGenerator(names)
        self.emitted: collections.Counter = collections.Counter()
        self.progress: Callable[[str, int, int], None] | None = None
        self.done = self.total = 0
        self.lowered: collections.Counter = collections.Counter()
        self.types = TypeTable(model, registry)
        # Domains whose nodes are placeholders to lower: every op domain of the registry,
        # and "custom" even when no op of the registry is there (unknown ops are errors).
        self.domains = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
        self.actions: collections.Counter = collections.Counter()
        # Template keys whose replacement is already queued for checking.
        self._checked: set = set()
        # (original node, replacement nodes, rule, type table of its scope) of every distinct replacement
        self.replacements: list[tuple[onnx.NodeProto, list[onnx.NodeProto], str, TypeTable]] = []

    def fail(self, cls: type, message: str, node: onnx.NodeProto, hint: str) -> Exception:
        return cls(message, path=self.path, node=node.name or "<unnamed>",
                   op=f"{node.domain}::{node.op_type}", hint=hint)

    def lower_graph(self, nodes: Any, *, in_function: bool = False) -> None:
        """Lower the custom:: nodes of one node list in place (subgraphs are their own scopes).

        In a model-local function body (``in_function``) tensor types are the caller's:
        nothing is looked up in the model's type table (which would also ask whole-model
        shape inference, inferring every body once per call site).
        """
        domains = self.domains
        if not any(n.domain in domains for n in nodes):
            return
        if in_function:
            model_types, self.types = self.types, TypeTable()
            try:
                self.lower_graph(nodes)
            finally:
                self.types = model_types
            return
        new_nodes: list[onnx.NodeProto] = []
        self._scope_constants: dict = {}
        self._templates: dict = {}
        progress, step = self.progress, PROGRESS_STEP
        for i, n in enumerate(nodes):
            if progress is not None and i % step == 0:
                progress("lowering", self.done + i, self.total)
            if n.domain in domains:
                replacement = self.lower_node(n)
                self.lowered[(n.domain, n.op_type)] += 1
                for r in replacement:
                    self.emitted[(r.domain, r.op_type)] += 1
                new_nodes.extend(replacement)
            else:
                new_nodes.append(n)
        self.done += len(nodes)
        del nodes[:]
        nodes.extend(new_nodes)

    def lower_node(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        op = self.registry.lookup(node.domain, node.op_type)
        if op is None:
            raise self.fail(UnsupportedOpError, "no op package defines this op", node,
                            hint=UNKNOWN_OP_HINT)
        self._check_arity(op, node)
        attrs = node_attrs(op, node, self.path)
        in_types = self._check_input_types(op, node)
        reasons = []
        for how in self.prefer:
            if how is Lowering.DECOMPOSE:
                dec = op.decomposition_for(self.opset)
                if dec is not None:
                    return self._decompose(op, node, attrs, dec, in_types)
                ranges = ", ".join(f"{d.name}: opset {d.min_opset}..{d.max_opset or ''}"
                                   for d in op.decompositions)
                reasons.append(f"no decomposition valid at opset {self.opset}"
                               + (f" (has {ranges})" if ranges else ""))
            elif how is Lowering.NATIVE:
                if self.registry.has_native(op):
                    return self._bind(op, node, attrs, how)
                reasons.append("has no native kernel" if not op.native else
                               "declares a native kernel but is not registered through an OpPackage "
                               "with NativeKernels")
            elif how is Lowering.PYTHON:
                if op.python_kernel is not None:
                    return self._bind(op, node, attrs, how)
                reasons.append("has no Python kernel")
        others = [h.value for h in (Lowering.DECOMPOSE, Lowering.NATIVE, Lowering.PYTHON) if h not in self.prefer]
        hint = (f"allow another lowering ({', '.join(others)}) with --prefer, or pick the opset with "
                "--target-opset" if others else "pick another opset with --target-opset or add a lowering "
                f"to the definition of {op.name}")
        raise self.fail(UnsupportedOpError, "; ".join(reasons), node, hint=hint)

    def _check_arity(self, op: OpDef, node: onnx.NodeProto) -> None:
        n_req = sum(not p.optional for p in op.inputs)
        if not n_req <= len(node.input) <= len(op.inputs):
            raise self.fail(RewriteError, f"has {len(node.input)} inputs; {op.name} takes "
                            f"{n_req}..{len(op.inputs)}", node, hint="re-export the model")
        if len(node.output) > len(op.outputs) or not node.output:
            raise self.fail(RewriteError, f"has {len(node.output)} outputs; {op.name} gives "
                            f"{len(op.outputs)}", node, hint="re-export the model")

    def _check_input_types(self, op: OpDef, node: onnx.NodeProto) -> tuple[int | None, ...]:
        """Element types of the node's inputs, each checked against the op's type constraints."""
        types = tuple(self.types.elem_type(i) if i else None for i in node.input)
        for param, name, elem in zip(op.inputs, node.input, types):
            if elem is None:
                continue
            allowed = op.type_constraints[param.type]
            if type_string(elem) not in allowed:
                raise self.fail(RewriteError, f"input '{name}' ({param.name}) has element type "
                                f"{type_string(elem) or elem}, {op.name} takes {', '.join(allowed)}", node,
                                hint="cast the input or fix the exporter")
        return types

    def _decompose(self, op: OpDef, node: onnx.NodeProto, attrs: dict[str, Any],
                   dec: Any, in_types: tuple[int | None, ...]) -> list[onnx.NodeProto]:
        inputs = list(node.input) + [""] * (len(op.inputs) - len(node.input))
        prefix = node.name or op.name
        # Which inputs are the same tensor matters: my_add(x, x) is no template for my_add(y, x).
        aliasing = tuple(inputs.index(i) for i in inputs)
        key = (op.qualified_name, dec.name, in_types, aliasing, repr(sorted(attrs.items())), len(node.output))
        template = self._templates.get(key)
        if template is not None:
            nodes = self._instantiate(template, inputs, list(node.output), prefix)
        else:
            builder = Builder(opset=self.opset, prefix=prefix, names=self.names, types=self.types,
                              node_name=node.name, op_name=op.qualified_name,
                              constants=self._scope_constants)
            shared = set(self._scope_constants.values())
            try:
                nodes = builder.finish(list(dec.build(builder, inputs, attrs)), list(node.output))
            except RewriteError as exc:
                raise self.fail(RewriteError, f"decomposition '{dec.name}': {exc.message}", node,
                                exc.hint or "fix the decomposition") from exc
            if not builder.used_shapes:
                # Later nodes with the same op, input types and attributes reuse this replacement
                # with their own names; constants made here are shared by value in this scope.
                reused = [n for n in nodes if not (n.op_type == "Constant" and n.output[0] not in shared)]
                self._templates[key] = (reused, inputs, list(node.output), prefix)
            # One strict check per distinct replacement, in any scope (shape-dependent ones each).
            if builder.used_shapes or key not in self._checked:
                self._checked.add(key)
                self.replacements.append((node, [n for n in nodes], f"decomposition '{dec.name}' of {op.qualified_name}",
                                          self.types))
        self.actions[(op.qualified_name, f"decompose:{dec.name}")] += 1
        return nodes

    def _instantiate(self, template: tuple, inputs: list[str], outputs: list[str],
                     prefix: str) -> list[onnx.NodeProto]:
        tpl_nodes, tpl_inputs, tpl_outputs, tpl_prefix = template
        rename = dict(zip(tpl_inputs, inputs))
        rename.update(zip(tpl_outputs, outputs))
        fresh = self.names.fresh
        cut = len(tpl_prefix)
        out = []
        for tpl in tpl_nodes:
            node = onnx.NodeProto()
            node.CopyFrom(tpl)
            node.name = fresh(prefix + tpl.name[cut:] if tpl.name.startswith(tpl_prefix) else tpl.name)
            for i, name in enumerate(tpl.output):
                if name not in rename:
                    rename[name] = fresh(prefix + name[cut:] if name.startswith(tpl_prefix) else name)
                node.output[i] = rename[name]
            for i, name in enumerate(tpl.input):
                if name in rename:
                    node.input[i] = rename[name]
            out.append(node)
        return out

    def _bind(self, op: OpDef, node: onnx.NodeProto, attrs: dict[str, Any], how: Lowering) -> onnx.NodeProto:
        domain = self.registry.kernel_domain(op, how.value)
        values = attrs if how is Lowering.NATIVE else encode_kernel_attrs(op, attrs)
        bound = onnx.NodeProto()
        bound.CopyFrom(node)
        bound.domain = domain
        del bound.attribute[:]
        # Every attribute is written out: kernels read them without knowing defaults.
        bound.attribute.extend(_make_attribute(op, k, v, how) for k, v in values.items())
        self.actions[(op.qualified_name, f"bind:{how.value}")] += 1
        extra = self._empty_optional_inputs(op, bound) if how is Lowering.PYTHON else []
        return [*extra, bound]

    def _empty_optional_inputs(self, op: OpDef, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        """onnxruntime-extensions needs every input: an omitted optional one becomes an empty
        tensor, which Python kernels read as absent."""
        missing = [k for k, p in enumerate(op.inputs) if p.optional and (k >= len(node.input) or not node.input[k])]
        if not missing:
            return []
        bound_types = {p.type: self.types.elem_type(name) for p, name in zip(op.inputs, node.input) if name}
        builder = Builder(opset=self.opset, prefix=node.name or op.name, names=self.names, types=self.types,
                          node_name=node.name, op_name=op.qualified_name, constants=self._scope_constants)
        while len(node.input) < len(op.inputs):
            node.input.append("")
        for k in missing:
            elem = bound_types.get(op.inputs[k].type)
            if elem is None:
                raise self.fail(RewriteError, f"cannot tell the element type of omitted input "
                                f"'{op.inputs[k].name}'", node, hint="give the model's inputs a type")
            node.input[k] = builder.constant(np.zeros((0,), helper.tensor_dtype_to_np_dtype(elem)), dtype=elem)
        return builder.nodes


def _fix_imports(imports: Any, used: set[str], opset: int, placeholders: frozenset[str]) -> None:
    """Drop unused placeholder-domain imports; import every used domain (ai.onnx at ``opset``)."""
    keep = [imp for imp in imports if not (imp.domain in placeholders and imp.domain not in used)]
    present = {imp.domain for imp in keep}
    if not present & set(_STANDARD_DOMAINS) and used & set(_STANDARD_DOMAINS):
        keep.append(helper.make_opsetid("", opset))
    keep.extend(helper.make_opsetid(d, 1) for d in sorted(used - present - set(_STANDARD_DOMAINS), key=str))
    if [(i.domain, i.version) for i in keep] != [(i.domain, i.version) for i in imports]:
        del imports[:]
        imports.extend(keep)


def _fix_opset_imports(model: onnx.ModelProto, opset: int, used: set[str],
                       placeholders: frozenset[str] = frozenset({PLACEHOLDER_DOMAIN})) -> None:
    """Consistent opset imports in the model and in every local function."""
    for fn in model.functions:
        fn_used = {n.domain for n in fn.node}
        _fix_imports(fn.opset_import, fn_used, opset, placeholders)
        used = used | fn_used
    used |= {f.domain for f in model.functions}
    _fix_imports(model.opset_import, used, opset, placeholders)


def _shapeless_io(model: onnx.ModelProto) -> list[onnx.TypeProto.Tensor]:
    return [vi.type.tensor_type for g in graphs(model.graph) for vi in (*g.input, *g.output)
            if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")]


def _without_external_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose external initializers are graph inputs of the same type.

    onnx's checker resolves external files against the working directory (and rejects
    links); graphkit validates external data itself, so the checker sees typed inputs.
    """
    external = onnx.TensorProto.EXTERNAL
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for g in graphs(copy.graph):
        moved = [t for t in g.initializer if t.data_location == external]
        if not moved:
            continue
        keep = [t for t in g.initializer if t.data_location != external]
        del g.initializer[:]
        g.initializer.extend(keep)
        declared = {i.name for i in g.input}
        g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in moved if t.name not in declared)
    return copy


def check_model(model: onnx.ModelProto, registry: OpRegistry, *, path: str | None = None,
                context: str = "", full: bool = True) -> None:
    """ONNX checker, plus strict shape inference over the whole model when ``full``.

    Custom ops are known to both through their schemas.
    """
    from graphkit.external_data import external_tensors

    if external_tensors(model):
        model = _without_external_initializers(model)
    # onnx's checker insists on a shape field in graph inputs/outputs; ONNX Runtime and
    # exporters do not. Give shapeless ones an empty shape during the check only.
    shapeless = _shapeless_io(model)
    with registry.onnx_schemas():
        try:
            for tt in shapeless:
                tt.shape.SetInParent()
            try:
                onnx.checker.check_model(model)
            finally:
                for tt in shapeless:
                    tt.ClearField("shape")
            if full:
                onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError,
                RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValidationError(f"invalid model{context}: {first}", path=path,
                                  hint="fix the input model, or skip the check with --no-check") from exc


def _check_replacement(original: onnx.NodeProto, nodes: list[onnx.NodeProto], types: TypeTable,
                       opset_imports: Any, registry: OpRegistry, rule: str, path: str | None) -> None:
    """Strict type and shape inference over one replacement, fed the types its inputs have."""
    produced = {o for n in nodes for o in n.output}
    inputs = list(dict.fromkeys(i for n in nodes for i in n.input if i and i not in produced))
    value_infos = []
    for name in inputs:
        elem = types.elem_type(name)
        if elem is None:
            return  # nothing to check against
        # Declared shapes only: inferring the whole model for one replacement costs more than
        # the check is worth (strict inference of the replacement works with unknown shapes).
        value_infos.append(helper.make_tensor_value_info(name, elem, types.shape(name, infer=False)))
    outputs = [helper.make_value_info(o, onnx.TypeProto()) for o in original.output if o]
    graph = helper.make_graph(nodes, "replacement", value_infos, outputs)
    mini = helper.make_model(graph, opset_imports=list(opset_imports), ir_version=10)
    with registry.onnx_schemas():
        try:
            onnx.shape_inference.infer_shapes(mini, check_type=True, strict_mode=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError,
                RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0]
            raise ValidationError(f"replacement made by {rule} is invalid: {first}", path=path,
                                  node=original.name, op=f"{original.domain}::{original.op_type}",
                                  hint=f"fix {rule}, or skip the check with --no-check") from exc


def _convert_opset(model: onnx.ModelProto, target: int, path: str | None) -> onnx.ModelProto:
    """Move the model's standard ops to ai.onnx opset ``target`` (custom nodes ride along)."""
    from onnx import version_converter

    current = ai_onnx_opset(model)
    if current == target or not any(d in _STANDARD_DOMAINS for d, _ in count_ops(model)):
        converted = model
    else:
        try:
            converted = version_converter.convert_version(model, target)
        except Exception as exc:  # the converter raises bare RuntimeErrors / its own types
            raise RewriteError(f"cannot convert from opset {current} to {target}: {str(exc).splitlines()[0]}",
                               path=path, hint="pick a --target-opset the converter supports, or omit it") from exc
    imports = [imp for imp in converted.opset_import if imp.domain not in _STANDARD_DOMAINS]
    del converted.opset_import[:]
    converted.opset_import.extend([helper.make_opsetid("", target), *imports])
    return converted


def _attach_functions(model: onnx.ModelProto, registry: OpRegistry, opset: int, names: NameGenerator,
                      path: str | None) -> collections.Counter:
    """Give every custom op used in ``model`` a local function holding its decomposition."""
    attrs_seen: dict[str, tuple[OpDef, dict[str, Any]]] = {}
    domains = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
    for nodes, _, _ in scopes(model):
        for node in nodes:
            if node.domain not in domains:
                continue
            op = registry.lookup(node.domain, node.op_type)
            if op is None:
                raise UnsupportedOpError("no op package defines this op", path=path, node=node.name,
                                         op=f"{node.domain}::{node.op_type}", hint=UNKNOWN_OP_HINT)
            given = node_attrs(op, node, path)
            if attrs_seen.setdefault(op.qualified_name, (op, given))[1] != given:
                raise UnsupportedOpError(
                    "--as-functions needs every node of an op to have the same attributes", path=path,
                    node=node.name, op=op.qualified_name, hint="decompose or bind these nodes instead")
    existing = {(f.domain, f.name) for f in model.functions}
    actions: collections.Counter = collections.Counter()
    for op, attrs in attrs_seen.values():
        name = op.name
        if (op.domain, name) in existing:
            continue
        dec = op.decomposition_for(opset)
        if dec is None:
            raise UnsupportedOpError(f"no decomposition valid at opset {opset} to put in a function",
                                     path=path, op=op.qualified_name, hint="pick another --target-opset")
        inputs = [p.name for p in op.inputs]
        builder = Builder(opset=opset, prefix=name, names=NameGenerator(inputs), types=TypeTable(),
                          op_name=op.qualified_name)
        try:
            body = builder.finish(list(dec.build(builder, inputs, attrs)), [p.name for p in op.outputs])
        except RewriteError as exc:
            raise RewriteError(f"--as-functions: decomposition '{dec.name}' needs what a function body "
                               f"cannot know: {exc.message}", path=path, op=op.qualified_name,
                               hint="decompose or bind these nodes instead") from exc
        model.functions.append(helper.make_function(
            op.domain, name, inputs, [p.name for p in op.outputs], body,
            [helper.make_opsetid("", opset)], attributes=[a.name for a in op.attributes], doc_string=op.doc))
        actions[(op.qualified_name, f"function:{dec.name}")] += 1
    return actions


DEFAULT_PREFERENCE = (Lowering.DECOMPOSE, Lowering.NATIVE, Lowering.PYTHON)


def rewrite_model(model: onnx.ModelProto, *, registry: OpRegistry | None = None,
                  lowering: Lowering | Sequence[Lowering] = DEFAULT_PREFERENCE,
                  rules: Iterable[Rule] | None = None, target_opset: int | None = None,
                  as_functions: bool = False, check: bool = True, full_check: bool = False,
                  path: str | None = None, progress: Callable[[str, int, int], None] | None = None,
                  ) -> tuple[onnx.ModelProto, RewriteReport]:
    """Apply ``rules``, then lower every custom:: node of ``model``; returns a new model and a report.

    ``lowering`` is one lowering or a preference order: each node gets the first that
    fits (a decomposition valid at the target opset, a native or a Python kernel).
    ``Lowering.KEEP`` leaves placeholders alone; ``as_functions`` keeps them and attaches
    their decompositions as model-local functions (ONNX Runtime runs a registered kernel
    where there is one, the function body elsewhere). ``target_opset`` converts the
    model's standard ops first. ``progress(phase, done, total)`` is called while lowering
    models of more than PROGRESS_MIN_NODES nodes.

    ``model`` itself is not modified. A model where nothing applies comes back
    unchanged field for field. ``check`` runs the ONNX checker on the result and strict
    shape inference on each distinct replacement, and on the whole model when it has at
    most FULL_CHECK_NODES nodes or ``full_check`` is set.
    """
    registry = default_registry() if registry is None else registry
    prefer = (lowering,) if isinstance(lowering, Lowering) else tuple(lowering)
    if as_functions:
        prefer = (Lowering.KEEP,)
    rule_set = rules if isinstance(rules, RuleSet) else RuleSet(rules or ())
    out = onnx.ModelProto()
    out.CopyFrom(model)
    index = ModelIndex(out)
    bad = next((k for k in index.op_counts if not (isinstance(k[0], str) and isinstance(k[1], str))), None)
    if bad is not None:  # protobuf hands over names that are not UTF-8 text as bytes
        raise ModelLoadError(f"a node's domain or op type {bad!r} is not valid UTF-8 text", path=path,
                             hint="re-export the model; ONNX names are UTF-8")
    report = RewriteReport(ops_before=index.op_counts)
    placeholders = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
    has_custom = bool(placeholders & set(index.domains))
    converting = target_opset is not None and target_opset != ai_onnx_opset(out)
    if not len(rule_set) and not converting and (not has_custom or prefer == (Lowering.KEEP,)) and not (
            as_functions and has_custom):
        report.ops_after = report.ops_before.copy()
        return out, report
    if target_opset is not None:
        out = _convert_opset(out, target_opset, path)
        index = ModelIndex(out) if converting else index
    opset = ai_onnx_opset(out) or _DEFAULT_OPSET
    lowerer = _Lowerer(out, registry, prefer, opset, path, index.names)
    if len(rule_set):
        def make_builder(node: onnx.NodeProto, rule_name: str) -> Builder:
            return Builder(opset=opset, prefix=node.name or rule_name, names=lowerer.names,
                           types=lowerer.types, node_name=node.name, op_name=rule_name)

        # Inner scopes first: rebuilding a node list copies its nodes, subgraphs included.
        for nodes, protected, inits in reversed(list(scopes(out))):
            apply_rules(nodes, rule_set, make_builder=make_builder, protected=protected,
                        initializers=inits, report=report.rules)
        gs_rules = [r for r in rule_set if isinstance(r, GraphSurgeonRule)]
        if gs_rules:
            out = apply_graphsurgeon_rules(out, gs_rules, report.rules, path)
            lowerer = _Lowerer(out, registry, prefer, opset, path, ModelIndex(out).names)
    if prefer != (Lowering.KEEP,):
        lowerer.total = sum(index.op_counts.values())
        if lowerer.total > PROGRESS_MIN_NODES:
            lowerer.progress = progress
        every = list(scopes(out))  # the main graph's scopes first, then the functions'
        in_main = sum(1 for _ in graphs(out.graph))
        for k in reversed(range(len(every))):  # inner scopes first, as above
            lowerer.lower_graph(every[k][0], in_function=k >= in_main)
        if lowerer.progress is not None:
            lowerer.progress("lowering", lowerer.total, lowerer.total)
    if as_functions:
        lowerer.actions.update(_attach_functions(out, registry, opset, lowerer.names, path))
    if not lowerer.actions and not report.rules.applied and not converting:
        report.ops_after = report.ops_before.copy()
        fresh = onnx.ModelProto()
        fresh.CopyFrom(model)
        return fresh, report
    report.actions = lowerer.actions
    if report.rules.applied or converting or as_functions:
        report.ops_after = count_ops(out)
    else:  # lowering only: derive the counts instead of walking the model again
        after = report.ops_before.copy()
        after.subtract(lowerer.lowered)
        after.update(lowerer.emitted)
        report.ops_after = +after
    _fix_opset_imports(out, opset, {d for d, _ in report.ops_after}, placeholders)
    if check:
        for original, nodes, rule, types in lowerer.replacements:
            _check_replacement(original, nodes, types, out.opset_import, registry, rule, path)
        applied = ", ".join(sorted({how for _, how in lowerer.actions} | set(report.rules.applied)))
        check_model(out, registry, path=path, context=f" after rewrite ({applied})",
                    full=full_check or sum(report.ops_after.values()) <= FULL_CHECK_NODES)
    return out, report
