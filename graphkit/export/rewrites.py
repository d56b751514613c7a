"""Export-time rewrites: replace a torch function or a module's forward while exporting only.

The replacement for ``torch.onnx.is_in_onnx_export()`` branches (seed 004, section 3) and
for MMDeploy's function rewriters, without their pitfalls: a rewrite lives in an explicit
:class:`RewriteRegistry` object (nothing registers itself on import), is selected by small
condition objects (:class:`Backend`, :class:`Opset`, :class:`Exporter`) against the
:class:`ExportTarget`, and is active only inside :meth:`RewriteRegistry.activate` (or
``graphkit.export.export(..., rewrites=...)``), which puts every attribute back on exit,
even on error. Two rewrites of the same target selected at once are an error naming both,
never "first registered wins". Targets are dotted paths resolved with importlib and
getattr, or classes; nothing is exec'd and no caller frames are inspected.

    rewrites = RewriteRegistry("my_model")

    @rewrites.function("torch.Tensor.repeat", when=Backend("tensorrt"))
    def repeat_as_expand(ctx, self, *sizes):
        ...                                # ctx.origin is the original torch.Tensor.repeat
        return ctx.origin(self, *sizes)

    @rewrites.forward(PointwiseMix, when=Opset(max=11))
    def pointwise_as_conv(ctx, self, x):  # self is the module
        return F.conv2d(x, self.weight[:, :, None, None])

A dotted target patches that attribute: ``"torch.nn.functional.interpolate"`` changes what
``F.interpolate(...)`` finds at call time, not a name a module imported earlier with
``from torch.nn.functional import interpolate`` (rewrite that module's name as well).
Patching is process-wide while active: do not run other torch code on other threads
meanwhile.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from graphkit.errors import ExportError, UsageError

__all__ = [
    "ActiveRewrites",
    "Backend",
    "Condition",
    "ExportTarget",
    "Exporter",
    "Opset",
    "Rewrite",
    "RewriteContext",
    "RewriteRegistry",
    "activate_rewrites",
]

EXPORTERS = ("torchscript", "dynamo")


@dataclass(frozen=True)
class ExportTarget:
    """What an export produces: which exporter, which ai.onnx opset, for which backend."""

    exporter: str = "torchscript"
    opset: int = 18
    backend: str = "onnxruntime"

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise UsageError(f"exporter {self.exporter!r} is not one of {', '.join(EXPORTERS)}")


# --------------------------------------------------------------------------- conditions


class Condition(Protocol):
    """Holds for an :class:`ExportTarget` or says why not."""

    def reason_against(self, target: ExportTarget) -> str | None:
        """None when the condition holds, else why it does not."""


@dataclass(frozen=True, init=False)
class Backend:
    """The target backend is one of ``names`` (``Backend("tensorrt", "onnxruntime")``)."""

    names: tuple[str, ...]

    def __init__(self, *names: str) -> None:
        if not names or not all(isinstance(n, str) and n for n in names):
            raise UsageError(f"Backend{names!r} needs one or more backend names",
                             hint='for example Backend("tensorrt")')
        object.__setattr__(self, "names", tuple(names))

    def reason_against(self, target: ExportTarget) -> str | None:
        if target.backend in self.names:
            return None
        return f"backend is {target.backend!r}, not {' or '.join(map(repr, self.names))}"


@dataclass(frozen=True)
class Opset:
    """``min <= opset <= max`` (either bound may be None)."""

    min: int | None = None
    max: int | None = None

    def __post_init__(self) -> None:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise UsageError(f"Opset(min={self.min}, max={self.max}) is empty")

    def reason_against(self, target: ExportTarget) -> str | None:
        if self.min is not None and target.opset < self.min:
            return f"opset {target.opset} < {self.min}"
        if self.max is not None and target.opset > self.max:
            return f"opset {target.opset} > {self.max}"
        return None


@dataclass(frozen=True)
class Exporter:
    """The torch exporter is ``name`` ("torchscript" or "dynamo")."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in EXPORTERS:
            raise UsageError(f"Exporter({self.name!r}): the exporters are {', '.join(EXPORTERS)}")

    def reason_against(self, target: ExportTarget) -> str | None:
        return None if target.exporter == self.name else f"exporter is {target.exporter}, not {self.name}"


# --------------------------------------------------------------------------- rewrites


@dataclass(frozen=True)
class RewriteContext:
    """First argument of every rewrite: the ``origin`` it replaces (call it for the
    original behaviour; calling the patched name again would recurse), the export
    ``target`` and the ``rewrite`` itself."""

    origin: Callable[..., Any]
    target: ExportTarget
    rewrite: "Rewrite"


