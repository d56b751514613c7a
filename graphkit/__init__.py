"""graphkit: deploy PyTorch models that use ops ONNX or ONNX Runtime do not know.

The package is light to import: onnx, onnxruntime and torch load only when used.
"""

from __future__ import annotations

import importlib
from typing import Any

from graphkit.errors import GraphkitError

__version__ = "0.1.0"

# Public name -> module that defines it; resolved on first access.
_LAZY = {
    "OpDef": "graphkit.ops",
    "OpRegistry": "graphkit.ops",
    "default_registry": "graphkit.ops",
    "Lowering": "graphkit.rewrite",
    "rewrite_model": "graphkit.rewrite",
    "load_model": "graphkit.modelio",
    "save_model": "graphkit.modelio",
    "open_session": "graphkit.runtime",
    "export": "graphkit.export",
}

__all__ = ["GraphkitError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graphkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
