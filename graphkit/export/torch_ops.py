"""The torch side of every graphkit op, derived from its :class:`~graphkit.ops.OpDef`.

Nothing here is written per op, and nothing assumes graphkit's own namespace or domain:
each op brings its torch namespace (``OpDef.torch_namespace``, ``graphkit`` by default)
and the ONNX domain of its placeholder node (``OpDef.domain``, ``custom`` by default).
From an OpDef graphkit derives:

- :func:`autograd_function` - a ``torch.autograd.Function`` whose forward is the op's fast
  forward (``torch_forward``, else ``reference``) and whose ``symbolic`` writes the
  placeholder node ``<domain>::<name>`` (the tutorial's path, for the TorchScript exporter;
  under torch.export it records the library op below when that is defined).
- a ``torch.library`` op ``<torch_namespace>::<name>`` (:class:`TorchOps`): real kernel =
  fast forward, fake kernel = the reference (pure torch, so it runs on fake tensors),
  autograd from the reference. Works with both exporters through the hooks below.
- :func:`onnxscript_translation` - the ``custom_translation_table`` entry for
  ``torch.onnx.export(dynamo=True)``.
- :func:`torchscript_symbolic` / :func:`scoped_symbolics` - the symbolic for
  ``<torch_namespace>::<name>`` used by ``torch.onnx.export(dynamo=False)``, registered
  only inside a ``with`` block.

torch's dispatcher is process-global: one torch name (``acme::rms_norm``) stands for one
OpDef at a time. Two ops of different packages that would share a torch name are an
ExportError naming both.

Positional order is always: inputs (declared order), then attributes (declared order).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from graphkit.errors import ExportError, UnknownOpError
from graphkit.export._placeholder import bind as _bind
from graphkit.export._placeholder import emit_placeholder as _emit_placeholder
from graphkit.export._placeholder import onnxscript_translation
from graphkit.export._placeholder import params as _params
from graphkit.export._symbolic_registry import SYMBOLIC_OPSET as _SYMBOLIC_OPSET
from graphkit.export._symbolic_registry import forget_empty_group, symbolic_registry
from graphkit.ops import AttrType, OpDef, OpPackage, OpRegistry
from graphkit.ops._opdef import TORCH_NAMESPACE

__all__ = [
    "LIBRARY_NAMESPACE",
    "TorchOps",
    "autograd_function",
    "check_torch_names",
    "defined_ops",
    "defined_packages",
    "library_schema",
    "onnxscript_translation",
    "custom_translation_table",
    "torch_name",
    "torchscript_symbolic",
    "scoped_symbolics",
    "symbolic_registered",
]

# The torch namespace of ops that do not name their own (OpDef.torch_namespace's default).
LIBRARY_NAMESPACE = TORCH_NAMESPACE


def torch_name(op: OpDef) -> str:
    """The op's torch name, ``<torch_namespace>::<name>`` (``acme::rms_norm``)."""
    return f"{op.torch_namespace}::{op.name}"


def _packet(op: OpDef) -> torch._ops.OpOverloadPacket:
    return getattr(getattr(torch.ops, op.torch_namespace), op.name)


def _describe(op: OpDef, registry: OpRegistry | None = None) -> str:
    """``custom::rms_norm of package rms_norm_ops (--ops)``, for messages."""
    package = registry.package_of(op) if registry is not None and op in registry else None
    return f"{op.qualified_name} of package {package.describe()}" if package is not None \
        else f"{op.qualified_name} (an OpDef outside any package)"


def check_torch_names(ops: Iterable[OpDef], registry: OpRegistry | None = None) -> None:
    """ExportError when two different ops of ``ops`` would be the same torch op
    (same ``torch_namespace`` and name), naming both (with their packages from ``registry``)."""
    seen: dict[str, OpDef] = {}
    for op in ops:
        other = seen.setdefault(torch_name(op), op)
        if other is not op and other != op:
            raise ExportError(
                f"torch op {torch_name(op)} would stand for two ops: {_describe(other, registry)} "
                f"and {_describe(op, registry)}", op=op.qualified_name,
                hint="give one of them another torch_namespace (OpDef(..., torch_namespace=...)), "
                     "or load only one of the packages")


# --------------------------------------------------------------------------- helpers


_forwards: dict[int, tuple[OpDef, Callable[..., Any]]] = {}
_forwards_lock = threading.Lock()


