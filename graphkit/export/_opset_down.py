"""The dynamo exporter's opset-18 model converted to an older ai.onnx opset.

torch's own conversion, asked for through ``opset_version``, fails on axes it does not see
as constants yet and then keeps opset 18 silently, so graphkit converts the finished model
itself, with the converter ``graphkit rewrite --target-opset`` uses
(:mod:`graphkit.rewrite.convert.opset`): graphkit's adapters in one pass over every graph,
subgraph (If/Loop/Scan bodies) and model-local function, onnx's version converter node by
node for the nodes they do not cover. Its Split-18 adapter writes ``num_outputs`` as the
sizes opset 18 gives (from the types in the node's own scope, or from the input's shape at
run time), and model-local functions keep their attribute references.

onnx's converter on the whole model costs the number of subgraphs times the values around
them (its shape inference copies the enclosing scope's types into every body): it is only
the fallback where a node holding subgraphs has no adapter (If/Loop/Scan below opset 12),
with what it gets wrong fixed:

- it has no adapter for Split-18 (``num_outputs``): Split nodes are hidden from it in a
  domain of their own, and :func:`split_without_num_outputs` writes them for the target
  opset after (sizes from the types in the node's own scope, or from the input's shape at
  run time; the ``split`` attribute below 13; an ExportError naming the node where they
  cannot be written). Below 13 the converter itself has no adapter for most ops (Concat,
  Neg, Identity, If: measured with onnx 1.23), so few models get that far;
- it keeps ReduceX-18's ``noop_with_empty_axes=0`` (:func:`drop_default_attributes`);
- it drops model-local functions and converts no function body: each body is converted on
  its own (as the graph of a model of its own) and put back;
- converting a body as a plain graph loses ``ref_attr_name`` (an attribute that takes the
  caller's value, ``axis = @ax``, becomes the attribute's default): a function whose body
  refers to its attributes is inlined at its call sites first (onnx.inliner), so each call
  site's own values are converted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import onnx.numpy_helper
import onnx.version_converter

from graphkit.errors import ExportError, RewriteError
from graphkit.rewrite.convert.opset import convert as convert_by_adapters
from graphkit.rewrite.convert.opset import split_18_runtime_sizes, split_18_sizes
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.graph.walk import AI_ONNX, ModelIndex, graph_tree, node_lists, walk
from graphkit.rewrite.lowering.builder import NameGenerator

__all__ = ["ConverterError", "convert_down", "drop_default_attributes", "split_without_num_outputs"]

_HIDDEN_DOMAIN = "graphkit.hidden_from_converter"

# Attributes newer opsets added whose value here means what the older op always does.
_NO_OP_ATTRIBUTES = {"noop_with_empty_axes": 0}


class ConverterError(Exception):
    """onnx's version converter failed; ``__cause__`` is its exception."""


