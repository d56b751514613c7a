"""Command-line helpers for the torch side: ``module:factory`` specs, ``--input`` specs,
``--dynamic`` specs, and silencing torch's own printing."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from graphkit.errors import ExportError, UsageError
from graphkit.input_specs import InputSpec
from graphkit.usercode import import_user_code

__all__ = ["load_object", "load_model_factory", "random_inputs", "silenced_output"]


def load_object(spec: str, *, what: str, example: str) -> Any:
    """The object named by ``module.path:name`` or ``file.py:name``."""
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr.isidentifier():
        raise UsageError(f"{what} {spec!r} is not MODULE:NAME or FILE.py:NAME", hint=f"for example {example}")
    module = import_user_code(module_part, what=what, failure=ExportError, example=example)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UsageError(f"{what}: {module_part} has no {attr!r}",
                         hint=f"for example {example}") from None


def load_model_factory(spec: str) -> Any:
    """Call the factory named by ``spec`` and return the torch module it builds."""
    import torch

    factory = load_object(spec, what="model factory", example="mypkg.models:build")
    if isinstance(factory, torch.nn.Module):
        return factory
    if not callable(factory):
        raise UsageError(f"model factory {spec!r} is a {type(factory).__name__}, not callable",
                         hint="name a function (or class) that returns a torch.nn.Module")
    try:
        model = factory()
    except Exception as exc:
        raise ExportError(f"model factory {spec} raised {type(exc).__name__}: {exc}",
                          hint="the factory is called without arguments; fix it or wrap it") from exc
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"model factory {spec} returned a {type(model).__name__}, not a torch.nn.Module",
                         hint="return the model instance")
    return model


def random_inputs(specs: Sequence[InputSpec], seed: int) -> list[Any]:
    """One random tensor per spec (standard normal floats, integers in [0, 10), coin-flip bools)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in specs:
        dtype = getattr(torch, s.dtype)
        if dtype.is_floating_point:
            out.append(torch.randn(s.shape, generator=gen).to(dtype))
        elif dtype is torch.bool:
            out.append(torch.rand(s.shape, generator=gen) < 0.5)
        else:
            out.append(torch.randint(0, 10, s.shape, generator=gen).to(dtype))
    return out


@contextlib.contextmanager
def silenced_output(enabled: bool = True) -> Iterator[None]:
    """Silence fds 1 and 2 and warnings: torch's TorchScript exporter prints the whole graph
    from C++ whenever an export fails."""
    if not enabled:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)
