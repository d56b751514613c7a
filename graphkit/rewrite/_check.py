"""Checking a rewrite's result: ONNX's checker and strict shape inference with every custom
op's schema known, over the whole model, over each replacement, or later over its bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx
from onnx import helper

from graphkit.errors import ValidationError
from graphkit.ops import OpRegistry
from graphkit.rewrite.graph.walk import graphs, walk
from graphkit.rewrite.graph.types import TypeTable

__all__ = ["check_context", "check_model", "check_replacement", "check_scan", "bytes_check"]


def check_scan(model: onnx.ModelProto) -> tuple[list[onnx.TypeProto.Tensor], bool]:
    """One walk for the check: the graph inputs/outputs (every graph) whose tensor type has no
    shape, and whether any tensor (initializers, sparse ones, attributes, any scope) is
    stored externally (graphkit.external_data.external_tensors)."""
    external = onnx.TensorProto.EXTERNAL
    tensor, tensors = onnx.AttributeProto.TENSOR, onnx.AttributeProto.TENSORS
    g_one, g_many = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS
    shapeless: list[onnx.TypeProto.Tensor] = []
    found = False
    for _, v in walk(model):
        g = v.graph
        if g is not None:
            for vi in (*g.input, *g.output):
                tt = vi.type.tensor_type
                if vi.type.HasField("tensor_type") and not tt.HasField("shape"):
                    shapeless.append(tt)
            found = found or any(t.data_location == external for t in g.initializer) or any(
                t.values.data_location == external or t.indices.data_location == external
                for t in g.sparse_initializer)
        held = []  # the graphs the nodes hold, for the walk (it does not scan the nodes again)
        for i, node in enumerate(v.nodes):
            if node.attribute:
                for a, attr in enumerate(node.attribute):
                    t = attr.type
                    if t == tensor:
                        found = found or attr.t.data_location == external
                    elif t == g_one:
                        held.append((i, a, -1))
                    elif t == g_many:
                        held.extend((i, a, k) for k in range(len(attr.graphs)))
                    elif t == tensors:
                        found = found or any(x.data_location == external for x in attr.tensors)
        v.children = held
    return shapeless, found


def _without_external_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose external initializers are graph inputs of the same type.

    onnx's checker resolves external files against the working directory (and rejects
    links); graphkit validates external data itself, so the checker sees typed inputs.
    """
    external = onnx.TensorProto.EXTERNAL
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for g in graphs(copy.graph):
        moved = [t for t in g.initializer if t.data_location == external]
        if not moved:
            continue
        keep = [t for t in g.initializer if t.data_location != external]
        del g.initializer[:]
        g.initializer.extend(keep)
        declared = {i.name for i in g.input}
        g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in moved if t.name not in declared)
    return copy


_CHECK_HINT = "fix the input model, or skip the check with --no-check"


def check_model(model: onnx.ModelProto, registry: OpRegistry, *, path: str | None = None,
                context: str = "", full: bool = True,
                scan: tuple[list[onnx.TypeProto.Tensor], bool] | None = None, hint: str = _CHECK_HINT) -> None:
    """ONNX checker, plus strict shape inference over the whole model when ``full``.

    Custom ops are known to both through their schemas. ``scan``: the graph inputs/outputs
    without a shape and whether any tensor is external, where the caller knows them
    (a ModelIndex of a model whose graphs' inputs, outputs and tensors are ``model``'s).
    """
    shapeless, external = check_scan(model) if scan is None else scan
    if external:
        model = _without_external_initializers(model)
        shapeless = check_scan(model)[0]
    # onnx's checker insists on a shape field in graph inputs/outputs; ONNX Runtime and
    # exporters do not. Give shapeless ones an empty shape during the check only.
    with registry.onnx_schemas():
        try:
            for tt in shapeless:
                tt.shape.SetInParent()
            try:
                onnx.checker.check_model(model)
            finally:
                for tt in shapeless:
                    tt.ClearField("shape")
            if full:
                onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError,
                RuntimeError) as exc:
            raise _invalid(exc, context, path, hint) from exc


def _invalid(exc: Exception, context: str, path: str | None, hint: str = _CHECK_HINT) -> ValidationError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ValidationError(f"invalid model{context}: {first}", path=path, hint=hint)


def bytes_check(model: onnx.ModelProto, shapeless: list[onnx.TypeProto.Tensor], registry: OpRegistry,
                 path: str | None, context: str, hint: str = _CHECK_HINT) -> Callable[[bytes], None]:
    """check_model without full inference, to run on the serialized ``model`` once its
    objects are gone: the checker parses a model of its own, the biggest thing in memory
    while both live. Shapeless graph inputs/outputs get their empty shape in bytes kept
    for the check (made here, while the objects are there)."""
    kept = None
    if shapeless:
        for tt in shapeless:
            tt.shape.SetInParent()
        try:
            kept = model.SerializeToString()
        finally:
            for tt in shapeless:
                tt.ClearField("shape")

    def run(data: bytes) -> None:
        with registry.onnx_schemas():
            try:
                onnx.checker.check_model(kept if kept is not None else data)
            except (onnx.checker.ValidationError, ValueError, RuntimeError) as exc:
                raise _invalid(exc, context, path, hint) from exc
    return run


def check_replacement(original: onnx.NodeProto, nodes: list[onnx.NodeProto], types: TypeTable,
                      opset_imports: Any, registry: OpRegistry, rule: str, path: str | None) -> None:
    """Strict type and shape inference over one replacement, fed the types its inputs have
    (every writer runs it on each replacement it built)."""
    produced = {o for n in nodes for o in n.output}
    inputs = list(dict.fromkeys(i for n in nodes for i in n.input if i and i not in produced))
    value_infos = []
    for name in inputs:
        elem = types.elem_type(name)
        if elem is None:
            return  # nothing to check against
        # Declared shapes only: inferring the whole model for one replacement costs more than
        # the check is worth (strict inference of the replacement works with unknown shapes).
        value_infos.append(helper.make_tensor_value_info(name, elem, types.shape(name, infer=False)))
    outputs = [helper.make_value_info(o, onnx.TypeProto()) for o in original.output if o]
    graph = helper.make_graph(nodes, "replacement", value_infos, outputs)
    mini = helper.make_model(graph, opset_imports=list(opset_imports), ir_version=10)
    with registry.onnx_schemas():
        try:
            onnx.shape_inference.infer_shapes(mini, check_type=True, strict_mode=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError,
                RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0]
            raise ValidationError(f"replacement made by {rule} is invalid: {first}", path=path,
                                  node=original.name, op=f"{original.domain}::{original.op_type}",
                                  hint=f"fix {rule}, or skip the check with --no-check") from exc


def check_context(applied: str, conversions: list[tuple[int | None, int, str]]) -> tuple[str, str]:
    """How a failed check of the output is reported (every writer says it alike): the words
    after "invalid model" naming what the rewrite ``applied`` and the opset ``conversions``
    it made (the report's), and the hint."""
    context, hint = f" after rewrite ({applied})", _CHECK_HINT
    if done := [f"{a}->{b}" for a, b, _ in conversions if a != b]:
        # the converter checks the types and attributes it sees; one the model does not
        # declare (an intermediate's type) the older op may lack
        what = f"the ai.onnx opset conversion {', '.join(done)}"
        context = f"{context[:-1]}; {what})" if applied else f" after {what}"
        hint = ("pick another --target-opset (the older ops lack a type or attribute the model uses), "
                "or skip the check with --no-check")
    return context, hint
