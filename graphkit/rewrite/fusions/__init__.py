"""A library of fusions built on the rule API, one module per fusion.

=============  =================================================================
name           what it does
=============  =================================================================
identity       removes Identity nodes (graph output names kept)
transpose      removes Transpose pairs that cancel, merges other pairs into one
conv_bn        folds an inference BatchNormalization into the Conv before it
layernorm      elementary-op LayerNorm -> LayerNormalization (opset >= 17)
gelu           erf and tanh GELU -> Gelu (opset >= 20)
qkv            three MatMul (+ Add) projections of one input -> one MatMul (+ Add), Split
gemm           MatMul + Add -> Gemm (2-D inputs, bias broadcasting to [M, N])
=============  =================================================================

``LIBRARY`` holds them in that order (the order ``all`` applies them in); nothing
registers itself on import. ``graphkit simplify`` applies those with ``in_simplify`` (all but
qkv) unless its ``--fuse`` names others::

    from graphkit.rewrite import fusions, rewrite_model, Lowering
    fused, report = rewrite_model(model, rules=fusions.rule_set("layernorm,gelu"),
                                  lowering=Lowering.KEEP, target_opset=20)
    report.rules.applied   # {"layernorm": 5, "gelu_erf": 1, "gelu_tanh": 1}
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from graphkit.errors import UsageError
from graphkit.rewrite.rules.ruleset import RuleSet
from graphkit.rewrite.fusions import _conv_bn, _gelu, _gemm, _identity, _layernorm, _qkv, _transpose

__all__ = ["LIBRARY", "Fusion", "get", "names", "rule_set"]

_ALL = "all"


@dataclass(frozen=True)
class Fusion:
    """A named fusion: its rules (applied together) and what it needs."""

    name: str
    summary: str
    rules: tuple[Any, ...]
    min_opset: int | None = None
    #: whether ``graphkit simplify``'s fuse pass applies it by default (``--fuse`` chooses)
    in_simplify: bool = True

    def rule_set(self) -> RuleSet:
        """This fusion's rules as a RuleSet for ``rewrite_model(rules=...)``."""
        return RuleSet(self.rules)


class _FusionLibrary:
    """Fusions by name, in the order ``all`` applies them."""

    def __init__(self, fusions: Iterable[Fusion]) -> None:
        self._fusions = {f.name: f for f in fusions}

    def __iter__(self) -> Iterator[Fusion]:
        return iter(self._fusions.values())

    def names(self) -> list[str]:
        """The fusions' names, in the order ``all`` applies them."""
        return list(self._fusions)

    def get(self, name: str) -> Fusion:
        """The fusion called ``name``; UsageError naming the valid ones otherwise."""
        fusion = self._fusions.get(name.strip().lower())
        if fusion is None:
            raise UsageError(f"unknown fusion {name!r}; the fusions are: {', '.join(self.names())}, or {_ALL}",
                             hint="for example --fuse layernorm,gelu")
        return fusion

    def select(self, spec: str | Iterable[str]) -> list[Fusion]:
        """``"layernorm,gelu"``, ``"all"`` or a list of names -> fusions in library order."""
        wanted = [n for n in (spec.split(",") if isinstance(spec, str) else spec) if n.strip()]
        if not wanted:
            raise UsageError("no fusion named", hint=f"name some of: {', '.join(self.names())}, or {_ALL}")
        if any(n.strip().lower() == _ALL for n in wanted):
            return list(self)
        chosen = {self.get(n).name for n in wanted}
        return [f for f in self if f.name in chosen]

    def rule_set(self, spec: str | Iterable[str]) -> RuleSet:
        """One RuleSet holding the rules of the fusions ``spec`` names."""
        return RuleSet([rule for fusion in self.select(spec) for rule in fusion.rules])

    def describe(self) -> str:
        """One line per fusion (name and summary), as ``rewrite --help`` lists them."""
        width = max(len(n) for n in self.names())
        return "\n".join(f"  {f.name:<{width}}  {f.summary}" for f in self)


LIBRARY = _FusionLibrary([
    Fusion("identity", "remove Identity nodes (graph output names kept)", _identity.RULES),
    Fusion("transpose", "remove Transpose pairs that cancel, merge other pairs", _transpose.RULES),
    Fusion("conv_bn", "fold an inference BatchNormalization into the Conv before it", _conv_bn.RULES),
    Fusion("layernorm", "elementary-op LayerNorm -> LayerNormalization (opset >= 17)", _layernorm.RULES, 17),
    Fusion("gelu", "erf and tanh GELU -> Gelu (opset >= 20)", _gelu.RULES, 20),
    # Not in simplify's default set: the packed MatMul and its Split cost ONNX Runtime 1-5% on
    # one thread at BERT's sizes (the Split copies; its graph optimizer fuses less), which the
    # node it saves per layer does not repay (docs/simplify.md).
    Fusion("qkv", "three MatMul (+ Add) projections of one input -> one packed MatMul (+ Add) and a Split",
           _qkv.RULES, in_simplify=False),
    Fusion("gemm", "MatMul + Add -> Gemm (2-D inputs, bias broadcasting to [M, N])", _gemm.RULES),
])


def get(name: str) -> Fusion:
    """``LIBRARY.get(name)``."""
    return LIBRARY.get(name)


def names() -> list[str]:
    """The names of graphkit's fusions (``--fuse`` accepts them and ``all``)."""
    return LIBRARY.names()


def rule_set(spec: str | Iterable[str]) -> RuleSet:
    """``LIBRARY.rule_set(spec)``: ``"layernorm,gelu"``, ``"all"`` or a list of names."""
    return LIBRARY.rule_set(spec)
