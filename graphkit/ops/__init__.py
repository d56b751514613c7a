"""Op definitions: the single source every other part of graphkit derives from.

An op is an :class:`OpDef`; ops ship in an :class:`OpPackage` (with their C++ kernels,
:class:`NativeKernels`); :func:`discover` builds the :class:`OpRegistry` every command
uses from graphkit's own package, installed ones, ``--ops`` and ``$GRAPHKIT_OPS``.

This package exports what an op package and its users write; the domains, discovery's
constants and schema building are graphkit's own (``graphkit.ops._opdef``,
``graphkit.ops._discovery``, ``graphkit.ops._schema``).
"""

from graphkit.ops._discovery import default_registry, discover
from graphkit.ops._opdef import (
    Attr,
    AttrType,
    ChannelLinear,
    Decomposition,
    ForeignOp,
    OpDef,
    Param,
    StandardOp,
)
from graphkit.ops._package import NativeKernels, OpPackage
from graphkit.ops._registry import OpRegistry
from graphkit.ops.shapes import broadcast

__all__ = [
    "Attr",
    "AttrType",
    "ChannelLinear",
    "Decomposition",
    "ForeignOp",
    "NativeKernels",
    "OpDef",
    "OpPackage",
    "OpRegistry",
    "Param",
    "StandardOp",
    "broadcast",
    "default_registry",
    "discover",
]
