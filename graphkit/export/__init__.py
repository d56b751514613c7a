"""graphkit's torch side: export models whose custom ops become placeholder nodes.

Importing this subpackage imports torch (``import graphkit`` alone does not). Every op,
graphkit's own or a user package's, is handled alike: its torch op is
``torch.ops.<torch_namespace>.<name>`` and its node ``<domain>::<name>``, both from its
OpDef (``graphkit`` and ``custom`` by default).

- :func:`export` - one call for both torch exporters (``dynamo=True``/``False``), with the
  gap fillers, placeholders and rewrites below active for the call only; the ops known
  are the registry passed plus those the model holds.
- :class:`TorchOps` - a registry's ops as torch ops (C++ forward, fake kernel from the
  reference), usable in models exported either way.
- :func:`autograd_function` - the tutorial's ``torch.autograd.Function`` + ``symbolic``.
- :func:`foreign_translations` / :func:`scoped_foreign_symbolics` - other libraries' torch
  ops an op stands for (``OpDef.foreign_ops``, e.g. ``torchvision::deform_conv2d``) written
  as its placeholder, for a direct ``torch.onnx.export`` call (``export`` uses them itself).
- :data:`GAP_FILLERS` - symbolics for ATen ops torch's TorchScript exporter lacks
  (:mod:`graphkit.export.aten`; ``python -m graphkit.export.gaps`` finds the gaps).
- :class:`RewriteRegistry` - export-time rewrites of torch functions and module forwards,
  selected by :class:`Backend`, :class:`Opset` and :class:`Exporter` conditions.
- :func:`load_extension` - build/cache/load a torch C++ extension shipped with an op.
"""

from graphkit.export._export import MAX_IR_VERSION, CustomNode, ExportReport, export
from graphkit.export._foreign import foreign_symbolic, foreign_translations, scoped_foreign_symbolics
from graphkit.export.aten import (
    Example,
    GapFiller,
    GapFillerTable,
    scoped_gap_fillers,
    scoped_placeholders,
)
from graphkit.export.extension import load_extension
from graphkit.export.gap_fillers import GAP_FILLERS
from graphkit.export.rewrites import (
    Backend,
    ExportTarget,
    Exporter,
    Opset,
    Rewrite,
    RewriteContext,
    RewriteRegistry,
    activate_rewrites,
)
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
    "GAP_FILLERS",
    "MAX_IR_VERSION",
    "Backend",
    "CustomNode",
    "Example",
    "ExportReport",
    "ExportTarget",
    "Exporter",
    "GapFiller",
    "GapFillerTable",
    "Opset",
    "Rewrite",
    "RewriteContext",
    "RewriteRegistry",
    "TorchOps",
    "activate_rewrites",
    "autograd_function",
    "custom_translation_table",
    "export",
    "foreign_symbolic",
    "foreign_translations",
    "library_schema",
    "load_extension",
    "onnxscript_translation",
    "scoped_foreign_symbolics",
    "scoped_gap_fillers",
    "scoped_placeholders",
    "scoped_symbolics",
    "torchscript_symbolic",
]
