"""The rewrite of serialized models and of files: the one entry point `graphkit rewrite` uses.

``rewrite_file`` reads, rewrites, checks and publishes a model file; ``rewrite_bytes``
does the rewrite on a serialized model. Both pick the writer the same way
(graphkit.rewrite.writers: the writers and their one interface): where only lowering is
asked (no rules, functions or simplify), the main graph's byte writer
(graphkit.rewrite.bytes.main_graph), or the bodies' (graphkit.rewrite.bytes.bodies) where it says
the placeholders are inside subgraphs (InBodies); the objects writer (``rewrite_model``'s
passes, graphkit.rewrite.engine.write) where a byte writer's preconditions do not hold
(Unsupported) or an option only it has is asked for. Every writer lowers through one
LoweringPlan; the report says which ran and why.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from graphkit.ops import OpRegistry, default_registry
from graphkit.rewrite import engine as _engine
from graphkit.rewrite.lowering.selection import check_target_opset
from graphkit.rewrite.engine import DEFAULT_PREFERENCE, Lowering, RewriteReport, rewrite_model
from graphkit.rewrite.writers import InBodies, Pieces, Request, Unsupported

__all__ = ["FileRewrite", "rewrite_bytes", "rewrite_file"]

@dataclass
class FileRewrite:
    """What ``rewrite_file`` did: the report, the model files' sizes (``bytes_before``,
    ``bytes_after``; external weights not counted) and the rewritten model (``output``: its
    bytes, or the ModelProto where it has external data)."""

    report: RewriteReport
    sizes: dict[str, int]
    # A writer's output stays in pieces (what it wrote); bytes are joined when asked for.
    _output: bytes | onnx.ModelProto | Pieces

    @property
    def output(self) -> bytes | onnx.ModelProto:
        if isinstance(self._output, Pieces):
            self._output = self._output.join()
        return self._output


def rewrite_bytes(data: bytes, *, registry: OpRegistry | None = None,
                  lowering: Lowering | Sequence[Lowering] = DEFAULT_PREFERENCE, check: bool = True,
                  path: str | None = None, model: onnx.ModelProto | None = None, fast: bool = True,
                  **options: Any) -> tuple[bytes, RewriteReport]:
    """``rewrite_model`` on a serialized model: returns the rewritten model's bytes and the report.

    ``model`` is ``data`` already parsed, if the caller has it (it is not modified);
    ``fast=False`` turns the byte writers off; ``options`` are ``rewrite_model``'s other keywords.
    """
    if not isinstance(data, bytes):
        data = bytes(data)
    owned = model is None
    if owned:
        model = onnx.load_model_from_string(data)
    request = _request(data, model, owned, registry=registry, lowering=lowering, check=check, path=path, **options)
    del model  # the request holds the only reference to a model parsed here: the objects writer may rewrite it
    out, report = _write(request, fast)
    return out.join(), report


def _request(data: bytes, model: onnx.ModelProto, owned: bool, *, registry: OpRegistry | None,
             lowering: Lowering | Sequence[Lowering], check: bool = True, path: str | None = None,
             full_check: bool = False, progress: Callable[[str, int, int], None] | None = None,
             target_opset: int | None = None, **options: Any) -> Request:
    """The writers' request for ``rewrite_model``'s keywords (``owned``: the caller keeps no
    reference to ``model``); ``options``: the keywords only the objects writer has."""
    if target_opset is not None:
        check_target_opset(target_opset)  # the objects writer's error, before any writer runs
    return Request(data, model, registry=default_registry() if registry is None else registry,
                   prefer=(lowering,) if isinstance(lowering, Lowering) else tuple(lowering), check=check,
                   full_check=full_check, path=path, progress=progress, target_opset=target_opset, owned=owned,
                   options=options)


def _write(request: Request, fast: bool = True) -> tuple[Pieces, RewriteReport]:
    """The writer for ``request`` (the module docstring says which), its output and report."""
    options = request.options
    if not fast:
        why = "the byte writer was turned off (fast=False)"
    elif options.get("rules") or options.get("as_functions"):
        why = "rules or --as-functions: the byte writer only lowers"
    elif options.get("simplify") is not None:
        why = "--simplify: the byte writer only lowers"
    else:
        from graphkit.rewrite.bytes import bodies, main_graph  # (here: `graphkit simplify` never imports them)

        try:
            try:
                return main_graph.write(request)
            except InBodies:  # placeholders in subgraphs: the byte writer for bodies
                return bodies.write(request)
        except Unsupported as exc:
            why = f"the byte writer does not handle this model: {exc}"
    out, report = _engine.write(request)
    report.writer_reason = why
    return out, report


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
    fast = options.pop("fast", True)  # False: the objects writer (rewrite_bytes's keyword)
    if dst is not None:
        check_output_path(dst, src)
    if fast and options.get("simplify") is not None and _only_simplifies(lowering, options):
        done = options["simplify"].write_file(src, dst, registry=registry, check=options.get("check", True),
                                              full_check=options.get("full_check", False),
                                              progress=options.get("progress"), before_write=before_write)
        if done is not None:  # (None: the splice does not apply; nothing was written)
            return FileRewrite(*done)
    data = read_model_bytes(src)
    request = _request(data, parse_model_bytes(data, src), True, registry=registry, lowering=lowering, path=src,
                       **options)
    del data  # the request holds the only references: the objects writer lets the bytes go once it has the model
    if request.has_external_data():
        files = check_external_data(request.model, src)
        if dst is not None:  # the weights are input too: refuse before any work
            check_output_path(dst, src, inputs=weights_files(files, dst))
        size = len(request.data)
        model, _ = request.release()
        out, report = rewrite_model(model, registry=request.registry, lowering=lowering, path=src, copy=False,
                                    **options)
        del model
        report.writer_reason = "external data: the objects writer places the weights with the model"
        sizes = {"bytes_before": size, "bytes_after": out.ByteSize()}
        if before_write is not None:
            before_write(report, sizes)
        if dst is not None:
            save_model(out, dst, input_path=src, external_data=external_data)
            sizes["bytes_after"] = os.path.getsize(dst)
        return FileRewrite(report, sizes, out)
    size = len(request.data)
    out, report = _write(request, fast)
    del request
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


def _only_simplifies(lowering: Lowering | Sequence[Lowering], options: dict[str, Any]) -> bool:
    """Whether the rewrite asked is ``graphkit simplify``'s (custom ops kept, no rules,
    functions or conversion): the options' write_file (graphkit.rewrite.simplify._splice) writes it, the input's
    large weights copied unparsed."""
    keep = lowering == Lowering.KEEP or (not isinstance(lowering, Lowering) and tuple(lowering) == (Lowering.KEEP,))
    return keep and set(options) <= {"simplify", "check", "full_check", "progress", "rules", "as_functions",
                                     "target_opset"} and not options.get("rules") and not options.get(
        "as_functions") and options.get("target_opset") is None
