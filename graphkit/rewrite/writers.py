"""The writers of a rewrite, and the one interface they share.

**Where a placeholder becomes standard ops.** In one place, whichever writer runs:
:meth:`graphkit.rewrite.lowering.plan.LoweringPlan.lower` turns a ``custom::`` node into its
replacement (a decomposition's nodes, a template later nodes of its kind repeat, or a
kernel binding; the choice between them is graphkit.rewrite.lowering.selection's). The writers
differ only in how they read the model, find the placeholders and write the result:

* ``objects`` (graphkit.rewrite.engine, :func:`~graphkit.rewrite.engine.write`): the model
  parsed into protobuf objects, ``rewrite_model``'s passes on it, serialized. Every option
  (rules, ``--as-functions``, ``--simplify``, any ``--target-opset``), every model.
* ``bytes``, main graph (graphkit.rewrite.bytes.main_graph): placeholders in the main graph only;
  the serialized model kept, each placeholder's entry replaced by its replacement's bytes.
* ``bytes``, bodies (graphkit.rewrite.bytes.bodies, writing through bytes.body_splice): placeholders
  inside If/Loop/Scan bodies too; the graphs holding them written again from their bytes.

Both byte writers lower only (no rules, functions or simplify), repeat the plan's result
for the first node of each kind on every later node of that kind (graphkit.rewrite.bytes.common:
what they share), and convert a ``--target-opset`` where the conversion moves only the
imports or changes nodes' own fields (graphkit.rewrite.bytes.conversions, a step of both).
Their output is the objects writer's, byte for byte where the input is as protobuf writes it
(tests/test_fastpath.py compares them on one corpus, tests/test_writer_equivalence.py on
every built-in op's exports); docs/benchmarks.md says what each saves, on which shapes.

**The interface.** A writer is a function ``write(request: Request) -> (Pieces, RewriteReport)``:

* ``request`` (:class:`Request`): the serialized model, the same model parsed, and the options.
  A writer reads both and changes neither, but the objects writer, which takes the model
  (:meth:`Request.release`) and may rewrite it in place where the request owns it.
* It returns the rewritten model as :class:`Pieces` (written to a file piece by piece) and the
  report ``rewrite_model`` gives for the same input and options; ``report.writer`` names the
  writer ("objects" or "bytes"), ``report.writer_reason`` why it ran.
* A byte writer raises :class:`Unsupported` (naming the precondition) where it does not handle
  the model, before any of the op's code runs or once the plan returns (never through the
  op's code: ``bytes.common.WriterTyping.serving``); the main graph's raises :class:`InBodies`
  where the placeholders are the bodies writer's. An error while lowering is the plan's,
  raised as it is: every writer reports it in the same words.

graphkit.rewrite.files (``rewrite_bytes``, ``rewrite_file``, what ``graphkit rewrite``
runs) picks: the main-graph byte writer, the bodies writer on :class:`InBodies`, the objects
writer on :class:`Unsupported` (or where an option only it has is asked for).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import onnx

if TYPE_CHECKING:  # (the engine imports this module: its RewriteReport is named, not imported)
    from graphkit.ops import OpRegistry
    from graphkit.rewrite.lowering.plan import Lowering

__all__ = ["InBodies", "Pieces", "Request", "Unsupported", "Writer"]

# Byte probes for TensorProto.data_location (field 14, varint) = EXTERNAL (1): every encoding
# of it holds one (the key's minimal bytes then the value's first, with or without a
# continuation bit), or a padded key, whose first byte is ``_PADDED_EXTERNAL``. Where only
# that one occurs (0xF0 is common in weights), the input is still trusted if it is canonical
# (as protobuf writes it: nothing padded).
_PROBE_EXTERNAL = (b"\x70\x01", b"\x70\x81")
_PADDED_EXTERNAL = b"\xf0"


class Unsupported(Exception):
    """A byte writer does not handle this model or option (a malformed wire format among the
    reasons); the objects writer runs instead."""


class InBodies(Unsupported):
    """Placeholders (or nodes a conversion changes) inside subgraphs: the bodies writer's business."""


class Pieces:
    """A serialized model as the pieces it is made of (bytes, memoryviews of the input), in
    order: a writer's output, written to a file piece by piece (``write``) rather than joined
    into one buffer beside the pieces; ``join`` makes that buffer where bytes are asked for."""

    def __init__(self, parts: list[Any]) -> None:
        self._parts = parts
        self.size = sum(map(len, parts))

    def __len__(self) -> int:
        return self.size

    def join(self) -> bytes:
        return b"".join(self._parts)

    def write(self, fh: Any, block: int = 1 << 12) -> None:
        """Write the model to the binary file ``fh``, ``block`` pieces joined at a time
        (a write per piece costs more than joining them)."""
        parts = self._parts
        for at in range(0, len(parts), block):
            fh.write(b"".join(parts[at:at + block]))


class Request:
    """One rewrite asked of a writer.

    ``data``: the serialized model; ``model``: it, parsed. ``owned``: nothing outside the
    request holds them (the caller dropped its references), so the objects writer may rewrite
    ``model`` in place and let the bytes go once it has the model. ``registry``, ``prefer``
    (the lowering preference, a tuple), ``check``, ``full_check``, ``path``, ``progress``,
    ``target_opset``: ``rewrite_model``'s keywords, which every writer takes; ``options``: its
    others (``rules``, ``as_functions``, ``simplify``), which only the objects writer has.
    What is learnt of the bytes once (canonical or not, external data) is kept here, for as
    long as the request lives.
    """

    def __init__(self, data: bytes, model: onnx.ModelProto, *, registry: OpRegistry, prefer: tuple[Lowering, ...],
                 check: bool = True, full_check: bool = False, path: str | None = None,
                 progress: Callable[[str, int, int], None] | None = None, target_opset: int | None = None,
                 owned: bool = False, options: dict[str, Any] | None = None) -> None:
        self.data: bytes | None = data
        self.model: onnx.ModelProto | None = model
        self.registry = registry
        self.prefer = prefer
        self.check = check
        self.full_check = full_check
        self.path = path
        self.progress = progress
        self.target_opset = target_opset
        self.owned = owned
        self.options = dict(options or {})
        self._canonical: bool | None = None
        self._external: bool | None = None

    def canonical(self) -> bool:
        """Whether ``data`` is ``model`` serialized canonically (as protobuf writes it: no varint
        longer than it needs). Asked only where a byte probe finds what could be a padded key;
        one ByteSize, remembered."""
        if self._canonical is None:
            self._canonical = len(self.data) == self.model.ByteSize()
        return self._canonical

    def has_external_data(self) -> bool:
        """Whether any tensor of the model is stored externally (remembered)."""
        if self._external is None:
            data = self.data
            if not any(p in data for p in _PROBE_EXTERNAL) and (_PADDED_EXTERNAL not in data or self.canonical()):
                self._external = False
            else:
                from graphkit.external_data import external_tensors

                self._external = bool(external_tensors(self.model))
        return self._external

    def release(self) -> tuple[onnx.ModelProto, bool]:
        """The parsed model, for the objects writer, and whether it may be rewritten in place
        (``owned``); the request holds neither the model nor the bytes after."""
        model, owned = self.model, self.owned
        self.model = self.data = None
        return model, owned


# A writer: the request in, the rewritten model's pieces and its RewriteReport out (module docstring).
Writer = Callable[[Request], tuple[Pieces, Any]]
