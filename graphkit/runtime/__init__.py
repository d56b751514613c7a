"""Running custom-op models in ONNX Runtime: native and Python kernels registered as needed.

``open_session(model)`` opens a session; see :mod:`graphkit.runtime.session` and
:mod:`graphkit.runtime.python_kernels`. Importing this package does not import torch (nor
onnxruntime-extensions, which loads with the first Python-kernel session).
"""

from graphkit.runtime.session import Session, open_session

__all__ = ["Session", "open_session"]
