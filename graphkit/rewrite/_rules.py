"""Pattern rules and graph passes: match, check, replace, in every scope of a model.

A rule reads like the graph it matches::

    def pattern(op, x, y):
        return op.Add(op.Mul(x, 2.0), y)

    def rewrite(op, x, y):
        return op.my_add(x, y, _domain="custom")

    fuse = Rule("fuse_my_add", pattern, rewrite, commute=True)

Variables (``x``, ``y``) match any tensor; Python numbers match constants of that value
(a Constant node or an initializer whose elements all equal it); keyword arguments
match attributes (a value, a tuple, a predicate ``lambda v: ...``, or a variable that
captures the value); see :mod:`graphkit.rewrite._pattern` for ``const``, ``optional``,
``either``, shared values, several outputs and ``*xs``. A matched inner node whose
output is used elsewhere is never swallowed. ``check(ctx, **bindings)`` may veto a match
with a reason; ``rewrite(op, **bindings)`` builds the replacement with the
:class:`~graphkit.rewrite.builder.Builder` and returns one tensor per pattern output
(returning an input removes the matched nodes: their consumers read the input).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import operator
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from graphkit.errors import GraphkitError, RewriteError, RuleError
from graphkit.rewrite._graphview import GraphView
from graphkit.rewrite._matcher import Match, Matcher, deterministic
from graphkit.rewrite._pattern import Either, Many, Out, PatternOps, PNode, Var, variables
from graphkit.rewrite._template import Template, trace, traceable
from graphkit.rewrite._walk import AI_ONNX, graphs, subgraphs
from graphkit.rewrite.builder import TypeTable

__all__ = ["GraphPass", "MatchContext", "MatchResult", "OpDelta", "Rule", "RuleReport", "RuleSet", "Scope",
           "apply_rule_set"]



class MatchResult:
    """Success, or failure with a reason. Falsy when failed."""

    def __init__(self, ok: bool = True, reason: str = "") -> None:
        self.ok = ok
        self.reason = reason

    def fail(self, reason: str) -> "MatchResult":
        """A failed result saying why: ``return MatchResult().fail("x and y are the same")``."""
        return MatchResult(False, reason)

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return "MatchResult(ok)" if self.ok else f"MatchResult(fail: {self.reason})"


# ---------------------------------------------------------------- scopes

@dataclass
class Scope:
    """One node list of a model (main graph, subgraph or function body) and what it sees.

    ``types`` knows the model's element types and shapes (computed once per rewrite;
    empty in function bodies, whose types are the caller's).
    """

    nodes: Any  # the repeated NodeProto field, edited in place
    protected: set[str]  # graph outputs: their names must stay produced
    initializers: list[onnx.TensorProto]  # visible here (enclosing graphs' included)
    graph: onnx.GraphProto | None  # None in a function body
    types: TypeTable
    opset: int
    make_builder: Callable[[onnx.NodeProto, str], Any]
    base_dir: str | None = None  # the model file's directory: external data is read from there
    ops: list[str] | None = None  # the nodes' op types where already read (the first view takes them)

    def view(self) -> GraphView:
        """A fresh index of producers, consumers and constants (build it after editing nodes)."""
        ops, self.ops = self.ops, None
        return GraphView(self.nodes, protected=self.protected, initializers=self.initializers,
                         base_dir=self.base_dir, ops=ops)

    def builder(self, node: onnx.NodeProto, name: str) -> Any:
        """A Builder for nodes replacing ``node``. In a graph, ``op.initializer()`` collects
        tensors in its ``initializers`` list (a graph pass hands them to add_initializers());
        in a function body it makes Constant nodes."""
        b = self.make_builder(node, name)
        if self.graph is not None:
            b.initializers = []
        return b

    def add_initializers(self, tensors: Iterable[onnx.TensorProto]) -> list[onnx.NodeProto]:
        """Put ``tensors`` in this graph; in a function body, return them as Constant nodes."""
        tensors = list(tensors)
        if self.graph is not None:
            self.graph.initializer.extend(tensors)
            self.initializers.extend(tensors)
            return []
        return [helper.make_node("Constant", [], [t.name], name=t.name, value=t) for t in tensors]


# ---------------------------------------------------------------- rules

@dataclass
class MatchContext:
    """What ``check`` may look at: the matched nodes, constants, element types and shapes, the
    producer and the consumers of a tensor."""

    view: GraphView
    nodes: list[onnx.NodeProto]
    types: TypeTable = field(default_factory=TypeTable)
    opset: int = 0

    def constant(self, name: str) -> np.ndarray | None:
        """The value of ``name`` if it is a Constant node's output or an initializer."""
        return self.view.constant_value(name)

    def dtype(self, name: str) -> int | None:
        """The ONNX element type (``onnx.TensorProto.FLOAT``...) of tensor ``name``, None if unknown."""
        return self.types.elem_type(name)

    def shape(self, name: str) -> list[Any] | None:
        """The shape of ``name`` (ints, dim names, None for unknown dims); None if unknown."""
        return self.types.shape(name)

    def rank(self, name: str) -> int | None:
        """The number of dimensions of ``name``; None if unknown."""
        shape = self.shape(name)
        return None if shape is None else len(shape)

    def producer(self, name: str) -> onnx.NodeProto | None:
        """The node that produces tensor ``name`` in this scope (None for inputs and initializers)."""
        index = self.view.producer.get(name)
        return None if index is None else self.view.nodes[index]

    def consumers(self, name: str) -> list[onnx.NodeProto]:
        """The nodes of this scope that read tensor ``name``, each once, in node order (a node
        whose subgraph reads it counts; a graph output is no node: ``[]`` if nothing else reads it)."""
        indices = self.view.consumers.get(name, ())
        return [self.view.nodes[i] for i in sorted(set(indices))]


