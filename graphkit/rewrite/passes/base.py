"""What every pass of the rewrite is given and gives back: :class:`PassContext` (the
options, the lowering plan, the analyses still true of the model, the report being filled),
:class:`Pass` (a named step and its precondition), :class:`PassResult`, :data:`ANALYSES`,
and :class:`RewriteReport`. The sequence of passes is :data:`graphkit.rewrite.engine.PASSES`."""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import onnx

from graphkit.errors import RewriteError
from graphkit.ops import OpRegistry
from graphkit.rewrite.graph.walk import AI_ONNX, ModelIndex
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.lowering.builder import NameGenerator
from graphkit.rewrite.lowering.plan import Lowering, LoweringPlan
from graphkit.rewrite.rules.ruleset import RuleReport, RuleSet

__all__ = ["ANALYSES", "DEFAULT_OPSET", "Pass", "PassResult", "PassContext", "RewriteReport", "Simplifier",
           "ai_onnx_opset"]


class Simplifier(Protocol):
    """What the simplify pass is handed (``rewrite_model(simplify=...)``): graphkit.rewrite.simplify's
    SimplifyOptions. ``fusions``: objects with ``rules`` and ``min_opset``, applied as rules when
    ``fuse``; ``run`` simplifies a model in place, calling ``fuse(model)`` (how many rules applied)
    each round, and returns what it did: ``changes`` (a Counter by pass), ``rounds``, ``kept``
    ((node, op) -> why its constant inputs did not fold) and ``describe()`` ((pass, what) rows).
    ``write_file`` is ``rewrite_file``'s simplify-only path (the file's large weights copied
    unparsed): (report, sizes, output pieces), or None where the plain path must run."""

    fusions: tuple[Any, ...]
    fuse: bool

    def run(self, model: onnx.ModelProto, registry: OpRegistry, *, opset: int, placeholder_domains: frozenset[str],
            path: str | None = None, fuse: Callable[[onnx.ModelProto], int] | None = None) -> Any: ...

    def write_file(self, src: str, dst: str | None, *, registry: OpRegistry | None, check: bool = True,
                   full_check: bool = False, progress: Callable[[str, int, int], None] | None = None,
                   before_write: Callable[[Any, dict[str, int]], None] | None = None) -> Any: ...


# Opset written into models that hold no ai.onnx import before a decomposition adds one.
DEFAULT_OPSET = 17


@dataclass
class RewriteReport:
    """What a rewrite did: op counts before/after, per-op actions, rules, and the passes run.

    ``passes`` lists ``(pass, what it changed)`` for every pass that changed the model;
    ``conversions`` the ai.onnx version conversions made, ``(from, to, how)`` with ``how``
    "adapters" (graphkit's), "version converter" (onnx's) or "imports only" (no standard op
    has a new version between the two), "adapters; onnx's converter node by node: ..." where
    onnx's converter did the nodes no adapter covers one at a time;
    ``writer`` says which writer made the output and why (``"objects"``: the passes on
    the parsed model; ``"bytes"``: a byte writer on the serialized one: graphkit.rewrite.writers);
    ``passed_over`` says, per op, why lowerings preferred to the one it got were not used
    (a decomposition ONNX Runtime cannot run or that cannot be built for the node).
    """

    ops_before: collections.Counter = field(default_factory=collections.Counter)
    ops_after: collections.Counter = field(default_factory=collections.Counter)
    actions: collections.Counter = field(default_factory=collections.Counter)
    rules: RuleReport = field(default_factory=RuleReport)
    passes: list[tuple[str, str]] = field(default_factory=list)
    conversions: list[tuple[int | None, int, str]] = field(default_factory=list)
    writer: str = "objects"
    writer_reason: str = ""
    passed_over: dict[str, list[str]] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)  # simplify: "op node" -> why its constant inputs did not fold

    @property
    def changed(self) -> bool:
        return sum(self.actions.values()) > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ops_before": {f"{d}::{o}" if d else o: n for (d, o), n in sorted(self.ops_before.items())},
            "ops_after": {f"{d}::{o}" if d else o: n for (d, o), n in sorted(self.ops_after.items())},
            "actions": [{"op": op, "lowering": how, "nodes": n}
                        for (op, how), n in sorted(self.actions.items())],
            "rules": {name: {"applied": self.rules.applied.get(name, 0),
                             "matched": self.rules.matched.get(name, 0),
                             "top_reasons": dict(self.rules.failures.get(name, collections.Counter()).most_common(5)),
                             "not_matched": self.rules.reasons.get(name, [])}
                      for name in sorted(set(self.rules.applied) | set(self.rules.reasons))},
            "passes": [{"pass": name, "changed": what} for name, what in self.passes],
            "conversions": [{"domain": "ai.onnx", "from": a, "to": b, "how": how} for a, b, how in self.conversions],
            "writer": {"name": self.writer, "why": self.writer_reason},
            "passed_over": {op: list(reasons) for op, reasons in sorted(self.passed_over.items())},
            "kept": dict(sorted(self.kept.items())),
        }


