"""Op definitions: the single source every other part of graphkit derives from.

An op is an :class:`OpDef`; ops ship in an :class:`OpPackage` (with their C++ kernels,
:class:`NativeKernels`); :func:`discover` builds the :class:`OpRegistry` every command
uses from graphkit's own package, installed ones, ``--ops`` and ``$GRAPHKIT_OPS``.
"""

from graphkit.ops._discovery import (
    BUILTIN_PACKAGE,
    ENTRY_POINT_GROUP,
    ENV_VAR,
    default_registry,
    discover,
    load_package,
)
from graphkit.ops._opdef import (
    DEFAULT_TOLERANCE,
    NATIVE_DOMAIN,
    PLACEHOLDER_DOMAIN,
    PYTHON_DOMAIN,
    REQUIRED,
    TORCH_NAMESPACE,
    Attr,
    AttrType,
    Decomposition,
    ForeignOp,
    OpDef,
    Param,
    StandardOp,
    ChannelLinear,
    kernel_domain,
    split_kernel_domain,
    tolerance_for,
)
from graphkit.ops._package import NativeKernels, OpPackage
from graphkit.ops._registry import OpRegistry
from graphkit.ops._schema import build_schema as onnx_schema
from graphkit.ops.shapes import broadcast

__all__ = [
    "BUILTIN_PACKAGE",
    "DEFAULT_TOLERANCE",
    "ENTRY_POINT_GROUP",
    "ENV_VAR",
    "NATIVE_DOMAIN",
    "PLACEHOLDER_DOMAIN",
    "PYTHON_DOMAIN",
    "REQUIRED",
    "TORCH_NAMESPACE",
    "Attr",
    "AttrType",
    "Decomposition",
    "ForeignOp",
    "NativeKernels",
    "OpDef",
    "OpPackage",
    "OpRegistry",
    "Param",
    "StandardOp",
    "ChannelLinear",
    "broadcast",
    "default_registry",
    "discover",
    "kernel_domain",
    "load_package",
    "onnx_schema",
    "split_kernel_domain",
    "tolerance_for",
]
