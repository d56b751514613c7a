"""Pattern rules: match nodes or multi-node patterns, check, replace.

A rule reads like the graph it matches::

    def pattern(op, x, y):
        return op.Add(op.Mul(x, 2.0), y)

    def rewrite(op, x, y):
        return op.my_add(x, y, _domain="custom")

    fuse = Rule("fuse_my_add", pattern, rewrite, commute=True)

Variables (``x``, ``y``) match any tensor; Python numbers match constants of that value
(a Constant node or an initializer whose elements all equal it); keyword arguments
match attributes (a value, or a predicate ``lambda v: ...``). A matched inner node whose
output is used elsewhere is never swallowed. ``check(ctx, **bindings)`` may veto a
match with a reason; ``rewrite(op, **bindings)`` builds the replacement with the
:class:`~graphkit.rewrite.builder.Builder`.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from graphkit.errors import GraphkitError, RewriteError
from graphkit.rewrite._graphview import GraphView

__all__ = ["MatchResult", "Rule", "RuleSet", "RuleReport", "MatchContext"]


class MatchResult:
    """Success, or failure with a reason. Falsy when failed."""

    def __init__(self, ok: bool = True, reason: str = "") -> None:
        self.ok = ok
        self.reason = reason

    def fail(self, reason: str) -> "MatchResult":
        return MatchResult(False, reason)

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return "MatchResult(ok)" if self.ok else f"MatchResult(fail: {self.reason})"


# ---------------------------------------------------------------- pattern graph

class _Var:
    def __init__(self, name: str) -> None:
        self.name = name


class _Const:
    def __init__(self, value: float) -> None:
        self.value = value


class _PNode:
    def __init__(self, op_type: str, inputs: Sequence[Any], domain: str, attrs: dict[str, Any],
                 commute: bool | None) -> None:
        self.op_type = op_type
        self.domain = domain
        self.inputs = [_lift(i) for i in inputs]
        self.attrs = attrs
        self.commute = commute


def _lift(value: Any) -> Any:
    if isinstance(value, (_Var, _PNode, _Const)):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _Const(float(value))
    raise TypeError(f"pattern inputs are variables, pattern ops or numbers, not {value!r}")


class _PatternOps:
    """``op.Mul(a, b, _domain="", **attr_constraints)`` inside a pattern function."""

    def __getattr__(self, op_type: str) -> Callable[..., _PNode]:
        def make(*inputs: Any, _domain: str = "", _commute: bool | None = None, **attrs: Any) -> _PNode:
            return _PNode(op_type, inputs, _domain, attrs, _commute)

        return make


_COMMUTATIVE = {("", "Add"), ("", "Mul"), ("", "Max"), ("", "Min"), ("", "Sum"), ("", "And"),
                ("", "Or"), ("", "Xor"), ("", "Equal")}


# ---------------------------------------------------------------- matching

@dataclass
class _Match:
    bindings: dict[str, str]
    nodes: list[int]  # indices into the node list; the root first


class _Failed(Exception):
    pass


class _Matcher:
    def __init__(self, root: _PNode, commute: bool, view: GraphView) -> None:
        self.root = root
        self.commute = commute
        self.view = view

    def match(self, index: int) -> _Match:
        bindings: dict[str, str] = {}
        nodes: list[int] = []
        self._node(self.root, index, bindings, nodes, is_root=True)
        return _Match(bindings, nodes)

    def _node(self, pat: _PNode, index: int, bindings: dict[str, str], nodes: list[int],
              is_root: bool) -> None:
        node = self.view.nodes[index]
        label = f"node '{node.name or node.op_type}'"
        if node.op_type != pat.op_type or node.domain not in (pat.domain, "ai.onnx" if not pat.domain else pat.domain):
            raise _Failed(f"{label} is {node.domain + '::' if node.domain else ''}{node.op_type}, "
                          f"pattern wants {pat.op_type}")
        if index in nodes:
            raise _Failed(f"{label} would be matched twice")
        if not is_root:
            for out in node.output:
                if out and self.view.other_uses(out, self._consumer_of(out, nodes)):
                    raise _Failed(f"{label} output '{out}' has other consumers")
        self._attrs(pat, node, label)
        inputs = list(node.input)
        if len(inputs) != len(pat.inputs):
            raise _Failed(f"{label} has {len(inputs)} inputs, pattern wants {len(pat.inputs)}")
        commute = pat.commute if pat.commute is not None else (
            self.commute and (pat.domain, pat.op_type) in _COMMUTATIVE)
        orders = [inputs] + ([inputs[::-1]] if commute and len(inputs) == 2 else [])
        reasons = []
        for order in orders:
            trial_b, trial_n = dict(bindings), nodes + [index]
            try:
                for p_in, name in zip(pat.inputs, order):
                    self._input(p_in, name, trial_b, trial_n, label)
            except _Failed as exc:
                reasons.append(str(exc))
                continue
            bindings.clear()
            bindings.update(trial_b)
            nodes[:] = trial_n
            return
        raise _Failed(" / ".join(dict.fromkeys(reasons)))

    def _consumer_of(self, name: str, nodes: list[int]) -> int:
        # the one consumer allowed is the pattern node that reached us: the last matched
        return nodes[-1] if nodes else -1

    def _input(self, pat: Any, name: str, bindings: dict[str, str], nodes: list[int], label: str) -> None:
        if isinstance(pat, _Var):
            bound = bindings.setdefault(pat.name, name)
            if bound != name:
                raise _Failed(f"{label}: '{pat.name}' would be both '{bound}' and '{name}'")
            return
        if isinstance(pat, _Const):
            value = self.view.constant_value(name) if name else None
            if value is None:
                raise _Failed(f"{label}: input '{name}' is not a constant")
            if value.size == 0 or not np.all(value == pat.value):
                shown = value.reshape(-1)[:3].tolist()
                raise _Failed(f"{label}: constant '{name}' is {shown}, pattern wants {pat.value:g}")
            return
        producer = self.view.producer.get(name)
        if producer is None:
            raise _Failed(f"{label}: input '{name}' is not produced by a {pat.op_type} node")
        self._node(pat, producer, bindings, nodes, is_root=False)

    @staticmethod
    def _attrs(pat: _PNode, node: onnx.NodeProto, label: str) -> None:
        given = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        for key, want in pat.attrs.items():
            have = given.get(key)
            if isinstance(have, bytes):
                have = have.decode()
            ok = want(have) if callable(want) else have == want
            if not ok:
                raise _Failed(f"{label}: attribute {key}={have!r} does not match")


# ---------------------------------------------------------------- rules

@dataclass
class MatchContext:
    """What ``check`` may look at: the matched nodes and constant values."""

    view: GraphView
    nodes: list[onnx.NodeProto]

    def constant(self, name: str) -> np.ndarray | None:
        return self.view.constant_value(name)


def _param_names(fn: Callable[..., Any], skip: int) -> list[str]:
    return list(inspect.signature(fn).parameters)[skip:]


@dataclass
class Rule:
    """``pattern`` -> (``check``) -> ``rewrite``. See the module docstring."""

    name: str
    pattern: Callable[..., Any]
    rewrite: Callable[..., Any]
    check: Callable[..., Any] | None = None
    commute: bool = False
    _root: _PNode | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        names = _param_names(self.pattern, 1)
        root = self.pattern(_PatternOps(), *[_Var(n) for n in names])
        if not isinstance(root, _PNode):
            raise RewriteError(f"rule '{self.name}': pattern must return an op, got {root!r}",
                               hint="return op.Something(...) from the pattern function")
        self._root = root

    @classmethod
    def node(cls, name: str, op_type: str, rewrite: Callable[..., Any], *, domain: str = "",
             inputs: int = 1, check: Callable[..., Any] | None = None, **attrs: Any) -> "Rule":
        """A single-node rule: match ``domain::op_type`` (with attribute constraints)."""
        var_names = [f"x{i}" for i in range(inputs)]

        def pattern(op, *xs):
            return getattr(op, op_type)(*xs, _domain=domain, **attrs)

        pattern.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter("op", inspect.Parameter.POSITIONAL_ONLY)]
            + [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in var_names])
        return cls(name, pattern, rewrite, check=check)

    @property
    def anchor(self) -> tuple[str, str]:
        return (self._root.domain, self._root.op_type)


@dataclass
class RuleReport:
    """Per rule: how many times it applied and why it did not elsewhere."""

    applied: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)

    def explain(self) -> str:
        lines = []
        for name in sorted(set(self.applied) | set(self.reasons)):
            lines.append(f"rule {name}: applied {self.applied.get(name, 0)}x")
            for reason in self.reasons.get(name, [])[:20]:
                lines.append(f"  no match: {reason}")
            extra = len(self.reasons.get(name, [])) - 20
            if extra > 0:
                lines.append(f"  ... {extra} more")
        return "\n".join(lines)


class RuleSet:
    """An ordered group of rules applied together until none applies.

    Holds pattern :class:`Rule` objects and GraphSurgeonRule objects (run after the
    pattern rules, on an onnx-graphsurgeon import of the model).
    """

    def __init__(self, rules: Iterable[Any]) -> None:
        self.rules = list(rules)
        names = [r.name for r in self.rules]
        if len(names) != len(set(names)):
            raise RewriteError(f"rule names must be unique, got {names}")

    def __iter__(self):
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)


def apply_rules(nodes: Any, rules: RuleSet, *, make_builder: Callable[[onnx.NodeProto, str], Any],
                protected: set[str], initializers: Any = (), report: RuleReport,
                max_passes: int = 10) -> int:
    """Apply ``rules`` to one node list until nothing changes; returns the number of rewrites."""
    total = 0
    for _ in itertools.repeat(None, max_passes):
        changed = 0
        for rule in rules:
            if not isinstance(rule, Rule):
                continue  # GraphSurgeonRule: applied model-wide by the engine
            changed += _apply_rule(nodes, rule, make_builder, protected, initializers, report)
        total += changed
        if not changed:
            break
    return total


def _apply_rule(nodes: Any, rule: Rule, make_builder, protected, initializers, report: RuleReport) -> int:
    domain, op_type = rule.anchor
    if not any(n.op_type == op_type for n in nodes):
        return 0
    view = GraphView(nodes, protected=protected, initializers=initializers)
    matcher = _Matcher(rule._root, rule.commute, view)
    used: set[int] = set()
    replacements: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    reasons = report.reasons.setdefault(rule.name, [])
    for index, node in enumerate(nodes):
        if node.op_type != op_type or index in used:
            continue
        try:
            m = matcher.match(index)
        except _Failed as exc:
            reasons.append(str(exc))
            continue
        if used.intersection(m.nodes):
            reasons.append(f"node '{node.name or node.op_type}' overlaps an earlier match")
            continue
        bindings = m.bindings
        if rule.check is not None:
            with _user_code(rule, "check"):
                verdict = rule.check(MatchContext(view, [nodes[i] for i in m.nodes]), **bindings)
            if not verdict:
                reason = getattr(verdict, "reason", "") or "check returned False"
                reasons.append(f"node '{node.name or node.op_type}': {reason}")
                continue
        builder = make_builder(node, rule.name)
        with _user_code(rule, "rewrite"):
            results = rule.rewrite(builder, **bindings)
            results = [results] if isinstance(results, str) else list(results)
            new_nodes = builder.finish(results, list(node.output))
        used.update(m.nodes)
        replacements[index] = new_nodes
        removed.update(i for i in m.nodes if i != index)
    if not replacements:
        return 0
    # Producers that fed only the replaced nodes (constants, typically) die with them.
    orphans = {name for i in (*removed, *replacements) for name in nodes[i].input if name}
    rebuilt = []
    for index, node in enumerate(nodes):
        if index in removed:
            continue
        rebuilt.extend(replacements.get(index, (node,)))
    rebuilt = _drop_dead(rebuilt, orphans, protected)
    del nodes[:]
    nodes.extend(rebuilt)
    report.applied[rule.name] = report.applied.get(rule.name, 0) + len(replacements)
    return len(replacements)


def _drop_dead(nodes: list[onnx.NodeProto], candidates: set[str], protected: set[str]) -> list[onnx.NodeProto]:
    """Remove producers of ``candidates`` that nothing uses any more, transitively."""
    if not candidates:
        return nodes
    view = GraphView(nodes, protected=protected)
    dead: set[int] = set()
    work = [name for name in candidates if name in view.producer]
    while work:
        index = view.producer[work.pop()]
        if index in dead:
            continue
        node = nodes[index]
        if any(out in protected or any(c not in dead for c in view.consumers.get(out, ()))
               for out in node.output if out):
            continue
        dead.add(index)
        work.extend(n for n in node.input if n in view.producer)
    return [n for i, n in enumerate(nodes) if i not in dead] if dead else nodes


@contextlib.contextmanager
def _user_code(rule: Rule, part: str):
    """Turn an exception from a rule's own code into a RewriteError naming the rule."""
    try:
        yield
    except GraphkitError:
        raise
    except Exception as exc:
        raise RewriteError(f"rule '{rule.name}': {part}() raised {type(exc).__name__}: {exc}",
                           hint="fix the rule (rerun with --debug for the traceback)") from exc
