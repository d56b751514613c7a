"""ATen ops the TorchScript exporter (``dynamo=False``) cannot export: graphkit's symbolics.

Two things map an ``aten::<op>`` call to ONNX while :func:`graphkit.export.export` runs,
registered with ``torch.onnx.register_custom_op_symbolic`` for that call only and
unregistered on exit, even on error:

- a :class:`GapFiller` (one row of a :class:`GapFillerTable`, default
  :data:`graphkit.export.GAP_FILLERS`): the standard ONNX op or short composition for an
  ATen op torch 2.13 has no symbolic for (``aten::asinh`` -> ``Asinh``);
- a placeholder (:func:`scoped_placeholders`): ``aten::<op>`` written as graphkit's
  ``custom::<op>`` node, for an op of the registry with the same name and inputs
  (``export(..., placeholders=["asinh"])``), so the lowering is chosen later per target.

Symbolics are registered at the export's opset only and never over someone else's:
torch's own symbolic (if torch has one at that opset) or a custom one already registered
there wins, and the table entry is skipped (see :attr:`ScopedSymbolics.skipped`); a row
whose ``replaces`` says why torch's symbolic is wrong (``aten::cumsum`` of a bool tensor)
is registered over torch's own.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from graphkit.errors import ExportError, OpDefinitionError
from graphkit.export._placeholder import emit_placeholder, onnxscript_translation
from graphkit.export._symbolic_registry import forget_empty_group, symbolic_registry
from graphkit.ops import OpDef

__all__ = [
    "Example",
    "GapFiller",
    "GapFillerTable",
    "ScopedSymbolics",
    "scoped_gap_fillers",
    "scoped_placeholders",
    "placeholder_translations",
    "torch_symbolic_exists",
    "forget_empty_group",
    "TORCHSCRIPT_OPSETS",
]

# Opsets torch 2.13's TorchScript exporter writes.
TORCHSCRIPT_OPSETS = range(7, 21)


@dataclass(frozen=True)
class Example:
    """A small call that reaches the ATen op: ``fn(*inputs(generator))``.

    Used by the tests and by ``python -m graphkit.export.gaps`` to show that the op is a
    gap without the filler and matches torch in ONNX Runtime with it.
    """

    fn: Callable[..., torch.Tensor]
    inputs: Callable[[torch.Generator], tuple[torch.Tensor, ...]]
    label: str = ""


@dataclass(frozen=True)
class GapFiller:
    """A symbolic for ``aten`` (``"aten::asinh"``), valid from ``min_opset`` on.

    ``symbolic(g, *args)`` receives the ATen op's arguments (see
    ``torch/_C/_VariableFunctions.pyi``) and returns the ONNX value(s); ``onnx`` names what
    it writes, for reports. ``replaces`` (empty for a gap) says why the row is registered
    over torch's own symbolic: torch exports the op, but writes a model ONNX Runtime refuses
    or that differs from torch for some inputs.

    ``tolerance``: (rtol, atol) by dtype name over :data:`graphkit.ops._opdef.DEFAULT_TOLERANCE`,
    how close the filler is to torch on every input (tests/test_edges.py checks edge
    values). ``unsupported``: dtype name -> why the exported model cannot run on ONNX
    Runtime's CPU provider for that dtype (checked: it must fail). ``semantics``: where the
    filler departs from torch on purpose, and why. ``tolerance_scale``: what rtol is relative
    to, ``"result"`` (|torch's value|) or ``"inputs"`` (the largest input magnitude, for
    results that cancel in torch as much as here: logaddexp near 0).
    """

    aten: str
    min_opset: int
    symbolic: Callable[..., Any]
    onnx: str
    examples: tuple[Example, ...] = ()
    replaces: str = ""
    tolerance: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    unsupported: Mapping[str, str] = field(default_factory=dict)
    semantics: str = ""
    tolerance_scale: str = "result"

    def __post_init__(self) -> None:
        if not self.aten.startswith("aten::") or len(self.aten) <= len("aten::"):
            raise OpDefinitionError(f"gap filler name {self.aten!r} is not 'aten::<op>'",
                                    hint="spell it like 'aten::asinh'")
        if self.min_opset not in TORCHSCRIPT_OPSETS:
            raise OpDefinitionError(f"gap filler {self.aten}: min_opset {self.min_opset} is outside "
                                    f"{TORCHSCRIPT_OPSETS.start}-{TORCHSCRIPT_OPSETS.stop - 1}",
                                    hint="use the first opset holding every ONNX op it writes")

    @property
    def name(self) -> str:
        return self.aten.split("::", 1)[1]


class GapFillerTable:
    """An immutable table of :class:`GapFiller`, one per ATen op."""

    def __init__(self, fillers: Iterable[GapFiller] = ()) -> None:
        self._fillers: dict[str, GapFiller] = {}
        for f in fillers:
            if f.aten in self._fillers:
                raise OpDefinitionError(f"gap filler {f.aten} is defined twice",
                                        hint="keep one entry per ATen op")
            self._fillers[f.aten] = f

    def __iter__(self) -> Iterator[GapFiller]:
        return iter(self._fillers.values())

    def __len__(self) -> int:
        return len(self._fillers)

    def __contains__(self, aten: object) -> bool:
        return aten in self._fillers

    def get(self, aten: str) -> GapFiller | None:
        return self._fillers.get(aten if "::" in aten else f"aten::{aten}")

    def without(self, *names: str) -> "GapFillerTable":
        """A copy without the named entries (``"asinh"`` or ``"aten::asinh"``)."""
        drop = {n if "::" in n else f"aten::{n}" for n in names}
        return GapFillerTable(f for f in self if f.aten not in drop)

    def __repr__(self) -> str:
        return f"GapFillerTable({len(self)} ops)"


# --------------------------------------------------------------------------- registration

_lock = threading.RLock()  # torch's symbolic registry is process-global


def _registry():
    reg = symbolic_registry()
    if reg is None:  # pragma: no cover - torch 2.13 has it
        raise ExportError("this torch has no TorchScript symbolic registry",
                          hint="use torch 2.13 or dynamo=True")
    return reg


def torch_symbolic_exists(aten: str, opset: int) -> bool:
    """Whether the TorchScript exporter has a symbolic (its own or a custom one) for
    ``aten`` at ``opset`` right now."""
    return _registry().is_registered_op(aten, opset)


def _overridden(aten: str, opset: int) -> bool:
    group = _registry().get_function_group(aten)
    return group is not None and group._functions.overridden(opset)


@dataclass
class ScopedSymbolics:
    """What a scoped registration did: ``registered`` ATen ops (ours, for the block),
    ``skipped`` ones (with the reason) and ``used``: those the exporter actually called."""

    opset: int
    registered: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)


def _recording(aten: str, fn: Callable[..., Any], scope: ScopedSymbolics) -> Callable[..., Any]:
    @functools.wraps(fn)
    def symbolic(g, *args, **kwargs):
        scope.used.add(aten)
        return fn(g, *args, **kwargs)

    return symbolic


@contextlib.contextmanager
def _scoped(entries: Sequence[tuple[str, Callable[..., Any]]], scope: ScopedSymbolics,
            *, conflict_is_error: bool) -> Iterator[ScopedSymbolics]:
    added: list[tuple[str, bool]] = []
    with _lock:
        try:
            for aten, fn in entries:
                if _overridden(aten, scope.opset):
                    reason = f"a custom symbolic for {aten} is already registered at opset {scope.opset}"
                    if conflict_is_error:
                        raise ExportError(reason, op=aten, hint="unregister it, or do not ask for "
                                          "this placeholder")
                    scope.skipped[aten] = reason
                    continue
                existed = _registry().get_function_group(aten) is not None
                torch.onnx.register_custom_op_symbolic(aten, _recording(aten, fn, scope), scope.opset)
                added.append((aten, existed))
                scope.registered.append(aten)
            yield scope
        finally:
            for aten, existed in reversed(added):
                torch.onnx.unregister_custom_op_symbolic(aten, scope.opset)
                forget_empty_group(aten, existed)


@contextlib.contextmanager
def scoped_gap_fillers(table: GapFillerTable | Iterable[GapFiller], opset: int, *,
                       skip: Iterable[str] = ()) -> Iterator[ScopedSymbolics]:
    """Register the fillers torch lacks at ``opset`` for the block only.

    An entry is skipped when ``opset < min_opset``, when torch has its own symbolic at
    ``opset`` (torch wins, unless the entry ``replaces`` it), when a custom symbolic is already registered there, or when its
    ATen op is in ``skip`` (``"aten::asinh"``).
    """
    scope = ScopedSymbolics(opset)
    skip = set(skip)
    entries = []
    with _lock:
        for f in table:
            if f.aten in skip:
                scope.skipped[f.aten] = "exported as a placeholder instead"
            elif opset < f.min_opset:
                scope.skipped[f.aten] = f"needs opset >= {f.min_opset}"
            elif torch_symbolic_exists(f.aten, opset) and not _overridden(f.aten, opset) \
                    and not f.replaces:
                scope.skipped[f.aten] = f"torch exports it at opset {opset}"
            else:
                entries.append((f.aten, f.symbolic))
        with _scoped(entries, scope, conflict_is_error=False) as s:
            yield s


def _placeholder_op(op: OpDef) -> None:
    if op.attributes or any(p.optional for p in op.inputs):
        raise ExportError(f"{op.qualified_name} cannot stand for aten::{op.name}: a placeholder for "
                          "an ATen op takes the op's tensor inputs only (no attributes or "
                          "optional inputs)", op=op.qualified_name,
                          hint="call the op through TorchOps in the model instead")


def _placeholder_symbolic(op: OpDef) -> Callable[..., Any]:
    n_in = len(op.inputs)

    def symbolic(g, *args):
        return emit_placeholder(g, op, list(args[:n_in]), {})

    symbolic.__name__ = f"aten_{op.name}_as_placeholder"
    return symbolic


@contextlib.contextmanager
def scoped_placeholders(ops: Iterable[OpDef], opset: int) -> Iterator[ScopedSymbolics]:
    """For the block, export ``aten::<name>`` as ``<op.domain>::<name>`` for each op of ``ops``
    (TorchScript exporter). Overrides torch's own symbolic at ``opset``; a custom symbolic
    someone else registered there is an ExportError."""
    ops = list(ops)
    for op in ops:
        _placeholder_op(op)
    scope = ScopedSymbolics(opset)
    with _scoped([(f"aten::{op.name}", _placeholder_symbolic(op)) for op in ops], scope,
                 conflict_is_error=True) as s:
        yield s


def placeholder_translations(ops: Iterable[OpDef]) -> dict[Any, Callable[..., Any]]:
    """``custom_translation_table`` entries writing ``<op.domain>::<name>`` for
    ``torch.ops.aten.<name>.default`` (the dynamo exporter)."""
    table = {}
    for op in ops:
        _placeholder_op(op)
        packet = getattr(torch.ops.aten, op.name, None)
        overload = getattr(packet, "default", None) if packet is not None else None
        if overload is None:
            raise ExportError(f"there is no ATen op aten::{op.name}.default for the placeholder "
                              f"{op.qualified_name}", op=op.qualified_name,
                              hint="name an ATen op the model calls (see torch.ops.aten)")
        table[overload] = onnxscript_translation(op)
    return table