def _forward(op: OpDef) -> Callable[..., Any]:
    """The op's fast forward (loaded once), or its reference when it has none."""
    hit = _forwards.get(id(op))
    if hit is not None and hit[0] is op:
        return hit[1]
    with _forwards_lock:
        hit = _forwards.get(id(op))
        if hit is not None and hit[0] is op:
            return hit[1]
        fn = op.torch_forward() if op.torch_forward is not None else op.reference
        _forwards[id(op)] = (op, fn)
        return fn


def _torch_dtype(type_str: str) -> torch.dtype | None:
    """'tensor(float)' -> torch.float32; None where torch has no dtype of that name (string,
    the float8 types, whose torch names differ). ONNX's element type names are torch's."""
    dtype = getattr(torch, type_str[len("tensor("):-1], None) if type_str.startswith("tensor(") else None
    return dtype if isinstance(dtype, torch.dtype) else None


def _check_dtypes(op: OpDef, inputs: Sequence[Any]) -> None:
    """Enforce the OpDef's type constraints on tensors (export runs only the fake kernel,
    so this is where a wrong dtype is caught before it reaches the ONNX graph)."""
    bound: dict[str, tuple[str, torch.dtype]] = {}
    for p, x in zip(op.inputs, inputs):
        if not isinstance(x, torch.Tensor):
            continue
        allowed = [d for t in op.type_constraints[p.type] if (d := _torch_dtype(t)) is not None]
        if allowed and len(allowed) == len(op.type_constraints[p.type]) and x.dtype not in allowed:
            raise TypeError(f"[{op.name}] input '{p.name}' must be one of "
                            f"{', '.join(str(d).replace('torch.', '') for d in allowed)}, got "
                            f"{str(x.dtype).replace('torch.', '')}")
        first = bound.setdefault(p.type, (p.name, x.dtype))
        if first[1] != x.dtype:
            raise TypeError(f"[{op.name}] inputs '{first[0]}' and '{p.name}' share type {p.type} "
                            f"but are {str(first[1]).replace('torch.', '')} and "
                            f"{str(x.dtype).replace('torch.', '')}")


def _tracing(inputs: Sequence[Any]) -> bool:
    """Whether torch.export / torch.compile is tracing (with fake tensors) right now."""
    from torch._subclasses.fake_tensor import FakeTensor

    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return True
    return any(isinstance(x, FakeTensor) for x in inputs)


def _as_tuple(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _reference_vjp(op: OpDef, inputs: Sequence[Any], attrs: Sequence[Any],
                   grads: Sequence[Any]) -> tuple:
    """Gradients of the reference w.r.t. the tensor inputs (None for the others)."""
    leaves = [x.detach().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point()
              else x for x in inputs]
    with torch.enable_grad():
        outs = _as_tuple(op.reference(*leaves, *attrs))
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        wrt = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
        if not pairs or not wrt:
            return tuple(None for _ in inputs)
        got = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                       allow_unused=True))
    return tuple(next(got) if isinstance(x, torch.Tensor) and x.requires_grad else None for x in leaves)


# --------------------------------------------------------------------------- autograd.Function

_functions: dict[int, tuple[OpDef, type]] = {}


def autograd_function(op: OpDef) -> type[torch.autograd.Function]:
    """A ``torch.autograd.Function`` for ``op`` (one class per OpDef, built once).

    ``F.apply(*inputs, *attributes)`` (trailing attributes may be omitted for their
    defaults): forward runs the fast forward (or the reference), backward differentiates
    the reference, and ``symbolic`` emits ``<domain>::<name>`` with ``<attr>_<suffix>=value``
    attributes - read by the TorchScript exporter (``dynamo=False``). ``torch.export``
    (``dynamo=True``) ignores ``symbolic`` and traces the forward: while
    ``<torch_namespace>::<name>`` is defined for this OpDef (:func:`graphkit.export.export` defines it for the call) the
    forward records that op, so the placeholder node comes out the same; otherwise the
    forward's own torch ops are traced.
    """
    hit = _functions.get(id(op))
    if hit is not None and hit[0] is op:
        return hit[1]

    def forward(ctx, *args):
        inputs, named = _bind(op, args)  # trailing attributes may be left to their defaults
        attrs = [named[a.name] for a in op.attributes]
        ctx.attrs = attrs
        ctx.n_args = len(args)
        ctx.save_for_backward(*[x if isinstance(x, torch.Tensor) else None for x in inputs])
        if _tracing(inputs):
            # torch.export (dynamo=True) ignores `symbolic` and traces this forward; when
            # <torch_namespace>::<name> is defined for this OpDef, record it so the
            # exporter's translation writes the same placeholder node.
            defined = _definitions.get(torch_name(op))
            if defined is not None and defined.op == op:
                return _packet(op)(*inputs, *attrs)
        with torch.no_grad():
            return _forward(op)(*inputs, *attrs)

    def backward(ctx, *grads):
        grads_in = _reference_vjp(op, ctx.saved_tensors, ctx.attrs, grads)
        return (*grads_in, *(None for _ in op.attributes))[: ctx.n_args]

    def symbolic(g, *args):
        inputs, attrs = _bind(op, args)
        return _emit_placeholder(g, op, inputs, attrs)

    cls = type(f"{_camel(op.name)}Function", (torch.autograd.Function,), {
        "__doc__": f"graphkit op {op.qualified_name}: {op.doc}",
        "__module__": __name__,
        "op": op,
        "forward": staticmethod(forward),
        "backward": staticmethod(backward),
        "symbolic": staticmethod(symbolic),
    })
    _functions[id(op)] = (op, cls)
    return cls


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


