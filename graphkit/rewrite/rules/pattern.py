"""The pattern language: what a rule's ``pattern(op, ...)`` function builds.

A pattern function is called once, with ``op`` (whose attributes make pattern nodes)
and one variable per parameter. What it returns is a small graph of these objects:

- a variable matches any tensor; the same variable used twice means the same tensor;
- a Python number matches a constant (Constant node or initializer) of that value;
- ``const(v)`` matches any constant and binds ``v`` to its value (a numpy array);
- ``optional(p)`` matches ``p`` or an absent input (the variables in ``p`` become None);
- ``either(p, q, ...)`` matches the first alternative that fits;
- ``op.Add(a, b, axis=..., _domain=..., _commute=..., _outputs=n)`` matches a node; a
  keyword constrains an attribute (a value, a tuple, a predicate ``lambda v: ...``, or a
  variable that captures the attribute's value); ``_outputs=n`` returns the node's n
  outputs so that the pattern can name the one it uses (``op.TopK(x, k, _outputs=2)[1]``);
- a pattern value used twice (``d = op.Sub(x, m)`` feeding two nodes) is one node;
- ``*xs`` in the pattern's signature matches the remaining inputs of a node (variadic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["const", "either", "optional"]


class Var:
    """A pattern variable: binds a tensor name (or, under const(), a constant's value)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Many(Var):
    """``*xs``: binds the list of a node's remaining inputs."""

    def __iter__(self):  # `op.Concat(*xs)` unpacks the one Many itself
        yield self


class Number:
    """A literal: matches a constant whose elements all equal ``value``."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"{self.value:g}"


class Const:
    """``const(v)``: a constant input whose value binds ``v``."""

    def __init__(self, var: Var) -> None:
        self.var = var

    def __repr__(self) -> str:
        return f"const({self.var.name})"


class Optional:
    """``optional(p)``: ``p``, or an absent input."""

    def __init__(self, inner: Any) -> None:
        self.inner = lift(inner)

    def __repr__(self) -> str:
        return f"optional({self.inner!r})"


class Either:
    """``either(p, q, ...)``: the first alternative that matches."""

    def __init__(self, alternatives: Sequence[Any]) -> None:
        self.alternatives = [lift(a) for a in alternatives]

    def __repr__(self) -> str:
        return f"either({', '.join(map(repr, self.alternatives))})"


class PNode:
    """A pattern node; as a value it stands for its first output."""

    def __init__(self, op_type: str, inputs: Sequence[Any], domain: str, attrs: dict[str, Any],
                 commute: bool | None, outputs: int) -> None:
        self.op_type = op_type
        self.domain = domain
        self.inputs = [lift(i) for i in inputs]
        self.attrs = attrs
        self.commute = commute
        self.outputs = outputs
        for i, p in enumerate(self.inputs):
            if isinstance(p, Many) and i != len(self.inputs) - 1:
                raise TypeError(f"{op_type}: a variadic input (*{p.name}) must be the last")

    def __repr__(self) -> str:
        return f"{self.op_type}({', '.join(map(repr, self.inputs))})"


class Out:
    """Output ``index`` of a multi-output pattern node."""

    def __init__(self, node: PNode, index: int) -> None:
        self.node = node
        self.index = index

    def __repr__(self) -> str:
        return f"{self.node!r}[{self.index}]"


VALUE_TYPES = (Var, Number, Const, Optional, Either, PNode, Out)


def lift(value: Any) -> Any:
    if isinstance(value, VALUE_TYPES):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Number(float(value))
    raise TypeError(f"pattern inputs are variables, pattern ops, numbers, const(), optional() or "
                    f"either(), not {value!r}")


def const(var: Var) -> Const:
    """Match a constant input (Constant node or initializer); bind ``var`` to its value."""
    if not isinstance(var, Var) or isinstance(var, Many):
        raise TypeError(f"const() takes a pattern variable, not {var!r}")
    return Const(var)


def optional(pattern: Any) -> Optional:
    """Match ``pattern`` or an absent (empty or missing trailing) input."""
    return Optional(pattern)


def either(*alternatives: Any) -> Either:
    """Match the first of ``alternatives`` that fits (backtracking into the others)."""
    if len(alternatives) < 2:
        raise TypeError("either() takes at least two alternatives")
    return Either(alternatives)


class PatternOps:
    """``op.Mul(a, b, _domain="", _commute=None, _outputs=1, **attr_constraints)`` in a pattern."""

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        if op_type.startswith("_"):
            raise AttributeError(op_type)

        def make(*inputs: Any, _domain: str = "", _commute: bool | None = None, _outputs: int = 1,
                 **attrs: Any) -> Any:
            node = PNode(op_type, inputs, _domain, attrs, _commute, _outputs)
            return node if _outputs == 1 else tuple(Out(node, i) for i in range(_outputs))

        return make


def variables(value: Any, into: dict[str, Var] | None = None, seen: set[int] | None = None) -> dict[str, Var]:
    """Every variable reachable from ``value`` (attribute captures included), by name."""
    into = {} if into is None else into
    seen = set() if seen is None else seen
    if id(value) in seen:
        return into
    seen.add(id(value))
    if isinstance(value, Var):
        into[value.name] = value
    elif isinstance(value, Const):
        into[value.var.name] = value.var
    elif isinstance(value, Optional):
        variables(value.inner, into, seen)
    elif isinstance(value, Either):
        for a in value.alternatives:
            variables(a, into, seen)
    elif isinstance(value, Out):
        variables(value.node, into, seen)
    elif isinstance(value, PNode):
        for v in value.attrs.values():
            if isinstance(v, Var):
                into[v.name] = v
        for i in value.inputs:
            variables(i, into, seen)
    return into


def pattern_nodes(value: Any, into: list[PNode] | None = None, seen: set[int] | None = None) -> list[PNode]:
    """Every pattern node reachable from ``value``, each once."""
    into = [] if into is None else into
    seen = set() if seen is None else seen
    if id(value) in seen:
        return into
    seen.add(id(value))
    if isinstance(value, Out):
        pattern_nodes(value.node, into, seen)
    elif isinstance(value, PNode):
        into.append(value)
        for i in value.inputs:
            pattern_nodes(i, into, seen)
    elif isinstance(value, Optional):
        pattern_nodes(value.inner, into, seen)
    elif isinstance(value, Either):
        for a in value.alternatives:
            pattern_nodes(a, into, seen)
    return into
