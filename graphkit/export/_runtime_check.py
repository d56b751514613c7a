"""Every export is opened in ONNX Runtime before it is written: a model ORT refuses fails
the export with the node, op and fix, instead of being reported as a success.

The written graph is opened with :func:`graphkit.runtime.open_session` (session creation
only: ORT resolves the graph, infers types and finds a kernel for every node; nothing
runs). Placeholder nodes (``custom::my_add``) are not ORT's: ``graphkit rewrite`` lowers
them later to whatever the target has. For the check a copy of the model has them lowered
by the rewrite engine as the nearest runnable form needing no compiler: bound to the op's
Python kernel (onnxruntime-extensions registers it with the types the kernel declares),
else its decomposition, else a prebuilt native kernel. A placeholder with none of those
(an op no package defines, or one whose every lowering is refused) is cut out, its
outputs becoming typed graph inputs, and the check's ``reason`` names it. Placeholders in
If/Loop bodies are cut out the same way (a body may read an outer value); model-local
functions are inlined into the checked copy first (ONNX Runtime inlines them too), and a
refused node inside one is named as the function's node, with the function.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx

from graphkit.errors import ExportError, KernelError, UnsupportedOpError
from graphkit.ops import OpRegistry
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.graph.walk import graph_tree, graphs

__all__ = ["RuntimeCheck", "check_loads"]

# Over protobuf's limit a model cannot be handed to ORT from memory (nor saved: save_model
# says so right after).
_PROTOBUF_LIMIT = 2**31 - 1
# Where ORT names the node it refused, across its error formats.
_NODE_PATTERNS = (re.compile(r"node with name '([^']*)'"), re.compile(r"in node \(([^)]*)\)"),
                  re.compile(r"of node \(([^)]*)\)"), re.compile(r'In Node, \("([^"]*)"'),
                  re.compile(r"Node \(([^)]*)\)"), re.compile(r"Name:'([^']*)'"),
                  re.compile(r"node '([^']*)'"))
# Where ORT names only a value no node, initializer or input produces: the node reading it.
_DANGLING = re.compile(r"Node input '([^']*)' is not a graph input")


@dataclass(frozen=True)
class RuntimeCheck:
    """What the check did: ``checked`` is False when it could not run (``reason`` says why).

    ``lowerings`` says how each placeholder op was checked (``"custom::my_add": "python"``:
    bound to its Python kernel; ``"decompose"``, ``"native"``, or ``"stand-in"``: cut out,
    its outputs fed as typed inputs); ``stand_ins`` counts the nodes cut out, and ``reason``
    then says why each such op could not be checked."""

    checked: bool
    stand_ins: int = 0
    reason: str = ""
    lowerings: Mapping[str, str] = field(default_factory=dict)


def _label(node: onnx.NodeProto) -> str:
    return f"{node.domain}::{node.op_type}"


def _placeholder_labels(model: onnx.ModelProto) -> dict[str, int]:
    """Placeholder ops of ``model`` (functions inlined: :func:`_inlined`) and their node
    counts, If/Loop bodies included."""
    from graphkit.runtime.session import STANDARD_DOMAINS as _STANDARD  # ONNX Runtime's own domains

    functions = {(f.domain, f.name) for f in model.functions}
    counts: dict[str, int] = {}
    for g in graphs(model.graph):
        for node in g.node:
            if node.domain not in _STANDARD and (node.domain, node.op_type) not in functions:
                counts[_label(node)] = counts.get(_label(node), 0) + 1
    return counts


def _stand_ins(model: onnx.ModelProto, registry: OpRegistry, cut_ops: set[str]
               ) -> tuple[onnx.ModelProto | None, int, str]:
    """A copy of ``model`` whose nodes of the ``cut_ops`` (``domain::op``) are replaced by
    graph inputs of their outputs' types; (None, 0, reason) when a type is unknown. With
    nothing to cut, ``model`` itself (the rewrite copies it)."""
    if not cut_ops:
        return model, 0, ""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    # The copy's graphs beside the model's: each cut output is typed in its own graph's scope.
    pairs = list(zip((g for g, _ in graph_tree(model.graph)), (g for g, _ in graph_tree(work.graph))))
    cut: list[tuple[onnx.GraphProto, str]] = []
    count = 0
    for original, g in pairs:
        keep = []
        for node in g.node:
            if _label(node) in cut_ops:
                cut += [(original, o) for o in node.output if o]
                count += 1
            else:
                keep.append(node)
        if len(keep) != len(g.node):
            del g.node[:]
            g.node.extend(keep)
    if not cut:
        return work, 0, ""

    def missing(types: TypeTable) -> list[str]:
        return [name for g, name in cut if name not in types.scope(g)]

    types = TypeTable.inferred(model, infer=False)
    if missing(types):
        types = TypeTable.inferred(model, registry)
    if missing(types):
        return None, 0, f"the type of placeholder output '{missing(types)[0]}' is unknown"
    stand_ins: dict[str, onnx.TypeProto] = {}
    for g, name in cut:
        tp = types.scope(g)[name]
        if stand_ins.setdefault(name, tp) != tp:  # sibling graphs: one name, two types
            return None, 0, f"placeholder output '{name}' has different types in two subgraphs"
    known_inputs = {i.name for i in work.graph.input}
    for name, tp in stand_ins.items():
        if name not in known_inputs:
            work.graph.input.append(onnx.helper.make_value_info(name, tp))
    return work, count, ""


def _preference(registry: OpRegistry, labels: Mapping[str, int]) -> tuple:
    """Python kernel first (registered without a compiler), then the decomposition, then a
    native kernel only when every native op of the model comes prebuilt (building one
    needs a compiler, which an export does not ask for)."""
    from graphkit.rewrite import Lowering

    native = [registry.package_of(op) for label in labels
              if (op := registry.lookup(*label.split("::", 1))) is not None and registry.has_native(op)]
    prebuilt = bool(native) and all(p.native.library is not None for p in native)
    return (Lowering.PYTHON, Lowering.DECOMPOSE, *((Lowering.NATIVE,) if prebuilt else ()))


def _unlowerable(registry: OpRegistry, label: str) -> str | None:
    """Why no lowering of placeholder op ``label`` can be checked, or None."""
    from graphkit.runtime import python_kernels as pk

    op = registry.lookup(*label.split("::", 1))
    if op is None:
        return "no op package defines it"
    python = op.python_kernel is not None and pk.kernel_problem(op) is None
    native = registry.has_native(op) and registry.package_of(op).native.library is not None
    if not (python or op.decompositions or native):
        return ("it has no Python kernel or decomposition, and its native kernel would need "
                "a compiler" if registry.has_native(op) else "it has no Python kernel, decomposition "
                "or native kernel")
    return None


def _lowered(model: onnx.ModelProto, registry: OpRegistry, refused: Mapping[str, str]
             ) -> tuple[onnx.ModelProto | None, int, dict[str, str], dict[str, str]]:
    """A copy of ``model`` with its placeholders lowered for the check (see the module
    docstring), those of the ``refused`` ops (op -> why) cut out: (model or None, nodes cut
    out, how each op was checked, why each op cut out was); the model is None when the check
    cannot run (the reasons say why)."""
    from graphkit.errors import GraphkitError
    from graphkit.rewrite import rewrite_model

    labels = _placeholder_labels(model)
    if not labels:
        return model, 0, {}, {}
    why = {label: reason for label in labels if (reason := _unlowerable(registry, label)) is not None}
    why.update(refused)
    prefer = _preference(registry, labels)
    # Each round either lowers every remaining op or stands one more in: at most one per op.
    for _ in range(len(labels) + 1):
        work, cut, problem = _stand_ins(model, registry, set(why))
        if work is None:
            return None, 0, {}, {**why, "": problem}
        if len(why) == len(labels):
            return work, cut, dict.fromkeys(labels, "stand-in"), why
        try:
            lowered, report = rewrite_model(work, registry=registry, lowering=prefer, check=False)
        except GraphkitError as exc:
            label = _placeholder_of(registry, exc.op, labels)
            if label is None or label in why:
                return None, 0, {}, {**why, "": f"lowering its placeholders failed: {exc.message}"}
            why[label] = exc.message
            continue
        except Exception as exc:  # noqa: BLE001 - an op package's decomposition raised: say so
            return None, 0, {}, {**why, "": f"lowering its placeholders raised {type(exc).__name__}: {exc} "
                                            f"(graphkit rewrite would too: fix the op package)"}
        how = {label: "stand-in" for label in why}
        for (op_name, action), _n in report.actions.items():
            label = _placeholder_of(registry, op_name, labels)
            if label is not None:
                how.setdefault(label, action.removeprefix("bind:"))
        return lowered, cut, how, why
    raise AssertionError("unreachable: every op was stood in for")


def _placeholder_of(registry: OpRegistry, name: str | None, labels: Mapping[str, int]) -> str | None:
    """The placeholder op (``domain::op``) of ``labels`` that ``name`` (a node's op, maybe
    bound to a kernel domain, or an op's qualified name) stands for."""
    if not name:
        return None
    if name in labels:
        return name
    domain, _, op_type = name.rpartition("::")
    op = registry.lookup(domain, op_type) or registry.get(name)
    if op is None:
        return None
    return next((label for label in labels if registry.lookup(*label.split("::", 1)) is op), None)


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


def _reader(model: onnx.ModelProto, value: str) -> onnx.NodeProto | None:
    """The first node reading ``value``."""
    for g in graphs(model.graph):
        for node in g.node:
            if value in node.input:
                return node
    return None


def _input_types(model: onnx.ModelProto, node: onnx.NodeProto, registry: OpRegistry) -> list[str]:
    scoped = TypeTable.inferred(model, registry)
    graph = next((g for g in graphs(model.graph) if any(n is node for n in g.node)), None)
    types = scoped if graph is None else scoped.scope(graph)
    out = []
    for name in node.input:
        tp = types.get(name)
        out.append("(none)" if not name else "?" if tp is None else
                   f"tensor({onnx.helper.tensor_dtype_to_np_dtype(tp.tensor_type.elem_type)})"
                   if tp.tensor_type.elem_type else "?")
    return out


def _refused(exc: Exception, model: onnx.ModelProto, registry: OpRegistry, model_name: str,
             exporter: str, path: str, how: Mapping[str, str],
             origin: Mapping[str, _Origin] | None = None) -> ExportError:
    import onnxruntime as ort

    text = str(exc.__cause__ or exc)
    name = getattr(exc, "node", None) if isinstance(exc, UnsupportedOpError) else None
    name = name or next((m.group(1) for p in _NODE_PATTERNS if (m := p.search(text))), None)
    node = _node(model, name) if name is not None else None
    if node is None and (m := _DANGLING.search(text)):
        node = _reader(model, m.group(1))
    op = None if node is None else (f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx")
                                    else node.op_type)
    placeholder = None if node is None else _placeholder_of(registry, op, how)
    reason = next((ln.strip() for ln in text.splitlines() if ln.strip()), text)
    reason = re.sub(r"^\[ONNXRuntimeError\] : \d+ : ", "", reason)
    other = "dynamo=True" if exporter == "dynamo=False" else "dynamo=False"
    replace = ("a GapFiller with `replaces` for the ATen op that writes it (graphkit.export.aten)"
               if exporter == "dynamo=False" else "an export rewrite (graphkit.export.RewriteRegistry)")
    if placeholder is not None:
        # A placeholder bound to its kernel for the check: the op package is what to fix.
        op = placeholder
        what = f"ONNX Runtime {ort.__version__} refuses {op} bound to its {how[op]} kernel: {reason}"
        hint = (f"fix {op} in its op package: its {how[op]} kernel is declared from the OpDef's "
                f"type_constraints (an output-only type variable declares its first type), which must "
                f"give the types its reference computes; or fix the node that feeds it")
    elif node is not None and any(k in text for k in ("Could not find an implementation", "NOT_IMPLEMENTED",
                                                      "Type Error")):
        types = ", ".join(_input_types(model, node, registry))
        what = f"ONNX Runtime {ort.__version__} cannot run {op} on inputs ({types}): {reason}"
        hint = (f"give {op} input types ONNX Runtime has a kernel for (cast before it in the "
                f"model), or export with {replace}, or try {other}")
        if how:
            hint += "; its placeholders were checked as " + ", ".join(f"{k}: {v}" for k, v in how.items())
    else:
        what = f"ONNX Runtime {ort.__version__} refuses the written model: {reason}"
        hint = f"try {other} or another opset, or export with {replace}"
        if how:
            hint += "; its placeholders were checked as " + ", ".join(f"{k}: {v}" for k, v in how.items())
    name = None if node is None else node.name
    source = (origin or {}).get(name) if name is not None else None
    if source is not None:
        name = source.node
        what += f" (node '{source.node}' of model-local function {source.function})"
    return ExportError(f"cannot export {model_name} ({exporter}): {what}", path=path,
                       node=name, op=op, hint=hint)


# onnx's inliner names a function's node ``<name>__<call>`` at each call (nested: once per level).
_INLINED = re.compile(r"(?:__\d+)+$")


@dataclass(frozen=True)
class _Origin:
    """Where a node of the checked (inlined) copy comes from in the written model."""

    node: str
    function: str  # "domain::name" of the model-local function holding it


def _inlined(model: onnx.ModelProto) -> tuple[onnx.ModelProto | None, dict[str, _Origin], str]:
    """``model`` with its model-local functions inlined (itself when it has none), the origin
    of each inlined node, and why inlining failed (the model is None then)."""
    if not model.functions:
        return model, {}, ""
    import onnx.inliner

    try:
        flat = onnx.inliner.inline_local_functions(model)
    except Exception as exc:  # noqa: BLE001 - onnx's inliner refuses: say so, do not crash the export
        return None, {}, f"inlining its model-local functions failed: {type(exc).__name__}: {exc}"
    own = {n.name for g in graphs(model.graph) for n in g.node}
    held = {n.name: f"{f.domain}::{f.name}" for f in model.functions for n in f.node if n.name}
    origin = {}
    for g in graphs(flat.graph):
        for node in g.node:
            base = _INLINED.sub("", node.name)
            if node.name not in own and base in held:
                origin[node.name] = _Origin(base, held[base])
    return flat, origin, ""


def check_loads(model: onnx.ModelProto, registry: OpRegistry, *, model_name: str, exporter: str,
                path: str) -> RuntimeCheck:
    """Open ``model`` in ONNX Runtime (session creation only) with its placeholder nodes
    lowered as the module docstring says; raise ExportError naming the node, op and fix if
    ORT refuses it."""
    if model.ByteSize() > _PROTOBUF_LIMIT:
        return RuntimeCheck(False, reason="over protobuf's 2 GiB limit")
    import onnxruntime as ort

    from graphkit.runtime import open_session

    model, origin, problem = _inlined(model)
    if model is None:
        return RuntimeCheck(False, reason=problem)
    refused: dict[str, str] = {}
    while True:
        work, stand_ins, how, why = _lowered(model, registry, refused)
        reason = "; ".join(f"{label} not checked: {text}" if label else text for label, text in why.items())
        if work is None:
            return RuntimeCheck(False, reason=reason)
        options = ort.SessionOptions()
        options.log_severity_level = 3  # ORT's warnings about the graph are not the user's business here
        try:
            open_session(work, registry=registry, options=options, unknown_domains=False)
        except UnsupportedOpError as exc:
            # graphkit refused a kernel before ORT saw the model (e.g. a Python kernel of that
            # name declared differently earlier in this process): check without that op.
            label = _placeholder_of(registry, exc.op, how)
            if label is None or label in refused:
                raise _refused(exc, work, registry, model_name, exporter, path, how, origin) from exc
            refused[label] = exc.message
            continue
        except KernelError as exc:
            raise _refused(exc, work, registry, model_name, exporter, path, how, origin) from exc
        return RuntimeCheck(True, stand_ins, reason, how)
