"""``export``: a torch model to an ONNX file holding graphkit's placeholder nodes.

Both torch exporters, one call:

- ``dynamo=True`` (``torch.export``): ops called through :class:`TorchOps` (or an
  :func:`autograd_function`) are recorded as ``<torch_namespace>::<name>`` and translated
  by the generated onnxscript functions into ``<domain>::<name>`` nodes.
- ``dynamo=False`` (TorchScript): autograd.Functions emit the node through their
  ``symbolic``; library ops through symbolics registered for the duration of the call only.

The ops known to the call are the ``registry`` passed (default: every discovered package)
plus those the model holds (see :mod:`graphkit.export._model_ops`), so a model whose
factory imports its op package itself exports without further setup. Should the model
still define an op in torch while being traced (from a TorchOps graphkit could not see),
the export runs once more with that op's hooks in place.

Dynamic dimensions are spelled once, ``{"a": {0: "batch"}}`` (keys are ONNX input names:
``input_names`` or, by default, the forward's parameter names), and become
``dynamic_axes`` or ``dynamic_shapes`` with ``torch.export.Dim`` as the exporter needs.
The file is written atomically and only when the whole export succeeded, which includes
ONNX Runtime loading it (:mod:`graphkit.export._runtime_check`: session creation with
placeholder nodes stood in for; a refused node is an ExportError naming it).

Around the torch exporter, for the call only (everything is put back on exit, even on
error):

- ``gap_fillers`` (default :data:`~graphkit.export.GAP_FILLERS`): symbolics for ATen ops
  the TorchScript exporter lacks (``aten::asinh`` -> ``Asinh``), see
  :mod:`graphkit.export.aten`; the dynamo exporter has its own and needs none.
- ``placeholders``: ATen ops written as graphkit's ``custom::<op>`` instead (an op of the
  registry with the same name and inputs, e.g. ``["asinh"]``), both exporters.
- ``rewrites``: :class:`~graphkit.export.RewriteRegistry` objects whose rewrites replace
  torch functions or module forwards while exporting (:mod:`graphkit.export.rewrites`).
- fixes of torch's traces (:mod:`graphkit.export._trace_fixes`): clamp with float bounds
  computed as torch eager does (both exporters); the dynamo trace under ``torch.no_grad()``
  (T5 fails in torch's own passes otherwise); and corrected dynamo translations
  (:mod:`graphkit.export._translation_fixes`).

The report names the placeholder nodes written and how each can be lowered at the
model's opset (``report.lowerings``), the gap fillers used and how often each rewrite ran.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import re
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import torch

from graphkit.errors import ExportError, GraphkitError
from graphkit.export import torch_ops
from graphkit.export._foreign import foreign_translations, scoped_foreign_symbolics
from graphkit.export._model_ops import merge, registry_for
from graphkit.export._opset_down import ConverterError, convert_down
from graphkit.export._runtime_check import RuntimeCheck, check_loads
from graphkit.export._trace_fixes import trace_fixes
from graphkit.export._translation_fixes import translation_fixes
from graphkit.export.aten import GapFillerTable, placeholder_translations, scoped_gap_fillers, scoped_placeholders
from graphkit.export.gap_fillers import GAP_FILLERS
from graphkit.export.rewrites import ExportTarget, RewriteRegistry, activate_rewrites
from graphkit.ops import OpDef, OpRegistry
from graphkit.ops._opdef import PLACEHOLDER_DOMAIN
from graphkit.rewrite.graph.walk import graphs, subgraphs

__all__ = ["export", "ExportReport", "CustomNode", "MAX_IR_VERSION"]

# ONNX Runtime 1.31.1 loads ir_version <= 13; graphkit writes at most 10 so older runtimes
# (ORT >= 1.17 reads 10) load its exports too.
MAX_IR_VERSION = 10
# torch 2.13's dynamo exporter builds opset 18; graphkit converts it to lower ones itself
# (see _convert_down).
_DYNAMO_MIN_OPSET = 18


@dataclass(frozen=True)
class CustomNode:
    """A placeholder node of the exported graph."""

    name: str
    op: str  # "custom::my_add"
    known: bool = True  # whether the registry defines this op


@dataclass(frozen=True)
class ExportReport:
    """What :func:`export` wrote."""

    path: Path
    exporter: str  # "dynamo" or "torchscript"
    opset: int
    ir_version: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    custom_nodes: tuple[CustomNode, ...] = ()  # nodes of the registry's ops (and unknown
    # ops in their domains)
    opset_imports: Mapping[str, int] = field(default_factory=dict)
    # "custom::asinh" -> ("decompose:asinh", "python"): lowerings at the model's opset
    lowerings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    gap_fillers: tuple[str, ...] = ()  # ATen ops written by graphkit's gap fillers
    rewrites: Mapping[str, int] = field(default_factory=dict)  # "registry/rewrite" -> calls
    # ONNX Runtime loaded the written model (placeholder nodes stood in for by inputs)
    runtime_check: RuntimeCheck | None = None
    # The op registry of the call: the one passed plus the model's ops (for verify/rewrite).
    registry: OpRegistry | None = field(default=None, compare=False, repr=False)

    def count(self, op: str) -> int:
        """How many custom nodes run ``op`` (``"my_add"``, any domain, or ``"custom::my_add"``)."""
        if "::" in op:
            return sum(1 for n in self.custom_nodes if n.op == op)
        return sum(1 for n in self.custom_nodes if n.op.rpartition("::")[2] == op)

    @property
    def unknown_ops(self) -> tuple[str, ...]:
        """Placeholder ops the registry does not define (nothing will serve them)."""
        return tuple(sorted({n.op for n in self.custom_nodes if not n.known}))

    def summary(self) -> str:
        ops: dict[str, int] = {}
        for n in self.custom_nodes:
            ops[n.op] = ops.get(n.op, 0) + 1
        listed = ", ".join(f"{k} x{v}" for k, v in sorted(ops.items())) or "no custom nodes"
        return (f"{self.path}: {self.exporter} exporter, opset {self.opset}, ir_version "
                f"{self.ir_version}; {listed}")

    def details(self) -> str:
        """:meth:`summary` plus how each custom op can be lowered, the gap fillers used and
        the rewrites that ran."""
        lines = [self.summary()]
        for op in sorted({n.op for n in self.custom_nodes}):
            ways = self.lowerings.get(op, ())
            lines.append(f"  {op}: " + (f"lowerings {', '.join(ways)}" if ways else
                                        "no lowering: unknown to the registry" if op in self.unknown_ops
                                        else f"no lowering at opset {self.opset}"))
        if self.gap_fillers:
            lines.append(f"  gap fillers used: {', '.join(self.gap_fillers)}")
        for name, calls in self.rewrites.items():
            lines.append(f"  rewrite {name}: {calls} call(s)")
        return "\n".join(lines)


def export(
    model: torch.nn.Module,
    args: Any,
    path: str | os.PathLike[str],
    *,
    dynamo: bool = True,
    registry: OpRegistry | None = None,
    opset: int = 18,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_dims: Mapping[str, Mapping[int, str]] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    gap_fillers: GapFillerTable | None = GAP_FILLERS,
    placeholders: Sequence[str] = (),
    rewrites: RewriteRegistry | Sequence[RewriteRegistry] | None = None,
    backend: str = "onnxruntime",
    torch_translations: Sequence[str] = (),
) -> ExportReport:
    """Export ``model(*args, **kwargs)`` to ``path`` with its custom ops as placeholder nodes.

    ``registry`` (default :func:`~graphkit.ops.default_registry`) names the ops graphkit
    hooks into the exporters; the ops the model holds are added to it
    (``report.registry`` is the result). Two of them sharing a torch name
    (``torch_namespace::name``) are an ExportError naming both. ``gap_fillers`` (None: none) are registered for the
    TorchScript exporter; ``placeholders`` names ATen ops to write as ``custom::<op>``;
    ``rewrites`` are activated for the :class:`~graphkit.export.rewrites.ExportTarget` (exporter,
    ``opset``, ``backend``) of this call. Other libraries' torch ops that a registry op
    stands for (``OpDef.foreign_ops``, e.g. ``torchvision::deform_conv2d``) are written as
    that op's placeholder with both exporters; ``torch_translations`` names those to leave to
    torch's own translation instead (torch writes standard ``DeformConv``, valid from opset
    19). Standard ops the model's opset lacks are an ExportError naming the node. The written
    model is opened in ONNX Runtime first (``report.runtime_check``). Raises ExportError
    naming the model class and the cause, or the node and op ONNX Runtime refuses (nothing
    is written then), OutputError for an unwritable ``path``.
    """
    # Exports run one at a time in a process: the exporters patch torch and register
    # symbolics and schemas process-wide while they trace. A second thread waits.
    with _EXPORT_LOCK:
        return _export(model, args, path, dynamo=dynamo, registry=registry, opset=opset,
                       input_names=input_names, output_names=output_names, dynamic_dims=dynamic_dims,
                       kwargs=kwargs, gap_fillers=gap_fillers, placeholders=placeholders,
                       rewrites=rewrites, backend=backend, torch_translations=torch_translations)


_EXPORT_LOCK = threading.RLock()


def _export(model, args, path, *, dynamo, registry, opset, input_names, output_names, dynamic_dims,
            kwargs, gap_fillers, placeholders, rewrites, backend, torch_translations) -> ExportReport:
    from graphkit.modelio import check_output_path, save_model
    from graphkit.ops import default_registry

    registry = default_registry() if registry is None else registry
    args = args if isinstance(args, tuple) else (args,)
    kwargs = dict(kwargs or {})
    model_name = type(model).__name__
    registry = registry_for(model, registry)
    try:
        torch_ops.check_torch_names(registry, registry)
    except ExportError as exc:
        raise _with_model(exc, model_name) from None
    if dynamo:
        _require_dynamo_packages(model_name)
    check_output_path(path, None)
    names = _input_names(model, args, kwargs, input_names)
    _check_dynamic_dims(dynamic_dims, names, model_name)
    placeholder_ops = _placeholder_ops(placeholders, registry, model_name)
    torch_translations = _torch_translations(torch_translations, registry, model_name)
    registries = _registries(rewrites)
    target = ExportTarget("dynamo" if dynamo else "torchscript", opset, backend)
    used = _Used()

    for attempt in (1, 2):
        before = set(torch_ops.defined_ops())
        try:
            with _eval_mode(model), activate_rewrites(registries, target) as active:
                if dynamo:
                    proto = _export_dynamo(model, args, kwargs, registry, opset, names,
                                           output_names, dynamic_dims,
                                           given_names=input_names is not None,
                                           placeholder_ops=placeholder_ops,
                                           torch_translations=torch_translations)
                else:
                    proto = _export_torchscript(model, args, kwargs, registry, opset, names,
                                                output_names, dynamic_dims, gap_fillers=gap_fillers,
                                                placeholder_ops=placeholder_ops, used=used,
                                                torch_translations=torch_translations)
                used.rewrites = {name: active.calls[name] for name in active.names}
            break
        except Exception as exc:  # noqa: BLE001 - every exporter failure becomes an ExportError
            late = _defined_since(before, registry)
            if attempt == 1 and late and _graphkit_root(exc) is None:
                # The model defined ops in torch while being traced (a TorchOps graphkit
                # could not see): their hooks were missing. Export again with them.
                registry = merge(registry, late, strict=False)
                continue
            root = _graphkit_root(exc)  # ours, possibly wrapped by the exporter
            if root is not None:
                named = _with_model(root, model_name)
                if named is root:
                    raise root  # e.g. NativeBuildError keeps its class and exit code
                raise named from exc
            exporter = "dynamo=True" if dynamo else "dynamo=False"
            raise ExportError(f"cannot export {model_name} ({exporter}): {_cause(exc)}",
                              hint=_failure_hint(exc, dynamo)) from exc

    proto = _finalize(proto, registry)
    _check_standard_ops(proto, model_name, torch_translations)
    # ONNX Runtime must load what was written (nothing is written otherwise).
    used.runtime_check = check_loads(proto, registry, model_name=model_name, path=os.fspath(path),
                                     exporter="dynamo=True" if dynamo else "dynamo=False")
    save_model(proto, path)
    return _report(proto, Path(path), "dynamo" if dynamo else "torchscript", registry, used)


def _distribution_name() -> str:
    """The name graphkit is installed under (pip's name for it), ``graphkit-onnx`` if unknown.

    Where several distributions claim the ``graphkit`` package (a stale ``*.egg-info`` left
    in a source checkout beside the installed one), ``graphkit-onnx`` wins if among them.
    """
    try:
        from importlib.metadata import packages_distributions

        names = packages_distributions().get("graphkit") or []
    except Exception:  # noqa: BLE001 - only a hint depends on it
        names = []
    return "graphkit-onnx" if "graphkit-onnx" in names or not names else names[0]


def _require_dynamo_packages(model_name: str) -> None:
    """The dynamo exporter needs onnxscript (and its onnx_ir), which only graphkit's ``torch``
    extra installs: without them, say which extra to install instead of failing mid-export."""
    missing = []
    for module in ("onnxscript", "onnx_ir"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        dist = _distribution_name()
        raise ExportError(
            f"cannot export {model_name} (dynamo=True): the dynamo exporter needs "
            f"{' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed",
            hint=f"pip install '{dist}[torch]', or export with dynamo=False (--no-dynamo)")


def _defined_since(before: set[str], registry: OpRegistry) -> list:
    """Packages (or ops) defined in torch since ``before`` whose ops ``registry`` lacks."""
    late = []
    for op, package in torch_ops.defined_packages():
        if torch_ops.torch_name(op) in before or registry.get(op.qualified_name) == op:
            continue
        late.append(package if package is not None else op)
    return late


@dataclass
class _Used:
    """What the hooks around the exporter did during one call."""

    gap_fillers: tuple[str, ...] = ()
    rewrites: dict[str, int] = field(default_factory=dict)
    runtime_check: RuntimeCheck | None = None


def _placeholder_ops(names: Sequence[str], registry: OpRegistry, model_name: str) -> list[OpDef]:
    if isinstance(names, str):
        names = [names]
    ops = []
    for name in names:
        short = name.split("::", 1)[1] if name.startswith("aten::") else name
        op = registry.get(short)
        if op is None:
            raise ExportError(f"cannot export {model_name}: no graphkit op '{short}' to stand for "
                              f"aten::{short}", hint=f"placeholders must name ops of the registry: "
                              f"{', '.join(sorted(o.name for o in registry))}")
        ops.append(op)
    return ops


def _torch_translations(names: Sequence[str], registry: OpRegistry, model_name: str) -> tuple[str, ...]:
    if isinstance(names, str):
        names = [names]
    known = sorted({f.name for op in registry for f in op.foreign_ops})
    for name in names:
        if name not in known:
            raise ExportError(f"cannot export {model_name}: torch_translations names {name!r}, which "
                              "no op of the registry stands for",
                              hint=f"name one of {', '.join(known) or '(none)'}")
    return tuple(names)


def _registries(rewrites) -> list[RewriteRegistry]:
    if rewrites is None:
        return []
    if isinstance(rewrites, RewriteRegistry):
        return [rewrites]
    return list(rewrites)


# --------------------------------------------------------------------------- exporters


def _export_dynamo(model, args, kwargs, registry, opset, names, output_names, dynamic_dims,
                   *, given_names: bool, placeholder_ops: Sequence[OpDef] = (),
                   torch_translations: Sequence[str] = ()) -> onnx.ModelProto:
    with _registry_ops(registry):
        table = translation_fixes(max(opset, _DYNAMO_MIN_OPSET))  # graphkit's own ops, placeholders and foreign ops win
        table.update(torch_ops.custom_translation_table())
        table.update(placeholder_translations(placeholder_ops))
        table.update(foreign_translations(registry, skip=torch_translations))
        dynamic_shapes = _dynamic_shapes(model, args, kwargs, names, dynamic_dims)
        with _quiet_dynamo(), trace_fixes(dynamo=True):
            program = torch.onnx.export(
                model, args, kwargs=kwargs or None, dynamo=True,
                opset_version=max(opset, _DYNAMO_MIN_OPSET),
                input_names=list(names) if given_names else None,
                output_names=list(output_names) if output_names else None,
                dynamic_shapes=dynamic_shapes, custom_translation_table=table,
                verbose=False, report=False, verify=False)
        if program is None:  # pragma: no cover - torch returns None only with f= given
            raise ExportError("torch.onnx.export returned no program")
        proto = program.model_proto
        return _convert_down(proto, opset) if opset < _DYNAMO_MIN_OPSET else proto


def _convert_down(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """The dynamo exporter's opset-18 model converted to ``opset`` (graphkit.export._opset_down)."""
    try:
        return convert_down(model, opset)
    except ConverterError as exc:
        raise ExportError(f"the dynamo exporter builds opset {_DYNAMO_MIN_OPSET} and onnx's version "
                          f"converter could not convert it to opset {opset}: {_first_line(exc.__cause__)}",
                          hint=f"export at opset >= {_DYNAMO_MIN_OPSET}, or with dynamo=False") from exc.__cause__


def _export_torchscript(model, args, kwargs, registry, opset, names, output_names,
                        dynamic_dims, *, gap_fillers: GapFillerTable | None = None,
                        placeholder_ops: Sequence[OpDef] = (), used: _Used | None = None,
                        torch_translations: Sequence[str] = ()) -> onnx.ModelProto:
    buf = io.BytesIO()
    dynamic_axes = {name: dict(axes) for name, axes in (dynamic_dims or {}).items()}
    model, args = _positional_call(model, args, kwargs)  # torch.jit.trace takes no kwargs
    placeholders = {f"aten::{op.name}" for op in placeholder_ops}
    with _registry_ops(registry), torch_ops.scoped_symbolics(), \
            scoped_foreign_symbolics(registry, skip=torch_translations), \
            scoped_placeholders(placeholder_ops, opset), \
            scoped_gap_fillers(gap_fillers or (), opset, skip=placeholders) as fillers, \
            trace_fixes(dynamo=False), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model, args, buf, dynamo=False, opset_version=opset,
            input_names=list(names), output_names=list(output_names) if output_names else None,
            dynamic_axes=dynamic_axes or None)
    if used is not None:
        used.gap_fillers = tuple(sorted(fillers.used))
    return onnx.load_from_string(buf.getvalue())


