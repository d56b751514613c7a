"""The torch side of every graphkit op, derived from its :class:`~graphkit.ops.OpDef`.

Nothing here is written per op. From an OpDef graphkit derives:

- :func:`autograd_function` - a ``torch.autograd.Function`` whose forward is the op's fast
  forward (``torch_forward``, else ``reference``) and whose ``symbolic`` writes the
  placeholder node ``custom::<name>`` (the tutorial's path, for the TorchScript exporter;
  under torch.export it records the library op below when that is defined).
- a ``torch.library`` op ``graphkit::<name>`` (:class:`TorchOps`): real kernel = fast forward,
  fake kernel = the reference (pure torch, so it runs on fake tensors), autograd from the
  reference. Works with both exporters through the hooks below.
- :func:`onnxscript_translation` - the ``custom_translation_table`` entry for
  ``torch.onnx.export(dynamo=True)``.
- :func:`torchscript_symbolic` / :func:`scoped_symbolics` - the symbolic for
  ``graphkit::<name>`` used by ``torch.onnx.export(dynamo=False)``, registered only inside a
  ``with`` block.

Positional order is always: inputs (declared order), then attributes (declared order).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from graphkit.errors import ExportError
from graphkit.ops import PLACEHOLDER_DOMAIN, AttrType, OpDef, OpRegistry, onnx_schema

__all__ = [
    "LIBRARY_NAMESPACE",
    "TorchOps",
    "autograd_function",
    "defined_ops",
    "library_schema",
    "onnxscript_translation",
    "custom_translation_table",
    "torchscript_symbolic",
    "scoped_symbolics",
    "symbolic_registered",
]

LIBRARY_NAMESPACE = "graphkit"
_SYMBOLIC_OPSET = 1  # register_custom_op_symbolic's "from this opset on"

_PY_TYPES: dict[AttrType, Any] = {
    AttrType.INT: int,
    AttrType.FLOAT: float,
    AttrType.STRING: str,
    AttrType.INTS: Sequence[int],
    AttrType.FLOATS: Sequence[float],
}


# --------------------------------------------------------------------------- helpers


def _params(op: OpDef) -> list[tuple[str, Any, bool]]:
    """(name, default, has_default) for every positional parameter: inputs then attributes.

    A parameter keeps its default only when every later one has one too (Python's and
    torch's rule), so an optional input before a required attribute must be passed (None).
    """
    raw: list[tuple[str, Any, bool]] = [(p.name, None, p.optional) for p in op.inputs]
    raw += [(a.name, None if a.required else a.type.coerce(a.default), not a.required)
            for a in op.attributes]
    out: list[tuple[str, Any, bool]] = []
    suffix_ok = True
    for name, default, has in reversed(raw):
        suffix_ok = suffix_ok and has
        out.append((name, default, has and suffix_ok))
    return out[::-1]


def _bind(op: OpDef, args: Sequence[Any], kwargs: dict[str, Any] | None = None) -> tuple[list, dict]:
    """Split a call into (inputs, attributes with defaults filled and types coerced)."""
    params = _params(op)
    kwargs = dict(kwargs or {})
    if len(args) > len(params):
        raise TypeError(f"{op.name}() takes {len(params)} arguments but {len(args)} were given")
    values: dict[str, Any] = {}
    for (name, default, has), value in zip(params, args):
        values[name] = value
    for name, default, has in params[len(args):]:
        if name in kwargs:
            values[name] = kwargs.pop(name)
        elif has:
            values[name] = default
        elif name in {p.name for p in op.inputs if p.optional}:
            values[name] = None
        elif any(a.name == name and not a.required for a in op.attributes):
            values[name] = op.attr(name).default
        else:
            raise TypeError(f"{op.name}() missing required argument '{name}'")
    if kwargs:
        raise TypeError(f"{op.name}() got unexpected argument(s) {sorted(kwargs)}")
    inputs = [values[p.name] for p in op.inputs]
    for p, v in zip(op.inputs, inputs):
        if v is None and not p.optional:
            raise TypeError(f"{op.name}() input '{p.name}' is required")
    attrs = {}
    for a in op.attributes:
        try:
            attrs[a.name] = a.type.coerce(values[a.name])
        except TypeError as exc:
            raise TypeError(f"{op.name}() attribute '{a.name}' must be {a.type.onnx_name}: {exc}") from exc
    return inputs, attrs


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


_TORCH_DTYPES = {
    "tensor(float16)": torch.float16, "tensor(float)": torch.float32,
    "tensor(double)": torch.float64, "tensor(bfloat16)": torch.bfloat16,
    "tensor(int8)": torch.int8, "tensor(int16)": torch.int16, "tensor(int32)": torch.int32,
    "tensor(int64)": torch.int64, "tensor(uint8)": torch.uint8, "tensor(bool)": torch.bool,
}


def _check_dtypes(op: OpDef, inputs: Sequence[Any]) -> None:
    """Enforce the OpDef's type constraints on tensors (export runs only the fake kernel,
    so this is where a wrong dtype is caught before it reaches the ONNX graph)."""
    bound: dict[str, tuple[str, torch.dtype]] = {}
    for p, x in zip(op.inputs, inputs):
        if not isinstance(x, torch.Tensor):
            continue
        allowed = [_TORCH_DTYPES[t] for t in op.type_constraints[p.type] if t in _TORCH_DTYPES]
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


def _emit_placeholder(g, op: OpDef, inputs: Sequence[Any], attrs: dict[str, Any]):
    """``g.op("custom::<name>", ...)`` with typed outputs; a missing optional input is an
    empty name. ``attrs`` maps attribute names to (coerced) values."""
    from torch.onnx import symbolic_helper

    values = list(inputs)
    while values and symbolic_helper._is_none(values[-1]):
        values.pop()
    values = [symbolic_helper._optional_input_placeholder_tensor(g) if symbolic_helper._is_none(v)
              else v for v in values]
    n_out = len(op.outputs)
    kwargs = {f"{name}_{op.attr(name).type.symbolic_suffix}": v for name, v in attrs.items()}
    out = g.op(f"{PLACEHOLDER_DOMAIN}::{op.name}", *values, **kwargs,
               **({"outputs": n_out} if n_out != 1 else {}))
    _set_output_types(op, inputs, attrs, out if n_out != 1 else (out,))
    return out


def _set_output_types(op: OpDef, inputs: Sequence[Any], attrs: dict[str, Any], outs: Sequence[Any]) -> None:
    """Give the placeholder's outputs dtype and shape (the exporter cannot infer them for a
    custom domain): dtype from the first input bound to the same type variable, shape
    from the OpDef's ``infer_shapes``. Best effort: anything unknown stays unknown."""
    shapes = []
    for v in inputs:
        try:
            sizes = v.type().varyingSizes() if isinstance(v, torch._C.Value) else None
        except RuntimeError:
            sizes = None
        shapes.append(None if sizes is None else list(sizes))
    try:
        out_shapes = op.infer_shapes(shapes, attrs)
    except Exception:  # noqa: BLE001 - a shape function may not handle unknown dims
        out_shapes = []
    for i, (p, out) in enumerate(zip(op.outputs, outs)):
        src = next((v for q, v in zip(op.inputs, inputs)
                    if q.type == p.type and isinstance(v, torch._C.Value)
                    and isinstance(v.type(), torch._C.TensorType) and v.type().scalarType() is not None),
                   None)
        if src is None:
            continue
        shape = out_shapes[i] if i < len(out_shapes) else None
        dims = None if shape is None else [d if isinstance(d, int) else None for d in shape]
        try:
            out.setType(src.type().with_sizes(dims))
        except (RuntimeError, TypeError):
            with contextlib.suppress(RuntimeError, TypeError):
                out.setType(src.type().with_sizes(None))


