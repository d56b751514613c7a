"""Builder: how decompositions add standard ONNX nodes to a graph."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphkit.errors import RewriteError
from graphkit.rewrite.graph.types import TypeTable

__all__ = ["Builder", "NameGenerator"]


class NameGenerator:
    """Unique node and tensor names that clash with nothing already in the model."""

    def __init__(self, taken: Iterable[str] = (), *, adopt: bool = False) -> None:
        # ``adopt``: ``taken`` is a set the caller hands over (it grows with the names made)
        self._taken = taken if adopt and isinstance(taken, set) else set(taken)
        # Next suffix to try per base: the i-th name made from one base costs O(1), not O(i)
        # (unnamed nodes all share a base). Names are never released, so the suffixes below
        # it stay taken and the names made are the same as probing from 1.
        self._next: dict[str, int] = {}

    def reserve(self, name: str) -> None:
        self._taken.add(name)

    def __contains__(self, name: str) -> bool:
        """Is ``name`` taken (the model's, or made here)?"""
        return name in self._taken

    def fresh(self, base: str) -> str:
        taken = self._taken
        if base not in taken:
            taken.add(base)
            return base
        i = self._next.get(base, 1)
        name = f"{base}_{i}"
        while name in taken:
            i += 1
            name = f"{base}_{i}"
        self._next[base] = i + 1
        taken.add(name)
        return name

    def fresh_grid(self, prefixes: list[str], suffixes: list[str]) -> list[str]:
        """``[self.fresh(p + s) for p in prefixes for s in suffixes]``, the same names, made a
        base at a time where one prefix repeats (unnamed nodes) or every base is new.

        Per base ``b`` (one of the suffixes after the one prefix), its names are ``b`` if not
        taken, then ``b_<i>`` on from its counter: made at once where none of those is taken
        and no base is another's plus ``_<digits>`` (only then can two bases' names meet, and
        the order they are asked in matter). Anything else is asked one by one."""
        if type(self).fresh is not NameGenerator.fresh or not prefixes:  # a subclass's own rule
            return [self.fresh(p + s) for p in prefixes for s in suffixes]
        taken, counters = self._taken, self._next
        first = prefixes[0]
        if prefixes.count(first) != len(prefixes):
            bases = [p + s for p in prefixes for s in suffixes]
            if len(set(bases)) == len(bases) and taken.isdisjoint(bases):  # each its own name
                taken.update(bases)
                return bases
            return list(map(self.fresh, bases))
        n, m = len(prefixes), len(suffixes)
        slots: dict[str, list[int]] = {}
        for t, s in enumerate(suffixes):
            slots.setdefault(first + s, []).append(t)
        if any(_numbered(b2, b1) for b1 in slots for b2 in slots if b1 != b2):
            return [self.fresh(p + s) for p in prefixes for s in suffixes]
        made: list[tuple[str, list[int], list[str], int]] = []
        for base, at in slots.items():
            count = n * len(at)
            own = base not in taken
            start = counters.get(base, 1)
            names = [f"{base}_{i}" for i in range(start, start + count - own)]
            if not taken.isdisjoint(names):  # a taken name to step over: one by one
                return [self.fresh(p + s) for p in prefixes for s in suffixes]
            made.append((base, at, [base, *names] if own else names, start + count - own))
        out: list[str] = [""] * (n * m)
        for base, at, names, after in made:
            taken.update(names)
            if len(names) > 1 or names[0] != base:  # a counter only where one was read
                counters[base] = after
            k = len(at)
            for r, t in enumerate(at):
                out[t::m] = names[r::k]
        return out


def _numbered(name: str, base: str) -> bool:
    """Whether ``name`` may be one NameGenerator makes from ``base`` (``base_<digits>``)."""
    rest = name[len(base) + 1:]
    return name.startswith(base + "_") and rest.isascii() and rest.isdigit()


class Builder:
    """Collects the nodes that replace one node.

    ``op`` adds a node and returns its output name(s); ``constant`` adds a typed
    constant; ``dtype``/``shape`` read what type inference knows about a tensor.
    """

    def __init__(self, *, opset: int, prefix: str, names: NameGenerator, types: TypeTable,
                 node_name: str = "", op_name: str = "", constants: dict | None = None) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        # Constants already made in this scope (by earlier replacements), shared by value.
        self._constants = {} if constants is None else constants
        self._own_constants = constants is None
        self._prefix = prefix
        self._names = names
        self._types = types
        self._node_name = node_name
        self._op_name = op_name
        self.used_shapes = False
        # Set by the rule engine where the scope can hold initializers (a graph, not a function).
        self.initializers: list[onnx.TensorProto] | None = None
        # Outputs replaced by an existing tensor instead of an Identity (see finish(alias=)).
        self.aliases: dict[str, str] = {}
        self._lookup: Any = None
        self._made: list[tuple[Any, list[str]]] = []  # (inputs, outputs) of each node op() made
        self._keep_ops: list[str] | None = None  # b.X functions kept on the builder (see _restart)
        # The nodes op() makes live in one message's memory (kept across restarts): a
        # NodeProto of its own costs about twice as much, and a rule may make a million.
        self._arena = onnx.GraphProto()

    def _restart(self, prefix: str, node_name: str) -> None:
        """Start on the replacement of another node, as a new Builder with this prefix and
        node name would (the rule engine keeps one per rule and scope, and calls
        :meth:`_release` when done with it)."""
        if self._keep_ops is None:
            self._keep_ops = []
        self.nodes = []
        self._made = []
        self._prefix = prefix
        self._node_name = node_name
        self.used_shapes = False
        self.aliases = {}
        if self._own_constants:
            self._constants = {}
        if self.initializers is not None:
            self.initializers = []

    def _release(self) -> None:
        """Drop the ``b.X`` functions kept since :meth:`_restart` (each refers to the builder:
        left, they would keep it alive until the cyclic collector runs)."""
        for op_type in self._keep_ops or ():
            self.__dict__.pop(op_type, None)
        self._keep_ops = None

    def op(self, op_type: str, *inputs: str, domain: str = "", outputs: int = 1,
           **attrs: Any) -> Any:
        """Add ``op_type(*inputs, **attrs)``; returns one name, or a tuple if ``outputs > 1``."""
        node_name = self._names.fresh(f"{self._prefix}/{op_type}")
        out_names = [self._names.fresh(f"{node_name}_out{i}" if outputs > 1 else f"{node_name}_out")
                     for i in range(outputs)]
        node = self._arena.node.add(op_type=op_type, input=inputs, output=out_names, name=node_name, domain=domain)
        if attrs:
            node.attribute.extend(helper.make_attribute(k, v) for k, v in sorted(attrs.items()))
        self.nodes.append(node)
        self._made.append((inputs, out_names))
        return out_names[0] if outputs == 1 else tuple(out_names)

    @property
    def prefix(self) -> str:
        return self._prefix

    def constant(self, value: Any, *, dtype: int | None = None, like: str | None = None) -> str:
        """A constant holding ``value``, of element type ``dtype`` or of tensor ``like``'s type.

        Where ``like``'s type is unknown (inside a function body) the constant is made
        float and cast with CastLike (opset 15 and up).
        """
        if dtype is None:
            if like is None:
                raise TypeError("constant() needs dtype= or like=")
            dtype = self._types.elem_type(like)
            if dtype is None:
                if self.opset < 15:
                    self.dtype(like)  # raises: unknown type and no CastLike before opset 15
                return self.op("CastLike", self.constant(value, dtype=onnx.TensorProto.FLOAT), like)
        array = np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(dtype))
        key = (dtype, array.shape, array.tobytes())
        name = self._constants.get(key)
        if name is None:
            name = self._names.fresh(f"{self._prefix}/const")
            tensor = numpy_helper.from_array(array, name=name)
            self.nodes.append(helper.make_node("Constant", [], [name], name=name, value=tensor))
            self._made.append(((), [name]))
            self._constants[key] = name
        return name

    def initializer(self, value: Any, *, dtype: int | None = None, name: str = "init") -> str:
        """An initializer holding ``value`` (of element type ``dtype``, else numpy's); returns its name.

        Where the scope cannot hold initializers (a function body, a decomposition) it
        is a Constant node instead.
        """
        if self.initializers is None:
            array = np.asarray(value)
            return self.constant(array, dtype=dtype or helper.np_dtype_to_tensor_dtype(array.dtype))
        array = np.asarray(value, dtype=None if dtype is None else helper.tensor_dtype_to_np_dtype(dtype))
        tensor = numpy_helper.from_array(array, name=self._names.fresh(f"{self._prefix}/{name}"))
        self.initializers.append(tensor)
        return tensor.name

    def constant_value(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it is a constant (Constant node or initializer), else None."""
        return None if self._lookup is None else self._lookup(name)

    def dtype(self, name: str) -> int:
        """The ONNX element type of tensor ``name``; RewriteError when unknown."""
        elem = self._types.elem_type(name)
        if elem is None:
            raise RewriteError(
                f"element type of input '{name}' is unknown", node=self._node_name, op=self._op_name,
                hint="give the model's inputs a type or make sure shape inference reaches this node")
        return elem

    def shape(self, name: str) -> list[Any] | None:
        self.used_shapes = True  # the result may depend on shapes: not reusable as a template
        return self._types.shape(name)

    def __getattr__(self, op_type: str) -> Any:
        """``b.Mul(x, y)`` is ``b.op("Mul", x, y)``; ``_domain=``/``_outputs=`` as in op()."""
        if op_type.startswith("_"):
            raise AttributeError(op_type)

        def make(*inputs: str, _domain: str = "", _outputs: int = 1, **attrs: Any) -> Any:
            return self.op(op_type, *inputs, domain=_domain, outputs=_outputs, **attrs)

        if self._keep_ops is not None:  # a builder used again and again: the next b.X finds it
            self._keep_ops.append(op_type)
            self.__dict__[op_type] = make
        return make

    def finish(self, results: list[str], outputs: list[str], *,
               alias: Any = None) -> list[onnx.NodeProto]:
        """The built nodes, renamed so that ``results[i]`` is produced as ``outputs[i]``.

        A result the builder did not make (an input, typically) becomes an Identity, or,
        where ``alias(output)`` is true, an entry of ``self.aliases``: the caller renames
        the output's consumers to the result and no node is left behind.
        """
        if len(results) < len([o for o in outputs if o]):
            raise RewriteError(f"replacement returned {len(results)} outputs for {len(outputs)}",
                               node=self._node_name, op=self._op_name,
                               hint="return one tensor per output of the replaced node")
        nodes = self.nodes
        made = self._made
        if len(results) == 1 and len(outputs) == 1 and len(nodes) == 1 and len(made) == 1 and outputs[0] \
                and made[0][1] == [results[0]]:  # one node made, its one output the result: rename it
            nodes[0].output[0] = outputs[0]
            return nodes
        if len(made) != len(nodes):  # nodes appended from outside op() and constant()
            made = [(tuple(n.input), list(n.output)) for n in nodes]
        produced = {o for _, outs in made for o in outs}
        rename: dict[str, str] = {}
        for new, orig in zip(results, outputs):
            if not orig:
                continue
            if new in produced and new not in rename:
                rename[new] = orig
            elif alias is not None and alias(orig):
                self.aliases[orig] = rename.get(new, new)
            else:  # the result is an input, or already stands for another output
                nodes.append(helper.make_node("Identity", [rename.get(new, new)], [orig],
                                              name=self._names.fresh(f"{self._prefix}/Identity")))
        if rename:  # the nodes' fields as Python lists: reading protobuf fields costs more
            for n, (ins, outs) in zip(nodes, made):
                for i, name in enumerate(ins):
                    if name in rename:
                        n.input[i] = rename[name]
                for i, name in enumerate(outs):
                    if name in rename:
                        n.output[i] = rename[name]
        return nodes