def _param_names(fn: Callable[..., Any], skip: int) -> list[tuple[str, bool]]:
    """(name, is_varargs) of ``fn``'s parameters after the first ``skip``."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    return [(p.name, p.kind is p.VAR_POSITIONAL) for p in params if p.kind is not p.VAR_KEYWORD]


@dataclass
class _Compiled:
    roots: list[Any]  # the pattern's output values
    anchor: tuple[str, str]  # (domain, op_type) of the first root's node
    vars: dict[str, Var] = field(default_factory=dict)  # every variable, by name
    simple: bool = False  # deterministic(): matched by Matcher.first, without generators


def _compile(name: str, pattern: Callable[..., Any]) -> list[_Compiled]:
    """The pattern function's graph; an ``either`` at the root is one pattern per alternative."""
    args = [Many(n) if star else Var(n) for n, star in _param_names(pattern, 1)]
    try:
        result = pattern(PatternOps(), *args)
    except TypeError as exc:
        raise RewriteError(f"rule '{name}': the pattern function failed: {exc}",
                           hint="build the pattern from op.X(...), variables, numbers, const(), "
                                "optional() and either()") from exc
    alternatives = result.alternatives if isinstance(result, Either) else [result]
    compiled = []
    for alt in alternatives:
        roots = list(alt) if isinstance(alt, tuple) else [alt]
        first = roots[0] if roots else None
        head = first.node if isinstance(first, Out) else first
        if not isinstance(head, PNode) or any(not isinstance(r, (PNode, Out)) for r in roots):
            raise RewriteError(f"rule '{name}': pattern must return an op, got {result!r}",
                               hint="return op.Something(...) (or a tuple of them) from the pattern function")
        compiled.append(_Compiled(roots, (head.domain, head.op_type)))
    return compiled


# _call_plan's answers, per function while it lives: a weak key, so that the cache keeps no
# rule's functions (nor what they capture) alive after the rule is gone.
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _call_plan(fn: Callable[..., Any]) -> tuple[tuple[str, str], ...]:
    """How ``_call`` passes bindings to ``fn``: (kind, name) per parameter after the first."""
    try:
        return _PLANS[fn]
    except KeyError:
        plan = _PLANS[fn] = _make_call_plan(fn)
        return plan
    except TypeError:  # not weakly referable (or not hashable): worked out each time
        return _make_call_plan(fn)


def _make_call_plan(fn: Callable[..., Any]) -> tuple[tuple[str, str], ...]:
    params = list(inspect.signature(fn).parameters.values())[1:]
    plan = []
    positional = any(p.kind is p.VAR_POSITIONAL for p in params)
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            plan.append(("star", p.name))
            positional = False  # what follows is keyword-only
        elif p.kind is p.VAR_KEYWORD:
            plan.append(("rest", ""))
        elif positional:
            plan.append(("arg", p.name))
        else:
            plan.append(("kw" if p.default is p.empty else "kw?", p.name))
    return tuple(plan)


def _caller(fn: Callable[..., Any]) -> Callable[[Any, dict[str, Any]], Any]:
    """``_call`` for one function: where it takes only positional parameters, without the
    plan's loop (made once per rule and rewrite: not cached, as it holds ``fn``)."""
    plan = _call_plan(fn)
    names = [name for _, name in plan]
    params = list(inspect.signature(fn).parameters.values())[1:]
    in_order = all(kind == "kw" and p.kind is p.POSITIONAL_OR_KEYWORD for (kind, _), p in zip(plan, params))
    if all(kind == "arg" for kind, _ in plan) or in_order:  # each parameter takes its binding by position
        return lambda first, bindings: fn(first, *map(bindings.get, names))
    if all(kind == "kw" for kind, _ in plan):
        return lambda first, bindings: fn(first, **{name: bindings.get(name) for name in names})
    return functools.partial(_call, fn)


def _call(fn: Callable[..., Any], first: Any, bindings: dict[str, Any]) -> Any:
    """``fn(first, ...)`` with the bindings its parameters name (``*xs`` gets a variadic list)."""
    args, kwargs = [first], {}
    plan = _call_plan(fn)
    for kind, name in plan:
        if kind == "arg":
            args.append(bindings.get(name))
        elif kind == "star":
            args.extend(bindings.get(name) or ())
        elif kind == "kw" or (kind == "kw?" and name in bindings):
            kwargs[name] = bindings.get(name)
        elif kind == "rest":
            named = {n for _, n in plan}
            kwargs.update({k: v for k, v in bindings.items() if k not in named})
    return fn(*args, **kwargs)


@dataclass
class Rule:
    """``pattern`` -> (``check``) -> ``rewrite``. See the module docstring.

    ``pattern`` may be a list of pattern functions: alternatives tried in order
    (variables a matching alternative does not bind reach ``check``/``rewrite`` as None).
    A single-node rule's ``rewrite`` that provably builds the same node for every match
    is traced once and its node stamped on each match (graphkit.rewrite._template);
    ``per_match=True`` calls it for every match instead.
    """

    name: str
    pattern: Callable[..., Any] | list[Callable[..., Any]]
    rewrite: Callable[..., Any]
    check: Callable[..., Any] | None = None
    commute: bool = False
    per_match: bool = False
    _patterns: list[_Compiled] = field(default_factory=list, init=False, repr=False)
    _simple_as_of: bool = field(default=False, init=False, repr=False, compare=False)
    _anchor_ops: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fns = self.pattern if isinstance(self.pattern, (list, tuple)) else [self.pattern]
        self._patterns = [c for fn in fns for c in _compile(self.name, fn)]
        bound: dict[str, Var] = {}
        for p in self._patterns:
            for r in p.roots:
                variables(r, bound)
                variables(r, p.vars)
            p.simple = deterministic(p.roots, self.commute)
        self._simple_as_of = self.commute
        self._anchor_ops = frozenset(p.anchor[1] for p in self._patterns)
        for part, fn in (("rewrite", self.rewrite), ("check", self.check)):
            if fn is None:
                continue
            params = list(inspect.signature(fn).parameters.values())[1:]
            unknown = [p.name for p in params if p.name not in bound and p.default is p.empty
                       and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
            if unknown:
                raise RewriteError(f"rule '{self.name}': {part}() takes {', '.join(map(repr, unknown))}, "
                                   f"which the pattern does not bind",
                                   hint="name the parameters after the pattern's variables")

    @classmethod
    def node(cls, name: str, op_type: str, rewrite: Callable[..., Any], *, domain: str = "",
             inputs: int = 1, outputs: int = 1, check: Callable[..., Any] | None = None,
             per_match: bool = False, **attrs: Any) -> "Rule":
        """A single-node rule: match ``domain::op_type`` (with attribute constraints) with
        ``inputs`` inputs; ``rewrite(op, x0, x1, ...)`` returns ``outputs`` tensors."""
        var_names = [f"x{i}" for i in range(inputs)]

        def pattern(op, *xs):
            return getattr(op, op_type)(*xs, _domain=domain, _outputs=outputs, **attrs)

        pattern.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter("op", inspect.Parameter.POSITIONAL_ONLY)]
            + [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in var_names])
        return cls(name, pattern, rewrite, check=check, per_match=per_match)

    def _simple(self) -> bool:
        """Is the (one) pattern deterministic()? (``commute`` may have been set since.)"""
        if self.commute != self._simple_as_of:
            for p in self._patterns:
                p.simple = deterministic(p.roots, self.commute)
            self._simple_as_of = self.commute
        return self._patterns[0].simple

    @property
    def anchor(self) -> tuple[str, str]:
        """(domain, op type) of the first pattern's root: the nodes matching starts from."""
        return self._patterns[0].anchor


