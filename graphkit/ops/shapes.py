"""Shape helpers for op definitions' ``infer_shapes``."""

from __future__ import annotations

from typing import Any

__all__ = ["broadcast"]


def broadcast(*shapes: list[Any] | None) -> list[Any] | None:
    """Numpy/ONNX multidirectional broadcast of shapes; None where unknown.

    Raises ValueError on shapes that cannot broadcast.
    """
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list[Any] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = {d for d in dims if isinstance(d, int) and d != 1}
        if len(known) > 1:
            raise ValueError(f"shapes {[list(s) for s in shapes]} cannot broadcast")
        if known:
            out.append(known.pop())
        elif all(d == 1 for d in dims):
            out.append(1)
        else:
            symbolic = {d for d in dims if d != 1}
            out.append(symbolic.pop() if len(symbolic) == 1 else None)
    return out