def convert_down(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` converted to ai.onnx ``opset`` by graphkit's converter, or, where a node
    holding subgraphs has none, by onnx's version converter on the whole model with what it
    gets wrong fixed (see the module docstring). Modifies ``model``; raises ExportError
    naming the node and op where a node cannot be converted, ConverterError where onnx's
    converter on the whole model fails."""
    source = next((i.version for i in model.opset_import if i.domain in AI_ONNX), opset)
    try:
        done = convert_by_adapters(model, opset, pick="export at an opset",
                                   keep=f"export at opset {source}")
    except RewriteError as exc:
        raise ExportError(f"the dynamo exporter builds opset {source} and graphkit could not convert it to opset "
                          f"{opset}: {exc.message}", node=exc.node, op=exc.op,
                          hint=f"{exc.hint}; or export with dynamo=False") from exc
    if not done.fallback:
        return model
    return _convert_whole_model(model, opset)


def _convert_whole_model(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` converted by onnx's version converter on the whole model, with what the
    converter gets wrong fixed (see the module docstring)."""
    _inline_attribute_references(model)
    for nodes, _ in node_lists(model):
        for node in nodes:
            if node.op_type == "Split" and node.domain in AI_ONNX:
                node.domain = _HIDDEN_DOMAIN
    for imports in (model.opset_import, *(fn.opset_import for fn in model.functions)):
        imports.append(onnx.helper.make_opsetid(_HIDDEN_DOMAIN, 1))
    functions = list(model.functions)
    del model.functions[:]  # the converter would drop them, converted or not
    try:
        converted = onnx.version_converter.convert_version(model, opset)
        for fn in functions:
            _convert_function(fn, opset)
    except Exception as exc:  # noqa: BLE001 - the converter raises RuntimeError or its own
        raise ConverterError(str(exc)) from exc
    converted.functions.extend(functions)
    for nodes, _ in node_lists(converted):
        for node in nodes:
            if node.domain == _HIDDEN_DOMAIN:
                node.domain = ""
    for imports in (converted.opset_import, *(fn.opset_import for fn in converted.functions)):
        kept = [i for i in imports if i.domain != _HIDDEN_DOMAIN]
        del imports[:]
        imports.extend(kept)
    split_without_num_outputs(converted, opset)
    drop_default_attributes(converted, opset)
    return converted


def _attribute_reference(fn: onnx.FunctionProto) -> str | None:
    """The first attribute in ``fn``'s body (nested graphs included) that refers to one of
    ``fn``'s attributes, as ``"node.attribute = @name"``; None when there is none."""
    for _, v in walk(fn, reverse=True):  # the body first, then its graphs, the last first
        for node in v.nodes:
            for attr in node.attribute:
                if attr.ref_attr_name:
                    return f"{node.name or node.op_type}.{attr.name} = @{attr.ref_attr_name}"
    return None


def _inline_attribute_references(model: onnx.ModelProto) -> None:
    """Inline, in place, every model-local function whose body refers to its attributes (the
    converter, which sees a body as a plain graph, would turn the references into the
    attributes' defaults). Repeated while inlining leaves such references in other functions
    (a call passing ``@ax`` on). Raises ConverterError if a reference survives."""
    for _ in range(len(model.functions) + 1):
        refs = {(fn.domain, fn.name): ref for fn in model.functions if (ref := _attribute_reference(fn)) is not None}
        if not refs:
            return
        try:
            inlined = onnx.inliner.inline_selected_functions(model, list(refs))
        except Exception as exc:  # noqa: BLE001 - the inliner raises its own C++ errors
            raise ConverterError(f"cannot inline model-local functions {sorted(refs)} whose bodies refer to their "
                                 f"attributes ({exc})") from exc
        model.CopyFrom(inlined)
        left = {key: refs[key] for key in refs if any((fn.domain, fn.name) == key for fn in model.functions)}
        if left:
            domain, name = next(iter(left))
            raise ConverterError(f"model-local function {domain}::{name} refers to its attribute ({left[domain, name]}) "
                                 "and was not inlined; the version converter would replace the reference by the "
                                 "attribute's default")
    raise ConverterError("model-local functions still refer to their attributes after inlining")


@contextlib.contextmanager
def _body_model(fn: onnx.FunctionProto) -> Iterator[onnx.ModelProto]:
    """``fn``'s body as the graph of a model of its own (its inputs and outputs untyped, its
    value_info kept); the nodes are written back into ``fn`` when the block ends."""
    untyped = onnx.TypeProto()
    graph = onnx.helper.make_graph(list(fn.node), fn.name, [onnx.helper.make_value_info(i, untyped) for i in fn.input],
                                   [onnx.helper.make_value_info(o, untyped) for o in fn.output],
                                   value_info=list(fn.value_info))
    model = onnx.helper.make_model(graph, opset_imports=list(fn.opset_import), ir_version=10)
    yield model
    del fn.node[:]
    fn.node.extend(model.graph.node)


def _convert_function(fn: onnx.FunctionProto, opset: int) -> None:
    """Convert ``fn``'s body to ai.onnx ``opset`` in place (a body at that opset stays as it is)."""
    imports = {i.domain: i for i in fn.opset_import}
    standard = imports.get("", imports.get("ai.onnx"))
    if standard is None or standard.version == opset:
        return
    with _body_model(fn) as body:
        converted = onnx.version_converter.convert_version(body, opset)
        body.graph.CopyFrom(converted.graph)
    standard.version = opset


def split_without_num_outputs(model: onnx.ModelProto, opset: int) -> None:
    """Bring every Split of ``model`` (hidden from onnx's version converter, which has no
    adapter for Split-18) to ai.onnx ``opset``, in every graph, subgraph and function body.

    Split-18's ``num_outputs`` (found by bench/zoo.py on GPT-2 at opset 17: the converter
    kept it and ONNX Runtime refused the node) becomes the sizes opset 18 gives: ceil-sized
    parts, the last one smaller. An even split of a known length needs none (the older
    Splits split evenly into as many parts as the node has outputs); other sizes are the
    ``split`` input from opset 13 (a Constant made before the node, or, where the length is
    unknown, computed from the input's shape) and the ``split`` attribute below it; below
    13, a ``split`` input becomes that attribute (it must be a constant), and below 11 a
    negative axis is counted from the front. Lengths and ranks come from the types stated
    in the node's own scope. What cannot be written at ``opset`` is an ExportError naming
    the node."""
    names = NameGenerator(ModelIndex(model).names)  # the Constants' names clash with nothing
    _split_fix_graphs(model, names, opset, "")
    for fn in model.functions:
        with _body_model(fn) as body:
            _split_fix_graphs(body, names, opset, f"function {fn.domain}::{fn.name}: ")


def _split_fix_graphs(model: onnx.ModelProto, names: NameGenerator, opset: int, where: str) -> None:
    types = TypeTable.inferred(model, infer=False)
    tree = graph_tree(model.graph)
    constants: dict[int, dict[str, onnx.TensorProto]] = {}

    def constant(index: int, name: str) -> np.ndarray | None:
        """The value of ``name`` where it is a constant seen from graph ``index``."""
        while index >= 0:
            if index not in constants:
                g = tree[index][0]
                found = {t.name: t for t in g.initializer}
                for n in g.node:
                    if n.op_type == "Constant" and n.domain in AI_ONNX and n.attribute and n.attribute[0].name == "value":
                        found[n.output[0]] = n.attribute[0].t
                constants[index] = found
            if name in constants[index]:
                return onnx.numpy_helper.to_array(constants[index][name])
            index = tree[index][1]
        return None

    # Inner graphs first: rebuilding a node list copies the graphs held in it.
    for index in reversed(range(len(tree))):
        g = tree[index][0]
        if not any(n.op_type == "Split" and n.domain in AI_ONNX for n in g.node):
            continue
        scope = types.scope(g)
        nodes: list[onnx.NodeProto] = []
        for node in g.node:
            if node.op_type == "Split" and node.domain in AI_ONNX:
                nodes.extend(_split_at(node, scope, lambda name, i=index: constant(i, name), opset, names, where))
            else:
                nodes.append(node)
        if len(nodes) != len(g.node):
            del g.node[:]
            g.node.extend(nodes)


def _split_at(node: onnx.NodeProto, types: Mapping[str, onnx.TypeProto], constant: Callable[[str], Any],
              opset: int, names: NameGenerator, where: str) -> list[onnx.NodeProto]:
    """``node`` (a Split) at ``opset``, in place, with the nodes it now reads made before it."""
    label = node.name or f"<unnamed Split of '{node.input[0]}'>"

    def refuse(message: str, hint: str) -> ExportError:
        return ExportError(f"{where}{message}", node=label, op="Split", hint=hint)

    attrs = {a.name: a for a in node.attribute}
    axis = attrs["axis"].i if "axis" in attrs else 0
    parts = attrs["num_outputs"].i if "num_outputs" in attrs else None
    split_input = node.input[1] if len(node.input) > 1 and node.input[1] else ""
    tp = types.get(node.input[0])
    shape = tp.tensor_type.shape if tp is not None and tp.tensor_type.HasField("shape") else None
    rank = len(shape.dim) if shape is not None else None
    length = None
    if rank is not None and -rank <= axis < rank and shape.dim[axis].HasField("dim_value"):
        length = shape.dim[axis].dim_value
    static_hint = (f"give '{node.input[0]}' a static length along axis {axis} (a fixed input shape), "
                   f"or export at opset >= 13")
    before: list[onnx.NodeProto] = []
    sizes: list[int] | None = None  # the sizes to write; None: an even split (or the split input kept)
    if parts is not None and not split_input:
        if length is not None:
            try:
                sizes = split_18_sizes(length, parts)
            except ValueError as exc:
                raise refuse(f"splits axis {axis}: {exc}", hint="fix the model's num_outputs") from exc
        elif opset >= 13:
            before, split_input = split_18_runtime_sizes(node, axis, parts, names.fresh)
        else:
            raise refuse(f"splits axis {axis} of unknown length into {parts} parts (Split-18 num_outputs); at "
                         f"opset {opset} the part sizes are an attribute, fixed when the model is written",
                         hint=static_hint)
    elif split_input and opset < 13:
        value = constant(split_input)
        if value is None:
            raise refuse(f"its part sizes '{split_input}' are computed, but at opset {opset} they are an "
                         "attribute, fixed when the model is written", hint="export at opset >= 13")
        sizes = [int(v) for v in np.asarray(value).reshape(-1)]
        split_input = ""
    if axis < 0 and opset < 11:
        if rank is None:
            raise refuse(f"axis {axis} counts from the back, which Split before opset 11 does not, and the rank of "
                         f"'{node.input[0]}' is unknown", hint="export at opset >= 11, or give the input a shape")
        axis += rank
    keep = [a for a in node.attribute if a.name not in ("num_outputs", "axis", "split")]
    del node.attribute[:]
    if "axis" in attrs or axis != 0:
        node.attribute.append(onnx.helper.make_attribute("axis", axis))
    node.attribute.extend(keep)
    if sizes is not None and opset >= 13:
        name = names.fresh(f"{node.name or node.output[0]}_split_sizes")
        before.append(onnx.helper.make_node("Constant", [], [name], name=name,
                                            value=onnx.numpy_helper.from_array(np.array(sizes, dtype=np.int64), name)))
        split_input = name
    elif sizes is not None:
        node.attribute.append(onnx.helper.make_attribute("split", sizes))
    del node.input[1:]
    if split_input:
        node.input.append(split_input)
    return [*before, node]


def drop_default_attributes(model: onnx.ModelProto, opset: int) -> None:
    """Remove attributes the node's schema at ``opset`` lacks when their value is the
    behaviour of the older op (ReduceMean-18's ``noop_with_empty_axes=0`` on ReduceMean-13:
    onnx's converter keeps it and ONNX Runtime refuses the node), in every graph, subgraph
    and function body."""
    for nodes, _ in node_lists(model):
        for node in nodes:
            if node.domain not in AI_ONNX or not node.attribute:
                continue
            try:
                schema = onnx.defs.get_schema(node.op_type, opset, "")
            except onnx.defs.SchemaError:
                continue
            keep = [a for a in node.attribute if a.name in schema.attributes
                    or _NO_OP_ATTRIBUTES.get(a.name, object()) != onnx.helper.get_attribute_value(a)]
            if len(keep) != len(node.attribute):
                del node.attribute[:]
                node.attribute.extend(keep)
