"""Op definitions: the single source every other part of graphkit derives from."""

from graphkit.ops._opdef import (
    NATIVE_DOMAIN,
    PLACEHOLDER_DOMAIN,
    PYTHON_DOMAIN,
    REQUIRED,
    Attr,
    AttrType,
    Decomposition,
    OpDef,
    Param,
)
from graphkit.ops._registry import KERNEL_DOMAINS, OpRegistry, default_registry
from graphkit.ops.shapes import broadcast

__all__ = [
    "NATIVE_DOMAIN",
    "PLACEHOLDER_DOMAIN",
    "PYTHON_DOMAIN",
    "KERNEL_DOMAINS",
    "REQUIRED",
    "Attr",
    "AttrType",
    "Decomposition",
    "OpDef",
    "OpRegistry",
    "Param",
    "broadcast",
    "default_registry",
]