@dataclass
class GraphPass:
    """A whole-scope rewrite: ``run(scope: Scope) -> int | MatchResult``.

    Runs in the same scopes as rules (main graph, subgraphs, functions), in the same
    rounds, and reports like them: the count of places it rewrote, or a reasoned failure.
    It edits ``scope.nodes`` in place, keeping them in topological order.
    """

    name: str
    run: Callable[[Scope], Any]


@dataclass
class RuleReport:
    """Per rule: rewrites, matches, and why it did not apply elsewhere.

    ``reasons`` holds one line per node that was a candidate and did not match (in the
    final round, so nothing repeats); ``failures`` counts them by kind.
    """

    applied: dict[str, int] = field(default_factory=dict)
    matched: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)
    failures: dict[str, collections.Counter] = field(default_factory=dict)

    def fail(self, rule: str, text: str, generic: str | None = None) -> None:
        """Record why ``rule`` did not apply somewhere: ``text`` names the place, ``generic``
        (default ``text``) is what the summary counts."""
        self.reasons.setdefault(rule, []).append(text)
        self.failures.setdefault(rule, collections.Counter())[text if generic is None else generic] += 1

    def apply(self, rule: str, count: int = 1) -> None:
        """Record that ``rule`` matched and rewrote ``count`` places."""
        self.applied[rule] = self.applied.get(rule, 0) + count
        self.matched[rule] = self.matched.get(rule, 0) + count

    def merge_round(self, other: "RuleReport") -> None:
        """Add one round's rewrites (each also a match)."""
        for name, n in other.applied.items():
            self.applied[name] = self.applied.get(name, 0) + n
            self.matched[name] = self.matched.get(name, 0) + n

    def merge_final(self, other: "RuleReport") -> None:
        """Add the last round a rule ran in: its reasons, and the matches it did not rewrite
        (vetoed by check, overlapping), counted once however many rounds saw them."""
        for name, n in other.matched.items():
            self.matched[name] = self.matched.get(name, 0) + n - other.applied.get(name, 0)
        for name, lines in other.reasons.items():
            self.reasons.setdefault(name, []).extend(lines)
        for name, counts in other.failures.items():
            self.failures.setdefault(name, collections.Counter()).update(counts)

    def explain(self, all: bool = False) -> str:
        """One summary per rule (rewrites, matches, top reasons with counts); ``all``: every node."""
        lines = []
        for name in sorted(set(self.applied) | set(self.reasons) | set(self.matched)):
            applied = self.applied.get(name, 0)
            matched = max(self.matched.get(name, 0), applied)
            missed = len(self.reasons.get(name, []))
            lines.append(f"rule {name}: applied {applied}x ({matched} matched, {missed} not)")
            if all:
                lines += [f"  no match: {reason}" for reason in self.reasons.get(name, [])]
                continue
            top = self.failures.get(name, collections.Counter()).most_common()
            for reason, n in top[:5]:
                lines.append(f"  {n}x no match: {reason}")
            if len(top) > 5:
                lines.append(f"  ... {sum(n for _, n in top[5:])} more of {len(top) - 5} other kinds "
                             f"(--explain=all lists every node)")
        return "\n".join(lines)


_ATTRIBUTES, _DOMAIN, _OP_TYPE = (operator.attrgetter(f) for f in ("attribute", "domain", "op_type"))


@dataclass
class OpDelta:
    """How applying rules changed the model's op counts: (domain, op_type) -> change. Not
    ``exact`` where it cannot tell (a graph pass ran; a node holding subgraphs came or went):
    count the model then."""

    counts: collections.Counter = field(default_factory=collections.Counter)
    exact: bool = True
    # Every rewrite so far overwrote nodes where they were: no node list rebuilt (the model's
    # graphs, node lists and graph inputs/outputs are the objects they were).
    in_place: bool = True

    def replaced(self, old: Iterable[onnx.NodeProto], new: Iterable[onnx.NodeProto]) -> None:
        """``old`` nodes left the model, ``new`` ones came."""
        if not self.exact:
            return
        old, new = list(old), list(new)
        graph_types = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for nodes in (old, new):  # attributes read in bulk: most nodes have none
            if any(a.type in graph_types for attrs in map(_ATTRIBUTES, nodes) if attrs for a in attrs):
                self.exact = False
                return
        self.counts.subtract(collections.Counter(zip(map(_DOMAIN, old), map(_OP_TYPE, old))))
        self.counts.update(zip(map(_DOMAIN, new), map(_OP_TYPE, new)))


class RuleSet:
    """An ordered group of rules applied together until none applies.

    Holds pattern :class:`Rule` and :class:`GraphPass` objects, applied round after round
    in every scope until a round changes nothing (at most ``max_rounds``; a set still
    rewriting then is a RuleError), and GraphSurgeonRule objects (run after them, on an
    onnx-graphsurgeon import of the model).
    """

    def __init__(self, rules: Iterable[Any], *, max_rounds: int = 10) -> None:
        self.rules = list(rules)
        self.max_rounds = max_rounds
        names = [r.name for r in self.rules]
        if len(names) != len(set(names)):
            raise RewriteError(f"rule names must be unique, got {names}")

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)


# ---------------------------------------------------------------- applying

