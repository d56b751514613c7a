"""Fixes around torch 2.13's dynamo trace, active for every ``dynamo=True`` export.

:mod:`graphkit.export._translation_fixes` corrects what torch's exporter writes for an ATen
op; these act earlier, on models the exporter cannot take through its own FX passes (step 2
of 3, "Failed to decompose the FX graph for ONNX compatibility"). Each was found by
``bench/zoo.py`` and is tested against torch eager in ``tests/test_zoo.py``.

- The trace runs under ``torch.no_grad()`` (an export is an inference graph). With grad
  enabled, ``scaled_dot_product_attention`` whose float mask requires grad (T5's position
  bias comes from an embedding weight) takes the math kernel in ``torch.export`` (output
  contiguous), the flash kernel in the exporter's decomposition (output in the query's
  layout; a following ``.contiguous()`` is then judged a no-op and dropped, the reshape
  becoming a ``view``), and the math kernel again in its type-promotion pass, whose fake
  run of that ``view`` fails: "Cannot view a tensor with shape ... and strides ...".
  Without grad every pass takes the same kernel.
- ``clamp``/``clip`` with one integer and one float bound (``x.clamp(min=0, max=64.0)``):
  the type-promotion pass turns the integer bound into a tensor and leaves the float one a
  number, an argument list no ``aten::clamp`` overload takes ("Unable to cast 64.0 to
  Tensor"). The integer bound is made a float for the trace: torch eager promotes both
  bounds and the result to the same floating type either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["trace_fixes"]

_CLAMPS = frozenset({torch.clamp, torch.clip, torch.Tensor.clamp, torch.Tensor.clip,
                     torch.Tensor.clamp_, torch.Tensor.clip_, torch.clamp_, torch.clip_})


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)


def _is_float(value: Any) -> bool:
    return isinstance(value, (float, torch.SymFloat))


def _float_bounds(args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """``(args, kwargs)`` of a clamp call with its integer bound made a float when the
    other bound is a float; None when the call has no such mix."""
    names = ("input", "min", "max")
    bound = dict(zip(names, args)) | kwargs
    lo, hi = bound.get("min"), bound.get("max")
    if not ((_is_int(lo) and _is_float(hi)) or (_is_float(lo) and _is_int(hi))):
        return None
    fixed = {k: torch.sym_float(v) if k in ("min", "max") and _is_int(v) else v for k, v in bound.items()}
    given = len(args)
    return tuple(fixed[n] for n in names[:given]), {k: fixed[k] for k in kwargs}


class _ClampBounds(TorchFunctionMode):
    """Rewrites clamp calls with mixed integer/float bounds (see the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _CLAMPS and (fixed := _float_bounds(tuple(args), dict(kwargs))) is not None:
            args, kwargs = fixed
        return func(*args, **kwargs)


@contextlib.contextmanager
def trace_fixes() -> Iterator[None]:
    """The fixes above, for the ``with`` block."""
    with torch.no_grad(), _ClampBounds():
        yield
