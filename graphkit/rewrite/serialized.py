"""The rewrite of serialized models and of files: the one entry point `graphkit rewrite` uses.

``rewrite_file`` reads, rewrites, checks and publishes a model file; ``rewrite_bytes``
does the rewrite on a serialized model. Both pick the writer the same way: lowering
alone (no rules or functions; a target opset only where the conversion moves just the
imports or changes nodes' own fields: graphkit.rewrite._convertbytes) splices the replacements into the
serialized model (graphkit.rewrite._fastpath, the "bytes" writer; graphkit.rewrite._bodybytes
where placeholders are inside subgraphs) where that writer's preconditions hold; anything else goes through ``rewrite_model``'s passes (the
"objects" writer). Both lower through one LoweringPlan; the report says which ran and why.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from graphkit.ops import OpRegistry, default_registry
from graphkit.rewrite import _bodybytes, _fastpath
from graphkit.rewrite import engine as _engine
from graphkit.rewrite._selection import check_target_opset
from graphkit.rewrite.engine import DEFAULT_PREFERENCE, Lowering, RewriteReport, rewrite_model

__all__ = ["FileRewrite", "rewrite_bytes", "rewrite_file"]


@dataclass
class FileRewrite:
    """What ``rewrite_file`` did: the report, the model files' sizes (``bytes_before``,
    ``bytes_after``; external weights not counted) and the rewritten model (``output``: its
    bytes, or the ModelProto where it has external data)."""

    report: RewriteReport
    sizes: dict[str, int]
    # The byte writer's output stays in pieces (what it wrote); bytes are joined when asked for.
    _output: bytes | onnx.ModelProto | _fastpath.Pieces

    @property
    def output(self) -> bytes | onnx.ModelProto:
        if isinstance(self._output, _fastpath.Pieces):
            self._output = self._output.join()
        return self._output


def rewrite_bytes(data: bytes, *, registry: OpRegistry | None = None,
                  lowering: Lowering | Sequence[Lowering] = DEFAULT_PREFERENCE, check: bool = True,
                  path: str | None = None, model: onnx.ModelProto | None = None, fast: bool = True,
                  **options: Any) -> tuple[bytes, RewriteReport]:
    """``rewrite_model`` on a serialized model: returns the rewritten model's bytes and the report.

    ``model`` is ``data`` already parsed, if the caller has it (it is not modified);
    ``fast=False`` turns the byte writer off; ``options`` are ``rewrite_model``'s other keywords.
    """
    out, report = _rewrite_bytes([data], [] if model is None else [model], False, registry=registry,
                                 lowering=lowering, check=check, path=path, fast=fast, **options)
    return out.join(), report


def _rewrite_bytes(source: list[bytes], parsed: list[onnx.ModelProto], owned: bool, *,
                   registry: OpRegistry | None = None,
                   lowering: Lowering | Sequence[Lowering] = DEFAULT_PREFERENCE, check: bool = True,
                   path: str | None = None, fast: bool = True,
                   **options: Any) -> tuple[_fastpath.Pieces, RewriteReport]:
    """rewrite_bytes, the output as its pieces. ``source`` holds the serialized model (taken
    out: where it held the only reference, the objects writer lets the bytes go once parsed);
    ``parsed`` holds it parsed, or nothing (then it is parsed here); ``owned``: the list held
    the only reference to it, so the objects writer rewrites it in place and its objects are
    gone before the ONNX checker parses the serialized result."""
    registry = default_registry() if registry is None else registry
    prefer = (lowering,) if isinstance(lowering, Lowering) else tuple(lowering)
    data = source.pop()
    if not isinstance(data, bytes):
        data = bytes(data)
    if parsed:
        model = parsed.pop()
    else:
        model, owned = onnx.load_model_from_string(data), True
    if not fast:
        why = "the byte writer was turned off (fast=False)"
    elif options.get("rules") or options.get("as_functions"):
        why = "rules or --as-functions: the byte writer only lowers"
    elif options.get("simplify") is not None:
        why = "--simplify: the byte writer only lowers"
    else:
        target = options.get("target_opset")
        if target is not None:
            check_target_opset(target)  # the objects writer's error, before either writer runs
        writer_options = dict(registry=registry, prefer=prefer, check=check, full_check=options.get("full_check", False),
                              path=path, progress=options.get("progress"), target_opset=target)
        try:
            try:
                return _fastpath.lower_pieces(data, model, **writer_options)
            except _fastpath.InBodies:  # placeholders in subgraphs: the byte writer for bodies
                return _bodybytes.lower_pieces(data, model, **writer_options)
        except _fastpath.Unsupported as exc:
            why = f"the byte writer does not handle this model: {exc}"
    _fastpath._Canonical.forget()  # it may hold the model (has_external_data)
    del data  # the objects writer needs the parsed model only
    out, report, deferred = _engine._rewrite(model, registry=registry, lowering=prefer, check=check, path=path,
                                             copy=not owned, defer_check=owned, **options)
    del model
    report.writer_reason = why
    result = out.SerializeToString()
    del out
    if deferred is not None:
        deferred(result)
    return _fastpath.Pieces([result]), report


def rewrite_file(src: str | os.PathLike[str], dst: str | os.PathLike[str] | None, *,
                 registry: OpRegistry | None = None,
                 lowering: Lowering | Sequence[Lowering] = DEFAULT_PREFERENCE,
                 external_data: str = "auto",
                 before_write: Callable[[RewriteReport, dict[str, int]], None] | None = None,
                 **options: Any) -> FileRewrite:
    """Rewrite the model file ``src`` into ``dst`` (None: a dry run, nothing written).

    Returns a :class:`FileRewrite` (``bytes_after`` of a dry run is the size the output
    would have). The output path is checked before any work, the weights of a model with
    external data too; the output is published atomically, its weights made valid from
    its directory (``external_data``: "auto", "link" or "copy", as ``save_model``).
    ``before_write(report, sizes)`` runs before anything is written (what raises there
    leaves nothing behind). ``options`` are ``rewrite_model``'s other keywords.
    """
    from graphkit.errors import OutputError
    from graphkit.external_data import check_external_data
    from graphkit.modelio import (PROTOBUF_LIMIT, check_output_path, parse_model_bytes, read_model_bytes,
                                  save_model, weights_files)
    from graphkit.publish import atomic_write

    src = os.fspath(src)
    registry = default_registry() if registry is None else registry
    if dst is not None:
        check_output_path(dst, src)
    data = read_model_bytes(src)
    model = parse_model_bytes(data, src)
    if _fastpath.has_external_data(data, model):
        _fastpath._Canonical.forget()  # it holds the model
        files = check_external_data(model, src)
        if dst is not None:  # the weights are input too: refuse before any work
            check_output_path(dst, src, inputs=weights_files(files, dst))
        size = len(data)
        del data
        out, report = rewrite_model(model, registry=registry, lowering=lowering, path=src, copy=False, **options)
        del model
        report.writer_reason = "external data: the objects writer places the weights with the model"
        sizes = {"bytes_before": size, "bytes_after": out.ByteSize()}
        if before_write is not None:
            before_write(report, sizes)
        if dst is not None:
            save_model(out, dst, input_path=src, external_data=external_data)
            sizes["bytes_after"] = os.path.getsize(dst)
        return FileRewrite(report, sizes, out)
    parsed = [model]
    del model  # the list holds the only reference: the rewrite may drop it early
    size, source = len(data), [data]
    del data  # the list holds the only reference: the objects writer lets the bytes go
    try:
        out, report = _rewrite_bytes(source, parsed, True, registry=registry, lowering=lowering, path=src, **options)
    finally:  # has_external_data's answer holds the model: also where no writer ran to forget it (an error before)
        _fastpath._Canonical.forget()
    sizes = {"bytes_before": size, "bytes_after": len(out)}
    if before_write is not None:
        before_write(report, sizes)
    if dst is not None:
        if len(out) > PROTOBUF_LIMIT:
            raise OutputError("model is over protobuf's 2 GiB limit and has inline weights",
                              path=os.fspath(dst), hint="move its weights to external data first")
        with atomic_write(dst) as tmp, open(tmp, "wb") as fh:
            out.write(fh)
    return FileRewrite(report, sizes, out)
