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
captures the value); see :mod:`graphkit.rewrite.rules.pattern` for ``const``, ``optional``,
``either``, shared values, several outputs and ``*xs``. A matched inner node whose
output is used elsewhere is never swallowed. ``check(ctx, **bindings)`` may veto a match
with a reason; ``rewrite(op, **bindings)`` builds the replacement with the
:class:`~graphkit.rewrite.lowering.builder.Builder` and returns one tensor per pattern output
(returning an input removes the matched nodes: their consumers read the input).

Beside: scopes and their interface (graph/scopes.py), reports (rules/report.py), traced replacements
stamped in place (rules/stamps.py), node-list edits (graph/edit.py).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from graphkit.errors import GraphkitError, RewriteError, RuleError
from graphkit.rewrite.graph.edit import dead_producers, outer_names, prune_initializers, referenced, rename_inputs, \
    same_nodes, toposort
from graphkit.rewrite.graph.view import GraphView
from graphkit.rewrite.graph.walk import holds_graphs, subgraphs
from graphkit.rewrite.rules.matcher import Match, Matcher, deterministic
from graphkit.rewrite.rules.pattern import Either, Many, Out, PatternOps, PNode, Var, variables
from graphkit.rewrite.rules.report import MatchResult, OpDelta, RuleReport
from graphkit.rewrite.graph.scopes import Scope, model_scopes
from graphkit.rewrite.rules.stamps import UNTRACED, Stamps, report_stamps, stamp_matches
from graphkit.rewrite.rules.template import TracedReplacement, trace, traceable
from graphkit.rewrite.graph.types import TypeTable

