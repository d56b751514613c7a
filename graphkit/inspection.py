"""What a model holds: opsets, custom ops and how each can be lowered, external data."""

from __future__ import annotations

import collections
import os
from typing import Any

import onnx

from graphkit.errors import ModelLoadError
from graphkit.external_data import check_external_data, external_tensors
from graphkit.ops import OpRegistry, default_registry, split_kernel_domain
from graphkit.rewrite._walk import scopes
from graphkit.rewrite.engine import ai_onnx_opset

__all__ = ["inspect_model", "lowerings_of"]


def lowerings_of(op, opset: int) -> list[str]:
    """The lowerings available for ``op`` at ai.onnx ``opset``, most portable first."""
    out = [f"decompose:{d.name}" for d in op.decompositions if d.supports(opset)]
    if op.native:
        out.append("native")
    if op.python_kernel is not None:
        out.append("python")
    return out


def inspect_model(model: onnx.ModelProto, *, path: str | os.PathLike[str] | None = None,
                  registry: OpRegistry | None = None) -> dict[str, Any]:
    """A JSON-ready summary of ``model``; external data is checked if ``path`` is given."""
    registry = registry or default_registry()
    opset = ai_onnx_opset(model) or 0
    where: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    nodes = 0
    for node_list, _, _ in scopes(model):
        for n in node_list:
            nodes += 1
            if isinstance(n.op_type, bytes) or isinstance(n.domain, bytes):
                raise ModelLoadError(f"node '{n.name!s}' has an op type or domain that is not valid UTF-8",
                                     path=None if path is None else str(path), hint="re-export the model")
            if registry.is_placeholder(n.domain, n.op_type) or split_kernel_domain(n.domain):
                where[(n.domain, n.op_type)].append(n.name or "<unnamed>")
    custom = []
    for (domain, op_type), names in sorted(where.items(), key=str):
        op = registry.lookup(domain, op_type)
        custom.append({"op": f"{domain}::{op_type}", "count": len(names), "nodes": names,
                       "known": op is not None,
                       "lowerings": lowerings_of(op, opset) if op is not None and domain == op.domain
                       else ([split_kernel_domain(domain)[0]] if op is not None else [])})
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
        "external_data": {"tensors": len(tensors), "files": sorted(files), "bytes": sum(files.values())},
    }