def ai_onnx_opset(model: onnx.ModelProto) -> int | None:
    for imp in model.opset_import:
        if imp.domain in AI_ONNX:
            return imp.version
    return None


@dataclass
class PassResult:
    """What one pass did: the model to go on with, whether (and how) it changed, and the
    analyses its change made false beyond what its Pass declares it never keeps."""

    model: onnx.ModelProto
    modified: bool
    detail: str = ""
    invalidates: frozenset[str] = frozenset()


# What passes share about the model besides the model itself, each true until a pass that
# changes the model does not keep it (Pass.keeps) or says it broke it (PassResult.invalidates).
# A pass reads one only through ctx.holds, and only one it declares in Pass.requires:
#   "index"        - ctx.index, the input's ModelIndex: its node lists and graphs are the model's
#   "counts"       - ctx.counts, the model's op counts but for what the lowering plan and the
#                    attached functions changed since (their deltas: plan.lowered/emitted, attached)
#   "placeholders" - ctx.index.found, the placeholder nodes with attributes, are the model's
ANALYSES = frozenset({"index", "counts", "placeholders"})


@dataclass
class PassContext:
    """Everything the passes share: the options, the plan, the main graph's types, the report."""

    registry: OpRegistry
    prefer: tuple[Lowering, ...]
    rules: RuleSet
    target_opset: int | None
    as_functions: bool
    check: bool
    full_check: bool
    path: str | None
    progress: Callable[[str, int, int], None] | None
    report: RewriteReport
    placeholders: frozenset[str]
    defer_check: bool = False        # the caller serializes the result: check the bytes then
    deferred_check: Callable[[bytes], None] | None = None
    # Facts of the input and the options, set before the first pass; no pass changes them.
    converting: bool = False         # a --target-opset other than the input's
    has_placeholders: bool = False   # in the input (rules may add some), standard ops an op computes included
    has_standard: bool = False       # standard ops an op computes (ai.onnx DeformConv) in the input
    plan: LoweringPlan | None = None
    index: ModelIndex | None = None  # of the input's copy: read where "index" holds (functions
                                     # attached are not in it; ``attached`` counts their nodes)
    types: TypeTable | None = None   # the main graph's (and its subgraphs') tensor types
    counts: collections.Counter | None = None  # read where "counts" holds; replaced, never changed in place
    valid: set[str] = field(default_factory=lambda: set(ANALYSES))  # the ANALYSES that hold
    attached: collections.Counter = field(default_factory=collections.Counter)  # the attached functions' ops
    simplify: Simplifier | None = None  # run the simplify passes after lowering
    # engine's FULL_CHECK_NODES, PROGRESS_MIN_NODES and PROGRESS_STEP when the rewrite started
    full_check_nodes: int = field(kw_only=True)  # whole-model shape inference up to this many nodes
    progress_min_nodes: int = field(kw_only=True)  # progress reported on models of more nodes
    progress_step: int = field(kw_only=True)  # nodes between two reports

    running: Pass | None = None      # the pass being run (the engine sets it)

    def holds(self, analysis: str) -> bool:
        """Whether ``analysis`` (one of ANALYSES) is still true of the model; a RewriteError
        where the running pass reads one it does not declare in ``requires``."""
        if self.running is not None and analysis not in self.running.requires:
            raise RewriteError(f"pass {self.running.name!r} reads the analysis {analysis!r} it does not require",
                               hint=f"add {analysis!r} to the Pass's requires (graphkit.rewrite.engine.PASSES)")
        return analysis in self.valid

    def make_plan(self, model: onnx.ModelProto, names: set[str]) -> None:
        """The one lowering plan of this rewrite, at the model's opset, avoiding ``names`` (a
        set the plan takes over: it grows with the names made; no copy of a million names)."""
        opset = ai_onnx_opset(model) or DEFAULT_OPSET
        self.plan = LoweringPlan(self.registry, self.prefer, opset, path=self.path,
                                 names=NameGenerator(names, adopt=True))
        self.types = TypeTable(model, self.registry)


@dataclass(frozen=True)
class Pass:
    """A named step of the rewrite: ``run`` only where ``applies`` holds.

    ``requires``: the ANALYSES it reads where they hold (it works without them, slower;
    ``ctx.holds`` refuses any other);
    ``keeps``: those still true after it changes the model, unless its PassResult
    ``invalidates`` them (a pass that changes the model drops every other one).
    """

    name: str
    applies: Callable[[PassContext, onnx.ModelProto], bool]
    run: Callable[[PassContext, onnx.ModelProto], PassResult]
    requires: frozenset[str] = frozenset()
    keeps: frozenset[str] = frozenset()
