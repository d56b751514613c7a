"""Matching a compiled pattern against one scope's nodes, with backtracking.

Every choice point (the two input orders of a commutative node, the alternatives of
``either``, the candidates for a second root) is a generator, so a failure late in a
match revisits earlier choices: ``x*s + x`` finds ``s*x + x``. Where a later root is
looked for: graphkit.rewrite.rules.roots.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from graphkit.errors import RuleError
from graphkit.rewrite.graph.view import GraphView
from graphkit.rewrite.rules.pattern import Const, Either, Many, Number, Optional, Out, PNode, Var, variables
from graphkit.rewrite.rules.roots import NAME, RootFinder

__all__ = ["Match", "Matcher", "attribute_default", "deterministic"]

COMMUTATIVE = frozenset({("", "Add"), ("", "Mul"), ("", "Max"), ("", "Min"), ("", "Sum"), ("", "And"),
                         ("", "Or"), ("", "Xor"), ("", "Equal")})
_MISSING = object()


@functools.lru_cache(maxsize=4096)
def attribute_default(domain: str, op_type: str, opset: int, name: str) -> Any:
    """The ONNX schema's default for an absent attribute (None when it has none)."""
    try:  # a hostile model's opset may be past what a C int holds: any opset that high is the newest
        schema = onnx.defs.get_schema(op_type, max(1, min(opset, 2**31 - 1)), domain)
    except (onnx.defs.SchemaError, TypeError, ValueError):
        return None
    attr = schema.attributes.get(name)
    if attr is None or not attr.default_value.type:
        return None
    return _plain(onnx.helper.get_attribute_value(attr.default_value))