def _scopes(model: onnx.ModelProto, types: TypeTable, make_builder: Callable, base_dir: str | None,
            tree: list[tuple[onnx.GraphProto, int, list[str] | None]] | None = None) -> list[Scope]:
    """Every scope, outer before inner (callers go through it reversed: rebuilding a node
    list copies its nodes, subgraphs included). ``tree``: the main graph and its subgraphs
    as ModelIndex.tree has them, where the caller has them (their nodes are not walked again;
    their op types, where read, go to the scopes' first views).

    No nested functions: a recursive closure is a reference cycle, and it would keep every
    scope (and through their type tables the model) alive until the cyclic collector runs."""
    model_opset = next((i.version for i in model.opset_import if i.domain in AI_ONNX), 1)
    out: list[Scope] = []
    if tree is None:
        _walk_scopes(out, model.graph, [], model_opset, types, make_builder, base_dir)
    else:
        for graph, parent, ops in tree:
            if parent < 0:
                made = _scope(graph, [], model_opset, types, make_builder, base_dir)
            else:
                up = out[parent]
                made = _scope(graph, up.initializers, model_opset, _ScopeTypes(up.types, graph), make_builder,
                              base_dir)
            made.ops = ops
            out.append(made)
    for fn in model.functions:
        opset = next((i.version for i in fn.opset_import if i.domain in AI_ONNX), model_opset)
        out.append(Scope(fn.node, set(fn.output), [], None, TypeTable(), opset, make_builder, base_dir))
        for node in fn.node:
            for g in subgraphs(node):
                _walk_scopes(out, g, [], opset, TypeTable(), make_builder, base_dir)
    return out


def _scope(graph: onnx.GraphProto, outer: list[onnx.TensorProto], opset: int, tt: Any, make_builder: Callable,
           base_dir: str | None) -> Scope:
    visible = list(outer)  # a list of the scope's own: add_initializers() extends it
    if graph.initializer:
        # An initializer that is also a graph input may be fed at run time: not a constant.
        fed = {i.name for i in graph.input}
        visible += [t for t in graph.initializer if t.name not in fed]
    return Scope(graph.node, {o.name for o in graph.output}, visible, graph, tt, opset, make_builder, base_dir)


def _walk_scopes(out: list[Scope], graph: onnx.GraphProto, outer: list[onnx.TensorProto], opset: int, tt: Any,
                 make_builder: Callable, base_dir: str | None) -> None:
    """``graph``'s scope, then its subgraphs', depth first, onto ``out``."""
    made = _scope(graph, outer, opset, tt, make_builder, base_dir)
    out.append(made)
    for node in made.nodes:
        if node.attribute:
            for g in subgraphs(node):
                _walk_scopes(out, g, made.initializers, opset, _ScopeTypes(tt, g), make_builder, base_dir)


class _ScopeTypes:
    """``table.scope(graph)``, looked up the first time a rule asks a subgraph's types: the
    forward typing pass that telling scopes apart needs runs then, or not at all (a rule
    that reads no type costs no typing of the model)."""

    __slots__ = ("_graph", "_scope", "_table")

    def __init__(self, table: TypeTable, graph: onnx.GraphProto) -> None:
        self._table, self._graph, self._scope = table, graph, None

    def __getattr__(self, name: str) -> Any:
        scope = self._scope
        if scope is None:
            scope = self._scope = self._table.scope(self._graph)
        return getattr(scope, name)


def _referenced(model: onnx.ModelProto) -> set[str]:
    """Every tensor name read anywhere in the model (node inputs, graph outputs)."""
    names: set[str] = set()
    for g in graphs(model.graph):
        names.update(o.name for o in g.output)
        for n in g.node:
            names.update(n.input)
    for fn in model.functions:
        for n in fn.node:
            names.update(n.input)
            for sub in subgraphs(n):
                for g in graphs(sub):
                    names.update(o.name for o in g.output)
                    for m in g.node:
                        names.update(m.input)
    return names


def apply_rule_set(model: onnx.ModelProto, rules: RuleSet, *, make_builder: Callable[[onnx.NodeProto, str], Any],
                   types: TypeTable, report: RuleReport, path: str | None = None,
                   delta: OpDelta | None = None,
                   tree: list[tuple[onnx.GraphProto, int, list[str] | None]] | None = None) -> int:
    """Apply the pattern rules and graph passes of ``rules`` to every scope of ``model`` in place.

    Initializers that a rewrite leaves unused are removed from the model (the external
    data files they point to are not touched). ``path``, the model's file, is where
    external weights are read from when a pattern needs their values. Returns the
    number of rewrites; ``delta``, if given, learns how the op counts changed. ``tree``:
    the model's ModelIndex.tree, where the caller has it.
    """
    import os

    base_dir = os.path.dirname(os.path.abspath(path)) if path else None
    active = [r for r in rules if isinstance(r, (Rule, GraphPass))]
    if not active:
        return 0
    # Names a rewrite stopped reading (or initializers it made): the only initializers that
    # can have become unused. A graph pass may drop any read: then compare with a full count.
    released: set[str] = set()
    before = _referenced(model) if any(isinstance(r, GraphPass) for r in active) else None
    if delta is None:
        delta = OpDelta(exact=False)
    elif before is not None:  # a graph pass may change any node: not followed
        delta.exact = False
    total = 0
    runs: dict[int, _RuleRun] = {}  # per rule, made once
    scopes = _scopes(model, types, make_builder, base_dir, tree)
    try:
        for scope in reversed(scopes):
            total += _apply_scope(scope, active, rules.max_rounds, report, released, path, runs, delta)
    finally:
        for run in runs.values():
            run.close()
    # Rules reach initializers only through their scopes' lists (add_initializers() extends
    # them): where every list is empty, no initializer can have become unused.
    if total and (before is not None or any(scope.initializers for scope in scopes)):
        _prune_initializers(model, released if before is None else released | before)
    return total


