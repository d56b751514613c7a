"""Every export is opened in ONNX Runtime before it is written: a model ORT refuses fails
the export with the node, op and fix, instead of being reported as a success.

The written graph is opened with :func:`graphkit.runtime.open_session` (session creation
only: ORT resolves the graph, infers types and finds a kernel for every node; nothing
runs). Placeholder nodes (``custom::my_add``, or an op no package defines) are not ORT's:
``graphkit rewrite`` lowers them later to whatever the target has. For the check each one
is cut out and its outputs become typed graph inputs, so every other node is checked
without building a kernel library or needing a compiler at export time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx

from graphkit.errors import ExportError, KernelError, UnsupportedOpError
from graphkit.ops import OpRegistry
from graphkit.rewrite._walk import graphs

__all__ = ["RuntimeCheck", "check_loads"]

# Over protobuf's limit a model cannot be handed to ORT from memory (nor saved: save_model
# says so right after).
_PROTOBUF_LIMIT = 2**31 - 1
# Where ORT names the node it refused, across its error formats.
_NODE_PATTERNS = (re.compile(r"node with name '([^']*)'"), re.compile(r"in node \(([^)]*)\)"),
                  re.compile(r'In Node, \("([^"]*)"'),
                  re.compile(r"Node \(([^)]*)\)"), re.compile(r"Name:'([^']*)'"),
                  re.compile(r"node '([^']*)'"))


@dataclass(frozen=True)
class RuntimeCheck:
    """What the check did: ``checked`` is False when it could not run (``reason`` says why);
    ``stand_ins`` placeholder nodes were cut out for it."""

    checked: bool
    stand_ins: int = 0
    reason: str = ""


def _types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every tensor type the model states (value_info, inputs, outputs)."""
    out: dict[str, onnx.TypeProto] = {}
    for g in graphs(model.graph):
        for vi in (*g.value_info, *g.input, *g.output):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                out.setdefault(vi.name, vi.type)
    return out


def _infer(model: onnx.ModelProto, registry: OpRegistry) -> dict[str, onnx.TypeProto]:
    """:func:`_types` after onnx's shape inference with the registry's schemas ({} if it fails)."""
    try:
        with registry.onnx_schemas():
            inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is a best effort here
        return {}
    return _types(inferred)


def _stand_ins(model: onnx.ModelProto, registry: OpRegistry) -> tuple[onnx.ModelProto | None, int, str]:
    """A copy of ``model`` whose placeholder nodes are replaced by graph inputs of their
    outputs' types; (None, 0, reason) when a placeholder sits where that cannot be done."""
    from graphkit.runtime.session import STANDARD_DOMAINS as _STANDARD  # ONNX Runtime's own domains

    functions = {(f.domain, f.name) for f in model.functions}
    if any(n.domain not in _STANDARD and (n.domain, n.op_type) not in functions
           for f in model.functions for n in f.node):
        return None, 0, "a model-local function holds a placeholder node"
    work = onnx.ModelProto()
    work.CopyFrom(model)
    cut: list[str] = []
    count = 0
    for g in graphs(work.graph):
        keep = []
        for node in g.node:
            if node.domain not in _STANDARD and (node.domain, node.op_type) not in functions:
                cut += [o for o in node.output if o]
                count += 1
            else:
                keep.append(node)
        if len(keep) != len(g.node):
            del g.node[:]
            g.node.extend(keep)
    if not cut:
        return work, 0, ""
    types = _types(model)
    if any(name not in types for name in cut):
        types = {**_infer(model, registry), **types}
    missing = [name for name in cut if name not in types]
    if missing:
        return None, 0, f"the type of placeholder output '{missing[0]}' is unknown"
    known_inputs = {i.name for i in work.graph.input}
    for name in cut:
        if name not in known_inputs:
            work.graph.input.append(onnx.helper.make_value_info(name, types[name]))
    return work, count, ""


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto | None:
    for g in graphs(model.graph):
        for node in g.node:
            if node.name == name:
                return node
    for f in model.functions:
        for node in f.node:
            if node.name == name:
                return node
    return None


def _input_types(model: onnx.ModelProto, node: onnx.NodeProto, registry: OpRegistry) -> list[str]:
    types = _infer(model, registry) or _types(model)
    for init in (i for g in graphs(model.graph) for i in g.initializer):
        types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, None))
    out = []
    for name in node.input:
        tp = types.get(name)
        out.append("(none)" if not name else "?" if tp is None else
                   f"tensor({onnx.helper.tensor_dtype_to_np_dtype(tp.tensor_type.elem_type)})"
                   if tp.tensor_type.elem_type else "?")
    return out


def _refused(exc: Exception, model: onnx.ModelProto, registry: OpRegistry, model_name: str,
             exporter: str, path: str) -> ExportError:
    import onnxruntime as ort

    text = str(exc.__cause__ or exc)
    name = next((m.group(1) for p in _NODE_PATTERNS if (m := p.search(text))), None)
    node = _node(model, name) if name is not None else None
    op = None if node is None else (f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx")
                                    else node.op_type)
    reason = next((ln.strip() for ln in text.splitlines() if ln.strip()), text)
    reason = re.sub(r"^\[ONNXRuntimeError\] : \d+ : ", "", reason)
    other = "dynamo=True" if exporter == "dynamo=False" else "dynamo=False"
    replace = ("a GapFiller with `replaces` for the ATen op that writes it (graphkit.export.aten)"
               if exporter == "dynamo=False" else "an export rewrite (graphkit.export.RewriteRegistry)")
    if node is not None and any(k in text for k in ("Could not find an implementation", "NOT_IMPLEMENTED",
                                                    "Type Error")):
        types = ", ".join(_input_types(model, node, registry))
        what = f"ONNX Runtime {ort.__version__} cannot run {op} on inputs ({types}): {reason}"
        hint = (f"give {op} input types ONNX Runtime has a kernel for (cast before it in the "
                f"model), or export with {replace}, or try {other}")
    else:
        what = f"ONNX Runtime {ort.__version__} refuses the written model: {reason}"
        hint = f"try {other} or another opset, or export with {replace}"
    return ExportError(f"cannot export {model_name} ({exporter}): {what}", path=path,
                       node=None if node is None else node.name, op=op, hint=hint)


def check_loads(model: onnx.ModelProto, registry: OpRegistry, *, model_name: str, exporter: str,
                path: str) -> RuntimeCheck:
    """Open ``model`` in ONNX Runtime (session creation only) with its placeholder nodes
    stood in for by inputs; raise ExportError naming the node, op and fix if ORT refuses it."""
    if model.ByteSize() > _PROTOBUF_LIMIT:
        return RuntimeCheck(False, reason="over protobuf's 2 GiB limit")
    work, stand_ins, why = _stand_ins(model, registry)
    if work is None:
        return RuntimeCheck(False, reason=why)
    import onnxruntime as ort

    from graphkit.runtime import open_session

    options = ort.SessionOptions()
    options.log_severity_level = 3  # ORT's warnings about the graph are not the user's business here
    try:
        open_session(work, registry=registry, options=options, unknown_domains=False)
    except (KernelError, UnsupportedOpError) as exc:
        raise _refused(exc, work, registry, model_name, exporter, path) from exc
    return RuntimeCheck(True, stand_ins)
