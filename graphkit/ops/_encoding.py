"""How graphkit.python nodes carry attributes.

onnxruntime-extensions passes only scalar int64 and string attributes to Python kernels,
and rounds floats to 6 digits; so INT and STRING travel as they are, FLOAT, INTS and
FLOATS as exact strings. The ONNX schemas of the graphkit.python domain follow this.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from graphkit.ops._opdef import AttrType, OpDef

__all__ = ["encode_list_attr", "decode_list_attr", "encode_kernel_attr", "decode_kernel_attr",
           "encode_kernel_attrs", "kernel_attr_type"]


# Op types of the float16-wrapped Python-kernel declarations:
# f"{name}{F16_TAG}{'+'.join(type vars)}" (graphkit.rewrite.lowering.binding writes them,
# graphkit.runtime.python_kernels declares them).
F16_TAG = "@f16:"


def kernel_attr_type(attr_type: AttrType) -> AttrType:
    """The ONNX attribute type a graphkit.python node uses for ``attr_type``."""
    return attr_type if attr_type in (AttrType.INT, AttrType.STRING) else AttrType.STRING


def _float32(value: float) -> float:
    """``value`` rounded to float32, as an ONNX FLOAT attribute holds it."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def encode_list_attr(values: Iterable[int | float]) -> str:
    """Encode an INTS or FLOATS attribute as a comma-separated string (``""`` for ``[]``).

    Floats are written with ``repr`` (shortest round trip); :func:`decode_list_attr` rounds
    them to float32 as an ONNX FLOATS attribute would.
    """
    parts = []
    for v in values:
        if isinstance(v, (bool, np.bool_)):
            raise TypeError(f"cannot encode {v!r} in a list attribute")
        if isinstance(v, (int, np.integer)):
            parts.append(str(int(v)))
        elif isinstance(v, (float, np.floating)):
            parts.append(repr(float(v)))
        else:
            raise TypeError(f"cannot encode {v!r} in a list attribute")
    return ",".join(parts)


def decode_list_attr(text: str | bytes, attr_type: AttrType) -> list:
    """Decode :func:`encode_list_attr` output back to a list of ``attr_type`` (INTS or FLOATS)."""
    if isinstance(text, bytes):
        text = text.decode()
    if attr_type not in (AttrType.INTS, AttrType.FLOATS):
        raise ValueError(f"decode_list_attr takes INTS or FLOATS, not {attr_type.onnx_name}")
    if not text.strip():
        return []
    out: list = []
    for item in text.split(","):
        item = item.strip()
        try:
            out.append(int(item) if attr_type is AttrType.INTS else _float32(float(item)))
        except ValueError:
            raise ValueError(f"{text!r} is not a comma-separated list of "
                             f"{'ints' if attr_type is AttrType.INTS else 'floats'}") from None
    return out


def encode_kernel_attr(value: Any, attr_type: AttrType) -> int | str:
    """One attribute as a ``graphkit.python`` node carries it: INT as int, STRING as str,
    FLOAT, INTS and FLOATS as strings (lossless, unlike ort-extensions' FLOAT path)."""
    value = attr_type.coerce(value)
    if attr_type is AttrType.INT or attr_type is AttrType.STRING:
        return value
    if attr_type is AttrType.FLOAT:
        return repr(float(value))
    return encode_list_attr(value)


def decode_kernel_attr(text: str | bytes, attr_type: AttrType) -> Any:
    """Inverse of :func:`encode_kernel_attr` for the string ort-extensions hands the kernel."""
    if isinstance(text, bytes):
        text = text.decode()
    if attr_type is AttrType.INT:
        return int(text)
    if attr_type is AttrType.STRING:
        return text
    if attr_type is AttrType.FLOAT:
        try:
            return _float32(float(text))
        except ValueError:
            raise ValueError(f"{text!r} is not a float") from None
    return decode_list_attr(text, attr_type)


def encode_kernel_attrs(op: OpDef, attrs: Mapping[str, Any]) -> dict[str, int | str]:
    """Every declared attribute of ``op`` (defaults filled in) in the kernel encoding.

    This is what ``graphkit rewrite --bind python`` writes on each node.
    """
    resolved = op.resolve_attrs(attrs)
    return {a.name: encode_kernel_attr(resolved[a.name], a.type) for a in op.attributes}
