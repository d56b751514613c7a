"""Applying a RuleSet: its rules and graph passes in every scope of a model, round after round.

:func:`apply_rule_set` runs each scope (:func:`_apply_scope`); one rule in one scope is
:func:`_apply_rule`, in steps: the rule's run pointed at the scope (:func:`_run_for`), a lean
rule's matches stamped in place (:func:`_stamp_lean`), the other matches found, checked and
their replacements built (:meth:`_RuleInScope.collect`), then written into the node list
(:meth:`_RuleInScope.write`). A rule's own code (check, rewrite, a graph pass) is called with
the bindings its parameters name (:func:`_call`); what it raises is a RuleError naming it.

The rules themselves: graphkit.rewrite.rules.ruleset.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import onnx

from graphkit.errors import GraphkitError, RuleError
from graphkit.rewrite.graph.edit import dead_producers, outer_names, prune_initializers, referenced, rename_inputs, \
    same_nodes, toposort
from graphkit.rewrite.graph.scopes import Scope, model_scopes
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.graph.view import GraphView
from graphkit.rewrite.graph.walk import holds_graphs, subgraphs
from graphkit.rewrite.rules.matcher import Match, Matcher
from graphkit.rewrite.rules.report import MatchResult, OpDelta, RuleReport
from graphkit.rewrite.rules.ruleset import GraphPass, MatchContext, Rule, RuleSet
from graphkit.rewrite.rules.stamps import UNTRACED, Stamps, report_stamps, stamp_matches
from graphkit.rewrite.rules.template import TracedReplacement, trace, traceable

__all__ = ["apply_rule_set"]


# ---------------------------------------------------------------- calling a rule's code

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
    the view if it still holds (None: the caller builds another).

    In steps: the rule's run pointed at this scope (:func:`_run_for`); a lean rule's matches
    stamped in place (:func:`_stamp_lean`); the other matches found, checked and their
    replacements built (:meth:`_RuleInScope.collect`); then the stamps written and the node
    list edited (:meth:`_RuleInScope.write`).
    """
    run = _run_for(runs, rule, view, scope.opset, delta, released)
    if run.lean:
        done = _stamp_lean(run, scope, view, rule, report)
        if done is not None:
            return done
    step = _RuleInScope(scope, view, rule, run, report, released, path)
    step.collect()
    return step.write(delta)


def _run_for(runs: dict[int, _RuleRun], rule: Rule, view: GraphView, opset: int, delta: OpDelta,
             released: set[str]) -> _RuleRun:
    """The rule's run (made in its first scope), its matchers pointed at ``view``, its stamps
    this scope's."""
    run = runs.get(id(rule))
    if run is None:
        run = runs[id(rule)] = _RuleRun(rule, view, opset, delta)
    else:
        for _, matcher in run.matchers:
            matcher.view, matcher.opset, matcher.commute = view, opset, rule.commute
    stamp = run.stamps
    stamp.indices, stamp.ops = [], []  # this scope's
    stamp.released = released  # inputs a stamped node stops reading: initializers to prune
    return run


def _stamp_lean(run: _RuleRun, scope: Scope, view: GraphView, rule: Rule,
                report: RuleReport) -> tuple[int, GraphView | None] | None:
    """A lean rule's matches stamped in order as long as each has a template: the result where
    that was every candidate; None where the rest take the general path (those stamped stay in
    ``run.stamps``)."""
    anchor_op, matcher = run.matchers[0]
    candidates = view.by_op.get(anchor_op, ())
    if candidates and run.fresh is None:  # names as a Builder of this rule makes them
        b = scope.make_builder(view.nodes[candidates[0]], rule.name)
        run.fresh = getattr(getattr(b, "_names", None), "fresh", None)
    if candidates and run.fresh is not None:
        done = stamp_matches(view, candidates, matcher, run, rule.name, run.stamps)
        if done == len(candidates):
            return report_stamps(view, run.stamps, report, rule.name)
    return None


