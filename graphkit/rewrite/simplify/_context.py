"""What the simplify passes share: the options, the ops known, the model's types, the
reasons nodes were kept, and the names taken."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx

from graphkit.ops import OpRegistry
from graphkit.rewrite.simplify._graph import SimplifyScope, base_dir_of, scopes_of
from graphkit.rewrite.graph.types import TypeTable
from graphkit.rewrite.simplify._shapes import simplify_types

__all__ = ["DEFAULT_SIZE_LIMIT", "SimplifyContext"]

DEFAULT_SIZE_LIMIT = 1 << 20  # bytes a folded output may hold (beyond twice its constant inputs)


@dataclass
class SimplifyContext:
    """What one run of the passes shares (made by _run.run_simplify)."""

    registry: OpRegistry
    opset: int
    placeholder_domains: frozenset[str]
    options: Any  # graphkit.rewrite.simplify._run.SimplifyOptions
    path: str | None = None
    types: TypeTable | None = None
    shape_values: dict[str, tuple[bool, tuple[Any, ...]]] = field(default_factory=dict)
    kept: dict[tuple[str, str], str] = field(default_factory=dict)  # (node, op) -> why it was kept
    _taken: set[str] | None = None

    def scopes(self, model: onnx.ModelProto) -> Iterator[SimplifyScope]:
        """Every scope of ``model``, read afresh (each graph before the graphs it holds)."""
        yield from scopes_of(model, base_dir_of(self.path), os.path.basename(self.path) if self.path else None)

    def infer(self, model: onnx.ModelProto) -> None:
        self.types = simplify_types(model, self.registry)
        self.shape_values = {}

    def keep(self, node: onnx.NodeProto, why: str) -> None:
        op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        self.kept[(node.name or f"<unnamed, writes {node.output[0] if node.output else ''}>", op)] = why

    def taken(self, model: onnx.ModelProto) -> None:
        """Start a run on ``model``: the names it uses are not given out by :meth:`fresh`."""
        taken: set[str] = set()
        for scope in self.scopes(model):
            taken.update(scope.producer)
            taken.update(scope.initializers)
            taken.update(scope.inputs)
        self._taken = taken

    def fresh(self, base: str) -> str:
        """A name no value of the model has, from ``base``."""
        if self._taken is None:
            raise RuntimeError("SimplifyContext.taken(model) starts a run before fresh() gives names")
        name, n = base, 0
        while name in self._taken:
            n += 1
            name = f"{base}_{n}"
        self._taken.add(name)
        return name