# --------------------------------------------------------------------------- torch.library op


def _schema_default(t: AttrType, value: Any) -> str:
    if t is AttrType.STRING:
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if t.is_list:
        return "[" + ", ".join(_schema_default(AttrType.INT if t is AttrType.INTS else AttrType.FLOAT, v)
                               for v in value) + "]"
    if t is AttrType.FLOAT:
        text = repr(float(value))
        return text if any(c in text for c in ".einf") else text + ".0"
    return str(int(value))


def library_schema(op: OpDef) -> str:
    """The torch schema of ``<torch_namespace>::<name>`` (without the namespace), e.g. ``my_add(Tensor a, Tensor b) -> Tensor``."""
    params = dict((name, (default, has)) for name, default, has in _params(op))
    args = []
    for p in op.inputs:
        _, has = params[p.name]
        if p.optional:
            args.append(f"Tensor? {p.name}" + ("=None" if has else ""))
        else:
            args.append(f"Tensor {p.name}")
    for a in op.attributes:
        default, has = params[a.name]
        text = f"{a.type.torch_type} {a.name}"
        if has:
            text += "=" + _schema_default(a.type, default)
        args.append(text)
    outs = ["Tensor"] * len(op.outputs)
    ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
    return f"{op.name}({', '.join(args)}) -> {ret}"


class _Definition:
    """One ``<torch_namespace>::<name>`` in torch's (process-global) dispatcher, shared by
    refcount. ``origin`` names the op and its package, for messages; ``package`` is the
    package the defining registry attributes the op to (None for a loose OpDef)."""

    def __init__(self, op: OpDef, origin: str, package: OpPackage | None = None) -> None:
        self.op = op
        self.origin = origin
        self.package = package
        self.refs = 0
        self.lib = torch.library.Library(op.torch_namespace, "FRAGMENT")
        qualname = torch_name(op)
        try:
            self.lib.define(library_schema(op))
        except RuntimeError as exc:
            self.lib._destroy()
            raise ExportError(f"cannot define torch op {qualname}: {str(exc).splitlines()[0]}",
                              op=op.qualified_name,
                              hint="another library already defines it in this process; "
                                   "close the TorchOps that owns it first") from exc
        try:
            self.lib.impl(op.name, self._impl, "CompositeExplicitAutograd")
            torch.library.register_fake(qualname, self._fake, lib=self.lib)
            torch.library.register_autograd(qualname, self._backward, setup_context=self._setup,
                                            lib=self.lib)
        except Exception:
            self.lib._destroy()
            raise

    # Kernels. Python kernels receive the arguments as the caller gave them (defaults are
    # not filled in), so every kernel binds them against the OpDef first.
    def _args(self, args, kwargs) -> tuple[list, list]:
        inputs, attrs = _bind(self.op, args, kwargs)
        return inputs, [attrs[a.name] for a in self.op.attributes]

    def _impl(self, *args, **kwargs):
        inputs, attrs = self._args(args, kwargs)
        return _own_outputs(_forward(self.op)(*inputs, *attrs), inputs)

    def _fake(self, *args, **kwargs):
        inputs, attrs = self._args(args, kwargs)
        _check_dtypes(self.op, inputs)
        return _own_outputs(self.op.reference(*inputs, *attrs), inputs)

    def _setup(self, ctx, inputs, output):
        ins, attrs = self._args(inputs, {})
        ctx.attrs = attrs
        ctx.n_args = len(inputs)
        ctx.save_for_backward(*[x if isinstance(x, torch.Tensor) else None for x in ins])

    def _backward(self, ctx, *grads):
        grads_in = _reference_vjp(self.op, ctx.saved_tensors, ctx.attrs, grads)
        # one gradient per argument the caller passed (inputs first, then attributes)
        return (*grads_in, *(None for _ in self.op.attributes))[: ctx.n_args]

    def destroy(self) -> None:
        self.lib._destroy()