class _RuleInScope:
    """One rule's matches in one scope: each candidate node matched, checked and given its
    replacement (:meth:`collect`), then written into the scope's node list (:meth:`write`).

    A match whose replacement is a traced template is queued (``checked``) and stamped after
    the loop, so a check or a rewrite run per match reads the nodes and types as the rule found
    them; every other match has its replacement built now (``replacements``, by the index of the
    last matched node; the other matched nodes in ``removed``)."""

    def __init__(self, scope: Scope, view: GraphView, rule: Rule, run: _RuleRun, report: RuleReport,
                 released: set[str], path: str | None) -> None:
        self.scope, self.view, self.rule, self.run, self.report = scope, view, rule, run, report
        self.released, self.path = released, path
        matcher = run.matchers[0][1]
        # One pattern without choice points: Matcher.first finds its only match at a node
        # without generators; where there is none, _first_match runs to say why.
        self.first = matcher.first if _FIRST and len(rule._patterns) == 1 and rule._simple() else None
        # A flat single-node pattern: its matches may get a traced replacement (see rules/template.py),
        # found from the matched node's fields alone where there is no check to hand bindings to.
        self.flat = flat = matcher.flat if self.first is not None and run.traced else None
        self.flat_match = matcher.flat_match if flat is not None and rule.check is None else None
        self.names_of, self.many = (flat[1], flat[2]) if flat is not None else ((), None)
        self.used: set[int] = set(run.stamps.indices)
        for _, m in run.matchers:
            m.taken = self.used  # later matches skip nodes earlier ones rewrite
        self.replacements: dict[int, list[onnx.NodeProto]] = {}
        self.checked: list[tuple] = []  # Stamps.write's arguments, per queued template
        self.removed: set[int] = set()
        self.aliases: dict[str, str] = {}
        self.reorder = False  # a pattern of several outputs: the rebuilt list is sorted again
        protected = scope.protected  # (view.outer_used read only when asked: it indexes the consumers)
        self.alias = lambda out: out not in protected and out not in view.outer_used  # noqa: E731
        self.builder, self.restart = run.builder, run.restart
        if self.restart is not None:  # the builder of an earlier scope: this scope's constants and initializers
            self.builder._lookup = view.constant_value
            self.builder.initializers = [] if scope.graph is not None else None

    def candidates(self) -> Iterable[int]:
        """The nodes of the rule's anchor ops, in order, past those the lean path stamped."""
        by_op, anchors = self.view.by_op, self.rule._anchor_ops  # the caller saw one of them in the scope
        if len(anchors) == 1:
            candidates = by_op.get(next(iter(anchors)), ())
        else:
            candidates = sorted(i for op in anchors for i in by_op.get(op, ()))
        stamped = len(self.run.stamps.indices)
        return candidates[stamped:] if stamped else candidates

    def collect(self) -> None:
        """Match every candidate; queue its template or build its replacement."""
        used, vnodes, first, flat_match = self.used, self.view.nodes, self.first, self.flat_match
        report, name = self.report, self.rule.name
        for index in self.candidates():
            if index in used:
                continue
            node = vnodes[index]
            if flat_match is not None and (found := flat_match(index)) is not None \
                    and self._queue_flat(index, node, found):
                continue
            match = None if first is None else first(index)
            if match is not None:  # first() refuses nodes taken by earlier matches: no overlap
                report.matched[name] = report.matched.get(name, 0) + 1
                if self.rule.check is not None and not self._passes_check(index, node, match):
                    continue
                if self.flat is not None and self._queue_checked(index, node, match):
                    continue
            else:
                label = _label(node, self.view, index)
                match, failure, structural = _first_match(self.rule, self.run.matchers, index, self.view, self.scope,
                                                          used, label, self.path)
                if structural:
                    report.matched[name] = report.matched.get(name, 0) + 1
                if match is None:
                    report.fail(name, *failure)
                    continue
            new_nodes = self._build(index, node, match)
            if new_nodes is not None:
                self._record(index, match, new_nodes)

    def _queue_flat(self, index: int, node: onnx.NodeProto, found: tuple) -> bool:
        """Queue the template for a flat match found from the node's fields (no check); False
        where it has none (a node holding graphs takes the general path)."""
        domain, bound_names, rest, output, _ = found
        run = self.run
        template = run.template(-1 if self.many is None else len(rest))
        fresh = run.fresh
        if template is None or not output or fresh is None or (node.attribute and holds_graphs(node)):
            return False
        self.used.add(index)
        self.checked.append((index, node, template, Stamps.name(fresh, node, self.rule.name, template),
                             template.inputs(bound_names, rest), output, domain))
        return True

    def _passes_check(self, index: int, node: onnx.NodeProto, match: Match) -> bool:
        """The rule's check on ``match``; a veto is reported with its reason."""
        view, name = self.view, self.rule.name
        ctx = MatchContext(view, [view.nodes[i] for i in match.nodes], self.scope.types, self.scope.opset)
        try:
            verdict = _call(self.rule.check, ctx, match.bindings)
        except GraphkitError:
            raise
        except Exception as exc:
            raise _user_error(name, "check", node, self.path, exc) from exc
        if verdict:
            return True
        reason = (verdict.reason or "check failed") if isinstance(verdict, MatchResult) else \
            f"check returned {verdict!r}"
        self.report.fail(name, f"{_label(node, view, index)}: {reason}", reason)
        return False

    def _queue_checked(self, index: int, node: onnx.NodeProto, match: Match) -> bool:
        """Queue the template for a flat match with the bindings its check was handed; False
        where it has none."""
        bound, many, run = match.bindings, self.many, self.run
        rest = bound[many] if many is not None else []
        template = run.template(-1 if many is None else len(rest))
        output = match.outputs[0]
        if template is None or not output or (node.attribute and holds_graphs(node)):
            return False
        if run.fresh is None:
            b = self.scope.make_builder(node, self.rule.name)
            run.fresh = getattr(getattr(b, "_names", None), "fresh", None)
        if run.fresh is None:
            return False
        self.used.add(index)
        inputs = template.inputs(tuple(bound[n] for n in self.names_of), rest)
        self.checked.append((index, node, template, Stamps.name(run.fresh, node, self.rule.name, template), inputs,
                             output, node.domain))
        return True

    def _build(self, index: int, node: onnx.NodeProto, match: Match) -> list[onnx.NodeProto] | None:
        """The replacement's nodes from ``rewrite``, with the Builder restarted for this match;
        None (reported) where they are the matched node itself."""
        name, scope, view = self.rule.name, self.scope, self.view
        builder = self.builder
        if builder is None:  # what scope.builder() makes, restarted for each later match
            builder, self.restart = _new_builder(scope.make_builder, node, name, scope.graph is not None,
                                                 view.constant_value, self.run)
            self.builder = builder
        elif self.restart is not None:
            self.restart(node.name or name, node.name)  # the prefix and name make_builder gives
        else:
            builder = self.builder = scope.make_builder(node, name)
            if scope.graph is not None:
                builder.initializers = []
            builder._lookup = view.constant_value
        try:
            results = self.run.call(builder, match.bindings)
        except GraphkitError:
            raise
        except Exception as exc:
            raise _user_error(name, "rewrite", node, self.path, exc) from exc
        outputs = match.outputs
        if results.__class__ is not str or len(outputs) != 1:
            results = _results(self.rule, results, len(outputs), node, self.path)
        else:
            results = [results]
        new_nodes = builder.finish(results, outputs, alias=self.alias)
        if not builder.aliases and same_nodes(new_nodes, [view.nodes[i] for i in match.nodes]):
            self.report.fail(name, f"{_label(node, view, index)}: the replacement is the matched node itself "
                             f"(output '{outputs[0]}' keeps its name)", "the replacement is the matched node itself")
            return None
        if builder.initializers:
            self.released.update(t.name for t in builder.initializers)
            new_nodes = scope.add_initializers(builder.initializers) + new_nodes
        if builder.aliases:
            self.aliases.update(builder.aliases)
        return new_nodes

    def _record(self, index: int, match: Match, new_nodes: list[onnx.NodeProto]) -> None:
        """``new_nodes`` stand where the last matched node stood; the other matched nodes go."""
        matched = match.nodes
        if len(matched) == 1:
            self.used.add(index)
            self.replacements[index] = new_nodes
        else:
            self.used.update(matched)
            last = max(matched)
            self.replacements[last] = new_nodes
            self.removed.update(i for i in matched if i != last)
        self.reorder |= len(match.outputs) > 1

    def write(self, delta: OpDelta) -> tuple[int, GraphView | None]:
        """The queued templates stamped, the built replacements written into the node list
        (over their nodes where each is one node for one, else the list rebuilt), what the
        removed nodes read released; returns how many rewrites and the view if it still holds."""
        view, report, name, stamp = self.view, self.report, self.rule.name, self.run.stamps
        for args in self.checked:
            stamp.write(*args)
        self.checked = []
        stamped = len(stamp.indices)
        replacements = self.replacements
        if not replacements:
            return report_stamps(view, stamp, report, name, counted=self.flat_match is None)
        if stamped:  # each overwrote its node where it is (it reads every input the node read)
            report_stamps(view, stamp, report, name, counted=self.flat_match is None)
        gone = self.removed | set(replacements)
        dead = self._release(gone)
        nodes, vnodes = self.scope.nodes, view.nodes
        if not (self.removed or dead or self.aliases or self.reorder) and \
                all(len(new) == 1 for new in replacements.values()):
            if delta.exact:
                delta.replaced([vnodes[i] for i in replacements], [new[0] for new in replacements.values()])
            for index, new in replacements.items():  # one node for one: overwrite it where it is
                nodes[index].CopyFrom(new[0])
        else:
            gone |= dead
            if delta.exact:
                delta.replaced([vnodes[i] for i in sorted(gone)], [n for new in replacements.values() for n in new])
            self._rebuild(nodes, gone)
            delta.in_place = False
        report.applied[name] = report.applied.get(name, 0) + len(replacements)
        return len(replacements) + stamped, None

    def _release(self, gone: set[int]) -> set[int]:
        """Release what the ``gone`` nodes read, and what their producers dead with them read
        (constants, typically); returns those producers."""
        view, released = self.view, self.released
        orphans = _reads(view, gone)
        released |= orphans
        read = {n for new in self.replacements.values() for node in new for n in node.input} \
            | set(self.aliases.values())
        # (a name the new nodes read keeps its producer: only the others are worth a look)
        dead = dead_producers(view, orphans - read, gone, read, self.scope.protected)
        if dead:
            released |= _reads(view, dead)
        return dead

    def _rebuild(self, nodes: Any, gone: set[int]) -> None:
        """The node list again: replacements where their last matched node stood, ``gone`` left out."""
        replacements = self.replacements
        rebuilt = []
        for index, node in enumerate(nodes):
            if index in replacements:
                rebuilt.extend(replacements[index])
            elif index not in gone:
                rebuilt.append(node)
        if self.aliases:
            rename_inputs(rebuilt, self.aliases)
        if self.reorder:
            rebuilt = toposort(rebuilt)
        del nodes[:]
        nodes.extend(rebuilt)


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