def _apply_scope(scope: Scope, rules: list[Any], max_rounds: int, report: RuleReport, released: set[str],
                 path: str | None, runs: dict[int, "_RuleRun"], delta: OpDelta) -> int:
    """Rules round after round until a round changes nothing; graph passes in the first round.

    Each rule's reasons are kept from the last round it ran in, so nothing repeats.
    """
    total = 0
    last: dict[str, RuleReport] = {}
    view: GraphView | None = None  # the scope's index (its op types: by_op), while it holds
    for round_no in range(max_rounds):
        changed_by: dict[str, int] = {}
        for rule in rules:
            if isinstance(rule, GraphPass):
                if round_no:
                    continue
                mine = last[rule.name] = RuleReport()
                n = _apply_pass(scope, rule, mine, path)
                view = scope.ops = None  # the pass may have changed any node (the op types read before too)
                delta.in_place = False
            else:
                if view is None:
                    view = scope.view()
                if rule._anchor_ops.isdisjoint(view.by_op):  # no node to start from: nothing to report
                    last[rule.name] = _NO_REPORT
                    continue
                mine = last[rule.name] = RuleReport()
                n, view = _apply_rule(scope, view, rule, mine, released, path, runs, delta)
            report.merge_round(mine)
            if n:
                changed_by[rule.name] = n
        total += sum(changed_by.values())
        if not changed_by:
            for mine in last.values():
                report.merge_final(mine)
            return total
    names = ", ".join(f"'{n}' ({k}x)" for n, k in changed_by.items())
    raise RuleError(f"rules did not converge: after {max_rounds} rounds rule {names} still rewrites", path=path,
                    hint="make the replacement something the pattern does not match again "
                         "(or raise RuleSet(max_rounds=...))")


_NO_REPORT = RuleReport()  # a rule's round in a scope without its anchor op (never written to)


def _apply_pass(scope: Scope, gpass: GraphPass, report: RuleReport, path: str | None) -> int:
    with _user_code(gpass.name, "run", None, path):
        result = gpass.run(scope)
    if isinstance(result, bool) or not isinstance(result, int):
        reason = getattr(result, "reason", "") or "returned no count"
        report.fail(gpass.name, reason, reason)
        return 0
    if result:
        report.apply(gpass.name, result)
    else:
        report.fail(gpass.name, "rewrote nothing", "rewrote nothing")
    return result


# Matcher.first for deterministic patterns; False: the generators for every pattern (what the
# differential test compares it with).
_FIRST = True
# Traced replacements stamped on single-node matches; False: rewrite() per match (likewise).
_TEMPLATES = True
_UNTRACED = object()


class _RuleRun:
    """What applying one rule keeps from scope to scope: its matchers (pointed at each
    scope's view), the rewrite's caller, one builder restarted for every match."""

    __slots__ = ("anchor", "builder", "call", "fresh", "lean", "matchers", "restart", "stamps", "templates",
                 "traced")

    def __init__(self, rule: Rule, view: GraphView, opset: int, delta: OpDelta) -> None:
        self.matchers = [(p.anchor[1], Matcher(p.roots, commute=rule.commute, view=view, rule=rule.name,
                                               opset=opset, vars=p.vars)) for p in rule._patterns]
        self.call = _caller(rule.rewrite)
        self.builder: Any = None
        self.restart: Callable[[str, str], None] | None = None
        # Count of *xs inputs (-1: none) -> the traced replacement, None where rewrite runs per match.
        self.templates: dict[int, Template | None] = {}
        self.fresh: Callable[[str], str] | None = None  # the Builder's name generator, for templates
        self.stamps = _Stamps(delta, rule._patterns[0].anchor[1])  # told to the OpDelta at the end
        # One flat pattern (one node of distinct variables) without check: its matches are
        # found from the node's fields and stamped without a Match (_stamp_matches).
        matcher = self.matchers[0][1]
        # Traced at all: not asked per match, and its code reaches nothing but its arguments.
        self.traced = _TEMPLATES and not rule.per_match and traceable(rule.rewrite)
        # Not with *xs: a count of its inputs may have no template, and the rewrite run per
        # match then must not read (types of) nodes stamped before it.
        self.lean = _FIRST and self.traced and rule.check is None \
            and len(rule._patterns) == 1 and matcher.flat is not None and matcher.flat[2] is None and rule._simple()
        self.anchor = rule._patterns[0].anchor

    def template(self, extra: int) -> Template | None:
        """The traced replacement for matches binding ``extra`` inputs to ``*xs`` (-1: no
        ``*xs``), traced the first time it is asked for (the matcher's plan is flat)."""
        template = self.templates.get(extra, _UNTRACED)
        if template is _UNTRACED:
            _, names_of, many = self.matchers[0][1].flat
            template = self.templates[extra] = trace(self.call, names_of, many, max(extra, 0), self.anchor)
        return template

    def close(self) -> None:
        self.stamps.count()
        if self.restart is not None:
            self.builder._release()
        self.builder = self.restart = None