def autograd_function(op: OpDef) -> type[torch.autograd.Function]:
    """A ``torch.autograd.Function`` for ``op`` (one class per OpDef, built once).

    ``F.apply(*inputs, *attributes)`` (trailing attributes may be omitted for their
    defaults): forward runs the fast forward (or the reference), backward differentiates
    the reference, and ``symbolic`` emits ``custom::<name>`` with ``<attr>_<suffix>=value``
    attributes - read by the TorchScript exporter (``dynamo=False``). ``torch.export``
    (``dynamo=True``) ignores ``symbolic`` and traces the forward: while ``graphkit::<name>``
    is defined for this OpDef (:func:`graphkit.export.export` defines it for the call) the
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
            # graphkit::<name> is defined for this OpDef, record it so the exporter's
            # translation writes the same placeholder node.
            defined = _definitions.get(op.name)
            if defined is not None and defined.op == op:
                return getattr(getattr(torch.ops, LIBRARY_NAMESPACE), op.name)(*inputs, *attrs)
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
    """The torch schema of ``graphkit::<name>``, e.g. ``my_add(Tensor a, Tensor b) -> Tensor``."""
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
    """One ``graphkit::<name>`` in torch's (process-global) dispatcher, shared by refcount."""

    def __init__(self, op: OpDef) -> None:
        self.op = op
        self.refs = 0
        self.lib = torch.library.Library(LIBRARY_NAMESPACE, "FRAGMENT")
        qualname = f"{LIBRARY_NAMESPACE}::{op.name}"
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


