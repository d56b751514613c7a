"""Command-line helpers for the torch side: ``module:factory`` specs, ``--input`` specs,
``--dynamic`` specs, and silencing torch's own printing."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from graphkit.errors import ExportError, UsageError
from graphkit.usercode import import_user_code

__all__ = ["load_object", "load_model_factory", "InputSpec", "parse_input", "parse_dynamic",
           "random_inputs", "silenced_output"]

DTYPES = ("float32", "float16", "float64", "bfloat16", "int64", "int32", "int8", "uint8", "bool")


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


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


_INPUT = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)=((?:\d+(?:x\d+)*)|scalar)(?::([a-z0-9]+))?$")


def parse_input(text: str) -> InputSpec:
    """``a=1x3x10x10``, ``a=1x3x10x10:float16``, ``n=scalar:int64``."""
    m = _INPUT.match(text.strip())
    if m is None:
        raise UsageError(f"--input {text!r} is not NAME=SHAPE[:DTYPE]",
                         hint="for example --input x=1x3x224x224 or --input ids=2x16:int64")
    name, shape, dtype = m.group(1), m.group(2), m.group(3) or "float32"
    if dtype not in DTYPES:
        raise UsageError(f"--input {text!r}: unknown dtype {dtype!r}", hint=f"one of {', '.join(DTYPES)}")
    dims = () if shape == "scalar" else tuple(int(d) for d in shape.split("x"))
    return InputSpec(name, dims, dtype)


def parse_dynamic(text: str) -> tuple[str, int, str]:
    """``a:0=batch`` -> ("a", 0, "batch")."""
    m = re.match(r"^([A-Za-z_][A-Za-z0-9_.]*):(\d+)=([A-Za-z_][A-Za-z0-9_]*)$", text.strip())
    if m is None:
        raise UsageError(f"--dynamic {text!r} is not NAME:AXIS=DIM", hint="for example --dynamic x:0=batch")
    return m.group(1), int(m.group(2)), m.group(3)


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
