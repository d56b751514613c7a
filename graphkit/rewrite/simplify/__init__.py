"""Simplify: the post-processor that sees through custom ops.

``graphkit simplify IN OUT`` (and ``graphkit rewrite --simplify``) runs these passes of
the rewrite engine after lowering, repeated until none changes the model:

======================  ===================================================================
pass                    what it does
======================  ===================================================================
lift-constants          Constant nodes of graphs become initializers
fold-constants          nodes whose inputs are constant are evaluated (custom ops by their
                        kernel or reference); shape arithmetic with known dims too
fold-shapes             Reshape targets computed from symbolic dims become constants
remove-no-ops           Identity, inference Dropout, Cast/Reshape/Expand/Transpose/... no-ops
absorb-into-custom-ops  BatchNormalization or per-channel Mul/Add after an op declaring
                        :class:`~graphkit.ops.ChannelLinear` folds into its weight and bias
merge-constants         initializers with equal type, shape and bytes become one
eliminate-common        nodes computing the same thing become one
eliminate-dead          unused nodes, initializers, functions and function inputs go
fuse                    graphkit's fusion library (graphkit.rewrite.fusions)
======================  ===================================================================

Shapes and types come from ONNX shape inference with every known custom op's shape
function. Graph inputs, outputs and their names never change.

This package sits above the engine: its entry points call ``rewrite_model`` / ``rewrite_file``
with a :class:`SimplifyOptions`, whose ``run`` the engine's simplify pass
(graphkit.rewrite.passes.simplify) calls; nothing below imports it. ::

    from graphkit.rewrite.simplify import simplify_model
    smaller, report = simplify_model(model)
    report.passes   # [("simplify:lift-constants", "107 Constant nodes lifted ..."), ...]
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import onnx

from graphkit.errors import UsageError
from graphkit.ops import OpRegistry
from graphkit.rewrite import fusions
from graphkit.rewrite.engine import Lowering, rewrite_model
from graphkit.rewrite.files import FileRewrite, rewrite_file
from graphkit.rewrite.simplify._run import FUSE, NAMES, SIMPLIFY_PASSES, SimplifyOptions

__all__ = ["PASS_NAMES", "SimplifyOptions", "simplify_file", "simplify_model", "simplify_options"]

PASS_NAMES: tuple[str, ...] = (*(p.name for p in SIMPLIFY_PASSES), FUSE)


def simplify_options(**overrides: Any) -> SimplifyOptions:
    """SimplifyOptions with graphkit's fusions meant for simplify (each where the model's opset
    has its ops: every fusion but qkv, see graphkit.rewrite.fusions); ``overrides`` set the
    other fields (``fusions=fusions.LIBRARY.select("all")`` for every one). An unknown pass in
    ``skip`` is a UsageError naming the passes."""
    skip = frozenset(overrides.get("skip", ()))
    unknown = sorted(skip - NAMES)
    if unknown:
        raise UsageError(f"unknown simplify pass(es) {unknown}; the passes are: {', '.join(PASS_NAMES)}",
                         hint="for example --skip fuse,eliminate-common")
    base = SimplifyOptions(fusions=tuple(f for f in fusions.LIBRARY if f.in_simplify))
    return dataclasses.replace(base, **{**overrides, "skip": skip})


def simplify_model(model: onnx.ModelProto, *, registry: OpRegistry | None = None,
                   options: SimplifyOptions | None = None, check: bool = True,
                   path: str | None = None) -> tuple[onnx.ModelProto, Any]:
    """A simplified copy of ``model`` (custom ops kept) and the rewrite report."""
    opts = simplify_options() if options is None else options
    return rewrite_model(model, registry=registry, lowering=Lowering.KEEP, simplify=opts, check=check, path=path)


def simplify_file(src: str | os.PathLike[str], dst: str | os.PathLike[str] | None, *,
                  registry: OpRegistry | None = None, options: SimplifyOptions | None = None,
                  **kwargs: Any) -> FileRewrite:
    """``rewrite_file`` keeping custom ops and simplifying (``dst`` None: a dry run); returns
    its FileRewrite."""
    opts = simplify_options() if options is None else options
    return rewrite_file(src, dst, registry=registry, lowering=Lowering.KEEP, simplify=opts, **kwargs)
