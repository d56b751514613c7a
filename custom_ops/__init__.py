"""graphkit's own op package, imported as ``graphkit_ops`` (this folder is its source).

graphkit finds it the way it finds any user's op package (``graphkit.ops.discover``
loads ``graphkit_ops:PACKAGE``); nothing under graphkit/ imports it. One sub-package
per op, each holding its definition and kernels.
"""

from pathlib import Path

from graphkit import __version__
from graphkit.ops import NativeKernels, OpPackage

from .asinh import ASINH
from .deform_conv2d import DEFORM_CONV2D
from .my_add import MY_ADD

ALL_OPS = (MY_ADD, DEFORM_CONV2D, ASINH)


def _openblas() -> dict[str, tuple[str, ...]]:
    """deform_conv2d's GEMM: OpenBLAS from the scipy-openblas32 wheel, imported only when the
    native kernels are built (defining and using the ops without them does not need it)."""
    import scipy_openblas32

    return {"include_dirs": (scipy_openblas32.get_include_dir(),),
            "library_dirs": (scipy_openblas32.get_lib_dir(),),
            "libraries": (scipy_openblas32.get_library(),)}


PACKAGE = OpPackage(
    name="graphkit_ops",
    ops=ALL_OPS,
    native=NativeKernels(root=Path(__file__).parent,
                         sources=("my_add/my_add.cc", "deform_conv2d/deform_conv2d.cc"),
                         build_options=_openblas,
                         # one rounding per operation, as in the torch references: gcc's
                         # default fma contraction (with -march=native) keeps 2 * max + -inf
                         # from overflowing (-inf where torch gives NaN)
                         cxx_flags=("-ffp-contract=off",)),
    version=__version__,
    doc="graphkit's built-in ops: my_add, deform_conv2d, asinh",
)

__all__ = ["ALL_OPS", "ASINH", "DEFORM_CONV2D", "MY_ADD", "PACKAGE"]