__all__ = ["GraphPass", "MatchContext", "MatchResult", "OpDelta", "Rule", "RuleReport", "RuleSet", "Scope",
           "apply_rule_set"]


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
    is traced once and its node stamped on each match (graphkit.rewrite.rules.template);
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

    Runs in the same scopes as rules (main graph, subgraphs, functions), in the first
    round, and reports like them: the count of places it rewrote, or a reasoned failure.
    It edits ``scope.nodes`` in place, keeping them in topological order. ``main_only``:
    it runs in the main graph alone, where it may also change the model's inputs and
    outputs (``scope.add_input``, ``remove_input``, ``add_output``, ``remove_output``,
    ``rename``, ``prune``: graphkit.rewrite.graph.scopes).
    """

    name: str
    run: Callable[[Scope], Any]
    main_only: bool = False


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
    before = referenced(model) if any(isinstance(r, GraphPass) for r in active) else None
    if delta is None:
        delta = OpDelta(exact=False)
    elif before is not None:  # a graph pass may change any node: not followed
        delta.exact = False
    total = 0
    runs: dict[int, _RuleRun] = {}  # per rule, made once
    scopes = model_scopes(model, types, make_builder, base_dir, tree)
    try:
        for scope in reversed(scopes):
            total += _apply_scope(scope, active, rules.max_rounds, report, released, path, runs, delta)
    finally:
        for run in runs.values():
            run.close()
    # Rules reach initializers only through their scopes' lists (add_initializers() extends
    # them): where every list is empty, no initializer can have become unused.
    if total and (before is not None or any(scope.initializers for scope in scopes)):
        prune_initializers(model, released if before is None else released | before)
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
                if round_no or (rule.main_only and not scope.main):
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
        self.templates: dict[int, TracedReplacement | None] = {}
        self.fresh: Callable[[str], str] | None = None  # the Builder's name generator, for templates
        self.stamps = Stamps(delta, rule._patterns[0].anchor[1])  # told to the OpDelta at the end
        # One flat pattern (one node of distinct variables) without check: its matches are
        # found from the node's fields and stamped without a Match (stamp_matches).
        matcher = self.matchers[0][1]
        # Traced at all: not asked per match, and its code reaches nothing but its arguments.
        self.traced = _TEMPLATES and not rule.per_match and traceable(rule.rewrite)
        # Not with *xs: a count of its inputs may have no template, and the rewrite run per
        # match then must not read (types of) nodes stamped before it.
        self.lean = _FIRST and self.traced and rule.check is None \
            and len(rule._patterns) == 1 and matcher.flat is not None and matcher.flat[2] is None and rule._simple()
        self.anchor = rule._patterns[0].anchor

    def template(self, extra: int) -> TracedReplacement | None:
        """The traced replacement for matches binding ``extra`` inputs to ``*xs`` (-1: no
        ``*xs``), traced the first time it is asked for (the matcher's plan is flat)."""
        template = self.templates.get(extra, UNTRACED)
        if template is UNTRACED:
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
    stamp.released = released  # inputs a stamped node stops reading: initializers to prune
    matchers = run.matchers
    if run.lean:  # matches stamped as long as each has a template, in order; the rest below
        candidates = view.by_op.get(matchers[0][0], ())
        if candidates and run.fresh is None:  # names as a Builder of this rule makes them
            b = scope.make_builder(view.nodes[candidates[0]], rule.name)
            run.fresh = getattr(getattr(b, "_names", None), "fresh", None)
        if candidates and run.fresh is not None:
            done = stamp_matches(view, candidates, matchers[0][1], run, rule.name, stamp)
            if done == len(candidates):
                return report_stamps(view, stamp, report, rule.name)
    nodes = scope.nodes
    patterns = rule._patterns
    anchors = rule._anchor_ops  # the caller saw one of them in the scope
    # One pattern without choice points: Matcher.first finds its only match at a node
    # without generators; where there is none, _first_match runs to say why.
    first = matchers[0][1].first if _FIRST and len(patterns) == 1 and rule._simple() else None
    # A flat single-node pattern: its matches may get a traced replacement (see rules/template.py),
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
            if template is not None and output and fresh is not None and not (node.attribute and holds_graphs(node)):
                # (written after the loop: below; a node holding graphs takes the general path)
                used.add(index)
                checked.append((index, node, template, Stamps.name(fresh, node, name, template),
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
                if template is not None and output and not (node.attribute and holds_graphs(node)):
                    if fresh is None:
                        b = make_builder(node, name)
                        fresh = run.fresh = getattr(getattr(b, "_names", None), "fresh", None)
                    if fresh is not None:
                        used.add(index)
                        inputs = template.inputs(tuple(bound[n] for n in names_of), rest)
                        checked.append((index, node, template, Stamps.name(fresh, node, name, template), inputs,
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
        if not builder.aliases and same_nodes(new_nodes, [vnodes[i] for i in match.nodes]):
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
        return report_stamps(view, stamp, report, name, counted=flat_match is None)
    if stamped:  # each overwrote its node where it is (it reads every input the node read)
        report_stamps(view, stamp, report, name, counted=flat_match is None)
    # Producers that fed only the replaced nodes (constants, typically) die with them.
    gone = removed | set(replacements)
    orphans = _reads(view, gone)
    released |= orphans
    read = {name for new in replacements.values() for n in new for name in n.input} | set(aliases.values())
    # (a name the new nodes read keeps its producer: only the others are worth a look)
    dead = dead_producers(view, orphans - read, gone, read, scope.protected)
    if dead:
        released |= _reads(view, dead)
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
        rename_inputs(rebuilt, aliases)
    if reorder:
        rebuilt = toposort(rebuilt)
    del nodes[:]
    nodes.extend(rebuilt)
    delta.in_place = False
    report.applied[rule.name] = report.applied.get(rule.name, 0) + len(replacements)
    return len(replacements) + stamped, None


def _reads(view: GraphView, indices: Iterable[int]) -> set[str]:
    """What the nodes at ``indices`` read: their inputs, and the outer values their graphs read."""
    names = {name for i in indices for name in view.node_inputs(i) if name}
    for i in indices:
        node = view.nodes[i]
        if node.attribute and holds_graphs(node):
            names.update(name for g in subgraphs(node) for name in outer_names(g) if name)
    return names


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
