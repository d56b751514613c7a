"""graphkit: deploy PyTorch models that use ops ONNX or ONNX Runtime do not know.

The package is light to import: onnx, onnxruntime and torch load only when used.
"""

from __future__ import annotations

import importlib
from typing import Any

from graphkit.errors import GraphkitError

__version__ = "0.1.0"

# Public name -> (module, attribute); resolved on first access. The torch-side export
# function is `graphkit.export.export` (graphkit.export is the torch subpackage). Op
# definitions and registries are graphkit.ops' (OpDef, OpRegistry, default_registry).
_LAZY = {
    "Lowering": ("graphkit.rewrite", "Lowering"),
    "rewrite_model": ("graphkit.rewrite", "rewrite_model"),
    "load_model": ("graphkit.modelio", "load_model"),
    "save_model": ("graphkit.modelio", "save_model"),
    "open_session": ("graphkit.runtime", "open_session"),
    "export_model": ("graphkit.export", "export"),
}

__all__ = ["GraphkitError", "__version__", *_LAZY]

# Names graphkit exported before its public surface was cut down (issue 28): where they are now.
_MOVED = {"OpDef": "graphkit.ops", "OpRegistry": "graphkit.ops", "default_registry": "graphkit.ops"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        where = f"; import it from {_MOVED[name]}" if name in _MOVED else ""
        raise AttributeError(f"module 'graphkit' has no attribute {name!r}{where}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
