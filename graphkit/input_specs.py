"""--input and --dynamic specs of `graphkit export` / `verify` (no torch: parsed before it loads)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from graphkit.errors import UsageError

__all__ = ["DTYPES", "InputSpec", "parse_dynamic", "parse_input"]

DTYPES = ("float32", "float16", "float64", "bfloat16", "int64", "int32", "int8", "uint8", "bool")


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
