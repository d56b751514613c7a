"""Going down, the nodes of an op the target opset lacks (LayerNormalization below 17,
GroupNormalization below 18, Gelu below 20, RMSNormalization below 23: any op ONNX gives a
function body built for the node), or whose meaning changed in between (GroupNormalization
across 21), replaced by the nodes of ONNX's own function body for them, which the adapters
then take down like any other node."""

from __future__ import annotations

from collections.abc import Mapping

import onnx
from onnx import helper

from graphkit.rewrite.convert.state import Conversion, nested_node_lists, roots
from graphkit.rewrite.convert.steps import MEANING_CHANGED
from graphkit.rewrite.graph.walk import AI_ONNX

__all__ = ["expand_functions", "expandable"]


def expandable(op: str, a: int, target: int) -> int | None:
    """The opset of the ONNX function body standing for ai.onnx ``op`` (at opset ``a``) going
    down to ``target``, where the older opset lacks the op or its meaning (LayerNormalization
    below 17, GroupNormalization below 18 or across 21, Gelu below 20, RMSNormalization below
    23...), else None: the newest body up to ``a`` (:func:`_function_nodes` refuses one whose ops
    do not mean at ``a`` what they meant at its opset)."""
    try:
        schema = onnx.defs.get_schema(op, a, "")
    except onnx.defs.SchemaError:
        return None
    if not schema.has_context_dependent_function:
        return None
    try:
        older = onnx.defs.get_schema(op, target, "").since_version
    except onnx.defs.SchemaError:
        older = None
    changed = any(o == op and target < v <= a for o, v in MEANING_CHANGED)
    if older is not None and not changed:
        return None
    versions = [v for v in schema.context_dependent_function_opset_versions if v <= a]
    return max(versions) if versions else None


def expand_functions(model: onnx.ModelProto, target: int, *, path: str | None, taken: set[str] | None,
                     pick: str, keep: str) -> list[str]:
    """Going down, each node of an op the target opset lacks (or whose meaning changed across
    it) replaced, where it is, by the nodes of ONNX's own function body for it: standard ops
    that the conversion then takes down as any other (LayerNormalization-17 to 13 becomes
    Flatten, ReduceMean, Sub, Div... at 13). The body is made for the node's attributes and
    its inputs' declared element types; its values get names of their own. Returns the ops
    expanded, as "<op> <opset of the body>"."""
    done: set[str] = set()
    conv = Conversion(target, path, model, taken, pick=pick, keep=keep)
    for a, fn, root in roots(model):
        if a <= target:
            continue
        found: dict[str, int | None] = {}
        # every node list, a graph's before its subgraphs'
        lists = list(nested_node_lists(model.graph if fn is None else fn))
        # Subgraphs' lists first: rebuilding a list copies the subgraphs its nodes hold, which
        # would lose changes made to them after.
        for nodes, graph in reversed(lists):
            placed: list[list[onnx.NodeProto]] = []
            expanded = False
            for node in nodes:
                version = None
                if node.domain in AI_ONNX:
                    if node.op_type not in found:
                        found[node.op_type] = expandable(node.op_type, a, target)
                    version = found[node.op_type]
                if version is None:
                    placed.append([node])
                    continue
                conv.function, conv.graph = fn, graph
                placed.append(_function_nodes(conv, node, version, a, conv.types))
                done.add(f"{node.op_type} {version}")
                expanded = True
            if expanded:
                made = [n for group in placed for n in group]
                del nodes[:]
                nodes.extend(made)
    if taken is not None:
        taken.update(conv.made)
    return sorted(done)


def _function_nodes(conv: Conversion, node: onnx.NodeProto, version: int, a: int,
                    scope: Mapping[str, onnx.TypeProto] | None) -> list[onnx.NodeProto]:
    """ONNX's function body (opset ``version``) for ``node``, its values renamed apart."""
    ref = next((at for at in node.attribute if at.ref_attr_name), None)
    if ref is not None:
        raise conv.error(node, f"it does not exist at that opset, and its attribute {ref.name} is the function's "
                         f"attribute {ref.ref_attr_name}, which the nodes standing for it need the value of",
                         f"inline the function, or {conv.keep}")
    inputs = []
    for name in node.input:
        tp = scope.get(name) if name and scope is not None else None
        if name and (tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.elem_type):
            raise conv.error(node, f"it does not exist at that opset, and the element type of its input '{name}' "
                             "(which the nodes standing for it depend on) is not declared",
                             f"declare the type of '{name}' in the model, or {conv.keep}")
        inputs.append(helper.make_tensor_type_proto(tp.tensor_type.elem_type, None).SerializeToString()
                      if name else onnx.TypeProto().SerializeToString())
    schema = onnx.defs.get_schema(node.op_type, a, "")
    try:
        body = onnx.FunctionProto.FromString(
            schema.get_context_dependent_function_with_opset_version(version, node.SerializeToString(), inputs))
    except Exception as exc:  # onnx raises bare errors from its function builders
        raise conv.error(node, f"it does not exist at that opset, and ONNX's function body for it fails: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", conv.keep) from exc
    for n in body.node:  # the body's ops must mean at ``a`` what they meant at ``version``
        if n.domain not in AI_ONNX or onnx.defs.get_schema(n.op_type, a, "").since_version > version:
            raise conv.error(node, f"it does not exist at that opset, and ONNX's function body for it (opset "
                             f"{version}) uses {n.domain or 'ai.onnx'}::{n.op_type}, which changed by opset {a}",
                             conv.keep)
    rename = {formal: actual for formal, actual in zip(body.input, node.input)}
    rename.update({formal: actual for formal, actual in zip(body.output, node.output) if actual})
    base = node.name or node.op_type
    out = []
    for n in body.node:
        for k, name in enumerate(n.input):
            if name:
                n.input[k] = rename[name]  # (a value the body reads is an input or made before)
        for k, name in enumerate(n.output):
            if name and name not in rename:
                rename[name] = conv.names.fresh(f"{base}/{name}")
                conv.made.append(rename[name])
            if name:
                n.output[k] = rename[name]
        n.name = conv.names.fresh(f"{base}/{n.op_type}")
        conv.made.append(n.name)
        out.append(n)
    return out
