"""graphkit's torch side: export models whose graphkit ops become ``custom::`` nodes.

Importing this subpackage imports torch (``import graphkit`` alone does not).

- :func:`export` - one call for both torch exporters (``dynamo=True``/``False``).
- :class:`TorchOps` - graphkit's ops as ``torch.ops.graphkit.<name>`` (C++ forward, fake
  kernel from the reference), usable in models exported either way.
- :func:`autograd_function` - the tutorial's ``torch.autograd.Function`` + ``symbolic``.
- :func:`load_extension` - build/cache/load a torch C++ extension shipped with an op.
"""

from graphkit.export._export import MAX_IR_VERSION, CustomNode, ExportReport, export
from graphkit.export.extension import load_extension
from graphkit.export.torch_ops import (
    TorchOps,
    autograd_function,
    custom_translation_table,
    library_schema,
    onnxscript_translation,
    scoped_symbolics,
    torchscript_symbolic,
)

__all__ = [
    "MAX_IR_VERSION",
    "CustomNode",
    "ExportReport",
    "TorchOps",
    "autograd_function",
    "custom_translation_table",
    "export",
    "library_schema",
    "load_extension",
    "onnxscript_translation",
    "scoped_symbolics",
    "torchscript_symbolic",
]


# `graphkit.export` names both this subpackage and (lazily, in graphkit/__init__.py) the
# function. Importing the subpackage first binds the module to that attribute, so the
# module itself is made callable: graphkit.export(model, args, path, ...) works either way.
import sys as _sys
import types as _types


class _CallableModule(_types.ModuleType):
    def __call__(self, *args, **kwargs):
        return export(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
