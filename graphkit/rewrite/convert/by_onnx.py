"""The nodes no adapter covers (a step of no kind here: Resize at 11, anything before opset
12 going down, ...), converted by onnx's version converter in batches of :data:`BATCH`
nodes per call, each node on its own in the batch's model, and the nodes it makes put in
the node's place."""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from graphkit.errors import RewriteError
from graphkit.rewrite.convert.state import Conversion

__all__ = ["BATCH", "onnx_converted"]

# Nodes no adapter covers given to onnx's converter per call: a call costs ~14 ms whatever
# the model (it builds its tables), and its IR costs the square of a graph's inputs (each new
# value's name is checked against every node's outputs, the inputs' node's included).
BATCH = 200


def onnx_converted(conv: Conversion, items: list[tuple[onnx.NodeProto, Any, Any]], a: int
                   ) -> dict[int, list[onnx.NodeProto]]:
    """Nodes of ai.onnx opset ``a`` (with their function and subgraph) converted by onnx's
    version converter in one call (see BATCH): one model holding them all, each node's inputs and outputs
    renamed apart (graph inputs typed as declared in the node's scope), so that no node reads
    another and sibling subgraphs' names cannot clash. Returns id(node) -> the nodes to put
    in its place, the values they make named anew."""
    from onnx import version_converter

    inputs: list[onnx.ValueInfoProto] = []
    copies: list[onnx.NodeProto] = []
    for k, (node, fn, graph) in enumerate(items):
        conv.function, conv.graph = fn, graph
        if any(attr.ref_attr_name for attr in node.attribute):
            raise conv.error(node, "no adapter here, and onnx's converter cannot see the function attribute it "
                             "refers to", f"inline the function, or {conv.keep}")
        types = conv.types or {}
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        for j, name in enumerate(node.input):
            if name:
                copy.input[j] = f"gk{k}i{j}"
                vi = onnx.ValueInfoProto(name=copy.input[j])
                if name in types:
                    vi.type.CopyFrom(types[name])
                inputs.append(vi)
        for j, name in enumerate(node.output):
            if name:
                copy.output[j] = f"gk{k}o{j}"
        copies.append(copy)
    outputs = [onnx.ValueInfoProto(name=o) for c in copies for o in c.output if o]
    mini = helper.make_model(helper.make_graph(copies, "nodes", inputs, outputs), opset_imports=[
        helper.make_opsetid("", a)], ir_version=conv.model.ir_version or 10)
    try:
        converted = version_converter.convert_version(mini, conv.target).graph
    except Exception as exc:  # noqa: BLE001 - the converter raises bare RuntimeErrors / its own types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        node = next((n for n, _, _ in items if n.op_type in first), items[0][0])
        conv.function, conv.graph = next((fn, g) for n, fn, g in items if n is node)
        raise conv.error(node, f"no adapter here, and onnx's version converter refuses it: {first}",
                         f"{conv.pick} other than {conv.target}, or {conv.keep}") from exc
    made = [helper.make_node("Constant", [], [t.name], value=t) for t in converted.initializer]
    made.extend(converted.node)
    # which item each made node belongs to: by the renamed names it reads or writes, or the
    # values a node of the item makes (in order: the converter's nodes are topologically
    # sorted); else (a Constant, an intermediate) by a node of the item reading what it makes
    # (in reverse order, readers before what they read: chains of any length)
    owner: dict[str, int] = {}
    for k, c in enumerate(copies):
        owner.update((n, k) for n in (*c.input, *c.output) if n)
    group: list[int | None] = [None] * len(made)
    for i, n in enumerate(made):
        k = next((owner[x] for x in (*n.input, *n.output) if x in owner), None)
        if k is not None:
            group[i] = k
            owner.update((x, k) for x in n.output if x)
    for i in range(len(made) - 1, -1, -1):
        n = made[i]
        if group[i] is None:
            group[i] = next((owner[x] for x in n.output if x in owner), None)
        if group[i] is not None:
            owner.update((x, group[i]) for x in n.input if x and x not in owner)
    out: dict[int, list[onnx.NodeProto]] = {}
    for k, (node, _, _) in enumerate(items):
        rename = {f"gk{k}i{j}": name for j, name in enumerate(node.input) if name}
        rename.update({f"gk{k}o{j}": name for j, name in enumerate(node.output) if name})
        base = node.name or node.output[0]
        nodes = [n for i, n in enumerate(made) if group[i] == k]
        for n in nodes:
            for j, name in enumerate(n.output):
                if name and name not in rename:
                    rename[name] = conv.names.fresh(f"{base}_{name.lstrip('_')}")
                    conv.made.append(rename[name])
        for n in nodes:
            n.input[:] = [rename.get(x, x) for x in n.input]
            n.output[:] = [rename.get(x, x) for x in n.output]
            n.name = node.name if n.op_type == node.op_type else (conv.names.fresh(f"{base}_{n.op_type}")
                                                                   if node.name else "")
        out[id(node)] = nodes
    if any(g is None for g in group):
        raise RewriteError(f"onnx's version converter made nodes graphkit cannot place (converting "
                           f"{', '.join(sorted({n.op_type for n, _, _ in items}))} to opset {conv.target})",
                           path=conv.path, hint=conv.keep)
    return out
