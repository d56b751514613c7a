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

Beside: applying a RuleSet to a model (rules/apply.py), scopes and their interface
(graph/scopes.py), reports (rules/report.py), traced replacements stamped in place
(rules/stamps.py), node-list edits (graph/edit.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from graphkit.errors import RewriteError
from graphkit.rewrite.graph.scopes import Scope
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.graph.view import GraphView
from graphkit.rewrite.rules.matcher import deterministic
from graphkit.rewrite.rules.pattern import Either, Many, Out, PatternOps, PNode, Var, variables
from graphkit.rewrite.rules.report import MatchResult, OpDelta, RuleReport

__all__ = ["GraphPass", "MatchContext", "MatchResult", "OpDelta", "Rule", "RuleReport", "RuleSet", "Scope"]


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