@dataclass(frozen=True)
class Rewrite:
    """``fn(ctx, *args, **kwargs)`` replaces ``target`` while the conditions hold.

    ``target`` is a dotted path (``"torch.Tensor.repeat"``) for a function rewrite, or a
    class (or the dotted path of one) whose ``forward`` is replaced for a forward rewrite.
    """

    name: str
    target: str | type
    fn: Callable[..., Any]
    when: tuple[Condition, ...] = ()
    forward: bool = False

    @property
    def target_name(self) -> str:
        t = self.target
        base = t if isinstance(t, str) else f"{t.__module__}.{t.__qualname__}"
        return f"{base}.forward" if self.forward else base

    def reasons_against(self, target: ExportTarget) -> list[str]:
        return [r for c in self.when if (r := c.reason_against(target)) is not None]


class RewriteRegistry:
    """An explicit collection of :class:`Rewrite`; pass it to ``export(rewrites=...)``."""

    def __init__(self, name: str = "rewrites", rewrites: Iterable[Rewrite] = ()) -> None:
        self.name = name
        self._rewrites: list[Rewrite] = []
        for r in rewrites:
            self.add(r)

    def add(self, rewrite: Rewrite) -> Rewrite:
        if any(r.name == rewrite.name for r in self._rewrites):
            raise UsageError(f"registry '{self.name}' already has a rewrite named '{rewrite.name}'",
                             hint="give each rewrite a unique name")
        for c in rewrite.when:
            if not callable(getattr(c, "reason_against", None)):
                raise UsageError(f"rewrite '{rewrite.name}': {c!r} is not a condition",
                                 hint="use Backend(...), Opset(...), Exporter(...) or an object "
                                      "with reason_against(target)")
        self._rewrites.append(rewrite)
        return rewrite

    def _decorator(self, target: str | type, when: Any, name: str | None, forward: bool):
        conditions = tuple(when) if isinstance(when, (tuple, list)) else ((when,) if when is not None else ())

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add(Rewrite(name or fn.__name__, target, fn, conditions, forward))
            return fn

        return register

    def function(self, target: str, *, when: Condition | Sequence[Condition] | None = None,
                 name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: ``fn(ctx, *args, **kwargs)`` replaces the function at dotted path ``target``."""
        if not isinstance(target, str) or "." not in target:
            raise UsageError(f"a function rewrite's target must be a dotted path, not {target!r}",
                             hint='for example "torch.nn.functional.interpolate"')
        return self._decorator(target, when, name, forward=False)

    def forward(self, cls: type | str, *, when: Condition | Sequence[Condition] | None = None,
                name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: ``fn(ctx, self, *args, **kwargs)`` replaces ``cls.forward``."""
        if not isinstance(cls, (type, str)):
            raise UsageError(f"a forward rewrite's target must be a class, not {cls!r}")
        return self._decorator(cls, when, name, forward=True)

    def __iter__(self) -> Iterator[Rewrite]:
        return iter(self._rewrites)

    def __len__(self) -> int:
        return len(self._rewrites)

    def __repr__(self) -> str:
        return f"RewriteRegistry({self.name!r}, {[r.name for r in self._rewrites]})"

    def select(self, target: ExportTarget) -> list[Rewrite]:
        """The rewrites whose conditions hold for ``target``; ExportError if two of them
        replace the same thing."""
        return _select([self], target)

    def explain(self, target: ExportTarget) -> str:
        """One line per rewrite: whether it applies to ``target`` and why not."""
        lines = []
        for r in self._rewrites:
            why = r.reasons_against(target)
            state = "applies" if not why else "skipped: " + "; ".join(why)
            lines.append(f"{self.name}/{r.name} ({r.target_name}): {state}")
        return "\n".join(lines)

    def activate(self, target: ExportTarget) -> contextlib.AbstractContextManager["ActiveRewrites"]:
        """Patch the selected rewrites in for the ``with`` block; restored on exit."""
        return activate_rewrites([self], target)


def _select(registries: Sequence[RewriteRegistry], target: ExportTarget) -> list[tuple[str, Rewrite]]:
    chosen: list[tuple[str, Rewrite]] = []
    by_target: dict[str, tuple[str, Rewrite]] = {}
    for reg in registries:
        for r in reg:
            if r.reasons_against(target):
                continue
            key = r.target_name
            if key in by_target:
                other_reg, other = by_target[key]
                raise ExportError(
                    f"rewrites '{other_reg}/{other.name}' and '{reg.name}/{r.name}' both replace "
                    f"{key} for {target}", hint="narrow the conditions of one of them "
                    "(Backend, Opset, Exporter) or drop one")
            by_target[key] = (reg.name, r)
            chosen.append((reg.name, r))
    return chosen


# --------------------------------------------------------------------------- patching


def _resolve(path: str, what: str) -> tuple[Any, str]:
    """(owner, attribute) for a dotted path: the longest importable module prefix, then
    attribute lookups."""
    parts = path.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ExportError(f"{what}: {path!r} is not a dotted path", hint='for example "torch.Tensor.repeat"')
    for i in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue
            raise ExportError(f"{what}: importing {module_name} failed: {exc}") from exc
        try:
            for p in parts[i:-1]:
                obj = getattr(obj, p)
        except AttributeError as exc:
            raise ExportError(f"{what}: {path} does not exist ({exc})",
                              hint="check the rewrite's target") from exc
        if not hasattr(obj, parts[-1]):
            raise ExportError(f"{what}: {path} does not exist", hint="check the rewrite's target")
        return obj, parts[-1]
    raise ExportError(f"{what}: no module of {path!r} can be imported", hint="check the rewrite's target")


def _resolve_class(target: type | str, what: str) -> type:
    if isinstance(target, type):
        return target
    owner, attr = _resolve(target, what)
    cls = getattr(owner, attr)
    if not isinstance(cls, type):
        raise ExportError(f"{what}: {target} is a {type(cls).__name__}, not a class")
    return cls


@dataclass
class _Patch:
    owner: Any
    attr: str
    had_own: bool
    raw: Any
    label: str


# (id(owner), attr) -> the active patch: a second activation of the same target, from any
# registry, is a conflict.
_active: dict[tuple[int, str], _Patch] = {}
_active_lock = threading.RLock()


@dataclass
class ActiveRewrites:
    """The rewrites patched in by an activation and how often each was called."""

    target: ExportTarget
    names: list[str] = field(default_factory=list)
    calls: collections.Counter = field(default_factory=collections.Counter)


def _wrap(label: str, rewrite: Rewrite, origin: Callable[..., Any], raw: Any, target: ExportTarget,
          calls: collections.Counter) -> Any:
    ctx = RewriteContext(origin=origin, target=target, rewrite=rewrite)

    def patched(*args: Any, **kwargs: Any) -> Any:
        calls[label] += 1
        return rewrite.fn(ctx, *args, **kwargs)

    with contextlib.suppress(AttributeError, TypeError):
        functools.update_wrapper(patched, origin)
    patched.__graphkit_rewrite__ = label  # type: ignore[attr-defined]
    if isinstance(raw, staticmethod):
        return staticmethod(patched)
    if isinstance(raw, classmethod):
        return classmethod(patched)
    return patched


def _patch(label: str, rewrite: Rewrite, target: ExportTarget, calls: collections.Counter) -> _Patch:
    what = f"rewrite '{label}'"
    if rewrite.forward:
        owner, attr = _resolve_class(rewrite.target, what), "forward"
    else:
        owner, attr = _resolve(rewrite.target, what)
    key = (id(owner), attr)
    if key in _active:
        raise ExportError(f"rewrites '{_active[key].label}' and '{label}' both replace "
                          f"{rewrite.target_name} at once", hint="activate one of them only")
    own = getattr(owner, "__dict__", {})
    had_own = attr in own
    raw = own[attr] if had_own else getattr(owner, attr)
    origin = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else getattr(owner, attr)
    if not callable(origin):
        raise ExportError(f"{what}: {rewrite.target_name} is not callable")
    replacement = _wrap(label, rewrite, origin, raw, target, calls)
    try:
        setattr(owner, attr, replacement)
    except (AttributeError, TypeError) as exc:
        raise ExportError(f"{what}: cannot replace {rewrite.target_name}: {exc}",
                          hint="name the attribute where Python code looks it up (for example "
                               "torch.Tensor.repeat, not torch._C.TensorBase.repeat)") from exc
    patch = _Patch(owner, attr, had_own, raw, label)
    _active[key] = patch
    return patch


def _unpatch(patch: _Patch) -> None:
    if patch.had_own:
        setattr(patch.owner, patch.attr, patch.raw)
    else:
        delattr(patch.owner, patch.attr)
    _active.pop((id(patch.owner), patch.attr), None)


@contextlib.contextmanager
def activate_rewrites(registries: Iterable[RewriteRegistry], target: ExportTarget) -> Iterator[ActiveRewrites]:
    """Patch in every rewrite of ``registries`` selected for ``target`` for the block.

    Everything is put back on exit, also when the block (or a later patch) raises.
    """
    registries = list(registries)
    for reg in registries:
        if not isinstance(reg, RewriteRegistry):
            raise UsageError(f"rewrites must be RewriteRegistry objects, not {type(reg).__name__}",
                             hint="collect rewrites in a RewriteRegistry")
    active = ActiveRewrites(target)
    patches: list[_Patch] = []
    with _active_lock:
        try:
            for reg_name, rewrite in _select(registries, target):
                label = f"{reg_name}/{rewrite.name}"
                patches.append(_patch(label, rewrite, target, active.calls))
                active.names.append(label)
            yield active
        finally:
            for patch in reversed(patches):
                _unpatch(patch)
