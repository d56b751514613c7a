"""rewrite_model on serialized models, with the byte-level writer for lowering-only rewrites."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx

from graphkit.ops import OpRegistry, default_registry
from graphkit.rewrite import _fastpath
from graphkit.rewrite.engine import DEFAULT_PREFERENCE, Lowering, RewriteReport, rewrite_model

__all__ = ["rewrite_bytes"]


def rewrite_bytes(data: bytes, *, registry: OpRegistry | None = None,
                  lowering: Lowering | Sequence[Lowering] = DEFAULT_PREFERENCE, check: bool = True,
                  path: str | None = None, model: onnx.ModelProto | None = None, fast: bool = True,
                  **options: Any) -> tuple[bytes, RewriteReport]:
    """``rewrite_model`` on a serialized model: returns the rewritten model's bytes and the report.

    Lowering alone (no rules, target opset or functions) splices the replacements into
    ``data`` at the protobuf wire level (graphkit.rewrite._fastpath), with the same result
    as ``rewrite_model``; anything that path does not handle goes through ``rewrite_model``.
    ``model`` is ``data`` already parsed, if the caller has it; ``options`` are
    ``rewrite_model``'s other keywords.
    """
    registry = default_registry() if registry is None else registry
    prefer = (lowering,) if isinstance(lowering, Lowering) else tuple(lowering)
    if not isinstance(data, bytes):
        data = bytes(data)
    if model is None:
        model = onnx.load_model_from_string(data)
    if not fast:
        why = "the byte writer was turned off (fast=False)"
    elif options.get("rules") or options.get("target_opset") is not None or options.get("as_functions"):
        why = "rules, --target-opset or --as-functions: the byte writer only lowers"
    else:
        try:
            return _fastpath.lower_bytes(data, model, registry=registry, prefer=prefer, check=check,
                                         full_check=options.get("full_check", False), path=path,
                                         progress=options.get("progress"))
        except _fastpath.Unsupported as exc:
            why = f"the byte writer does not handle this model: {exc}"
    out, report = rewrite_model(model, registry=registry, lowering=prefer, check=check, path=path, **options)
    report.writer_reason = why
    return out.SerializeToString(), report