def _own_outputs(out: Any, inputs: Sequence[Any]) -> Any:
    """Custom ops may not return (views of) their inputs: clone any that would."""
    def own(t):
        if isinstance(t, torch.Tensor) and (t._base is not None or any(t is x for x in inputs)):
            return t.clone()
        return t
    if isinstance(out, (tuple, list)):
        return tuple(own(t) for t in out)
    return own(out)


_definitions: dict[str, _Definition] = {}  # by torch name, "acme::rms_norm"
_definitions_lock = threading.RLock()


def defined_ops() -> dict[str, OpDef]:
    """The ops graphkit has defined in torch in this process, by torch name
    (``"graphkit::my_add"``, ``"acme::rms_norm"``)."""
    with _definitions_lock:
        return {name: d.op for name, d in _definitions.items()}


def defined_packages() -> list[tuple[OpDef, OpPackage | None]]:
    """(op, its package or None) for every op graphkit has defined in torch right now."""
    with _definitions_lock:
        return [(d.op, d.package) for d in _definitions.values()]


class TorchOps:
    """The ops of a registry as torch ops, ``torch.ops.<torch_namespace>.<name>``, defined
    lazily on first use.

    ``ops = TorchOps(registry)`` (default: :func:`~graphkit.ops.default_registry`);
    ``ops.rms_norm(x, w)`` calls ``torch.ops.acme.rms_norm`` for an op whose
    ``torch_namespace`` is ``acme`` (defining it on first access; a name defined in several
    domains is spelled ``ops.define("acme.vision::rms_norm")``), ``ops.function("rms_norm")``
    is the op's autograd.Function. torch's dispatcher is global, so a torch name stands for
    one OpDef at a time: another TorchOps using the *same* OpDef shares the definition, a
    different OpDef of the same torch name is an ExportError naming both (and so is a
    registry holding two ops of one torch name). ``close()`` (or leaving
    ``with TorchOps(...) as ops:``) drops this object's definitions; the last user of a
    definition destroys its torch Library.
    """

    def __init__(self, registry: OpRegistry | None = None) -> None:
        if registry is None:
            from graphkit.ops import default_registry

            registry = default_registry()
        check_torch_names(registry, registry)
        self._registry = registry
        self._held: dict[str, _Definition] = {}
        self._closed = False

    @property
    def registry(self) -> OpRegistry:
        return self._registry

    def _opdef(self, name: str) -> OpDef:
        op = self._registry.get(name)
        if op is None:
            from graphkit._invocation import wording

            raise UnknownOpError(
                f"no op named {name!r} in any loaded op package (this TorchOps' registry has "
                f"{', '.join(sorted(o.qualified_name for o in self._registry))})",
                hint=wording("pass --ops PACKAGE naming the op package that defines it, list it in "
                             "$GRAPHKIT_OPS, or install it",
                             "build TorchOps(graphkit.ops.discover(['PACKAGE'])) with the op package that "
                             "defines it, list it in $GRAPHKIT_OPS, or install it"))
        return op

    def define(self, name: str) -> torch._ops.OpOverloadPacket:
        """Define the op called ``name`` (bare or ``domain::name``) in torch now (idempotent)
        and return ``torch.ops.<torch_namespace>.<name>``."""
        if self._closed:
            raise ExportError("this TorchOps is closed", op=name, hint="create a new TorchOps")
        op = self._opdef(name)
        key = torch_name(op)
        with _definitions_lock:
            if key not in self._held:
                current = _definitions.get(key)
                if current is None:
                    current = _definitions[key] = _Definition(op, _describe(op, self._registry),
                                                                self._registry.package_of(op))
                elif current.op != op:
                    raise ExportError(
                        f"torch op {key} is already defined for {current.origin}; "
                        f"{_describe(op, self._registry)} cannot define it too",
                        op=op.qualified_name,
                        hint="give one of the ops another torch_namespace, close() the other "
                             "TorchOps first, or use one registry")
                current.refs += 1
                self._held[key] = current
        return _packet(op)

    def define_all(self) -> None:
        """Define every op of the registry."""
        for op in self._registry:
            self.define(op.qualified_name)

    def op(self, name: str) -> torch._ops.OpOverloadPacket:
        return self.define(name)

    def function(self, name: str) -> type[torch.autograd.Function]:
        """The op's :func:`autograd_function` (needs no library definition)."""
        return autograd_function(self._opdef(name))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.define(name)

    def __dir__(self) -> Iterable[str]:
        return [*super().__dir__(), *(op.name for op in self._registry)]

    def close(self) -> None:
        """Release this object's definitions (the last user destroys the torch Library)."""
        with _definitions_lock:
            for key, d in self._held.items():
                d.refs -= 1
                if d.refs <= 0 and _definitions.get(key) is d:
                    del _definitions[key]
                    d.destroy()
            self._held.clear()
            self._closed = True

    def __enter__(self) -> "TorchOps":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"defined={sorted(self._held)}"
        return f"TorchOps({sorted(o.qualified_name for o in self._registry)}, {state})"


