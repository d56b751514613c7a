"""The simplify passes, in order, repeated until none changes the model; and
:class:`SimplifyOptions`, what the rewrite engine is handed to run them.

Each :class:`SimplifyPass` states its contract: whether it reads the model's types
(``requires_types``: ONNX shape inference, run once per round and shared) and whether it
keeps them valid (``keeps_types``: it removes nodes or renames values to ones of the same
type, but never makes a value of a new type). A pass returns how many things it changed.

The engine imports nothing from here: its simplify pass (graphkit.rewrite.passes.simplify)
calls :meth:`SimplifyOptions.run` on the options it is handed, and ``rewrite_file``
(graphkit.rewrite.files) their :meth:`SimplifyOptions.write_file` (the splice).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx

from graphkit.ops import OpRegistry
from graphkit.rewrite.simplify._absorb import absorb_channel_affine
from graphkit.rewrite.simplify._cleanup import (cancel_reshapes, eliminate_common, eliminate_dead, lift_constants,
                                                merge_constants, remove_no_ops)
from graphkit.rewrite.simplify._context import DEFAULT_SIZE_LIMIT, SimplifyContext
from graphkit.rewrite.simplify._fold import fold_constants, fold_shapes
from graphkit.rewrite.simplify._splice import simplify_spliced

__all__ = ["FUSE", "SIMPLIFY_PASSES", "SimplifyOptions", "SimplifyPass", "SimplifyResult", "run_simplify"]

FUSE = "fuse"  # the fusion library's pass (run by the caller's rules; see run_simplify)


@dataclass(frozen=True)
class SimplifyPass:
    name: str
    run: Callable[[SimplifyContext, onnx.ModelProto], int]
    what: str  # "{n} <what>" in the report
    requires_types: bool = False
    keeps_types: bool = True


SIMPLIFY_PASSES: tuple[SimplifyPass, ...] = (
    SimplifyPass("lift-constants", lift_constants, "Constant nodes lifted to initializers"),
    SimplifyPass("fold-constants", fold_constants, "nodes folded", requires_types=True),
    SimplifyPass("fold-shapes", fold_shapes, "shape computations made constant", requires_types=True),
    SimplifyPass("remove-no-ops", remove_no_ops, "no-op nodes removed", requires_types=True),
    SimplifyPass("cancel-reshapes", cancel_reshapes, "Reshape pairs around elementwise ops removed",
                 requires_types=True, keeps_types=False),
    SimplifyPass("absorb-into-custom-ops", absorb_channel_affine, "per-channel scale/shift folded into custom ops",
                 requires_types=True),
    SimplifyPass("merge-constants", merge_constants, "duplicate initializers merged"),
    SimplifyPass("eliminate-common", eliminate_common, "duplicate nodes merged"),
    SimplifyPass("eliminate-dead", eliminate_dead, "unused nodes, initializers and function inputs removed"),
)
NAMES = frozenset(p.name for p in SIMPLIFY_PASSES) | {FUSE}


@dataclass
class SimplifyResult:
    """What simplify did: per pass, how many changes over all rounds; the rounds run; and,
    per node kept though its inputs were constant, why."""

    changes: collections.Counter
    rounds: int
    kept: dict[tuple[str, str], str]

    def describe(self) -> list[tuple[str, str]]:
        """(pass, what it changed) for the report, in pass order."""
        what = {p.name: p.what for p in SIMPLIFY_PASSES} | {FUSE: "fusions applied"}
        order = [p.name for p in SIMPLIFY_PASSES] + [FUSE]
        return [(f"simplify:{name}", f"{self.changes[name]} {what[name]}") for name in order if self.changes[name]]


@dataclass(frozen=True)
class SimplifyOptions:
    """How ``graphkit simplify`` (and ``rewrite --simplify``) runs.

    ``size_limit``: the most bytes a folded node's outputs may hold (unless no more than
    twice its constant inputs); ``fusions``: the fusions the "fuse" pass applies (objects
    with ``rules`` and ``min_opset``, as graphkit.rewrite.fusions' ``Fusion``; those the
    model's opset lacks are left out); ``fuse``: run them; ``skip``: names of passes not to
    run; ``max_rounds``: the passes repeat until nothing changes, at most this many times.
    """

    size_limit: int = DEFAULT_SIZE_LIMIT
    fusions: tuple[Any, ...] = ()
    fuse: bool = True
    skip: frozenset[str] = frozenset()
    max_rounds: int = 8

    def run(self, model: onnx.ModelProto, registry: OpRegistry, *, opset: int, placeholder_domains: frozenset[str],
            path: str | None = None, fuse: Callable[[onnx.ModelProto], int] | None = None) -> SimplifyResult:
        """The simplify passes on ``model`` in place, with these options (:func:`run_simplify`)."""
        return run_simplify(model, registry, opset=opset, placeholder_domains=placeholder_domains, options=self,
                            path=path, fuse=fuse)

    def write_file(self, src: str, dst: str | None, *, registry: OpRegistry | None, check: bool = True,
                   full_check: bool = False, progress: Callable[[str, int, int], None] | None = None,
                   before_write: Callable[[Any, dict[str, int]], None] | None = None) -> tuple[Any, dict[str, int], Any] | None:
        """``rewrite_file(src, dst, lowering=KEEP, simplify=self)`` with the input's large weights
        copied unparsed (graphkit.rewrite.simplify._splice): what its FileRewrite holds, or
        None where the plain path must run (nothing written then)."""
        return simplify_spliced(src, dst, registry=registry, options=self, check=check, full_check=full_check,
                                progress=progress, before_write=before_write)


def run_simplify(model: onnx.ModelProto, registry: OpRegistry, *, opset: int, placeholder_domains: frozenset[str],
                 options: SimplifyOptions, path: str | None = None,
                 fuse: Callable[[onnx.ModelProto], int] | None = None) -> SimplifyResult:
    """Simplify ``model`` in place. ``fuse(model)`` applies the fusion library's rules and
    returns how many applied (run after the passes each round, while it finds any)."""
    ctx = SimplifyContext(registry, opset, placeholder_domains, options, path)
    ctx.taken(model)
    changes: collections.Counter = collections.Counter()
    rounds = 0
    fused_at_fixed_point = False  # the rules run to their own fixed point: again only after a change
    while rounds < options.max_rounds:
        rounds += 1
        changed = False
        ctx.types = None
        for p in SIMPLIFY_PASSES:
            if p.name in options.skip:
                continue
            if p.requires_types and ctx.types is None:
                ctx.infer(model)
            n = p.run(ctx, model)
            if n:
                changes[p.name] += n
                changed = True
                if not p.keeps_types:
                    ctx.types = None
        if fuse is not None and options.fuse and FUSE not in options.skip and (changed or not fused_at_fixed_point):
            n = fuse(model)
            fused_at_fixed_point = True
            if n:
                changes[FUSE] += n
                changed = True
                ctx.taken(model)  # the rules made names
        if not changed:
            break
    return SimplifyResult(changes, rounds, ctx.kept)
