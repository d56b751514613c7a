"""A rule's replacement traced once and stamped on every match, where that is provably the same.

A rule's ``rewrite(op, x0, x1)`` is a Python call per match (about 20 us: the call, the
Builder, a NodeProto made and copied). Where the replacement depends on the match only
through the names it wires in, it is the same replacement every time: :func:`trace` calls
``rewrite`` on stand-ins for the bindings and records what it built, and the rule engine
then stamps that record on each match instead of calling ``rewrite`` again.

What "depends only through the names" means is checked, not assumed. The stand-ins are
``str`` objects (``isinstance(x, str)`` holds, as for a real binding) whose every method,
operator, comparison, hash, conversion and formatting marks the trace as having read
the binding; the ``op`` handed in records ``op.X(...)``/``op.op(...)`` and marks the trace
on anything else a Builder offers (``dtype``, ``shape``, ``constant_value``,
``initializer``, ``constant``, ``opset``, ``prefix``, ``nodes``...). A trace is used only if:

- nothing was read, and ``rewrite`` neither raised nor returned anything but a name it made;
- every node input is a binding, a name an earlier node made, or ``""`` (absent), never
  another literal name; no attribute, domain or op type holds a binding's text;
- a second trace on stand-ins of another text and length records the same (a ``rewrite``
  keeping state, random, or reading the text through C code that calls no method of the
  stand-in, such as ``len("".join(...))``, differs);
- it is one node, of another op type than the matched one, whose one output is the
  result and whose inputs read every binding, holding no subgraph: the engine overwrites
  the matched node with it. Anything else runs ``rewrite`` per match.

C code can read a binding's characters without calling a method of it (``re.match("model/",
x)``, ``str.startswith(x, "m")``): where both stand-ins give the same answer the traces agree
and the template would be wrong for the matches they stand for. So only a ``rewrite`` whose
code can reach nothing but its arguments is traced (:func:`traceable`: no global, closure
variable or default but constants, functions passing the same test, ``onnx``/``math`` and a
few builtins that read a ``str`` through its methods; no import, no dunder attribute, no
attribute named as a ``str`` method (``"a/b".find(x)``), no ``in``, no global or closure
variable written). Out of sight still: state ``rewrite`` keeps in its
arguments' objects. ``Rule(per_match=True)`` calls ``rewrite`` for every match.
"""

from __future__ import annotations

import builtins
import dis
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import helper

__all__ = ["TracedReplacement", "trace", "traceable"]

_MARK = "\x00graphkit-trace:"
_MARK_BYTES = _MARK.encode()


class _Trace:
    __slots__ = ("nodes", "read", "refs", "salt")

    def __init__(self, salt: str = "") -> None:
        self.salt = salt  # the second trace's stand-ins differ in text and length from the first's
        self.nodes: list[tuple[str, str, tuple[Any, ...], int, tuple[bytes, ...]]] = []
        self.read = False  # the rewrite looked at a binding or asked the builder anything but op()
        self.refs: dict[int, tuple[Any, ...]] = {}  # id(stand-in) -> ("var", name) | ("many", j) | ("made", k, i)


class _Ref(str):
    """A binding's stand-in while tracing (its methods are set below: each marks the trace)."""

    def __new__(cls, trace: _Trace, ref: tuple[Any, ...]) -> "_Ref":
        self = super().__new__(cls, f"{_MARK}{len(trace.refs)}{trace.salt}")
        vars(self)["trace"] = trace
        trace.refs[id(self)] = ref
        return self


def _reading(name: str) -> Callable[..., Any]:
    method = getattr(str, name)

    def read(self: _Ref, *args: Any, **kwargs: Any) -> Any:
        vars(self)["trace"].read = True
        return method(self, *args, **kwargs)
    read.__name__ = name
    return read


def _marking(name: str) -> Callable[..., Any]:
    def read(self: _Ref, *args: Any, **kwargs: Any) -> Any:
        vars(self)["trace"].read = True
        raise TypeError(f"a traced binding does not support {name}")
    read.__name__ = name
    return read


_KEEP = {"__new__", "__init__", "__getattribute__", "__setattr__", "__delattr__", "__init_subclass__",
         "__subclasshook__", "__class__", "__doc__", "__dict__", "__class_getitem__"}
for _name in dir(str):
    if _name not in _KEEP and callable(getattr(str, _name)):
        setattr(_Ref, _name, _reading(_name))
# What str lacks but Python asks an object for (a reflected operator, truth, numbers, a path).
for _name in ("__radd__", "__bool__", "__int__", "__float__", "__complex__", "__index__", "__fspath__",
              "__round__", "__trunc__", "__floor__", "__ceil__", "__abs__", "__neg__", "__pos__", "__invert__",
              "__rmod__", "__and__", "__or__", "__xor__", "__rand__", "__ror__", "__rxor__", "__sub__", "__rsub__",
              "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__divmod__", "__pow__",
              "__matmul__", "__lshift__", "__rshift__", "__copy__", "__deepcopy__", "__reversed__"):
    if _name not in vars(_Ref):
        setattr(_Ref, _name, _marking(_name))