# --------------------------------------------------------------------------- dynamo=True


def custom_translation_table(ops: Iterable[OpDef] | None = None) -> dict[Any, Callable[..., Any]]:
    """``{torch.ops.<torch_namespace>.<name>.default: translation}`` for ``ops`` (default:
    every op currently defined through :class:`TorchOps`), each writing its op's
    ``<domain>::<name>`` node; ops not defined in torch are skipped. The translation follows
    the OpDef torch has for that name."""
    defined = defined_ops()
    table = {}
    for op in (defined.values() if ops is None else ops):
        current = defined.get(torch_name(op))
        if current is None:
            continue
        table[_packet(current).default] = onnxscript_translation(current)
    return table


# --------------------------------------------------------------------------- dynamo=False


def _const(value: Any, what: str) -> Any:
    """A Python value from a TorchScript symbolic argument (constant Value or list of them)."""
    if not isinstance(value, torch._C.Value):
        return value
    node = value.node()
    if node.mustBeNone():
        return None
    if node.kind() == "prim::ListConstruct":
        return [_const(v, what) for v in node.inputs()]
    if node.kind() in ("onnx::Constant", "prim::Constant"):
        if not node.hasAttribute("value"):
            return None
        const = getattr(node, node.kindOf("value"))("value")  # t, s, i, f, ival, ...
        if isinstance(const, torch.Tensor):
            const = const.tolist()
        return const
    raise ExportError(f"attribute {what} must be a constant, got a {node.kind()} value",
                      hint="pass attributes as Python constants, not tensors computed in the model")


def torchscript_symbolic(op: OpDef) -> Callable[..., Any]:
    """The TorchScript symbolic for ``<torch_namespace>::<name>``: emits ``<domain>::<name>``."""
    n_in = len(op.inputs)

    def symbolic(g, *args):
        inputs, raw = list(args[:n_in]), list(args[n_in:])
        attrs = {}
        for a, v in zip(op.attributes, raw):
            value = _const(v, f"'{a.name}' of {op.qualified_name}")
            try:
                attrs[a.name] = a.type.coerce(value)
            except TypeError as exc:
                raise ExportError(f"attribute '{a.name}' must be {a.type.onnx_name}: {exc}",
                                  op=op.qualified_name, hint="fix the call in the model") from exc
        return _emit_placeholder(g, op, inputs, attrs)

    symbolic.__name__ = f"{op.name}_symbolic"
    return symbolic


def symbolic_registered(name: str | OpDef, opset: int = 18) -> bool:
    """Whether a TorchScript symbolic is registered for an op at ``opset``: an OpDef, a
    torch name (``"acme::rms_norm"``) or a bare name (in the ``graphkit`` namespace)."""
    if isinstance(name, OpDef):
        name = torch_name(name)
    elif "::" not in name:
        name = f"{LIBRARY_NAMESPACE}::{name}"
    reg = symbolic_registry()
    return bool(reg is not None and reg.is_registered_op(name, opset))


@contextlib.contextmanager
def scoped_symbolics(ops: Iterable[OpDef] | None = None) -> Iterator[list[str]]:
    """Register the TorchScript symbolics of ``ops`` (default: every op defined through
    :class:`TorchOps`) for the block only; unregistered on exit, even on error. A symbolic
    someone else registered already is left alone. Yields the names registered here."""
    reg = symbolic_registry()
    added: list[tuple[str, bool]] = []
    try:
        for op in (defined_ops().values() if ops is None else ops):
            qualname = torch_name(op)
            if reg is not None and reg.is_registered_op(qualname, _SYMBOLIC_OPSET):
                continue
            existed = reg is not None and reg.get_function_group(qualname) is not None
            torch.onnx.register_custom_op_symbolic(qualname, torchscript_symbolic(op), _SYMBOLIC_OPSET)
            added.append((qualname, existed))
        yield [name for name, _ in added]
    finally:
        for qualname, existed in reversed(added):
            torch.onnx.unregister_custom_op_symbolic(qualname, _SYMBOLIC_OPSET)
            if reg is not None:
                forget_empty_group(qualname, existed)
