"""The adapters: one per kind of step (:data:`~graphkit.rewrite.convert.steps.STEP_KINDS`),
each changing or checking one node for one step (:data:`ADAPT`), and what they make
(Split-18's sizes, a Softmax-like's axis moved last, GroupNormalization's per-channel scale
and bias). Each raises a :class:`~graphkit.errors.RewriteError` naming the node, the op and
what to do where the older op cannot do what the node does."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import onnx
from onnx import helper, numpy_helper

from graphkit.rewrite.convert.state import Conversion, find_attr, remove_attr
from graphkit.rewrite.convert.steps import (ABSENT, ADDED_ATTRIBUTES, INTEGERS, MEANING_CHANGED, NEW_FOR_FLOATS,
                                            NEW_VALUES, ONES, OPTIONAL_INPUT, TO_INPUT, Step)

__all__ = ["ADAPT", "declared_rank", "last_axis", "move_axis_last", "split_18_runtime_sizes", "split_18_sizes"]


def _check_types(conv: Conversion, step: Step, node: onnx.NodeProto) -> None:
    """Down: the node's element types the model declares are among those the older op takes,
    and its values of one type parameter there have one type (Pow-7's base and exponent,
    BatchNormalization-14's X and scale: two parameters in the newer op). A type the model
    does not declare is not checked here: the output's check finds it."""
    types = conv.types
    if types is None:
        return
    allowed, sides = _type_rules(step)
    bound: dict[str, tuple[str, str]] = {}  # type parameter -> (the first value's type, its name)
    for (params, variadic), actuals in zip(sides, (node.input, node.output)):
        if not params:
            continue
        for i, name in enumerate(actuals):
            if i >= len(params) and not variadic:  # an input the older op lacks (to-input steps check it)
                break
            param = params[min(i, len(params) - 1)]
            tp = types.get(name) if name else None
            if tp is None or param not in allowed or not tp.HasField("tensor_type"):
                continue
            text = _type_text(tp.tensor_type.elem_type)
            if text not in allowed[param]:
                raise conv.error(node, f"{node.op_type}-{step.old} does not take {text[7:-1]} ({name})",
                                 f"{conv.pick} of at least {step.new}")
            first = bound.setdefault(param, (text, name))
            if first[0] != text:
                raise conv.error(node, f"{node.op_type}-{step.old} takes one type for '{first[1]}' and '{name}' "
                                 f"({first[0][7:-1]} and {text[7:-1]} here)",
                                 f"{conv.pick} of at least {step.new}, or Cast them to one type")


@functools.lru_cache(maxsize=None)
def _type_rules(step: Step) -> tuple[dict[str, frozenset[str]], tuple[tuple[tuple[str, ...], bool], ...]]:
    """The older op's allowed types per type parameter, and per side (inputs, outputs) each
    formal's type parameter and whether the last one is variadic."""
    schema = step.schema_old
    allowed = {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints}
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    return allowed, tuple((tuple(f.type_str for f in formals), bool(formals) and formals[-1].option == variadic)
                          for formals in (schema.inputs, schema.outputs))


@functools.lru_cache(maxsize=None)
def _type_text(elem: int) -> str:
    """'tensor(float)' for TensorProto.FLOAT, as schemas write their allowed types."""
    return f"tensor({helper.tensor_dtype_to_string(elem)[len('TensorProto.'):].lower()})"


def _types(conv: Conversion, step: Step, node: onnx.NodeProto) -> None:
    if conv.up:
        return
    _check_types(conv, step, node)
    floats = NEW_FOR_FLOATS.get((step.op, step.new))
    if floats is not None:
        attr = find_attr(node, floats[0])
        if (helper.get_attribute_value(attr) if attr is not None else floats[1]) == floats[1]:
            tp = (conv.types or {}).get(node.input[0]) if node.input else None
            elem = tp.tensor_type.elem_type if tp is not None and tp.HasField("tensor_type") else 0
            if elem not in INTEGERS:
                what = (f"on {helper.tensor_dtype_to_string(elem)[len('TensorProto.'):].lower()} inputs" if elem
                        else f"where the type of '{node.input[0]}' is not declared (it may be a float)")
                raise conv.error(node, f"{floats[0]}={floats[1]} {what} is new in {step.op}-{step.new} "
                                 f"({step.op}-{step.old} takes it on integers only)",
                                 f"{conv.pick} of at least {step.new}, or {conv.keep}")
    new = NEW_VALUES.get((step.op, step.new))
    if new is not None:
        attr = find_attr(node, new[0])
        if attr is not None and helper.get_attribute_value(attr) in new[1]:
            raise conv.error(node, f"{new[0]}={helper.get_attribute_value(attr).decode()} is new in "
                             f"{step.op}-{step.new}", f"{conv.pick} of at least {step.new}")


def _is_default(attr: onnx.AttributeProto, default: Any) -> bool:
    if default is ABSENT:
        return False
    value = helper.get_attribute_value(attr)
    if default == ONES:
        return all(v == 1 for v in value)
    return value == default


def _attributes(conv: Conversion, step: Step, node: onnx.NodeProto) -> None:
    if conv.up:
        return
    _check_types(conv, step, node)
    for name, default in ADDED_ATTRIBUTES[(step.op, step.new)].items():
        attr = find_attr(node, name)
        if attr is None:
            continue
        if not _is_default(attr, default) and not _allowzero_moot(conv, node, name):
            raise conv.error(node, f"attribute {name} is new in {step.op}-{step.new}",
                             f"{conv.pick} of at least {step.new}, or drop {name}")
        remove_attr(node, name)


def _allowzero_moot(conv: Conversion, node: onnx.NodeProto, name: str) -> bool:
    """Reshape's allowzero=1 changes nothing where the shape is a constant without a 0 (the
    dynamo exporter writes it on every Reshape)."""
    if node.op_type != "Reshape" or name != "allowzero" or len(node.input) < 2:
        return False
    source = conv.constant(node.input[1])
    tensor = None
    if source is not None:
        if isinstance(source[0], onnx.TensorProto):
            tensor = source[0]
        elif (value := find_attr(source[0], "value")) is not None and value.type == onnx.AttributeProto.TENSOR:
            tensor = value.t
    if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return False
    return 0 not in numpy_helper.to_array(tensor).reshape(-1).tolist()


def _optional_input(conv: Conversion, step: Step, node: onnx.NodeProto) -> None:
    if conv.up:
        return
    _check_types(conv, step, node)
    index = OPTIONAL_INPUT[(step.op, step.new)]
    if len(node.input) > index and node.input[index]:
        raise conv.error(node, f"input {index} is new in {step.op}-{step.new}",
                         f"{conv.pick} of at least {step.new}")
    del node.input[index:]


def _int64_constant(conv: Conversion, node: onnx.NodeProto, what: str, values: tuple[int, ...] | str) -> None:
    """``node`` reads ``values`` as input 1: an int64 constant of its namespace (the main
    graph or its function), one for all the nodes there that read the same values. A str is
    the name of the function's attribute holding them (a Constant whose value_ints refers to it)."""
    holder = conv.model.graph if conv.function is None else conv.function
    key = (id(holder), what, values)
    name = conv.shared.get(key)
    if name is None:
        name = conv.shared[key] = conv.names.fresh(f"{node.name or node.output[0]}_{what}")
        conv.made.append(name)
        conv.new_constants.setdefault(id(holder), (holder, []))[1].append((name, values))
    del node.input[1:]
    node.input.append(name)


def _to_input(conv: Conversion, step: Step, node: onnx.NodeProto) -> None:
    name = TO_INPUT[(step.op, step.new)]
    if conv.up:
        attrs = node.attribute
        for i, attr in enumerate(attrs):
            if attr.name == name:
                break
        else:
            return
        values = attr.ref_attr_name or tuple(attr.ints)  # in a function: axes = @its_attribute
        del attrs[i]
        _int64_constant(conv, node, name, values)
        return
    _check_types(conv, step, node)
    if step.new != 13 or step.op == "ReduceSum":  # ReduceX-18 / ReduceSum-13 added noop_with_empty_axes
        noop = find_attr(node, "noop_with_empty_axes")
        if noop is not None and noop.i != 0:
            given = len(node.input) > 1 and node.input[1]
            values = _constant_value(conv, step, node, name) if given else []
            if not values:
                raise conv.error(node, "noop_with_empty_axes=1 with no axes (the identity) has no older form",
                                 f"{conv.pick} of at least {step.new}")
        remove_attr(node, "noop_with_empty_axes")
    if len(node.input) > 1 and node.input[1]:
        source = conv.constant(node.input[1])
        ref = find_attr(source[0], "value_ints") if source is not None and not isinstance(
            source[0], onnx.TensorProto) else None
        values = [] if ref is not None and ref.ref_attr_name else _constant_value(conv, step, node, name)
        if ref is not None and ref.ref_attr_name:  # a function's Constant <value_ints = @attr>
            node.attribute.append(onnx.AttributeProto(name=name, ref_attr_name=ref.ref_attr_name,
                                                      type=onnx.AttributeProto.INTS))
        if source is not None:
            conv.released.append(source)
        del node.input[1:]
        if values:  # empty axes of a Reduce: all of them, as no attribute says
            node.attribute.append(_ints_attribute(name, tuple(values)))


@functools.lru_cache(maxsize=4096)
def _ints_attribute(name: str, values: tuple[int, ...]) -> onnx.AttributeProto:
    """An INTS attribute (helper.make_attribute's), made once per value: appending copies it."""
    return onnx.AttributeProto(name=name, type=onnx.AttributeProto.INTS, ints=values)


def _constant_value(conv: Conversion, step: Step, node: onnx.NodeProto, what: str) -> list[int]:
    """The ints a Constant node or an initializer named by ``node``'s input 1 holds (read once
    per constant: many nodes may read one)."""
    source = conv.constant(node.input[1])
    if source is not None and id(source[0]) in conv.values:
        return conv.values[id(source[0])]
    values = _read_constant(conv, step, node, what, source)
    if source is not None:
        conv.values[id(source[0])] = values
    return values


def _read_constant(conv: Conversion, step: Step, node: onnx.NodeProto, what: str,
                   source: tuple[Any, Any] | None) -> list[int]:
    tensor = None
    if source is not None:
        holder = source[0]
        if isinstance(holder, onnx.TensorProto):
            tensor = holder
        elif (value := find_attr(holder, "value")) is not None and value.type == onnx.AttributeProto.TENSOR:
            tensor = value.t
        elif (ints := find_attr(holder, "value_ints")) is not None:
            return list(ints.ints)
    if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise conv.error(node, f"its {what} ({node.input[1]}) are not a constant, and {step.op}-{step.old} "
                         "takes them as an attribute",
                         f"make the {what} a Constant, or {conv.pick} of at least {step.new}")
    return [int(v) for v in numpy_helper.to_array(tensor).reshape(-1)]


def _num_outputs(conv: Conversion, step: Step, node: onnx.NodeProto) -> None:
    given = len(node.input) > 1 and node.input[1]
    if conv.up:
        if not given and find_attr(node, "num_outputs") is None:
            node.attribute.append(helper.make_attribute("num_outputs", len(node.output)))
        return
    _check_types(conv, step, node)
    attr = find_attr(node, "num_outputs")
    if attr is None:
        return
    parts = attr.i
    remove_attr(node, "num_outputs")
    if given:
        return
    axis_attr = find_attr(node, "axis")
    axis = axis_attr.i if axis_attr is not None else 0
    length = _axis_length(conv, node, axis)
    if length is None:
        if conv.target < 13:
            raise conv.error(node, f"it splits axis {axis} of unknown length into {parts} parts (Split-18 "
                             f"num_outputs); before opset 13 the part sizes are an attribute, fixed when the "
                             "model is written",
                             f"give '{node.input[0]}' a static length along axis {axis} (a fixed input shape), "
                             f"or {conv.pick} of at least 13")
        made, sizes_name = split_18_runtime_sizes(node, axis, parts, conv.names.fresh)
        conv.made.extend(o for n in made for o in n.output)
        conv.put_before(node, made)
        node.input.append(sizes_name)
        return
    try:
        sizes = split_18_sizes(length, parts)
    except ValueError as exc:
        raise conv.error(node, str(exc), "fix the model's num_outputs") from exc
    if sizes and conv.target < 13:  # the next step's form: the split attribute
        node.attribute.append(helper.make_attribute("split", sizes))
    elif sizes:
        _int64_constant(conv, node, "split", tuple(sizes))


def _axis_length(conv: Conversion, node: onnx.NodeProto, axis: int) -> int | None:
    """The length of ``node``'s input 0 along ``axis`` as declared in its scope, else None."""
    tp = (conv.types or {}).get(node.input[0])
    shape = tp.tensor_type.shape if tp is not None and tp.tensor_type.HasField("shape") else None
    if shape is None or not -len(shape.dim) <= axis < len(shape.dim) or not shape.dim[axis].HasField("dim_value"):
        return None
    return shape.dim[axis].dim_value


def split_18_runtime_sizes(node: onnx.NodeProto, axis: int, parts: int, fresh: Callable[[str], str]
                           ) -> tuple[list[onnx.NodeProto], str]:
    """Nodes computing, from the shape of Split ``node``'s input at run time, the sizes opset
    18's ``num_outputs=parts`` gives along ``axis`` (ceil(length / parts) each, the last one
    the rest: :func:`split_18_sizes`), for a Split of opset 13 to 17 whose length is unknown;
    and the name of the sizes. ``fresh`` makes a name from a base that clashes with no other."""
    base = node.name or node.output[0]
    made: list[onnx.NodeProto] = []

    def op(op_type: str, *inputs: str, **attrs: Any) -> str:
        out = fresh(f"{base}_split_sizes/{op_type}")
        made.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def const(value: int) -> str:
        out = fresh(f"{base}_split_sizes/const")
        made.append(helper.make_node("Constant", [], [out], name=out,
                                     value=helper.make_tensor(out, onnx.TensorProto.INT64, [1], [value])))
        return out

    length = op("Gather", op("Shape", node.input[0]), const(axis), axis=0)  # [length]
    chunk = op("Div", op("Add", length, const(parts - 1)), const(parts))  # ceil(length / parts)
    last = op("Sub", length, op("Mul", chunk, const(parts - 1)))
    sizes = fresh(f"{base}_split_sizes")
    made.append(helper.make_node("Concat", [chunk] * (parts - 1) + [last], [sizes], name=sizes, axis=0))
    return made, sizes


def split_18_sizes(length: int, parts: int) -> list[int] | None:
    """The part sizes Split-18's ``num_outputs=parts`` gives an axis of ``length``: ceil(length
    / parts) each, the last one the rest; None where they are even (what the older Splits do
    without sizes). ValueError where the last would be negative (opset 18 refuses the node)."""
    chunk = -(-length // parts)
    last = length - chunk * (parts - 1)
    if last < 0:
        raise ValueError(f"num_outputs={parts} on an axis of length {length}: opset 18 refuses it "
                         f"(its last part would have a negative length)")
    return None if length % parts == 0 else [chunk] * (parts - 1) + [last]


def last_axis(node: onnx.NodeProto, up: bool, types: Mapping[str, onnx.TypeProto] | None) -> int | None:
    """The axis of a Softmax-like ``node`` (at the older version going up, the newer going
    down) where it is the input's last one, else None."""
    attr = find_attr(node, "axis")
    axis = attr.i if attr is not None else (1 if up else -1)
    if axis == -1:
        return axis
    tp = (types or {}).get(node.input[0])
    if tp is None or not tp.tensor_type.HasField("shape"):
        return None
    rank = len(tp.tensor_type.shape.dim)
    return axis if axis in (rank - 1, -1) else None


def _last_axis_step(conv: Conversion, step: Step, node: onnx.NodeProto) -> None:
    """Write the last axis out (the two versions' defaults differ), as onnx's converter does:
    -1 going up (Hardmax keeps a value it has), rank - 1 going down where the rank is declared."""
    if not conv.up:
        _check_types(conv, step, node)
    attr = find_attr(node, "axis")
    if conv.up and step.op == "Hardmax" and attr is not None:
        return
    if not conv.up and attr is not None and attr.i >= 0:  # rank - 1 already (the last axis, or moved there)
        return
    axis = -1
    tp = (conv.types or {}).get(node.input[0])
    if not conv.up and tp is not None and tp.tensor_type.HasField("shape"):
        axis = len(tp.tensor_type.shape.dim) - 1
    remove_attr(node, "axis")
    node.attribute.append(helper.make_attribute("axis", axis))


def declared_rank(types: Mapping[str, onnx.TypeProto] | None, name: str) -> int | None:
    tp = (types or {}).get(name)
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    return len(tp.tensor_type.shape.dim)


def move_axis_last(conv: Conversion, node: onnx.NodeProto, rank: int) -> None:
    """Down below 13, a Softmax-like over a middle axis: Transpose that axis last, the op over
    the last axis (``rank - 1``), Transpose back (the older ops flatten to 2-D at the axis)."""
    attr = find_attr(node, "axis")
    axis = attr.i if attr is not None else -1
    axis += rank if axis < 0 else 0
    perm = [i for i in range(rank) if i != axis] + [axis]
    back = [perm.index(i) for i in range(rank)]
    base = node.name or node.output[0]
    moved, result = conv.names.fresh(f"{base}_axis_last"), conv.names.fresh(f"{base}_over_last")
    conv.made.extend((moved, result))
    before = helper.make_node("Transpose", [node.input[0]], [moved], name=conv.names.fresh(f"{base}_Transpose"),
                              perm=perm)
    after = helper.make_node("Transpose", [result], [node.output[0]], name=conv.names.fresh(f"{base}_Transpose"),
                             perm=back)
    node.input[0], node.output[0] = moved, result
    remove_attr(node, "axis")
    node.attribute.append(helper.make_attribute("axis", rank - 1))
    conv.replaced.setdefault(id(conv.nodes), conv.nodes)
    conv.wrapped[id(node)] = (before, after)


def _per_channel(conv: Conversion, step: Step, node: onnx.NodeProto) -> None:
    """Up: the per-group scale and bias repeated over each group's channels (see STEP_KINDS)."""
    if not conv.up:
        raise conv.error(node, MEANING_CHANGED[(step.op, step.new)], f"{conv.pick} of at least {step.new}")
    groups = find_attr(node, "num_groups").i
    base = node.name or node.output[0]
    made: list[onnx.NodeProto] = []

    def op(op_type: str, *inputs: str, **attrs: Any) -> str:
        out = conv.names.fresh(f"{base}_per_channel/{op_type}")
        made.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def const(values: list[int]) -> str:
        out = conv.names.fresh(f"{base}_per_channel/const")
        made.append(helper.make_node("Constant", [], [out], name=out, value=helper.make_tensor(
            out, onnx.TensorProto.INT64, [len(values)], values)))
        return out

    channels = _axis_length(conv, node, 1)
    if channels is not None:
        shape = const([groups, channels // groups])
    else:
        per_group = op("Div", op("Gather", op("Shape", node.input[0]), const([1]), axis=0), const([groups]))
        shape = op("Concat", const([groups]), per_group, axis=0)
    axis, flat = const([1]), const([-1])
    for i in (1, 2):
        node.input[i] = op("Reshape", op("Expand", op("Unsqueeze", node.input[i], axis), shape), flat)
    conv.made.extend(n.output[0] for n in made)
    conv.put_before(node, made)


ADAPT: dict[str, Callable[[Conversion, Step, onnx.NodeProto], None]] = {
    "types": _types, "attributes": _attributes, "optional-input": _optional_input, "to-input": _to_input,
    "num-outputs": _num_outputs, "last-axis": _last_axis_step, "per-channel": _per_channel}
