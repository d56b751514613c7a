"""Fixes around torch 2.13's traces: models torch's exporters fail on, or export wrongly.

:mod:`graphkit.export._translation_fixes` corrects what torch's dynamo exporter writes for
an ATen op; these act earlier, while the model is traced. Each was found by
``bench/zoo.py`` or its tests and is tested against torch eager in ``tests/test_zoo.py``.

- ``dynamo=True``: the trace runs under ``torch.no_grad()`` (an export is an inference
  graph). With grad enabled, ``scaled_dot_product_attention`` whose float mask requires
  grad (T5's position bias comes from an embedding weight) takes the math kernel in
  ``torch.export`` (output contiguous), the flash kernel in the exporter's decomposition
  (output in the query's layout; a following ``.contiguous()`` is then judged a no-op and
  dropped, the reshape becoming a ``view``), and the math kernel again in its
  type-promotion pass, whose fake run of that ``view`` fails ("Failed to decompose the FX
  graph ...: Cannot view a tensor with shape ... and strides ..."). Without grad every pass
  takes the same kernel.
- Both exporters: ``clamp``/``clip`` whose bounds are numbers of another kind than the
  tensor. torch eager promotes an integer tensor with a float bound to the default float
  type. The dynamo exporter fails on one integer and one float bound
  (``x.clamp(min=0, max=64.0)``: its type-promotion pass makes the integer bound a tensor
  and leaves the float one a number, an argument list no ``aten::clamp`` overload takes,
  "Unable to cast 64.0 to Tensor"); the TorchScript exporter clamps an integer tensor with
  float bounds in its integer type (``arange(8).clamp(0.5, 3.5)`` gives int64 [0, 1, 2, 3,
  3, ...], torch float32 [0.5, 1.0, 2.0, 3.0, 3.5, ...]). For the trace an integer tensor
  with a float bound is cast to the default float type first, and an integer bound beside
  a float one made a float: what torch eager computes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["trace_fixes"]

_IN_PLACE = frozenset({torch.Tensor.clamp_, torch.Tensor.clip_, torch.clamp_, torch.clip_})
_CLAMPS = frozenset({torch.clamp, torch.clip, torch.Tensor.clamp, torch.Tensor.clip}) | _IN_PLACE


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)


def _is_float(value: Any) -> bool:
    return isinstance(value, (float, torch.SymFloat))


def _float_bounds(args: tuple, kwargs: dict, *, in_place: bool) -> tuple[tuple, dict] | None:
    """``(args, kwargs)`` of a clamp call as torch eager computes it (see the module
    docstring); None when the call needs no change. An in-place clamp keeps its tensor
    (torch refuses a float result for an integer one, and so does the trace)."""
    names = ("input", "min", "max")
    bound = dict(zip(names, args)) | kwargs
    x, lo, hi = bound.get("input"), bound.get("min"), bound.get("max")
    if not isinstance(x, torch.Tensor) or not (_is_float(lo) or _is_float(hi)):
        return None
    cast = not (in_place or x.is_floating_point() or x.is_complex())
    if not (cast or _is_int(lo) or _is_int(hi)):
        return None
    fixed = {k: torch.sym_float(v) if k != "input" and _is_int(v) else v for k, v in bound.items()}
    if cast:
        fixed["input"] = x.to(torch.get_default_dtype())
    return tuple(fixed[n] for n in names[:len(args)]), {k: fixed[k] for k in kwargs}


class _ClampBounds(TorchFunctionMode):
    """Rewrites clamp calls whose bounds are numbers of another kind than the tensor (see
    the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _CLAMPS:
            fixed = _float_bounds(tuple(args), dict(kwargs), in_place=func in _IN_PLACE)
            if fixed is not None:
                args, kwargs = fixed
        return func(*args, **kwargs)


@contextlib.contextmanager
def trace_fixes(dynamo: bool) -> Iterator[None]:
    """The fixes above for the exporter (``dynamo`` or TorchScript), for the ``with`` block."""
    with torch.no_grad() if dynamo else contextlib.nullcontext(), _ClampBounds():
        yield