def _apply_rule(scope: Scope, view: GraphView, rule: Rule, report: RuleReport, released: set[str],
                path: str | None, runs: dict[int, _RuleRun], delta: OpDelta) -> tuple[int, GraphView | None]:
    """Rewrite the matches of ``rule`` in ``scope`` (indexed by ``view``); returns how many and
    the view if it still holds (None: the caller builds another)."""
    run = runs.get(id(rule))
    if run is None:
        run = runs[id(rule)] = _RuleRun(rule, view, scope.opset, delta)
    else:
        for _, matcher in run.matchers:
            matcher.view, matcher.opset, matcher.commute = view, scope.opset, rule.commute
    stamp = run.stamps
    stamp.indices, stamp.ops = [], []  # this scope's
    matchers = run.matchers
    if run.lean:  # matches stamped as long as each has a template, in order; the rest below
        candidates = view.by_op.get(matchers[0][0], ())
        if candidates and run.fresh is None:  # names as a Builder of this rule makes them
            b = scope.make_builder(view.nodes[candidates[0]], rule.name)
            run.fresh = getattr(getattr(b, "_names", None), "fresh", None)
        if candidates and run.fresh is not None:
            done = _stamp_matches(view, candidates, matchers[0][1], run, rule.name, stamp)
            if done == len(candidates):
                return _stamped(view, stamp, report, rule.name)
    nodes = scope.nodes
    patterns = rule._patterns
    anchors = rule._anchor_ops  # the caller saw one of them in the scope
    # One pattern without choice points: Matcher.first finds its only match at a node
    # without generators; where there is none, _first_match runs to say why.
    first = matchers[0][1].first if _FIRST and len(patterns) == 1 and rule._simple() else None
    # A flat single-node pattern: its matches may get a traced replacement (see _template.py),
    # found from the matched node's fields alone where there is no check to hand bindings to.
    flat = matchers[0][1].flat if first is not None and run.traced else None
    flat_match = matchers[0][1].flat_match if flat is not None and rule.check is None else None
    names_of, many = (flat[1], flat[2]) if flat is not None else ((), None)
    by_op = view.by_op
    if len(anchors) == 1:
        candidates = by_op.get(next(iter(anchors)), ())
    else:
        candidates = sorted(i for op in anchors for i in by_op.get(op, ()))
    if stamp.indices:
        candidates = candidates[len(stamp.indices):]
    fresh = run.fresh
    used: set[int] = set(stamp.indices)
    for _, matcher in matchers:
        matcher.taken = used  # later matches skip nodes earlier ones rewrite
    replacements: dict[int, list[onnx.NodeProto]] = {}
    # Templates stamped after the loop, as replacements are written (named now, in order): a
    # check or a rewrite run per match reads the nodes and types as the rule found them.
    checked: list[tuple] = []
    removed: set[int] = set()
    aliases: dict[str, str] = {}
    reorder = False
    name, check, call = rule.name, rule.check, run.call
    protected = scope.protected
    alias = lambda out: out not in protected and out not in view.outer_used  # noqa: E731
    in_graph = scope.graph is not None
    make_builder, lookup = scope.make_builder, view.constant_value
    vnodes = view.nodes
    builder, restart = run.builder, run.restart
    if restart is not None:  # the builder of an earlier scope: this scope's constants and initializers
        builder._lookup = lookup
        builder.initializers = [] if in_graph else None
    for index in candidates:
        if index in used:
            continue
        node = vnodes[index]
        if flat_match is not None and (found := flat_match(index)) is not None:
            domain, bound_names, rest, output, _ = found
            template = run.template(-1 if many is None else len(rest))
            if template is not None and output and fresh is not None:  # (written after the loop: below)
                used.add(index)
                checked.append((index, node, template, _Stamps.name(fresh, node, name, template),
                                template.inputs(bound_names, rest), output, domain))
                continue
        match = None if first is None else first(index)
        if match is not None:  # first() refuses nodes taken by earlier matches: no overlap
            report.matched[name] = report.matched.get(name, 0) + 1
            if check is not None:
                ctx = MatchContext(view, [vnodes[i] for i in match.nodes], scope.types, scope.opset)
                try:
                    verdict = _call(check, ctx, match.bindings)
                except GraphkitError:
                    raise
                except Exception as exc:
                    raise _user_error(name, "check", node, path, exc) from exc
                if not verdict:
                    reason = (verdict.reason or "check failed") if isinstance(verdict, MatchResult) else \
                        f"check returned {verdict!r}"
                    report.fail(name, f"{_label(node, view, index)}: {reason}", reason)
                    continue
            if flat is not None:  # (with a check: the bindings it was handed)
                bound = match.bindings
                rest = bound[many] if many is not None else []
                template = run.template(-1 if many is None else len(rest))
                output = match.outputs[0]
                if template is not None and output:
                    if fresh is None:
                        b = make_builder(node, name)
                        fresh = run.fresh = getattr(getattr(b, "_names", None), "fresh", None)
                    if fresh is not None:
                        used.add(index)
                        inputs = template.inputs(tuple(bound[n] for n in names_of), rest)
                        checked.append((index, node, template, _Stamps.name(fresh, node, name, template), inputs,
                                        output, node.domain))
                        continue
        else:
            label = _label(node, view, index)
            match, failure, structural = _first_match(rule, matchers, index, view, scope, used, label, path)
            if structural:
                report.matched[name] = report.matched.get(name, 0) + 1
            if match is None:
                report.fail(name, *failure)
                continue
        if builder is None:  # what scope.builder() makes, restarted for each later match
            builder, restart = _new_builder(make_builder, node, name, in_graph, lookup, run)
        elif restart is not None:
            restart(node.name or name, node.name)  # the prefix and name make_builder gives
        else:
            builder = make_builder(node, name)
            if in_graph:
                builder.initializers = []
            builder._lookup = lookup
        try:
            results = call(builder, match.bindings)
        except GraphkitError:
            raise
        except Exception as exc:
            raise _user_error(name, "rewrite", node, path, exc) from exc
        outputs = match.outputs
        if results.__class__ is not str or len(outputs) != 1:
            results = _results(rule, results, len(outputs), node, path)
        else:
            results = [results]
        new_nodes = builder.finish(results, outputs, alias=alias)
        if not builder.aliases and _same_nodes(new_nodes, [vnodes[i] for i in match.nodes]):
            report.fail(name, f"{_label(node, view, index)}: the replacement is the matched node itself "
                        f"(output '{outputs[0]}' keeps its name)", "the replacement is the matched node itself")
            continue
        if builder.initializers:
            released.update(t.name for t in builder.initializers)
            new_nodes = scope.add_initializers(builder.initializers) + new_nodes
        if builder.aliases:
            aliases.update(builder.aliases)
        matched = match.nodes
        if len(matched) == 1:
            used.add(index)
            replacements[index] = new_nodes
        else:
            used.update(matched)
            last = max(matched)
            replacements[last] = new_nodes
            removed.update(i for i in matched if i != last)
        reorder |= len(outputs) > 1
    for args in checked:
        stamp.write(*args)
    del checked
    stamped = len(stamp.indices)
    if not replacements:
        return _stamped(view, stamp, report, name, counted=flat_match is None)
    if stamped:  # each overwrote its node where it is (it reads every input the node read)
        _stamped(view, stamp, report, name, counted=flat_match is None)
    # Producers that fed only the replaced nodes (constants, typically) die with them.
    gone = removed | set(replacements)
    orphans = {name for i in gone for name in view.node_inputs(i) if name}
    released |= orphans
    read = {name for new in replacements.values() for n in new for name in n.input} | set(aliases.values())
    # (a name the new nodes read keeps its producer: only the others are worth a look)
    dead = _dead_producers(view, orphans - read, gone, read, scope.protected)
    if not (removed or dead or aliases or reorder) and all(len(new) == 1 for new in replacements.values()):
        if delta.exact:
            delta.replaced([vnodes[i] for i in replacements], [new[0] for new in replacements.values()])
        for index, new in replacements.items():  # one node for one: overwrite it where it is
            nodes[index].CopyFrom(new[0])
        report.applied[rule.name] = report.applied.get(rule.name, 0) + len(replacements)
        return len(replacements) + stamped, None
    gone |= dead
    if delta.exact:
        delta.replaced([vnodes[i] for i in sorted(gone)], [n for new in replacements.values() for n in new])
    rebuilt = []
    for index, node in enumerate(nodes):
        if index in replacements:
            rebuilt.extend(replacements[index])
        elif index not in gone:
            rebuilt.append(node)
    if aliases:
        _rename_inputs(rebuilt, aliases)
    if reorder:
        rebuilt = _toposort(rebuilt)
    del nodes[:]
    nodes.extend(rebuilt)
    delta.in_place = False
    report.applied[rule.name] = report.applied.get(rule.name, 0) + len(replacements)
    return len(replacements) + stamped, None


