"""What a model holds: opsets, custom ops and how each can be lowered, external data."""

from __future__ import annotations

import collections
import os
from typing import Any

import onnx

from graphkit._invocation import wording
from graphkit.errors import ModelLoadError
from graphkit.external_data import check_external_data, external_tensors
from graphkit.ops import OpRegistry, default_registry
from graphkit.ops._opdef import split_kernel_domain
from graphkit.rewrite.graph.walk import scopes
from graphkit.rewrite.engine import ai_onnx_opset

__all__ = ["STANDARD_DOMAINS", "inspect_model", "lowerings_of", "package_info", "unknown_hint"]

# Domains whose ops ONNX or ONNX Runtime implement: nodes anywhere else are custom ops.
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})


def unknown_hint() -> str:
    """How to make an unknown op known, in the caller's words (the command's or the API's)."""
    return wording("pass --ops PACKAGE, set $GRAPHKIT_OPS, or install the package that defines it; "
                   "`graphkit ops` lists the known ops",
                   "pass registry=graphkit.ops.discover(['PACKAGE']), set $GRAPHKIT_OPS, or install the "
                   "package that defines it; list(discover()) holds the known ops")


def lowerings_of(op, opset: int, registry: OpRegistry | None = None) -> list[str]:
    """The lowerings available for ``op`` at ai.onnx ``opset``, most portable first.

    With ``registry``, "native" is listed only when the op's package ships NativeKernels."""
    out = [f"decompose:{d.name}" for d in op.decompositions if d.supports(opset)]
    if op.native and (registry is None or registry.has_native(op)):
        out.append("native")
    if op.python_kernel is not None:
        out.append("python")
    return out


def package_info(registry: OpRegistry, op) -> dict[str, str] | None:
    """``{"name", "version", "origin"}`` of the package that brought ``op`` (None: a loose OpDef)."""
    package = registry.package_of(op)
    if package is None:
        return None
    return {"name": package.name, "version": package.version, "origin": package.origin}


def inspect_model(model: onnx.ModelProto, *, path: str | os.PathLike[str] | None = None,
                  registry: OpRegistry | None = None) -> dict[str, Any]:
    """A JSON-ready summary of ``model``; external data is checked if ``path`` is given.

    Every node outside the standard domains (:data:`STANDARD_DOMAINS`) that does not call
    a model-local function is a custom op; each is listed with the package that defines it
    in ``registry`` (default: :func:`graphkit.ops.default_registry`), or ``"known": false``
    and a ``"hint"`` when no package does.
    """
    registry = default_registry() if registry is None else registry
    opset = ai_onnx_opset(model) or 0
    functions = {(f.domain, f.name) for f in model.functions}
    where: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    standard_types = registry.standard_op_types()
    standard: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    nodes = 0
    for node_list, _, _ in scopes(model):
        for n in node_list:
            nodes += 1
            if isinstance(n.op_type, bytes) or isinstance(n.domain, bytes):
                raise ModelLoadError(f"node '{n.name!s}' has an op type or domain that is not valid UTF-8",
                                     path=None if path is None else str(path), hint="re-export the model")
            if n.domain in STANDARD_DOMAINS:
                if standard_types and (n.domain, n.op_type) in standard_types:
                    standard[(n.domain, n.op_type)].append(n.name or "<unnamed>")
                continue
            if (n.domain, n.op_type) in functions and registry.lookup(n.domain, n.op_type) is None:
                continue  # a call of a model-local function the model itself defines
            where[(n.domain, n.op_type)].append(n.name or "<unnamed>")
    custom = []
    for (domain, op_type), names in sorted(where.items(), key=str):
        op = registry.lookup(domain, op_type)
        entry: dict[str, Any] = {"op": f"{domain}::{op_type}", "domain": domain, "op_type": op_type,
                                 "count": len(names), "nodes": names, "known": op is not None}
        if op is None:
            entry["package"] = None
            entry["lowerings"] = []
            entry["hint"] = unknown_hint()
        else:
            kernel = split_kernel_domain(domain)
            entry["definition"] = op.qualified_name
            entry["package"] = package_info(registry, op)
            entry["bound"] = kernel[0] if kernel is not None else None
            entry["lowerings"] = [kernel[0]] if kernel is not None else lowerings_of(op, opset, registry)
            entry["function"] = (domain, op_type) in functions
        custom.append(entry)
    computed = []
    for (domain, op_type), names in sorted(standard.items(), key=str):
        op, std = registry.standard_op(domain, op_type)
        computed.append({"op": str(std), "as": op.qualified_name, "count": len(names), "nodes": names,
                         "since_opset": std.since_opset, "valid": opset >= std.since_opset,
                         "package": package_info(registry, op), "lowerings": lowerings_of(op, opset, registry)})
    tensors = external_tensors(model)
    files: dict[str, int] = {}
    if tensors and path is not None:
        for location, real in check_external_data(model, path).items():
            files[location] = real.stat().st_size
    return {
        "path": None if path is None else str(path),
        "ir_version": model.ir_version,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "opsets": {imp.domain: imp.version for imp in model.opset_import},
        "nodes": nodes,
        "functions": [f"{f.domain}::{f.name}" for f in model.functions],
        "custom_ops": custom,
        "standard_ops_of_graphkit_ops": computed,
        "external_data": {"tensors": len(tensors), "files": sorted(files), "bytes": sum(files.values())},
    }
