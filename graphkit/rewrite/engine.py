"""Lowering custom:: placeholder nodes: decompose them or bind them to kernels.

Works on the protobuf directly: untouched nodes keep their order, names and fields,
and every scope (subgraphs of If/Loop/Scan, model-local functions) is visited.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import helper

from graphkit.errors import OpDefinitionError, RewriteError, UnsupportedOpError, ValidationError
from graphkit.ops import (
    NATIVE_DOMAIN,
    PLACEHOLDER_DOMAIN,
    PYTHON_DOMAIN,
    OpDef,
    OpRegistry,
    default_registry,
)
from graphkit.rewrite._rules import Rule, RuleReport, RuleSet, apply_rules
from graphkit.rewrite.builder import Builder, NameGenerator, TypeTable

__all__ = ["Lowering", "RewriteReport", "rewrite_model", "ai_onnx_opset"]

# Opset written into models that hold no ai.onnx import before a decomposition adds one.
_DEFAULT_OPSET = 17
_STANDARD_DOMAINS = ("", "ai.onnx")


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


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph nested in its nodes' attributes."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graphs(g)


def _all_node_lists(model: onnx.ModelProto) -> Iterator[Any]:
    for g in _graphs(model.graph):
        yield g.node
    for fn in model.functions:
        yield fn.node
        for node in fn.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    for g in _graphs(attr.g):
                        yield g.node


def _count_ops(model: onnx.ModelProto) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for nodes in _all_node_lists(model):
        for n in nodes:
            counts[(n.domain, n.op_type)] += 1
    return counts


def _names_in_use(model: onnx.ModelProto) -> set[str]:
    names: set[str] = set()
    for g in _graphs(model.graph):
        names.update(i.name for i in g.input)
        names.update(o.name for o in g.output)
        names.update(t.name for t in g.initializer)
        names.update(v.name for v in g.value_info)
        for n in g.node:
            names.add(n.name)
            names.update(n.input)
            names.update(n.output)
    for fn in model.functions:
        for n in fn.node:
            names.add(n.name)
            names.update(n.input)
            names.update(n.output)
    return names


class _Lowerer:
    def __init__(self, model: onnx.ModelProto, registry: OpRegistry, lowering: Lowering,
                 opset: int, path: str | None) -> None:
        self.registry = registry
        self.lowering = lowering
        self.opset = opset
        self.path = path
        self.names = NameGenerator(_names_in_use(model))
        self.types = TypeTable(model, registry)
        self.actions: collections.Counter = collections.Counter()

    def fail(self, cls: type, message: str, node: onnx.NodeProto, hint: str) -> Exception:
        return cls(message, path=self.path, node=node.name or "<unnamed>",
                   op=f"{node.domain}::{node.op_type}", hint=hint)

    def lower_graph(self, nodes: Any) -> None:
        """Rewrite one node list in place; recurse into subgraphs."""
        if not any(n.domain == PLACEHOLDER_DOMAIN for n in nodes):
            for n in nodes:
                self._recurse(n)
            return
        new_nodes: list[onnx.NodeProto] = []
        self._scope_constants: dict = {}
        for n in nodes:
            if n.domain == PLACEHOLDER_DOMAIN:
                new_nodes.extend(self.lower_node(n))
            else:
                self._recurse(n)
                new_nodes.append(n)
        del nodes[:]
        nodes.extend(new_nodes)

    def _recurse(self, node: onnx.NodeProto) -> None:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                self.lower_graph(attr.g.node)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    self.lower_graph(g.node)

    def lower_node(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        op = self.registry.get(node.op_type)
        if op is None:
            raise self.fail(UnsupportedOpError, "no op definition for this custom op", node,
                            hint=f"define '{node.op_type}' in custom_ops/ as the README's 'Adding an op' "
                                 "shows, or remove the node before rewriting")
        self._check_arity(op, node)
        try:
            attrs = op.resolve_attrs({a.name: helper.get_attribute_value(a) for a in node.attribute},
                                     where=node.name)
        except OpDefinitionError as exc:
            raise self.fail(RewriteError, exc.message, node, exc.hint or "fix the node") from exc
        if self.lowering is Lowering.DECOMPOSE:
            return self._decompose(op, node, attrs)
        return [self._bind(op, node, attrs)]

    def _check_arity(self, op: OpDef, node: onnx.NodeProto) -> None:
        n_req = sum(not p.optional for p in op.inputs)
        if not n_req <= len(node.input) <= len(op.inputs):
            raise self.fail(RewriteError, f"has {len(node.input)} inputs; {op.name} takes "
                            f"{n_req}..{len(op.inputs)}", node, hint="re-export the model")
        if len(node.output) > len(op.outputs) or not node.output:
            raise self.fail(RewriteError, f"has {len(node.output)} outputs; {op.name} gives "
                            f"{len(op.outputs)}", node, hint="re-export the model")

    def _decompose(self, op: OpDef, node: onnx.NodeProto, attrs: dict[str, Any]) -> list[onnx.NodeProto]:
        dec = op.decomposition_for(self.opset)
        if dec is None:
            ranges = ", ".join(f"{d.name}: opset {d.min_opset}..{d.max_opset or ''}" for d in op.decompositions)
            raise self.fail(UnsupportedOpError, f"no decomposition valid at opset {self.opset}"
                            + (f" (has {ranges})" if ranges else ""), node,
                            hint="bind it to a kernel with --bind native or --bind python")
        builder = Builder(opset=self.opset, prefix=node.name or op.name, names=self.names,
                          types=self.types, node_name=node.name, op_name=op.qualified_name,
                          constants=self._scope_constants)
        inputs = list(node.input) + [""] * (len(op.inputs) - len(node.input))
        try:
            nodes = builder.finish(list(dec.build(builder, inputs, attrs)), list(node.output))
        except RewriteError as exc:
            raise self.fail(RewriteError, f"decomposition '{dec.name}': {exc.message}", node,
                            exc.hint or "fix the decomposition") from exc
        self.actions[(op.qualified_name, f"decompose:{dec.name}")] += 1
        return nodes

    def _bind(self, op: OpDef, node: onnx.NodeProto, attrs: dict[str, Any]) -> onnx.NodeProto:
        if self.lowering is Lowering.NATIVE:
            if not op.native:
                raise self.fail(UnsupportedOpError, "has no native kernel", node,
                                hint="decompose it (the default) or --bind python")
            domain, values = NATIVE_DOMAIN, attrs
        else:
            if op.python_kernel is None:
                raise self.fail(UnsupportedOpError, "has no Python kernel", node,
                                hint="decompose it (the default) or --bind native")
            from graphkit.runtime.python_kernels import encode_list_attr

            domain = PYTHON_DOMAIN
            values = {k: encode_list_attr(v) if op.attr(k).type.is_list else v for k, v in attrs.items()}
        bound = onnx.NodeProto()
        bound.CopyFrom(node)
        bound.domain = domain
        del bound.attribute[:]
        # Every attribute is written out: kernels read them without knowing defaults.
        bound.attribute.extend(helper.make_attribute(k, v) for k, v in values.items())
        self.actions[(op.qualified_name, f"bind:{self.lowering.value}")] += 1
        return bound


def _fix_opset_imports(model: onnx.ModelProto, opset: int) -> None:
    used = {n.domain for nodes in _all_node_lists(model) for n in nodes}
    imports = {imp.domain: imp for imp in model.opset_import}
    if PLACEHOLDER_DOMAIN in imports and PLACEHOLDER_DOMAIN not in used:
        keep = [imp for imp in model.opset_import if imp.domain != PLACEHOLDER_DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(keep)
    present = {imp.domain for imp in model.opset_import}
    if not present & set(_STANDARD_DOMAINS) and used & set(_STANDARD_DOMAINS):
        model.opset_import.append(helper.make_opsetid("", opset))
    for domain in sorted(used - present - set(_STANDARD_DOMAINS)):
        model.opset_import.append(helper.make_opsetid(domain, 1))


def check_model(model: onnx.ModelProto, registry: OpRegistry, *, path: str | None = None,
                context: str = "") -> None:
    """ONNX checker plus strict shape inference, custom ops known through their schemas."""
    # onnx's checker insists on a shape field in graph inputs/outputs; ONNX Runtime and
    # exporters do not. Give shapeless ones an empty shape during the check only.
    shapeless = [vi.type.tensor_type for g in _graphs(model.graph) for vi in (*g.input, *g.output)
                 if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")]
    with registry.onnx_schemas():
        try:
            for tt in shapeless:
                tt.shape.SetInParent()
            try:
                onnx.checker.check_model(model)
            finally:
                for tt in shapeless:
                    tt.ClearField("shape")
            onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValidationError(f"invalid model{context}: {first}", path=path,
                                  hint="fix the input model, or skip the check with --no-check") from exc


def _scopes(model: onnx.ModelProto) -> Iterator[tuple[Any, set[str], list[onnx.TensorProto]]]:
    """(node list, protected names, visible initializers) of every graph, subgraph and function."""
    def walk(graph: onnx.GraphProto, outer: list[onnx.TensorProto]):
        visible = [*outer, *graph.initializer]
        yield graph.node, {o.name for o in graph.output}, visible
        for node in graph.node:
            for attr in node.attribute:
                subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else (
                    attr.graphs if attr.type == onnx.AttributeProto.GRAPHS else [])
                for g in subgraphs:
                    yield from walk(g, visible)

    yield from walk(model.graph, [])
    for fn in model.functions:
        yield fn.node, set(fn.output), []


def rewrite_model(model: onnx.ModelProto, *, registry: OpRegistry | None = None,
                  lowering: Lowering = Lowering.DECOMPOSE, rules: Iterable[Rule] | None = None,
                  check: bool = True, path: str | None = None) -> tuple[onnx.ModelProto, RewriteReport]:
    """Apply ``rules`` then lower every custom:: node of ``model``; returns a new model and a report.

    ``model`` itself is not modified. A model where nothing applies comes back
    unchanged field for field.
    """
    registry = registry or default_registry()
    rule_set = rules if isinstance(rules, RuleSet) else RuleSet(rules or ())
    out = onnx.ModelProto()
    out.CopyFrom(model)
    report = RewriteReport(ops_before=_count_ops(out))
    has_custom = any(d == PLACEHOLDER_DOMAIN for d, _ in report.ops_before)
    if not len(rule_set) and (not has_custom or lowering is Lowering.KEEP):
        report.ops_after = report.ops_before.copy()
        return out, report
    opset = ai_onnx_opset(out) or _DEFAULT_OPSET
    lowerer = _Lowerer(out, registry, lowering, opset, path)
    if len(rule_set):
        def make_builder(node: onnx.NodeProto, rule_name: str) -> Builder:
            return Builder(opset=opset, prefix=node.name or rule_name, names=lowerer.names,
                           types=lowerer.types, node_name=node.name, op_name=rule_name)

        for nodes, protected, inits in list(_scopes(out)):
            apply_rules(nodes, rule_set, make_builder=make_builder, protected=protected,
                        initializers=inits, report=report.rules)
    if lowering is not Lowering.KEEP:
        lowerer.lower_graph(out.graph.node)
        for fn in out.functions:
            lowerer.lower_graph(fn.node)
    if not lowerer.actions and not report.rules.applied:
        report.ops_after = report.ops_before.copy()
        fresh = onnx.ModelProto()
        fresh.CopyFrom(model)
        return fresh, report
    _fix_opset_imports(out, opset)
    report.actions = lowerer.actions
    report.ops_after = _count_ops(out)
    if check:
        applied = ", ".join(sorted({how for _, how in lowerer.actions} | set(report.rules.applied)))
        check_model(out, registry, path=path, context=f" after rewrite ({applied})")
    return out, report
