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