# Everything a Builder offers besides op() and op.X(): reading any of them is reading the match.
_BUILDER_API = frozenset({"constant", "constant_value", "dtype", "finish", "initializer", "prefix", "shape",
                          "opset", "nodes", "initializers", "aliases", "used_shapes"})


class _Tracer:
    """The ``op`` a traced rewrite gets: records op.X(...) nodes."""

    def __init__(self, trace: _Trace) -> None:
        self._trace = trace

    def op(self, op_type: str, *inputs: Any, domain: str = "", outputs: int = 1, **attrs: Any) -> Any:
        trace = self._trace
        refs = trace.refs
        ins = []
        for name in inputs:
            ref = refs.get(id(name)) if type(name) is _Ref else None
            if ref is not None:
                ins.append(ref)
            elif type(name) is str and not name:
                ins.append(("absent",))
            else:  # a literal name, or a binding's text made into another str: not the same everywhere
                trace.read = True
                ins.append(("literal",))
        if type(op_type) is not str or type(domain) is not str or type(outputs) is not int or outputs < 1 \
                or _MARK in op_type or _MARK in domain:
            trace.read = True
            return ""
        made = [helper.make_attribute(k, v) for k, v in sorted(attrs.items())]
        encoded = tuple(a.SerializeToString() for a in made)
        if any(_MARK_BYTES in e for e in encoded):
            trace.read = True
        k = len(trace.nodes)
        trace.nodes.append((op_type, domain, tuple(ins), outputs, encoded))
        outs = [_Ref(trace, ("made", k, i)) for i in range(outputs)]
        return outs[0] if outputs == 1 else tuple(outs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _BUILDER_API:
            self._trace.read = True
            raise AttributeError(f"{name} is not available while a rewrite is traced")

        def make(*inputs: Any, _domain: str = "", _outputs: int = 1, **attrs: Any) -> Any:
            return self.op(name, *inputs, domain=_domain, outputs=_outputs, **attrs)
        return make


@dataclass(frozen=True, eq=False)
class TracedReplacement:
    """One traced replacement: ``node``, a NodeProto holding the op type, domain and
    attributes (in the Builder's order) the rewrite gave, no inputs, outputs or name;
    ``positions``: per input, which of the match's inputs it reads (the variables' in the
    pattern's order, then those ``*xs`` binds; -1 for an absent one). ``same_inputs``: it
    reads the matched node's inputs in their order."""

    node: onnx.NodeProto
    positions: tuple[int, ...]
    same_inputs: bool
    op_type: str  # the node's, read once
    domain: str

    def inputs(self, names: tuple[str, ...], rest: list[str]) -> tuple[str, ...]:
        """The node's inputs for a match binding ``names`` to the variables and ``rest`` to ``*xs``."""
        bound = (*names, *rest)
        if self.same_inputs:
            return bound
        return tuple(bound[p] if p >= 0 else "" for p in self.positions)


def _record(call: Callable[[Any, dict[str, Any]], Any], names: tuple[str, ...], many: str | None,
            extra: int, salt: str = "") -> tuple[Any, ...] | None:
    """One trace: (nodes, results), or None where the rewrite read the match or failed."""
    trace = _Trace(salt)
    bindings: dict[str, Any] = {n: _Ref(trace, ("var", n)) for n in names}
    if many is not None:
        bindings[many] = [_Ref(trace, ("many", many, j)) for j in range(extra)]
    try:
        result = call(_Tracer(trace), bindings)
    except Exception:  # the rewrite runs per match, which reports what it raises
        return None
    results = result if isinstance(result, (tuple, list)) and type(result) in (tuple, list) else [result]
    refs = []
    for r in results:
        ref = trace.refs.get(id(r)) if type(r) is _Ref else None
        if ref is None:
            return None
        refs.append(ref)
    if trace.read:
        return None
    return tuple(trace.nodes), tuple(refs)


def trace(call: Callable[[Any, dict[str, Any]], Any], names: tuple[str, ...], many: str | None, extra: int,
          anchor: tuple[str, str]) -> TracedReplacement | None:
    """The template of a single-node rule's ``rewrite`` (``call(op, bindings)``) for matches binding
    the variables ``names`` and ``extra`` inputs to ``*many``; None where it is not provably the
    same for every such match or cannot overwrite the matched node (then ``rewrite`` runs per
    match). ``anchor``: the matched op's (domain, op_type). The traces cannot see C code
    reading a binding's text: the caller asks :func:`traceable` of the rewrite first."""
    first = _record(call, names, many, extra)
    if first is None or _record(call, names, many, extra, salt=".other-text" * 3) != first:
        return None
    nodes, results = first
    if len(nodes) != 1 or results != (("made", 0, 0),):
        return None
    op_type, domain, inputs, outputs, encoded = nodes[0]
    if outputs != 1 or (domain, op_type) == anchor or (domain in ("", "ai.onnx") and anchor[0] in ("", "ai.onnx")
                                                       and op_type == anchor[1]):
        return None  # the same op may be the matched node itself: the engine compares per match
    wanted = [("var", n) for n in names] + [("many", many, j) for j in range(extra)]
    if not set(wanted) <= set(inputs):
        return None  # an input it drops may leave its producer dead: the per-match path sees to that
    node = onnx.NodeProto(op_type=op_type, domain=domain)
    for e in encoded:
        a = node.attribute.add()
        a.ParseFromString(e)
        if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            return None  # a node holding subgraphs: new scopes, counted again (per match)
    positions = tuple(wanted.index(ref) if ref in wanted else -1 for ref in inputs)
    return TracedReplacement(node, positions, list(inputs) == wanted, op_type, domain)


# Builtins a traced rewrite may call: each reads a str argument, if at all, through the
# stand-in's own methods (len: __len__, int: __int__, sorted/min/max: __lt__...), never its
# characters directly. type(), id(), getattr(), str and the like are not among them.
_SAFE_BUILTINS = frozenset(id(f) for f in (
    abs, all, any, bool, dict, enumerate, float, int, isinstance, len, list, max, min, range, reversed,
    sorted, sum, tuple, zip))
_CONSTANTS = (type(None), bool, int, float, complex, str, bytes)
_STR_ATTRIBUTES = frozenset(dir(str))
_SAFE_MODULES = ("onnx", "math")
_SAFE_CLASSES = frozenset({id(onnx.TensorProto), id(onnx.AttributeProto)})
_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"})  # (the last: 3.12)
_DEREFS = frozenset({"LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_CLOSURE", "LOAD_FROM_DICT_OR_DEREF"})
_REFUSED = frozenset({"IMPORT_NAME", "IMPORT_FROM", "IMPORT_STAR", "STORE_GLOBAL", "DELETE_GLOBAL",
                      "STORE_NAME", "DELETE_NAME", "LOAD_SUPER_ATTR", "LOAD_ASSERTION_ERROR",
                      "STORE_ATTR", "DELETE_ATTR"})  # (an attribute set: state kept between calls)


def traceable(fn: Any) -> bool:
    """May ``fn``'s result depend on its str arguments only through their methods? True where
    everything its code reaches besides its arguments is harmless (see the module docstring);
    False for anything else (a bound method, a partial, a callable object, a module or class
    reachable from its code): such a rewrite runs per match."""
    return _reaches_nothing(fn, set())


def _harmless(value: Any, seen: set[int]) -> bool:
    if isinstance(value, _CONSTANTS):
        return True
    if type(value) in (tuple, frozenset):
        return all(_harmless(v, seen) for v in value)
    if isinstance(value, types.FunctionType):
        return _reaches_nothing(value, seen)
    if isinstance(value, types.ModuleType):
        name = value.__name__
        return name in _SAFE_MODULES or name.startswith("onnx.")
    if isinstance(value, type) and issubclass(value, BaseException):
        return True  # raising: the trace fails, the rewrite runs per match
    return id(value) in _SAFE_BUILTINS or id(value) in _SAFE_CLASSES


def _reaches_nothing(fn: Any, seen: set[int]) -> bool:
    if not isinstance(fn, types.FunctionType):
        return False
    if id(fn) in seen:
        return True
    seen.add(id(fn))
    code = fn.__code__
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    defaults = (*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values())
    if not all(_harmless(d, seen) for d in defaults):
        return False
    fn_globals = fn.__globals__
    missing = object()
    stack = [code]
    while stack:
        co = stack.pop()
        stack.extend(c for c in co.co_consts if isinstance(c, types.CodeType))
        for ins in dis.get_instructions(co):
            op = ins.opname
            if op in _REFUSED:
                return False
            if op in ("LOAD_ATTR", "LOAD_METHOD"):
                # x.__class__, f.__globals__...; and a str's methods: on a literal or a str made
                # of a binding ("a/b".find(x), "".join([x]).startswith(...)) C code reads the
                # binding's characters (on the binding itself the stand-in notices them anyway)
                name = str(ins.argval)
                if name.startswith("__") or name in _STR_ATTRIBUTES:
                    return False
            elif op == "CONTAINS_OP":  # x in "a/b c/d": str.__contains__ reads x in C
                return False
            elif op in _LOADS:
                value = fn_globals.get(ins.argval, missing)
                if value is missing:
                    value = getattr(builtins, ins.argval, missing)
                if value is missing or not _harmless(value, seen):
                    return False
            elif op in _DEREFS or op in ("STORE_DEREF", "DELETE_DEREF"):
                cell = cells.get(ins.argval) if ins.argval not in code.co_cellvars else None
                if cell is not None:
                    if op not in _DEREFS:
                        return False  # a closure variable written: state kept between calls
                    try:
                        value = cell.cell_contents
                    except ValueError:
                        return False
                    if not _harmless(value, seen):
                        return False
    return True