def _stamp_matches(view: GraphView, candidates: Any, matcher: Matcher, run: _RuleRun, rule: str,
                   stamp: "_Stamps") -> int:
    """Stamp the template on the matches at ``candidates`` (a flat pattern, no check), in
    order, up to the first that has none (no match, no template); returns how many.
    (``_Stamps.name`` and ``write`` inlined: this loop runs once per match.)"""
    flat_match, fresh, templates = matcher.flat_match, run.fresh, run.templates
    many = matcher.flat[2]
    matcher.taken = set()  # single nodes in order: no match overlaps an earlier one
    nodes = view.nodes
    indices, ops, domains, made = stamp.indices, stamp.ops, stamp.domains, stamp.made
    done = 0
    for index in candidates:
        found = flat_match(index)
        if found is None:
            break
        domain, names, rest, output, node = found
        extra = -1 if many is None else len(rest)
        template = templates.get(extra, _UNTRACED)
        if template is _UNTRACED:
            template = run.template(extra)
        if template is None or not output:
            break
        if node is None:
            node = nodes[index]
        if node.attribute and not stamp.holds_graphs:
            stamp.holds_graphs = any(a.type in _GRAPH_TYPES for a in node.attribute)
        op_type = template.op_type
        node_name = fresh(f"{node.name or rule}/{op_type}")
        fresh(f"{node_name}_out")
        node.CopyFrom(template.node)
        node.input.extend(names if template.same_inputs and not rest else template.inputs(names, rest))
        node.output.append(output)
        node.name = node_name
        indices.append(index)
        ops.append(op_type)
        domains[domain] = domains.get(domain, 0) + 1
        key = id(template)
        made[key] = (template, made[key][1] + 1) if key in made else (template, 1)
        done += 1
    return done


def _stamped(view: GraphView, stamp: "_Stamps", report: RuleReport, rule: str,
             counted: bool = False) -> tuple[int, GraphView | None]:
    """Report the stamped matches (``counted``: as matches too, already), tell the OpDelta;
    the count and the view if it still holds."""
    stamped = len(stamp.indices)
    if not stamped:
        return 0, view
    if not counted:
        report.matched[rule] = report.matched.get(rule, 0) + stamped
    report.applied[rule] = report.applied.get(rule, 0) + stamped
    return stamped, view if view.restamp(stamp.indices, stamp.ops) else None


def _new_builder(make_builder: Callable[[onnx.NodeProto, str], Any], node: onnx.NodeProto, name: str,
                 in_graph: bool, lookup: Callable[[str], Any], run: _RuleRun) -> tuple[Any, Any]:
    """What scope.builder() makes, and its restart (kept on ``run`` for later matches and scopes)."""
    builder = make_builder(node, name)
    if in_graph:
        builder.initializers = []
    builder._lookup = lookup
    restart = getattr(builder, "_restart", None)
    if restart is not None:
        run.builder, run.restart = builder, restart
    return builder, restart


_GRAPH_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


class _Stamps:
    """Matched nodes overwritten with their template's node, named and wired as the Builder
    would make it: the fields CopyFrom of the per-match replacement gives. Keeps what the
    op counts and the view need (which nodes, of which op now, from which domain)."""

    __slots__ = ("delta", "domains", "holds_graphs", "indices", "made", "op_type", "ops")
    # indices, ops: the current scope's; domains, made, holds_graphs: every scope's

    def __init__(self, delta: OpDelta, op_type: str) -> None:
        self.delta, self.op_type = delta, op_type  # op_type: the matched nodes'
        self.indices: list[int] = []
        self.ops: list[str] = []
        self.domains: dict[str, int] = {}
        self.made: dict[int, tuple[Template, int]] = {}
        self.holds_graphs = False

    @staticmethod
    def name(fresh: Callable[[str], str], node: onnx.NodeProto, rule: str, template: Template) -> str:
        """The names the Builder would give the node and its output (which finish() replaces)."""
        name = fresh(f"{node.name or rule}/{template.op_type}")
        fresh(f"{name}_out")
        return name

    def write(self, index: int, node: onnx.NodeProto, template: Template, name: str, inputs: Any, output: str,
              domain: str) -> None:
        """Overwrite ``node`` (at ``index``) with the template's node, so named and wired."""
        if node.attribute and not self.holds_graphs:
            self.holds_graphs = any(a.type in _GRAPH_TYPES for a in node.attribute)
        node.CopyFrom(template.node)
        node.input.extend(inputs)
        node.output.append(output)
        node.name = name
        self.indices.append(index)
        self.ops.append(template.op_type)
        self.domains[domain] = self.domains.get(domain, 0) + 1
        made = self.made.get(id(template))
        self.made[id(template)] = (template, 1 if made is None else made[1] + 1)

    def count(self) -> None:
        """Tell the OpDelta (once, when done with every scope)."""
        delta = self.delta
        if self.holds_graphs:
            delta.exact = False
        if delta.exact:
            for domain, n in self.domains.items():
                delta.counts[(domain, self.op_type)] -= n
            for template, n in self.made.values():
                delta.counts[(template.domain, template.op_type)] += n
        self.domains, self.made = {}, {}


def _label(node: onnx.NodeProto, view: GraphView, index: int) -> str:
    return f"node '{node.name or view.ops[index]}'"


