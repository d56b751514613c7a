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
- :func:`foreign_symbolic` - a TorchScript symbolic writing another library's torch op an
  op stands for (``OpDef.foreign_ops``, e.g. ``torchvision::deform_conv2d``) as its
  placeholder (``graphkit.export._foreign`` has the translation tables ``export`` uses).
- :data:`GAP_FILLERS` - symbolics for ATen ops torch's TorchScript exporter lacks
  (:mod:`graphkit.export.aten` defines GapFiller and its table; ``python -m
  graphkit.export.gaps`` finds the gaps).
- :class:`RewriteRegistry` - export-time rewrites of torch functions and module forwards,
  selected by :class:`Backend`, :class:`Opset` and :class:`Exporter` conditions; a rewrite
  receives a :class:`RewriteContext` (``ctx.origin``).
- :class:`ExportReport` - what :func:`export` returns.

Everything else (the scoped symbolic tables, :mod:`graphkit.export.extension`'s
``load_extension``, ...) is imported from its module.
"""

from graphkit.export._export import ExportReport, export
from graphkit.export._foreign import foreign_symbolic
from graphkit.export.gap_fillers import GAP_FILLERS
from graphkit.export.rewrites import Backend, Exporter, Opset, RewriteContext, RewriteRegistry
from graphkit.export.torch_ops import TorchOps, autograd_function

__all__ = [
    "GAP_FILLERS",
    "Backend",
    "ExportReport",
    "Exporter",
    "Opset",
    "RewriteContext",
    "RewriteRegistry",
    "TorchOps",
    "autograd_function",
    "export",
    "foreign_symbolic",
]
