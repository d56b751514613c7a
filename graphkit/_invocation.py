"""Who is calling graphkit: the ``graphkit`` command or Python code.

The command runs inside :func:`command_line`: for that block the op packages named with
``--ops`` reach every registry built without naming its packages (``TorchOps()`` in a model
factory, ``open_session(model)``, ``discover()``), as ``$GRAPHKIT_OPS`` does, and hints
speak the command's language (``--ops PACKAGE``). Outside it, hints name the Python API
(``registry=discover([...])``). Nothing here outlives the block; the state is a context
variable, so other threads and later callers see none of it. Standard library only: the
CLI enters the block before it imports anything heavy.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence

__all__ = ["command_line", "command_ops", "in_command", "wording"]

_COMMAND: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("graphkit_command", default=None)


@contextlib.contextmanager
def command_line(ops: Sequence[str] = ()) -> Iterator[None]:
    """The ``graphkit`` command runs inside this block; ``ops`` are its ``--ops`` values."""
    token = _COMMAND.set(tuple(ops))
    try:
        yield
    finally:
        _COMMAND.reset(token)


def in_command() -> bool:
    """True inside :func:`command_line` (the ``graphkit`` command), False for Python callers."""
    return _COMMAND.get() is not None


def command_ops() -> tuple[str, ...]:
    """The command's ``--ops`` values; () outside :func:`command_line`."""
    return _COMMAND.get() or ()


def wording(cli: str, api: str) -> str:
    """``cli`` inside :func:`command_line`, ``api`` for Python callers: a hint's two phrasings."""
    return cli if in_command() else api