def _results(rule: Rule, results: Any, wanted: int, node: onnx.NodeProto, path: str | None) -> list[str]:
    """``rewrite``'s return value as a list of one tensor name per pattern output."""
    if isinstance(results, str):
        results = [results]
    elif isinstance(results, (tuple, list)) and all(isinstance(r, str) for r in results):
        results = list(results)
    else:
        raise RuleError(f"rule '{rule.name}': rewrite() returned {results!r}, not tensor names", path=path,
                        node=node.name or node.op_type, op=node.op_type,
                        hint="return the name op.X(...) gave (or a tuple of them, one per pattern output)")
    if len(results) != wanted:
        raise RuleError(f"rule '{rule.name}': rewrite() returned {len(results)} tensors for the pattern's "
                        f"{wanted} outputs", path=path, node=node.name or node.op_type, op=node.op_type,
                        hint="return one tensor per value the pattern function returns")
    return results


def _first_match(rule: Rule, matchers: list[tuple[str, Matcher]], index: int, view: GraphView, scope: Scope,
                 used: set[int], label: str, path: str | None) -> tuple[Match | None, tuple[str, str], bool]:
    """The first match at ``index`` that overlaps no earlier one and passes ``check``;
    the reason when there is none; whether the pattern matched at all."""
    failure = (f"{label}: no match", "no match")
    structural = False
    op_type = view.nodes[index].op_type
    for anchor_op, matcher in matchers:
        if anchor_op != op_type:
            continue
        found = False
        for match in matcher.matches(index):
            found = True
            if used.intersection(match.nodes):
                failure = (f"{label} overlaps an earlier match", "overlaps an earlier match")
                continue
            structural = True
            if rule.check is None:
                return match, failure, structural
            ctx = MatchContext(view, [view.nodes[i] for i in match.nodes], scope.types, scope.opset)
            with _user_code(rule.name, "check", view.nodes[index], path):
                verdict = _call(rule.check, ctx, match.bindings)
            if verdict:
                return match, failure, structural
            reason = (verdict.reason or "check failed") if isinstance(verdict, MatchResult) else \
                f"check returned {verdict!r}"
            failure = (f"{label}: {reason}", reason)
        if not found and not structural:  # a check's veto on another alternative's match says more
            text, generic = matcher.reason()
            failure = (text if text.startswith(label) else f"{label}: {text}", generic)
    return None, failure, structural


def _same_nodes(new: list[onnx.NodeProto], old: list[onnx.NodeProto]) -> bool:
    """Is the replacement the matched nodes again (names aside)? Then it changes nothing:
    an Identity kept for a graph output, typically."""
    if len(new) != len(old):
        return False
    if len(new) == 1:
        if new[0].op_type != old[0].op_type:
            return False
    elif sorted(n.op_type for n in new) != sorted(n.op_type for n in old):
        return False
    key = lambda n: (n.domain, n.op_type, tuple(n.input), tuple(n.output),  # noqa: E731
                     tuple(a.SerializeToString() for a in n.attribute))
    return sorted(map(key, new)) == sorted(map(key, old))


def _rename_inputs(nodes: list[onnx.NodeProto], aliases: dict[str, str]) -> None:
    def resolve(name: str) -> str:
        seen = set()
        while name in aliases and name not in seen:
            seen.add(name)
            name = aliases[name]
        return name

    for node in nodes:
        for i, name in enumerate(node.input):
            if name in aliases:
                node.input[i] = resolve(name)


def _toposort(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` in an order where producers come first, otherwise keeping their order."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = []
    for n in nodes:
        names = list(n.input)
        for g in subgraphs(n):
            names.extend(_outer_names(g))
        deps.append([producer[x] for x in names if x in producer])
    done = [False] * len(nodes)
    order: list[onnx.NodeProto] = []
    for start in range(len(nodes)):
        stack = [(start, 0)]
        while stack:
            i, k = stack.pop()
            if done[i]:
                continue
            if k < len(deps[i]):
                stack.append((i, k + 1))
                j = deps[i][k]
                if not done[j]:
                    stack.append((j, 0))
                continue
            done[i] = True
            order.append(nodes[i])
    return order


def _outer_names(graph: onnx.GraphProto) -> list[str]:
    return [name for g in graphs(graph) for n in g.node for name in n.input]


def _dead_producers(view: GraphView, candidates: set[str], gone: set[int], read: set[str],
                    protected: set[str]) -> set[int]:
    """Producers of ``candidates`` that nothing reads once the ``gone`` nodes are gone (and the
    new nodes read ``read``), transitively; indices into ``view``."""
    dead: set[int] = set()
    work = [name for name in candidates if name in view.producer]
    while work:
        index = view.producer[work.pop()]
        if index in dead or index in gone:
            continue
        if any(out in protected or out in read
               or any(c not in dead and c not in gone for c in view.consumers.get(out, ()))
               for out in view.outputs[index] if out):
            continue
        dead.add(index)
        work.extend(n for n in view.inputs[index] if n in view.producer)
    return dead


def _prune_initializers(model: onnx.ModelProto, released: set[str]) -> None:
    """Drop the initializers named in ``released`` (read before a rewrite, or made by one) that
    are read no more.

    Graph inputs of the same name stay (they may be fed). A dropped initializer stored as
    external data is only removed from the model; its file is left as it is.
    """
    owners = [g for g in graphs(model.graph) if g.initializer]
    if not owners or not any(t.name in released for g in owners for t in g.initializer):
        return  # no initializer a rewrite released: nothing to count
    after = _referenced(model)
    for g in owners:
        inputs = {i.name for i in g.input}
        dead = [k for k, t in enumerate(g.initializer)
                if t.name in released and t.name not in after and t.name not in inputs]
        for k in reversed(dead):
            del g.initializer[k]


@contextlib.contextmanager
def _user_code(rule: str, part: str, node: onnx.NodeProto | None, path: str | None):
    """Turn an exception from a rule's own code into a RuleError naming rule and node."""
    try:
        yield
    except GraphkitError:
        raise
    except Exception as exc:
        raise _user_error(rule, part, node, path, exc) from exc


def _user_error(rule: str, part: str, node: onnx.NodeProto | None, path: str | None, exc: Exception) -> RuleError:
    return RuleError(f"rule '{rule}': {part}() raised {type(exc).__name__}: {exc}", path=path,
                     node=None if node is None else (node.name or node.op_type),
                     op=None if node is None else node.op_type,
                     hint="fix the rule (rerun with --debug for the traceback)")
