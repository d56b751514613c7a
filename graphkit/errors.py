"""graphkit's one exception hierarchy.

Every error a user can cause is a :class:`GraphkitError`. Its message names what
went wrong (file, node, op) and ``hint`` says how to fix it. Each class carries the
process exit code the CLI uses, documented in docs/exit-codes.md.
"""

from __future__ import annotations

__all__ = [
    "GraphkitError",
    "UsageError",
    "ModelLoadError",
    "OutputError",
    "OpDefinitionError",
    "OpPackageError",
    "UnknownOpError",
    "UnsupportedOpError",
    "RewriteError",
    "RuleError",
    "ValidationError",
    "KernelError",
    "NativeBuildError",
    "ExportError",
    "VerificationError",
    "ToolError",
    "EXIT_INTERNAL",
    "documented_exit_codes",
]

EXIT_INTERNAL = 70  # an unexpected exception: a graphkit bug


class GraphkitError(Exception):
    """Base of every error graphkit raises on purpose."""

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        path: str | None = None,
        node: str | None = None,
        op: str | None = None,
    ) -> None:
        self.message = message
        self.hint = hint
        self.path = None if path is None else str(path)
        self.node = node
        self.op = op
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.path:
            where.append(self.path)
        if self.node is not None:
            where.append(f"node '{self.node}'")
        if self.op:
            where.append(f"op {self.op}")
        text = f"{': '.join(where)}: {self.message}" if where else self.message
        if self.hint:
            text += f" ({self.hint})"
        return text


class UsageError(GraphkitError):
    """The command line or API call itself is wrong."""

    exit_code = 2


class ModelLoadError(GraphkitError):
    """An input model is missing, unreadable, not ONNX, or truncated."""

    exit_code = 3


class OutputError(GraphkitError):
    """An output cannot be written where asked."""

    exit_code = 4


class OpDefinitionError(GraphkitError):
    """An op definition is inconsistent (a bug in the definition, not the model)."""

    exit_code = 5


class OpPackageError(GraphkitError):
    """An op package cannot be found or imported, or two packages define the same op."""

    exit_code = 13


class UnknownOpError(OpPackageError, AttributeError):
    """An op asked for by name (``TorchOps().rms_norm``) that no loaded op package defines.
    An AttributeError too, so ``hasattr`` and ``getattr(ops, name, default)`` keep working."""


class UnsupportedOpError(GraphkitError):
    """A node has no rule, decomposition or kernel for what was asked."""

    exit_code = 6


class RewriteError(GraphkitError):
    """A rewrite rule failed or produced an invalid graph."""

    exit_code = 7


class RuleError(RewriteError):
    """A user's rewrite rule failed: its predicate, check or rewrite raised, or a rule set
    never stopped rewriting. The message names the rule, the node and the exception."""

    exit_code = 14


class ValidationError(GraphkitError):
    """The ONNX checker or shape inference rejected a model."""

    exit_code = 8


class KernelError(GraphkitError):
    """A kernel failed at run time, or a session could not be created."""

    exit_code = 9


class NativeBuildError(GraphkitError):
    """The native kernel library or torch extension failed to compile."""

    exit_code = 10


class ExportError(GraphkitError):
    """A torch model could not be exported."""

    exit_code = 11


class VerificationError(GraphkitError):
    """Two computations of the same model differ beyond tolerance (torch vs ORT, a vs b)."""

    exit_code = 12


class ToolError(GraphkitError):
    """An external program graphkit needs (graphviz's ``dot`` for pictures) is missing or failed."""

    exit_code = 15


def documented_exit_codes() -> set[int]:
    """Every exit code the CLI may give on purpose: 0, argparse's 2 and each error class's."""
    codes, todo = {0, 2}, [GraphkitError]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        codes.add(cls.exit_code)
    return codes - {GraphkitError.exit_code}
