"""Running custom-op models in ONNX Runtime: native and Python kernels registered as needed.

``open_session(model)`` opens a session; see :mod:`graphkit.runtime.session` and
:mod:`graphkit.runtime.python_kernels`. Importing this package does not import torch (nor
onnxruntime-extensions, which loads with the first Python-kernel session).
"""

from graphkit.runtime.python_kernels import (
    decode_kernel_attr,
    decode_list_attr,
    encode_kernel_attr,
    encode_kernel_attrs,
    encode_list_attr,
)
from graphkit.runtime.session import Session, TensorInfo, open_session

__all__ = [
    "Session",
    "TensorInfo",
    "open_session",
    "encode_list_attr",
    "decode_list_attr",
    "encode_kernel_attr",
    "decode_kernel_attr",
    "encode_kernel_attrs",
]
