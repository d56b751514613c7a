"""The TorchScript exporter's (process-global) symbolic registry, as graphkit touches it.

Shared by :mod:`graphkit.export.aten` and :mod:`graphkit.export.torch_ops`, which both
register symbolics for one export and remove them afterwards.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SYMBOLIC_OPSET", "symbolic_registry", "forget_empty_group"]

# The opset custom symbolics are registered at ("from this opset on"). torch serves a target
# opset >= 9 from the highest registration <= it, and (legacy rule) 7 and 8 only from a
# registration in [target, 9]: 9 is the one value that covers every opset it exports.
SYMBOLIC_OPSET = 9


def symbolic_registry() -> Any:
    """torch's registry of TorchScript symbolics, or None where torch has another layout."""
    try:
        from torch.onnx._internal.torchscript_exporter import registration
    except ImportError:  # older/newer layouts: callers fall back to always (un)registering
        return None
    return registration.registry


def forget_empty_group(name: str, existed: bool) -> None:
    """Undo what registering created: torch keeps an empty function group after
    ``unregister_custom_op_symbolic``, and its "unsupported operator" error then fails with
    ``min() arg is an empty sequence`` instead of naming the op."""
    reg = symbolic_registry()
    if reg is None:
        return
    group = reg.get_function_group(name)
    if not existed and group is not None and not group._functions:
        reg._registry.pop(name, None)