_definitions: dict[str, _Definition] = {}
_definitions_lock = threading.RLock()


def defined_ops() -> dict[str, OpDef]:
    """The ops graphkit has defined as ``graphkit::<name>`` in this process, by name."""
    with _definitions_lock:
        return {name: d.op for name, d in _definitions.items()}


class TorchOps:
    """graphkit's ops as ``torch.ops.graphkit.<name>``, defined lazily on first use.

    ``ops = TorchOps(registry)`` (default: :func:`~graphkit.ops.default_registry`);
    ``ops.my_add(a, b)`` calls ``torch.ops.graphkit.my_add`` (defining it on first access),
    ``ops.function("my_add")`` is the op's autograd.Function. torch's dispatcher is global, so
    a given op can be defined by one OpDef at a time: another TorchOps using the *same*
    OpDef shares the definition, a different OpDef of the same name is an ExportError.
    ``close()`` (or leaving ``with TorchOps(...) as ops:``) drops this object's definitions;
    the last user of a definition destroys its torch Library.
    """

    def __init__(self, registry: OpRegistry | None = None) -> None:
        if registry is None:
            from graphkit.ops import default_registry

            registry = default_registry()
        self._registry = registry
        self._held: dict[str, _Definition] = {}
        self._closed = False

    @property
    def registry(self) -> OpRegistry:
        return self._registry

    def _opdef(self, name: str) -> OpDef:
        op = self._registry.get(name)
        if op is None:
            raise AttributeError(f"no graphkit op named {name!r}; this registry has "
                                 f"{sorted(o.name for o in self._registry)}")
        return op

    def define(self, name: str) -> torch._ops.OpOverloadPacket:
        """Define ``graphkit::<name>`` now (idempotent) and return ``torch.ops.graphkit.<name>``."""
        if self._closed:
            raise ExportError("this TorchOps is closed", op=f"{LIBRARY_NAMESPACE}::{name}",
                              hint="create a new TorchOps")
        op = self._opdef(name)
        with _definitions_lock:
            if name not in self._held:
                current = _definitions.get(name)
                if current is None:
                    current = _definitions[name] = _Definition(op)
                elif current.op != op:
                    raise ExportError(
                        f"torch op {LIBRARY_NAMESPACE}::{name} is already defined from another "
                        "OpDef of the same name", op=op.qualified_name,
                        hint="close() the other TorchOps first, or use one registry")
                current.refs += 1
                self._held[name] = current
        return getattr(getattr(torch.ops, LIBRARY_NAMESPACE), name)

    def define_all(self) -> None:
        """Define every op of the registry."""
        for op in self._registry:
            self.define(op.name)

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
            for name, d in self._held.items():
                d.refs -= 1
                if d.refs <= 0 and _definitions.get(name) is d:
                    del _definitions[name]
                    d.destroy()
            self._held.clear()
            self._closed = True

    def __enter__(self) -> "TorchOps":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"defined={sorted(self._held)}"
        return f"TorchOps({sorted(o.name for o in self._registry)}, {state})"


# --------------------------------------------------------------------------- dynamo=True


