"""The dynamo exporter's opset-18 model converted to an older ai.onnx opset.

graphkit converts the finished model itself with onnx's version converter (torch's own
conversion, asked for through ``opset_version``, fails on axes it does not see as constants
yet and then keeps opset 18 silently), and fixes what the converter gets wrong, in every
graph, subgraph (If/Loop/Scan bodies) and model-local function:

- it has no adapter for Split-18, which differs from Split-13 only by ``num_outputs``: Split
  nodes are hidden from it in a domain of their own, and :func:`split_without_num_outputs`
  fixes them after;
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
from collections.abc import Iterator

import numpy as np
import onnx
import onnx.inliner
import onnx.numpy_helper
import onnx.version_converter

from graphkit.rewrite._walk import AI_ONNX, ModelIndex, graphs, node_lists, value_types
from graphkit.rewrite.builder import NameGenerator

__all__ = ["ConverterError", "convert_down", "drop_default_attributes", "split_without_num_outputs"]

_HIDDEN_DOMAIN = "graphkit.hidden_from_converter"

# Attributes newer opsets added whose value here means what the older op always does.
_NO_OP_ATTRIBUTES = {"noop_with_empty_axes": 0}


class ConverterError(Exception):
    """onnx's version converter failed; ``__cause__`` is its exception."""


def convert_down(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` converted to ai.onnx ``opset`` by onnx's version converter, with what the
    converter gets wrong fixed (see the module docstring). Modifies ``model``; raises
    ConverterError when the converter fails."""
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
    split_without_num_outputs(converted)
    drop_default_attributes(converted, opset)
    return converted


def _attribute_reference(fn: onnx.FunctionProto) -> str | None:
    """The first attribute in ``fn``'s body (nested graphs included) that refers to one of
    ``fn``'s attributes, as ``"node.attribute = @name"``; None when there is none."""
    stack: list = [fn.node]
    while stack:
        for node in stack.pop():
            for attr in node.attribute:
                if attr.ref_attr_name:
                    return f"{node.name or node.op_type}.{attr.name} = @{attr.ref_attr_name}"
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g.node)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(g.node for g in attr.graphs)
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


def split_without_num_outputs(model: onnx.ModelProto) -> None:
    """onnx's version converter leaves Split-18's ``num_outputs`` attribute on the Split-13 it
    writes (found by bench/zoo.py: GPT-2 at opset 17; ONNX Runtime refuses the node). Split-13
    splits evenly into as many parts as the node has outputs: drop the attribute where the
    axis' length is known and even, else give the sizes opset 18 would (ceil-sized parts, the
    last one smaller) as the ``split`` input, a Constant made just before the node. Every
    graph, subgraph and function body; lengths from the types stated in the body's scope.
    Unknown lengths are left to the load check."""
    names = NameGenerator(ModelIndex(model).names)  # the Constants' names clash with nothing
    _split_fix_graphs(model, names)
    for fn in model.functions:
        with _body_model(fn) as body:
            _split_fix_graphs(body, names)


def _split_fix_graphs(model: onnx.ModelProto, names: NameGenerator) -> None:
    types = value_types(model, infer=False)
    for g in graphs(model.graph):
        if not any(n.op_type == "Split" for n in g.node):
            continue
        nodes: list[onnx.NodeProto] = []
        for node in g.node:
            sizes = _split_sizes(node, types) if node.op_type == "Split" and node.domain in AI_ONNX else None
            if sizes is not None:
                keep = [a for a in node.attribute if a.name != "num_outputs"]
                del node.attribute[:]
                node.attribute.extend(keep)
            if sizes:  # uneven: opset 18's sizes as the split input
                name = names.fresh(f"{node.name or node.output[0]}_split_sizes")
                nodes.append(onnx.helper.make_node("Constant", [], [name], name=name, value=onnx.numpy_helper.from_array(
                    np.array(sizes, dtype=np.int64), name)))
                del node.input[1:]
                node.input.append(name)
            nodes.append(node)
        if len(nodes) != len(g.node):
            del g.node[:]
            g.node.extend(nodes)


def _split_sizes(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> list[int] | None:
    """None: leave the Split as it is; []: drop num_outputs (even parts); else the sizes of
    the parts opset 18 gives."""
    attrs = {a.name: a for a in node.attribute}
    if "num_outputs" not in attrs or (len(node.input) > 1 and node.input[1]):
        return None
    n = attrs["num_outputs"].i
    axis = attrs["axis"].i if "axis" in attrs else 0
    tp = types.get(node.input[0])
    shape = tp.tensor_type.shape if tp is not None and tp.tensor_type.HasField("shape") else None
    if shape is None or not -len(shape.dim) <= axis < len(shape.dim) or not shape.dim[axis].HasField("dim_value"):
        return None
    length = shape.dim[axis].dim_value
    chunk = -(-length // n)
    sizes = [chunk] * (n - 1) + [length - chunk * (n - 1)]
    if sizes[-1] <= 0:
        return None
    return [] if length % n == 0 else sizes


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
