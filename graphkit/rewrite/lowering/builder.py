"""Builder: how decompositions add standard ONNX nodes to a graph."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphkit.errors import RewriteError
from graphkit.rewrite.graph.walk import subgraphs, value_types

__all__ = ["Builder", "NameGenerator", "TypeTable"]


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


_T = onnx.TensorProto
_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS
# Standard ops whose outputs all have the element type of input 0.
SAME_AS_INPUT0 = frozenset("""
    Abs Acos Acosh Add AveragePool BatchNormalization Ceil Celu Clip Concat Conv ConvTranspose Cos
    Cosh CumSum DepthToSpace Div Dropout Einsum Elu Erf Exp Expand Flatten Floor Gather GatherElements
    GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool HardSigmoid HardSwish Hardmax Identity
    InstanceNormalization LayerNormalization LeakyRelu Log LogSoftmax LpNormalization MatMul Max MaxPool
    Mean Min Mish Mod Mul Neg Pad Pow PRelu Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp
    ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize Round Selu
    Shrink Sigmoid Sign Sin Sinh Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum
    Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze Upsample DeformConv GridSample RoiAlign
    Asin Asinh Atan Atanh
""".split())
FIXED_TYPES = {"Shape": _T.INT64, "Size": _T.INT64, "NonZero": _T.INT64, "ArgMax": _T.INT64, "ArgMin": _T.INT64,
               "Equal": _T.BOOL, "Less": _T.BOOL, "Greater": _T.BOOL, "LessOrEqual": _T.BOOL,
               "GreaterOrEqual": _T.BOOL, "Not": _T.BOOL, "And": _T.BOOL, "Or": _T.BOOL, "Xor": _T.BOOL,
               "IsNaN": _T.BOOL, "IsInf": _T.BOOL}
# Outputs after the first that have a fixed type.
_SECOND_OUTPUT = {"TopK": _T.INT64, "MaxPool": _T.INT64, "Dropout": _T.BOOL}


class _SiblingReuse(Exception):
    """Two sibling graphs define one name: the table goes from one map to one per scope."""


class TypeTable:
    """Element types and shapes of a model's tensors, computed on first use.

    Element types come from the declarations (inputs, value_info, initializers,
    constants) and a forward pass over the nodes that knows the common standard ops and
    the registry's ops. Whatever that leaves unknown is asked of ONNX shape inference,
    once, the first time it is needed.

    Scopes: ONNX's SSA form spans nested graphs (a subgraph reads outer values but never
    defines an outer name again), but sibling graphs (an If's branches, two Loop bodies)
    may each define one name, each with its own type. Where no two graphs define a name,
    one map serves every scope; where some do (found by the forward pass), each subgraph
    gets a table of the names it defines that looks the others up in the tables of the
    graphs around it. ``scope(graph)`` is the table a node of ``graph`` sees.
    """

    # A model with thousands of If/Loop bodies may have a table per body: kept small.
    __slots__ = ("_defined", "_elem", "_graph", "_model", "_parent", "_registry", "_scoped", "_state", "_top",
                 "_tables", "_types")

    def __init__(self, model: onnx.ModelProto | None = None, registry: Any = None) -> None:
        self._model = model
        self._registry = registry
        self._types: dict[str, onnx.TypeProto] = {}
        self._elem: dict[str, int] = {}
        self._parent: TypeTable | None = None
        # The root table (None: this one). Not a reference to itself: a table in a cycle lives,
        # with the model it holds, until the cyclic collector runs (after the ONNX checker
        # has parsed the output beside it, doubling the peak memory).
        self._top: TypeTable | None = None
        self._graph: onnx.GraphProto | None = None  # a subgraph's table: its graph
        # On the root: whether there is a table per scope; id(subgraph) -> its table then;
        # while there is not, the names subgraphs define and leave untyped (to find one
        # defined twice: a typed one is in the map).
        self._scoped = False
        self._tables: dict[int, TypeTable] = {}
        self._defined: set[str] = set()
        self._state = "new" if model is not None else "done"

    @property
    def _root(self) -> "TypeTable":
        return self._top or self

    def set(self, name: str, tp: onnx.TypeProto) -> None:
        self._types[name] = tp
        if tp.HasField("tensor_type") and tp.tensor_type.elem_type:
            self._elem[name] = tp.tensor_type.elem_type

    def _get(self, name: str) -> int | None:
        """The element type of ``name`` as this scope sees it (its own, else an outer one)."""
        elem = self._elem.get(name)
        if elem is None and self._parent is not None:
            return self._parent._get(name)
        return elem

    def _type(self, name: str) -> onnx.TypeProto | None:
        tp = self._types.get(name)
        if tp is None and self._parent is not None:
            return self._parent._type(name)
        return tp

    def elem_type(self, name: str) -> int | None:
        root = self._root
        if root._state == "new":
            root._forward()
        elem = self._get(name)
        if elem is None and root._state == "forward":
            root._infer()
            elem = self._get(name)
        return elem

    def shape(self, name: str, *, infer: bool = True) -> list[Any] | None:
        """The shape of ``name``; unless ``infer`` is False, ask shape inference when undeclared."""
        root = self._root
        if root._state == "new":
            root._forward()
        tp = self._type(name)
        if infer and tp is None and root._state == "forward":
            root._infer()
            tp = self._type(name)
        if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tp.tensor_type.shape.dim]

    def per_scope(self) -> bool:
        """Whether subgraphs have tables of their own (two sibling graphs define one name);
        runs the forward pass if it has not run. Where not, ``scope(graph)`` is this table."""
        root = self._root
        if root._state == "new":
            root._forward()
        return root._scoped

    def scope(self, graph: onnx.GraphProto) -> TypeTable:
        """The table a node of ``graph`` sees: ``graph`` is the model's main graph or one of
        its subgraphs (a graph no longer in the model is typed on its own, inside this table's)."""
        root = self._root
        if root._model is None:
            return self  # a function body's: nothing is declared, nothing to tell apart
        if graph is root._model.graph:
            return root
        if root._state == "new":
            root._forward()  # whether one map serves every scope
        if not root._scoped:
            return root
        table = root._tables.get(id(graph))
        if table is None or table._graph is not graph:
            root._index_new_graphs()  # a graph rebuilt after the forward pass (a copy)
            table = root._tables.get(id(graph))
            if table is None or table._graph is not graph:
                table = self._child(graph)
                table._forward_graph(graph)
        return table

    def _child(self, graph: onnx.GraphProto) -> TypeTable:
        """The table of ``graph``, nested in this table's graph: this one while one map
        serves every scope, else a new one."""
        root = self._root
        if not root._scoped:
            return root
        table = TypeTable(None, self._registry)
        table._parent, table._top, table._graph = self, root, graph
        table._tables = table._defined = None  # the root's only
        root._tables[id(graph)] = table
        return table

    def _index_new_graphs(self) -> None:
        """Tables for the model's graphs that have none (copies made by rebuilding a node list)."""
        tables = self._tables
        stack: list[tuple[onnx.GraphProto, TypeTable]] = [(self._model.graph, self)]
        while stack:
            g, table = stack.pop()
            for sub in (sub for node in g.node if node.attribute for sub in subgraphs(node)):
                known = tables.get(id(sub))
                if known is not None and known._graph is sub:
                    stack.append((sub, known))
                else:
                    table._child(sub)._forward_graph(sub)

    def _define(self, graph: onnx.GraphProto) -> list[str]:
        """While one map serves every scope, before subgraph ``graph`` is typed: the names it
        defines (inputs, initializers, node outputs); one already typed, or defined untyped,
        is another graph's (SSA: never an outer one)."""
        root = self._root
        elem, types, untyped = root._elem, root._types, root._defined
        names = [name for name in itertools.chain((i.name for i in graph.input), (t.name for t in graph.initializer),
                                                  (o for n in graph.node for o in n.output)) if name]
        for name in names:
            if name in elem or name in types or name in untyped:
                self._sibling_reuse(name)
        return names

    def _defined_untyped(self, names: list[str]) -> None:
        """After a subgraph is typed: what it defines and left untyped (a sibling may type it)."""
        root = self._root
        elem, untyped = root._elem, root._defined
        for name in names:
            if name not in elem:
                untyped.add(name)

    def _sibling_reuse(self, name: str) -> None:
        raise _SiblingReuse(name)

    def _declare(self, graph: onnx.GraphProto) -> None:
        outer = self._parent
        for vi in (*graph.input, *graph.output, *graph.value_info):
            # A subgraph's output may be an outer value: it keeps the outer value's type.
            if outer is None or outer._get(vi.name) is None:
                self.set(vi.name, vi.type)
        for t in graph.initializer:
            self.set(t.name, helper.make_tensor_type_proto(t.data_type, list(t.dims)))

    def _forward(self) -> None:
        self._state = "forward"
        try:
            self._forward_graph(self._model.graph)
        except _SiblingReuse:
            self._types.clear()
            self._elem.clear()
            self._scoped, self._defined = True, None
            self._forward_graph(self._model.graph)

    def _forward_node(self, node: onnx.NodeProto, domain: str, op: str) -> None:
        """The element types of one node's outputs from its inputs' (subgraphs aside)."""
        elem = self._elem
        get = elem.get if self._parent is None else self._get
        std = domain in ("", "ai.onnx")
        if std and op in SAME_AS_INPUT0 and node.input and (t := get(node.input[0])) is not None:
            for i, out in enumerate(node.output):
                elem.setdefault(out, _SECOND_OUTPUT.get(op, t) if i else t)
        elif std and op in FIXED_TYPES:
            for out in node.output:
                elem.setdefault(out, FIXED_TYPES[op])
        elif std and op in ("Cast", "Constant", "ConstantOfShape"):
            for a in node.attribute:
                if a.name == "to":
                    elem.setdefault(node.output[0], a.i)
                elif a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    elem.setdefault(node.output[0], a.t.data_type)
            if op == "ConstantOfShape":
                elem.setdefault(node.output[0], _T.FLOAT)
        elif std and op in ("CastLike", "Where") and len(node.input) > 1 and (t := get(node.input[1])) is not None:
            elem.setdefault(node.output[0], t)
        elif self._registry is not None and (opdef := self._registry.lookup(domain, op)):
            bound = {}
            for p, name in zip(opdef.inputs, node.input):
                t = get(name)
                if t is not None:
                    bound.setdefault(p.type, t)
            for p, out in zip(opdef.outputs, node.output):
                if p.type in bound:
                    elem.setdefault(out, bound[p.type])

    def _forward_graph(self, graph: onnx.GraphProto) -> None:
        """Declare and forward-type ``graph``, this table's graph, and its subgraphs (in tables of their own)."""
        self._declare(graph)
        forward_node = self._forward_node
        for node in graph.node:
            domain = node.domain
            forward_node(node, domain, node.op_type)
            if node.attribute:
                self._forward_subgraphs(node, domain)

    def _forward_subgraphs(self, node: onnx.NodeProto, domain: str) -> None:
        """Forward-type the graphs ``node`` holds, each in its own table."""
        bodies = None
        scoped = self._root._scoped
        for attr in node.attribute:
            t = attr.type
            if t == _GRAPH:
                names = None if scoped else self._define(attr.g)
                table = self._child(attr.g)
                table._forward_graph(attr.g)
                if names:
                    self._defined_untyped(names)
                if bodies is None:
                    bodies = {}
                bodies[attr.name] = table, attr.g
            elif t == _GRAPHS:
                for g in attr.graphs:
                    names = None if scoped else self._define(g)
                    self._child(g)._forward_graph(g)
                    if names:
                        self._defined_untyped(names)
        if bodies and domain in ("", "ai.onnx"):
            self._forward_control_flow(node, bodies)

    def _forward_control_flow(self, node: onnx.NodeProto,
                              bodies: dict[str, tuple[TypeTable, onnx.GraphProto]]) -> None:
        """If/Loop/Scan outputs take the element types of their body's outputs.

        Without this, every model with control flow fell back to whole-model ONNX shape
        inference, whose cost grows with the square of the number of subgraphs.
        """
        found = bodies.get({"If": "then_branch", "Loop": "body", "Scan": "body"}.get(node.op_type, ""))
        if found is None:
            return
        table, body = found
        elem = self._elem
        outs = list(body.output)[1:] if node.op_type == "Loop" else list(body.output)
        for out, body_out in zip(node.output, outs):
            if out and (t := table._get(body_out.name)) is not None:
                elem.setdefault(out, t)

    def _infer(self) -> None:
        """Ask ONNX shape inference (custom ops known through their schemas), for every scope."""
        self._state = "done"
        types = value_types(self._model, self._registry)
        if self._scoped:
            found = [(self.scope(graph), own) for graph, own in types.by_graph()]
        else:  # one map: the first type found for a name
            flat: dict[str, onnx.TypeProto] = {}
            for _, own in types.by_graph():
                for name, tp in own.items():
                    flat.setdefault(name, tp)
            found = [(self, flat)]
        for table, own in found:
            have = table._types
            for name, tp in own.items():
                if name not in have or not have[name].tensor_type.HasField("shape"):
                    table.set(name, tp)


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