def onnxscript_translation(op: OpDef, domain: str = PLACEHOLDER_DOMAIN) -> Callable[..., Any]:
    """The ``custom_translation_table`` function for ``torch.ops.graphkit.<name>.default``.

    torch's exporter calls it as ``fn(*fx_args, **fx_kwargs)`` and infers an ONNX signature
    from ``inspect.signature`` + ``typing.get_type_hints``: a parameter annotated with
    int/float/str/Sequence[int]/Sequence[float] is an attribute, any other one an input. The
    generated function therefore carries a real ``__signature__`` and ``__annotations__``
    (inputs typed by a TypeVar per type constraint, attributes by their Python type).
    """
    import onnx_ir as ir
    import onnxscript

    schema = onnx_schema(op, domain)
    onnx_op = onnxscript.values.Op(onnxscript.values.Opset(domain, op.since_version), op.name, schema)
    type_vars = {name: typing.TypeVar(name) for name in op.type_constraints}
    ir_types = {AttrType.INT: ir.AttributeType.INT, AttrType.FLOAT: ir.AttributeType.FLOAT,
                AttrType.STRING: ir.AttributeType.STRING, AttrType.INTS: ir.AttributeType.INTS,
                AttrType.FLOATS: ir.AttributeType.FLOATS}
    P = inspect.Parameter
    params, annotations = [], {}
    defaults = {name: (default, has) for name, default, has in _params(op)}
    for p in op.inputs:
        tv = type_vars[p.type]
        ann = typing.Optional[tv] if p.optional else tv
        _, has = defaults[p.name]
        params.append(P(p.name, P.POSITIONAL_OR_KEYWORD, default=None if has else P.empty, annotation=ann))
        annotations[p.name] = ann
    for a in op.attributes:
        default, has = defaults[a.name]
        ann = _PY_TYPES[a.type]
        params.append(P(a.name, P.POSITIONAL_OR_KEYWORD, default=default if has else P.empty,
                        annotation=ann))
        annotations[a.name] = ann
    outs = [type_vars[p.type] for p in op.outputs]
    ret = outs[0] if len(outs) == 1 else tuple.__class_getitem__(tuple(outs))
    annotations["return"] = ret
    signature = inspect.Signature(params, return_annotation=ret)

    def translation(*args: Any, **kwargs: Any) -> Any:
        inputs, attrs = _bind(op, args, kwargs)
        return onnx_op(*inputs, **{name: ir.Attr(name, ir_types[op.attr(name).type], value)
                                   for name, value in attrs.items()})

    translation.__name__ = translation.__qualname__ = op.name
    translation.__doc__ = f"{domain}::{op.name} placeholder node for {LIBRARY_NAMESPACE}::{op.name}."
    translation.__signature__ = signature  # type: ignore[attr-defined]
    translation.__annotations__ = annotations
    translation.op = op  # type: ignore[attr-defined]
    return translation


def custom_translation_table(ops: Iterable[OpDef] | None = None) -> dict[Any, Callable[..., Any]]:
    """``{torch.ops.graphkit.<name>.default: translation}`` for ``ops`` (default: every op
    currently defined through :class:`TorchOps`); ops not defined in torch are skipped."""
    defined = defined_ops()
    table = {}
    for op in (defined.values() if ops is None else ops):
        if defined.get(op.name) is None:
            continue
        target = getattr(getattr(torch.ops, LIBRARY_NAMESPACE), op.name).default
        table[target] = onnxscript_translation(defined[op.name])
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
    """The TorchScript symbolic for ``graphkit::<name>``: emits ``custom::<name>``."""
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


def _symbolic_registry():
    try:
        from torch.onnx._internal.torchscript_exporter import registration
    except ImportError:  # older/newer layouts: fall back to always (un)registering
        return None
    return registration.registry


def symbolic_registered(name: str, opset: int = 18) -> bool:
    """Whether a TorchScript symbolic is registered for ``graphkit::<name>`` at ``opset``."""
    reg = _symbolic_registry()
    return bool(reg is not None and reg.is_registered_op(f"{LIBRARY_NAMESPACE}::{name}", opset))


@contextlib.contextmanager
def scoped_symbolics(ops: Iterable[OpDef] | None = None) -> Iterator[list[str]]:
    """Register the TorchScript symbolics of ``ops`` (default: every op defined through
    :class:`TorchOps`) for the block only; unregistered on exit, even on error. A symbolic
    someone else registered already is left alone. Yields the names registered here."""
    reg = _symbolic_registry()
    added: list[tuple[str, bool]] = []
    try:
        for op in (defined_ops().values() if ops is None else ops):
            qualname = f"{LIBRARY_NAMESPACE}::{op.name}"
            if reg is not None and reg.is_registered_op(qualname, _SYMBOLIC_OPSET):
                continue
            existed = reg is not None and reg.get_function_group(qualname) is not None
            torch.onnx.register_custom_op_symbolic(qualname, torchscript_symbolic(op), _SYMBOLIC_OPSET)
            added.append((qualname, existed))
        yield [name for name, _ in added]
    finally:
        from graphkit.export.aten import forget_empty_group

        for qualname, existed in reversed(added):
            torch.onnx.unregister_custom_op_symbolic(qualname, _SYMBOLIC_OPSET)
            if reg is not None:
                forget_empty_group(qualname, existed)