class _KeywordCall(torch.nn.Module):
    """Calls ``model(*args, **kwargs)`` from positional values (for TorchScript tracing)."""

    def __init__(self, model: torch.nn.Module, n_args: int, keywords: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.n_args = n_args
        self.keywords = tuple(keywords)

    def forward(self, *values):
        return self.model(*values[: self.n_args], **dict(zip(self.keywords, values[self.n_args:])))


def _positional_call(model, args: tuple, kwargs: dict) -> tuple[Any, tuple]:
    """(model, args) that trace like ``model(*args, **kwargs)``: kwargs become positional
    when forward allows it, else a thin wrapper passes them as keywords."""
    if not kwargs:
        return model, args
    try:
        sig = inspect.signature(model.forward)
        bound = sig.bind(*args, **kwargs)
    except (TypeError, ValueError, AttributeError):
        return _KeywordCall(model, len(args), list(kwargs)), (*args, *kwargs.values())
    order = [p.name for p in sig.parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    given = list(bound.arguments)
    if set(given) == set(order[: len(given)]):  # the values fill a prefix of the parameters
        return model, tuple(bound.arguments[name] for name in order[: len(given)])
    return _KeywordCall(model, len(args), list(kwargs)), (*args, *kwargs.values())


@contextlib.contextmanager
def _eval_mode(model) -> Iterator[None]:
    """Export in eval mode (as the TorchScript exporter does by default), then restore."""
    if not isinstance(model, torch.nn.Module):
        yield
        return
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for m, training in modes.items():
            m.training = training


@contextlib.contextmanager
def _registry_ops(registry: OpRegistry) -> Iterator[None]:
    """Define the registry's ops in torch for the call, each under its torch name
    (sharing any definition a model's TorchOps already made). An op whose torch name is
    already defined from a different OpDef is left as it is: the model uses that one."""
    ops = torch_ops.TorchOps(registry)
    try:
        defined = torch_ops.defined_ops()
        for op in registry:
            current = defined.get(torch_ops.torch_name(op))
            if current is None or current == op:
                ops.define(op.qualified_name)
        yield
    finally:
        ops.close()


@contextlib.contextmanager
def _quiet_dynamo() -> Iterator[None]:
    """Silence exporter chatter that says nothing about the user's model."""
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)  # "torchvision is not installed. Skipping torchvision::nms"
    try:
        with warnings.catch_warnings():
            # Two inputs sharing one named Dim make torch warn that the name is not reused.
            warnings.filterwarnings("ignore", message=r"# The axis name: .* will not be used")
            # torch's own pytree deprecation, raised inside torch.export.
            warnings.filterwarnings("ignore", category=FutureWarning, message=r".*LeafSpec")
            yield
    finally:
        logger.setLevel(level)


# --------------------------------------------------------------------------- names and dims


def _positional_params(model) -> list[str] | None:
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError, AttributeError):
        return None
    return [p.name for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _input_names(model, args, kwargs, input_names) -> list[str]:
    """ONNX input names: ``input_names``, else the forward's parameter names of the
    tensors passed (so both exporters name inputs alike)."""
    if input_names is not None:
        return list(input_names)
    params = _positional_params(model) or []
    names: list[str] = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            names.append(params[i] if i < len(params) else f"input_{i}")
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            names.append(k)
    return names


def _check_dynamic_dims(dynamic_dims, names: Sequence[str], model_name: str) -> None:
    if not dynamic_dims:
        return
    unknown = sorted(set(dynamic_dims) - set(names))
    if unknown:
        raise ExportError(f"cannot export {model_name}: dynamic_dims names unknown input(s) {unknown}",
                          hint=f"the inputs are {list(names)} (input_names, else the forward's "
                               "parameter names)")
    for name, axes in dynamic_dims.items():
        for axis, dim in axes.items():
            if not isinstance(axis, int) or not isinstance(dim, str) or not dim.isidentifier():
                raise ExportError(
                    f"cannot export {model_name}: dynamic_dims[{name!r}] must map an axis (int) "
                    f"to a dimension name (identifier), got {axis!r}: {dim!r}",
                    hint='spell it like {"a": {0: "batch"}}')


def _dynamic_shapes(model, args, kwargs, names, dynamic_dims):
    """``dynamic_shapes`` for torch.export: one shared ``Dim`` per dimension name, keyed by
    the forward's parameter names."""
    if not dynamic_dims:
        return None
    dims: dict[str, Any] = {}

    def spec(axes: Mapping[int, str]) -> dict[int, Any]:
        return {axis: dims.setdefault(dim, torch.export.Dim(dim)) for axis, dim in axes.items()}

    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise ExportError(f"the example inputs do not fit {type(model).__name__}.forward: {exc}",
                          hint="pass args (and kwargs) as forward expects them") from exc
    tensor_params = [p for p, v in bound.arguments.items() if isinstance(v, torch.Tensor)]
    by_param = dict(zip(names, tensor_params))
    shapes: dict[str, Any] = {p: None for p in bound.arguments}
    for name, axes in dynamic_dims.items():
        shapes[by_param[name]] = spec(axes)
    return shapes


# --------------------------------------------------------------------------- the written model


def _finalize(model: onnx.ModelProto, registry: OpRegistry) -> onnx.ModelProto:
    """Import every op domain the nodes use (at the highest ``since_version`` of the
    registry's ops used there, else 1) and keep ir_version loadable."""
    wanted: dict[str, int] = {}
    domains = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
    nodes = list(_all_nodes(model.graph))
    for fn in model.functions:
        for node in fn.node:
            nodes.extend([node, *_subgraph_nodes(node)])
    for n in nodes:
        if registry.is_placeholder(n.domain, n.op_type):
            op = registry.get(f"{n.domain}::{n.op_type}")
            wanted[n.domain] = max(wanted.get(n.domain, 1), op.since_version)
        elif n.domain in domains:  # an op the registry lacks, in one of its domains
            wanted.setdefault(n.domain, 1)
    imports = {imp.domain: imp for imp in model.opset_import}
    for domain, version in sorted(wanted.items()):
        if domain in imports:
            imports[domain].version = imports[domain].version or version
        else:
            model.opset_import.append(onnx.helper.make_opsetid(domain, version))
    model.ir_version = min(model.ir_version or MAX_IR_VERSION, MAX_IR_VERSION)
    return model


def _check_standard_ops(model: onnx.ModelProto, model_name: str, torch_translations: Sequence[str]) -> None:
    """ExportError for a standard ONNX node the model's opset does not have (torch's
    ``DeformConv`` at opset 18): such a model is invalid, so it is never written."""
    imports = {imp.domain: imp.version for imp in model.opset_import}
    opset = imports.get("", imports.get("ai.onnx"))
    if opset is None:
        return
    for node in _all_nodes(model.graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            since = _first_version(node.op_type)
            fix = (f"export at opset >= {since}" if since is not None else "export with another opset")
            if torch_translations:
                fix += (f", or let graphkit write its placeholder (drop torch_translations="
                        f"{list(torch_translations)}, --torch-translation on the command line)")
            else:
                fix += (", or export the torch op that became it as a placeholder (an op of the "
                        "registry that lists it in foreign_ops)")
            raise ExportError(
                f"cannot export {model_name}: the exporter wrote {node.op_type}, which opset {opset} "
                f"does not have" + (f" (it exists from opset {since})" if since is not None else ""),
                node=node.name or node.op_type, op=node.op_type, hint=fix) from None


def _first_version(op_type: str) -> int | None:
    versions = [s.since_version for s in onnx.defs.get_all_schemas_with_history()
                if s.name == op_type and s.domain == ""]
    return min(versions) if versions else None


def _subgraph_nodes(node: onnx.NodeProto) -> Iterator[onnx.NodeProto]:
    for g in subgraphs(node):
        yield from _all_nodes(g)


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for g in graphs(graph):
        yield from g.node


def _report(model: onnx.ModelProto, path: Path, exporter: str, registry: OpRegistry,
            used: _Used | None = None) -> ExportReport:
    from graphkit.inspection import lowerings_of

    used = used or _Used()
    imports = {imp.domain: imp.version for imp in model.opset_import}
    opset = imports.get("", imports.get("ai.onnx", 0))
    domains = registry.placeholder_domains() | {PLACEHOLDER_DOMAIN}
    nodes = tuple(CustomNode(n.name, f"{n.domain}::{n.op_type}",
                             registry.is_placeholder(n.domain, n.op_type))
                  for n in _all_nodes(model.graph)
                  if n.domain in domains or registry.is_placeholder(n.domain, n.op_type))
    lowerings = {}
    for node in nodes:
        op = registry.get(node.op) if node.known else None
        if op is not None and node.op not in lowerings:
            lowerings[node.op] = tuple(lowerings_of(op, opset, registry))
    return ExportReport(
        path=path, exporter=exporter, opset=opset,
        ir_version=model.ir_version, inputs=tuple(i.name for i in model.graph.input),
        outputs=tuple(o.name for o in model.graph.output), custom_nodes=nodes,
        opset_imports=imports, lowerings=lowerings, gap_fillers=used.gap_fillers,
        rewrites=dict(used.rewrites), runtime_check=used.runtime_check, registry=registry)


# --------------------------------------------------------------------------- errors


def _graphkit_root(exc: BaseException | None) -> GraphkitError | None:
    """The GraphkitError an exporter exception wraps, if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, GraphkitError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _with_model(exc: GraphkitError, model_name: str) -> GraphkitError:
    """ExportErrors name the model; other graphkit errors (a failed build) keep their class."""
    if not isinstance(exc, ExportError) or model_name in exc.message:
        return exc
    return ExportError(f"cannot export {model_name}: {exc.message}", hint=exc.hint, path=exc.path,
                       node=exc.node, op=exc.op)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(exc: BaseException) -> str:
    text = next((ln.strip() for ln in _ANSI.sub("", str(exc)).splitlines() if ln.strip()), "")
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _root(exc: BaseException) -> BaseException:
    """The exception at the bottom of ``exc``'s chain (torch wraps the cause in its own errors)."""
    root = exc
    seen = {id(exc)}
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        root = nxt
    return root


def _cause(exc: BaseException) -> str:
    """The root cause's first line (torch wraps it in step-by-step exporter errors)."""
    root = _root(exc)
    if root is exc:
        return _first_line(exc)
    return f"{_first_line(root)} [in {type(exc).__name__}]"


def _library_dirs() -> tuple[str, ...]:
    """Where the exporters' code lives: an exception raised there is the exporter's, not the model's."""
    import sysconfig

    import onnx as _onnx

    dirs = [os.path.dirname(m.__file__) for m in (torch, _onnx) if getattr(m, "__file__", None)]
    dirs.append(str(Path(__file__).resolve().parents[1]))  # graphkit
    for name in ("onnxscript", "onnx_ir"):
        with contextlib.suppress(ImportError, AttributeError, TypeError):
            dirs.append(os.path.dirname(__import__(name).__file__))
    dirs += [p for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")) if p]
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


def _failure_hint(exc: BaseException, dynamo: bool) -> str:
    """The hint of an export failure: where the model's own code raised the cause (the other
    exporter runs the same code, so switching exporters is no fix), else the other exporter."""
    root = _root(exc)
    tb, last = root.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is not None:
        where = last.tb_frame.f_code.co_filename
        if not where.startswith("<") and not os.path.realpath(where).startswith(_library_dirs()):
            return (f"{type(root).__name__} raised by the model's own code at {where}:{last.tb_lineno}: "
                    "fix the model there; both exporters run that code")
    return ("torch.export could not trace the model: fix the cause, or try dynamo=False" if dynamo
            else "fix the cause, or try dynamo=True")
