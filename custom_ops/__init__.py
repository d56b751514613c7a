"""graphkit's custom ops: one package per op, each holding its definition and kernels.

``ALL_OPS`` is the explicit list graphkit's default registry is built from; adding an
op means adding its package and one entry here.
"""

from custom_ops.asinh import ASINH
from custom_ops.deform_conv2d import DEFORM_CONV2D
from custom_ops.my_add import MY_ADD

ALL_OPS = (MY_ADD, DEFORM_CONV2D, ASINH)

__all__ = ["ALL_OPS", "ASINH", "DEFORM_CONV2D", "MY_ADD"]