def _plain(value: Any) -> Any:
    """Attribute values as rules compare them: text as str, tensors as numpy arrays."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


def _same(have: Any, want: Any) -> bool:
    if isinstance(want, (tuple, list)):
        return isinstance(have, (tuple, list, np.ndarray)) and len(have) == len(want) and all(
            _same(h, w) for h, w in zip(have, want))
    if isinstance(have, np.ndarray) or isinstance(want, np.ndarray):
        return np.array_equal(np.asarray(have), np.asarray(want))
    if isinstance(want, float) or isinstance(have, float):
        if not isinstance(have, (int, float)) or not isinstance(want, (int, float)):
            return False
        return bool(np.float32(have) == np.float32(want))  # attributes are stored as float32
    return have == want


def deterministic(roots: list[Any], commute: bool) -> bool:
    """Does the pattern leave the matcher no choice to make? One root, no ``either``, no
    node whose two inputs may be swapped: then a node matches in at most one way, and
    :meth:`Matcher.first` finds it without generators."""
    if len(roots) != 1:
        return False
    seen: set[int] = set()

    def plain(value: Any) -> bool:
        if isinstance(value, Either):
            return False
        if isinstance(value, Optional):
            return plain(value.inner)
        if isinstance(value, Out):
            value = value.node
        if not isinstance(value, PNode) or id(value) in seen:
            return True
        seen.add(id(value))
        swaps = value.commute if value.commute is not None else (
            commute and (value.domain, value.op_type) in COMMUTATIVE)
        fixed = [p for p in value.inputs if not isinstance(p, Many)]
        if swaps and len(fixed) == 2:
            return False
        return all(plain(p) for p in value.inputs)

    return plain(roots[0])


def _flat_plan(roots: list[Any]) -> tuple[PNode, tuple[str, ...], str | None] | None:
    """(node, its input variables' names, the ``*xs`` name) where the pattern is one node
    whose inputs are distinct variables (optionally a trailing ``*xs``) and whose attribute
    constraints capture nothing: Matcher.first's flat case."""
    if len(roots) != 1 or roots[0].__class__ is not PNode:
        return None
    pat = roots[0]
    if any(isinstance(v, Var) for v in pat.attrs.values()):
        return None
    inputs = pat.inputs
    many = inputs[-1].name if inputs and inputs[-1].__class__ is Many else None
    fixed = inputs[:-1] if many is not None else inputs
    if any(p.__class__ is not Var for p in fixed):
        return None
    names = tuple(p.name for p in fixed)
    if len(set(names) | {many}) != len(names) + 1:
        return None  # a variable used twice: equal tensors, the general case
    return pat, names, many


class _State:
    """One partial match: variable bindings, pattern node -> graph node, nodes taken."""

    __slots__ = ("bindings", "nodes", "used")

    def __init__(self, bindings: dict[str, Any], nodes: dict[int, int], used: frozenset[int]) -> None:
        self.bindings = bindings
        self.nodes = nodes
        self.used = used

    def bind(self, **more: Any) -> "_State":
        return _State({**self.bindings, **more}, self.nodes, self.used)


@dataclass
class Match:
    """A full match: bindings by variable name, graph node indices, the graph names of the outputs."""

    bindings: dict[str, Any]
    nodes: list[int]  # the anchor first
    outputs: list[str]


class Matcher:
    """Matches one pattern (its output values ``roots``) anchored at a node of ``view``."""

    def __init__(self, roots: list[Any], *, commute: bool, view: GraphView, rule: str, opset: int,
                 max_alternatives: int = 16, vars: dict[str, Var] | None = None) -> None:
        self.roots = roots
        self.commute = commute
        self.view = view
        self.rule = rule
        self.opset = opset
        self.max_alternatives = max_alternatives
        if vars is None:  # the pattern's variables (a caller matching it often passes them in)
            vars = {}
            for r in roots:
                variables(r, vars)
        self.vars = vars
        self._root_outs = [(id(r.node), r.index) if isinstance(r, Out) else (id(r), 0) for r in roots]
        self._flat = _flat_plan(roots)
        self.failures: list[tuple[int, str, str]] = []  # (depth, text, generic) of the current anchor
        self._at = 0  # how many nodes the partial match being tried holds
        self._roots = RootFinder(roots)  # where roots after the first are looked for
        self.taken: set[int] = set()  # nodes earlier matches of this round rewrite (the caller's set)

    @property
    def flat(self) -> tuple[PNode, tuple[str, ...], str | None] | None:
        """The flat plan (node, its variables' names, the ``*xs`` name) where the pattern is
        one node of distinct variables (``flat_match`` then matches it), else None."""
        return self._flat

    # -- entry

    def matches(self, index: int) -> Iterator[Match]:
        """Full matches anchored at node ``index`` (the first root), in search order (the
        pattern's input order first, then commuted orders and later alternatives)."""
        self.failures = []
        first = self.roots[0]
        pnode = first.node if isinstance(first, Out) else first
        count = 0
        for st in self._node(pnode, index, _State({}, {}, frozenset())):
            for full in self._more_roots(1, st):
                match = self._complete(full)
                if match is not None:
                    yield match
                    count += 1
                    if count >= self.max_alternatives:
                        return

    def first(self, index: int) -> Match | None:
        """For a :func:`deterministic` pattern: the match at node ``index``, the one
        :meth:`matches` would yield (it yields no other), or None (``matches`` then says why).

        The same checks in the same order as ``_node`` and ``_value``, on one mutable state
        instead of a generator per choice point.
        """
        if self._flat is not None:
            return self._first_flat(index)
        first = self.roots[0]
        pnode = first.node if isinstance(first, Out) else first
        bindings: dict[str, Any] = {}
        nodes: dict[int, int] = {}
        used: set[int] = set()
        if not self._first_node(pnode, index, bindings, nodes, used):
            return None
        return self._whole(bindings, nodes, used)

    def _first_flat(self, index: int) -> Match | None:
        """first() for one node whose inputs are distinct variables (``Rule.node``): the same
        checks as _first_node, _first_value and _whole, in a row."""
        found = self.flat_match(index)
        if found is None:
            return None
        _, names, rest, output, _ = found
        _, names_of, many = self._flat
        bindings = dict(zip(names_of, names))
        if many is not None:
            bindings[many] = rest
        get = bindings.get
        return Match({name: get(name) for name in self.vars}, [index], [output])

    def flat_match(self, index: int) -> tuple[str, tuple[str, ...], list[str], str, Any] | None:
        """For a pattern with a flat plan (``_flat``: one node, distinct variables): the
        match at node ``index`` as (the node's domain, the names its variables bind, in
        order, those ``*xs`` binds, the first output, the node where it was read, else None),
        or None where ``first`` finds none."""
        pat, names_of, many = self._flat
        view = self.view
        if view.ops[index] != pat.op_type:
            return None
        node = None
        if "inputs" in view.__dict__:  # the view's copies of the fields, where made
            domain, names, outs = view.domains[index], view.inputs[index], view.outputs[index]
        else:  # else the node's own: a single-node rule needs no copy of every node
            node = view.nodes[index]
            domain, names, outs = node.domain, tuple(node.input), tuple(node.output)
        if domain != pat.domain and not (domain == "ai.onnx" and not pat.domain):
            return None
        if index in self.taken:
            return None
        if pat.attrs and self._attrs(pat, view.nodes[index], index, {}) is None:
            return None
        k = len(names_of)
        rest: list[str] = []
        if len(names) > k:
            rest = list(names[k:])
            names = names[:k]
            if many is None:
                if any(rest):
                    return None
                rest = []
        if len(names) < k or not all(names):
            return None  # an absent input: no variable binds it
        output = outs[0] if outs else ""
        if len(outs) > 1:
            for name in outs:
                if name and name != output and (
                        name in view.protected or any(c != index for c in view.consumers.get(name, ()))):
                    return None
        return domain, names, rest, output, node

    def _first_node(self, pat: PNode, index: int, bindings: dict[str, Any], nodes: dict[int, int],
                    used: set[int]) -> bool:
        view = self.view
        seen = nodes.get(id(pat))
        if seen is not None:
            return seen == index
        domain = view.domains[index]
        if view.ops[index] != pat.op_type or (domain != pat.domain and not (domain == "ai.onnx" and not pat.domain)):
            return False
        if index in used or index in self.taken:
            return False
        names = view.inputs[index]
        pats = pat.inputs
        if pat.attrs:
            captured = self._attrs(pat, view.nodes[index], index, bindings)
            if captured is None:
                return False
        else:
            captured = None
        many = pats[-1] if pats and isinstance(pats[-1], Many) else None
        fixed = pats[:-1] if many is not None else pats
        rest: list[str] = []
        if len(names) > len(fixed):
            rest = list(names[len(fixed):])
            names = names[:len(fixed)]
            if many is None and any(rest):
                return False
        if many is not None:
            bound = bindings.get(many.name, _MISSING)
            if bound is not _MISSING and bound != rest:
                return False
        if captured:
            bindings.update(captured)
        if many is not None:
            bindings[many.name] = rest
        nodes[id(pat)] = index
        used.add(index)
        value = self._first_value
        for k, p in enumerate(fixed):
            if not value(p, names[k] if k < len(names) else "", bindings, nodes, used):
                return False
        return True

    def _first_value(self, pat: Any, name: str, bindings: dict[str, Any], nodes: dict[int, int],
                     used: set[int]) -> bool:
        cls = pat.__class__
        if cls is Var:
            if not name:
                return False
            bound = bindings.get(pat.name, _MISSING)
            if bound is _MISSING:
                bindings[pat.name] = name
                return True
            return bound == name
        if cls is Optional:
            if not name:
                for v in variables(pat.inner):
                    if v not in bindings:
                        bindings[v] = None
                return True
            return self._first_value(pat.inner, name, bindings, nodes, used)
        if not name:
            return False
        if cls is Number or cls is Const:
            value = self.view.constant_value(name)
            if value is None:
                return False
            if cls is Number:
                return not (value.size == 0 or not np.all(value == pat.value))
            bound = bindings.get(pat.var.name, _MISSING)
            if bound is _MISSING:
                bindings[pat.var.name] = value
                return True
            return _same(bound, value)
        if cls is Out:
            pnode, out = pat.node, pat.index
        elif cls is PNode:
            pnode, out = pat, 0
        else:  # a Var subclass, an Either: what deterministic() let through is above
            raise AssertionError(f"not a deterministic pattern value: {pat!r}")
        producer = self.view.producer.get(name)
        if producer is None:
            return False
        outs = self.view.outputs[producer]
        if out >= len(outs) or outs[out] != name:
            return False
        return self._first_node(pnode, producer, bindings, nodes, used)

    def reason(self) -> tuple[str, str]:
        """Why the last anchor did not match: (text, generic) of the failures that came
        closest (most nodes matched), distinct ones joined."""
        failures = self.failures
        if not failures:
            return "no match", "no match"
        deepest = max(f[0] for f in failures)
        texts: dict[str, None] = {}
        generics: dict[str, None] = {}
        for depth, text, generic in failures:
            if depth == deepest:
                texts[text] = generics[generic] = None
        return " / ".join(list(texts)[:3]), " / ".join(list(generics)[:3])

    def _label(self, index: int) -> str:
        return f"node '{self.view.nodes[index].name or self.view.ops[index]}'"

    def _fail(self, text: str, generic: str) -> None:
        self.failures.append((self._at, text, generic))

    # -- roots after the first: found up from the readers of what they share (rules/roots.py)

    def _more_roots(self, k: int, st: _State) -> Iterator[_State]:
        if k == len(self.roots):
            yield st
            return
        root = self.roots[k]
        pnode = root.node if isinstance(root, Out) else root
        if id(pnode) in st.nodes:
            yield from self._more_roots(k + 1, st)
            return
        candidates, why = self._roots.candidates(k, st.bindings, st.nodes, st.used, self.view, self.taken)
        if why is not None:
            self._at = len(st.used)
            self._fail(*why)
            return
        tried = False
        for cand in candidates:
            tried = True
            for s in self._node(pnode, cand, st):
                yield from self._more_roots(k + 1, s)
        if not tried:
            self._at = len(st.used)
            self._fail(*self._roots.why_none(k, st.used, self.taken))

    # -- nodes and values

    def _node(self, pat: PNode, index: int, st: _State) -> Iterator[_State]:
        view = self.view
        op = view.ops[index]
        self._at = len(st.used)
        seen = st.nodes.get(id(pat))
        if seen is not None:
            if seen == index:
                yield st
            else:
                self._fail(f"{self._label(index)}: the pattern's shared {pat.op_type} is another node here",
                           f"shared {pat.op_type} is two different nodes")
            return
        domain = view.domains[index]
        if op != pat.op_type or (domain != pat.domain and not (domain == "ai.onnx" and not pat.domain)):
            have = f"{domain + '::' if domain else ''}{op}"
            self._fail(f"{self._label(index)} is {have}, pattern wants {pat.op_type}",
                       f"{pat.op_type} input is produced by {have}")
            return
        if index in st.used:
            self._fail(f"{self._label(index)} would be matched twice", f"{pat.op_type} would be matched twice")
            return
        if index in self.taken:
            self._fail(f"{self._label(index)} is part of an earlier match", "overlaps an earlier match")
            return
        node = view.nodes[index]
        captured = self._attrs(pat, node, index, st.bindings)
        if captured is None:
            return
        names = list(view.inputs[index])
        pats = pat.inputs
        many = pats[-1] if pats and isinstance(pats[-1], Many) else None
        fixed = pats[:-1] if many is not None else pats
        rest: list[str] = []
        if len(names) > len(fixed):
            rest = names[len(fixed):]
            names = names[:len(fixed)]
            if many is None and any(rest):
                self._fail(f"{self._label(index)} has {len(view.inputs[index])} inputs, pattern wants {len(pats)}",
                           f"{pat.op_type} has more inputs than the pattern")
                return
        names += [""] * (len(fixed) - len(names))
        if many is not None:
            bound = st.bindings.get(many.name, _MISSING)
            if bound is not _MISSING and bound != rest:
                self._fail(f"{self._label(index)}: *{many.name} would be two different lists", "variadic inputs differ")
                return
            captured[many.name] = list(rest)
        st2 = _State({**st.bindings, **captured}, {**st.nodes, id(pat): index}, st.used | {index})
        commute = pat.commute if pat.commute is not None else (
            self.commute and (pat.domain, pat.op_type) in COMMUTATIVE)
        first = fixed[0] if fixed else None
        if not self._quick_fail(first, names[0] if fixed else "", st2, index):
            yield from self._inputs(fixed, names, st2, index)
        if commute and len(fixed) == 2 and names[0] != names[1] and not self._quick_fail(first, names[1], st2, index):
            yield from self._inputs(fixed, names[::-1], st2, index)

    def _quick_fail(self, pat: Any, name: str, st: _State, at: int) -> bool:
        """Would ``_value(pat, name)`` fail at once on the producer's op type? Then record the
        same failure and say so: most candidates end here, without a chain of generators."""
        if not isinstance(pat, (PNode, Out)) or not name:
            return False
        pnode, out = (pat.node, pat.index) if isinstance(pat, Out) else (pat, 0)
        if id(pnode) in st.nodes:
            return False
        view = self.view
        producer = view.producer.get(name)
        if producer is None or out >= len(view.outputs[producer]) or view.outputs[producer][out] != name:
            return False  # _value says why
        op, domain = view.ops[producer], view.domains[producer]
        if op == pnode.op_type and (domain == pnode.domain or (domain == "ai.onnx" and not pnode.domain)):
            return False
        self._at = len(st.used)
        have = f"{domain + '::' if domain else ''}{op}"
        self._fail(f"{self._label(producer)} is {have}, pattern wants {pnode.op_type}",
                   f"{pnode.op_type} input is produced by {have}")
        return True

    def _inputs(self, pats: list[Any], names: list[str], st: _State, at: int, k: int = 0) -> Iterator[_State]:
        if k == len(pats):
            yield st
            return
        for s in self._value(pats[k], names[k], st, at):
            yield from self._inputs(pats, names, s, at, k + 1)

    def _value(self, pat: Any, name: str, st: _State, at: int) -> Iterator[_State]:
        """Match pattern value ``pat`` against tensor ``name``, an input of node ``at``."""
        self._at = len(st.used)
        if isinstance(pat, Optional):
            if not name:
                absent = {v: None for v in variables(pat.inner) if v not in st.bindings}
                yield st.bind(**absent)
            else:
                yield from self._value(pat.inner, name, st, at)
            return
        if isinstance(pat, Either):
            for alt in pat.alternatives:
                yield from self._value(alt, name, st, at)
            return
        if not name:
            self._fail(f"{self._label(at)}: input for {pat!r} is absent", f"input for {pat!r} is absent")
            return
        if isinstance(pat, Var):
            bound = st.bindings.get(pat.name, _MISSING)
            if bound is _MISSING:
                yield st.bind(**{pat.name: name})
            elif bound == name:
                yield st
            else:
                self._fail(f"{self._label(at)}: '{pat.name}' would be both '{bound}' and '{name}'",
                           f"'{pat.name}' would be two different tensors")
            return
        if isinstance(pat, (Number, Const)):
            value = self.view.constant_value(name)
            if value is None:
                self._fail(f"{self._label(at)}: input '{name}' is not a constant", f"input for {pat!r} is not a constant")
                return
            if isinstance(pat, Number):
                if value.size == 0 or not np.all(value == pat.value):
                    shown = value.reshape(-1)[:3].tolist()
                    self._fail(f"{self._label(at)}: constant '{name}' is {shown}, pattern wants {pat.value:g}",
                               f"constant is not {pat.value:g}")
                    return
                yield st
                return
            bound = st.bindings.get(pat.var.name, _MISSING)
            if bound is _MISSING:  # the tensor's name too: a later root may read it (rules/roots.py)
                yield st.bind(**{pat.var.name: value, pat.var.name + NAME: name})
            elif _same(bound, value):
                yield st
            else:
                self._fail(f"{self._label(at)}: const({pat.var.name}) would be two different values",
                           f"const({pat.var.name}) would be two different values")
            return
        pnode, out = (pat.node, pat.index) if isinstance(pat, Out) else (pat, 0)
        producer = self.view.producer.get(name)
        if producer is None:
            self._fail(f"{self._label(at)}: input '{name}' is not produced by a {pnode.op_type} node",
                       f"input is not produced by a {pnode.op_type} node")
            return
        outs = self.view.outputs[producer]
        if out >= len(outs) or outs[out] != name:
            self._fail(f"{self._label(at)}: input '{name}' is not output {out} of its producer",
                       f"{pnode.op_type} output {out} is not the one used")
            return
        yield from self._node(pnode, producer, st)

    def _attrs(self, pat: PNode, node: onnx.NodeProto, at: int, bindings: dict[str, Any]) -> dict[str, Any] | None:
        """Check the attribute constraints; returns the captured values (None: no match)."""
        if not pat.attrs:
            return {}
        given = {a.name: a for a in node.attribute}
        captured: dict[str, Any] = {}
        for key, want in pat.attrs.items():
            if key in given:
                have = _plain(onnx.helper.get_attribute_value(given[key]))
            else:
                domain = "" if node.domain == "ai.onnx" else node.domain
                have = attribute_default(domain, node.op_type, self.opset, key)
            if isinstance(want, Var):
                bound = bindings.get(want.name, captured.get(want.name, _MISSING))
                if bound is not _MISSING and not _same(have, bound):
                    self._fail(f"{self._label(at)}: attribute {key}={have!r} differs from {want.name}={bound!r}",
                               f"attribute {key} differs from {want.name}")
                    return None
                captured[want.name] = have
                continue
            if callable(want):
                try:
                    ok = want(have)
                except Exception as exc:
                    raise RuleError(f"rule '{self.rule}': the predicate for attribute {key} raised "
                                    f"{type(exc).__name__}: {exc} (on {key}={have!r})",
                                    node=node.name or node.op_type, op=node.op_type,
                                    hint="fix the predicate (absent attributes arrive as the schema "
                                         "default, or None where there is none)") from exc
            else:
                ok = _same(have, want)
            if not ok:
                self._fail(f"{self._label(at)}: attribute {key}={have!r} does not match",
                           f"attribute {key} does not match")
                return None
        return captured

    # -- the whole match: inner nodes' outputs may not escape

    def _complete(self, st: _State) -> Match | None:
        return self._whole(st.bindings, st.nodes, st.used)

    def _whole(self, bindings: dict[str, Any], nodes: dict[int, int], matched: Any) -> Match | None:
        view = self.view
        outputs = []
        for pid, out in self._root_outs:
            node_outs = view.outputs[nodes[pid]]
            outputs.append(node_outs[out] if out < len(node_outs) else "")
        self._at = len(matched) + 1
        view_outputs = view.outputs
        for i in matched:
            for name in view_outputs[i]:
                if not name or name in outputs:
                    continue
                if name in view.protected or any(c not in matched for c in view.consumers.get(name, ())):
                    self._fail(f"{self._label(i)} output '{name}' has other consumers",
                               f"{view.ops[i]} output has other consumers")
                    return None
        get = bindings.get
        anchor = nodes[self._root_outs[0][0]]
        if len(matched) == 1:
            return Match({name: get(name) for name in self.vars}, [anchor], outputs)
        return Match({name: get(name) for name in self.vars}, [anchor] + sorted(i for i in matched if i != anchor),
                     outputs)
