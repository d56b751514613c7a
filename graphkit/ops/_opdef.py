"""The one definition of a custom op: signature, types, shapes, references, lowerings.

Everything else graphkit does with an op (ONNX schema, torch export hooks,
decompositions, kernel bindings) is derived from an :class:`OpDef`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graphkit.errors import OpDefinitionError

if TYPE_CHECKING:
    from graphkit.rewrite.lowering.builder import Builder

__all__ = [
    "REQUIRED",
    "AttrType",
    "Attr",
    "Param",
    "Decomposition",
    "ForeignOp",
    "OpDef",
    "StandardOp",
    "ChannelLinear",
    "Shape",
    "PLACEHOLDER_DOMAIN",
    "NATIVE_DOMAIN",
    "PYTHON_DOMAIN",
    "DEFAULT_TOLERANCE",
    "tolerance_for",
    "TORCH_NAMESPACE",
    "kernel_domain",
    "split_kernel_domain",
]

PLACEHOLDER_DOMAIN = "custom"
NATIVE_DOMAIN = "graphkit.native"
PYTHON_DOMAIN = "graphkit.python"
TORCH_NAMESPACE = "graphkit"



def kernel_domain(kind: str, domain: str) -> str:
    """The domain of a node bound to a ``kind`` ("native" or "python") kernel of an op in
    ``domain``: ``graphkit.native`` for ``custom`` ops, ``graphkit.native.<domain>`` else."""
    base = {"native": NATIVE_DOMAIN, "python": PYTHON_DOMAIN}[kind]
    return base if domain == PLACEHOLDER_DOMAIN else f"{base}.{domain}"


def split_kernel_domain(domain: str) -> tuple[str, str] | None:
    """Inverse of :func:`kernel_domain`: (kind, op domain), or None for other domains."""
    for kind, base in (("native", NATIVE_DOMAIN), ("python", PYTHON_DOMAIN)):
        if domain == base:
            return kind, PLACEHOLDER_DOMAIN
        if domain.startswith(base + ".") and len(domain) > len(base) + 1:
            return kind, domain[len(base) + 1:]
    return None


# A shape is a list of dims (int, a symbolic name, or None when unknown), or None
# when even the rank is unknown.
Shape = "list[int | str | None] | None"


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


class AttrType(enum.Enum):
    """Attribute types an op may declare, with their ONNX and TorchScript spellings."""

    INT = ("INT", "i", "int")
    FLOAT = ("FLOAT", "f", "float")
    STRING = ("STRING", "s", "str")
    INTS = ("INTS", "i", "int[]")
    FLOATS = ("FLOATS", "f", "float[]")

    def __init__(self, onnx_name: str, symbolic_suffix: str, torch_type: str) -> None:
        self.onnx_name = onnx_name
        self.symbolic_suffix = symbolic_suffix
        self.torch_type = torch_type

    @property
    def is_list(self) -> bool:
        return self in (AttrType.INTS, AttrType.FLOATS)

    def coerce(self, value: Any) -> Any:
        """Return ``value`` as this type's Python value, or raise TypeError."""
        if self is AttrType.INT:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"expected an int, got {value!r}")
            return int(value)
        if self is AttrType.FLOAT:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"expected a float, got {value!r}")
            return float(value)
        if self is AttrType.STRING:
            if isinstance(value, bytes):
                return value.decode()
            if not isinstance(value, str):
                raise TypeError(f"expected a string, got {value!r}")
            return value
        scalar = AttrType.INT if self is AttrType.INTS else AttrType.FLOAT
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"expected a list, got {value!r}")
        return [scalar.coerce(v) for v in value]


@dataclass(frozen=True)
class Attr:
    """A typed attribute; ``default`` is :data:`REQUIRED` when it has none."""

    name: str
    type: AttrType
    default: Any = REQUIRED
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Param:
    """A tensor input or output; ``type`` names an entry of ``OpDef.type_constraints``."""

    name: str
    type: str
    doc: str = ""
    optional: bool = False


@dataclass(frozen=True)
class Decomposition:
    """Rewrites one node into standard ONNX ops, valid for opsets ``[min_opset, max_opset]``.

    ``build(builder, inputs, attrs)`` receives the node's input tensor names (``""`` for an
    absent optional input) and its attributes with defaults filled in, adds nodes through
    the builder and returns the names of the tensors that replace the node's outputs.
    """

    name: str
    build: Callable[["Builder", Sequence[str], Mapping[str, Any]], Sequence[str]]
    min_opset: int
    max_opset: int | None = None

    def supports(self, opset: int) -> bool:
        return opset >= self.min_opset and (self.max_opset is None or opset <= self.max_opset)


# (rtol, atol) per floating dtype for "computes the same as its reference": a lowering
# passes where |got - want| <= atol + rtol * |want| (NaN where the reference is NaN, the
# same infinities and the same sign bits). About two ulps; atol twice the smallest
# subnormal. An op declares its own where its lowerings cannot do better.
DEFAULT_TOLERANCE: Mapping[str, tuple[float, float]] = {
    "float16": (2e-3, 1.2e-7), "bfloat16": (1.6e-2, 1.9e-40),
    "float32": (2.4e-7, 2.9e-45), "float64": (4.5e-16, 1e-323),
}


def tolerance_for(declared: Mapping[str, tuple[float, float]], dtype: str) -> tuple[float, float]:
    """(rtol, atol) for ``dtype`` (a numpy/torch name: "float32"): ``declared`` first, then
    :data:`DEFAULT_TOLERANCE`; (0, 0) for integer and bool dtypes (exact)."""
    if dtype in declared:
        return declared[dtype]
    return DEFAULT_TOLERANCE.get(dtype, (0.0, 0.0))


@dataclass(frozen=True)
class ForeignOp:
    """A torch op of another library that the op also stands for, e.g. torchvision's
    ``torchvision::deform_conv2d`` for graphkit's ``deform_conv2d``.

    ``name`` is its torch name (``namespace::op``) and ``schema`` its torch schema without
    the namespace, as that library declares it. ``to_op(args)`` maps a call, given as the
    schema's arguments by name (tensors as the exporter's values, scalars as Python values),
    to the op's ``(inputs, attributes)``: inputs in declared order (None for an absent
    optional one), attributes by name. Both torch exporters write the op's placeholder for
    every call of the foreign op (:func:`graphkit.export.export`).
    """

    name: str
    schema: str
    to_op: Callable[[Mapping[str, Any]], tuple[Sequence[Any], Mapping[str, Any]]]

    @property
    def namespace(self) -> str:
        return self.name.partition("::")[0]

    @property
    def op_name(self) -> str:
        return self.name.partition("::")[2]


@dataclass(frozen=True)
class StandardOp:
    """A standard ONNX op that computes what the op does, e.g. ai.onnx ``DeformConv`` (opset
    19 on) for graphkit's ``deform_conv2d``: ``graphkit rewrite`` treats its nodes as the
    op's placeholders, so ``--bind``/``--prefer`` apply to them and a node the model's opset
    lacks is repaired (lowered like a placeholder).

    ``to_op(attrs)`` maps the standard node's attributes (by name, as Python values) to the
    op's; it raises ValueError where the node has no equivalent (the message says why).
    ``inputs`` orders the standard node's inputs as the op's (op input ``i`` is standard
    input ``inputs[i]``; None: the same order). ``decomposition`` names the op's
    decomposition that writes this standard op: where the lowering choice picks it at an
    opset the standard op exists in, the node is left as it is (a copy of the op without
    that decomposition simply never keeps one).
    """

    op_type: str
    since_opset: int
    to_op: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    decomposition: str | None = None
    inputs: tuple[int, ...] | None = None
    domain: str = ""

    def __str__(self) -> str:
        return self.op_type if self.domain in ("", "ai.onnx") else f"{self.domain}::{self.op_type}"


@dataclass(frozen=True)
class ChannelLinear:
    """The op's output is linear in ``weight`` per output channel, plus ``bias``:
    ``out[:, c, ...] = f(weight[c, ...]) + bias[c]`` with ``f`` linear (a convolution, a
    deformable one, a matrix product). ``graphkit simplify`` then folds a following
    BatchNormalization, or a Mul/Add/Sub/Div by a per-channel constant, into the weight and
    bias. ``weight`` and ``bias`` name inputs of the op (``bias`` an optional one);
    ``channel_axis`` is the output's channel axis and ``weight_axis`` the weight's.
    """

    weight: str
    bias: str
    channel_axis: int = 1
    weight_axis: int = 0


@dataclass(frozen=True)
class OpDef:
    """Everything graphkit knows about one custom op.

    - ``reference`` is the torch semantics written with torch ops only (so it also runs on
      fake tensors during export); ``torch_forward`` optionally returns a faster forward
      (for example a C++ extension), loaded on first use.
    - ``infer_shapes(shapes, attrs)`` maps input shapes to output shapes (see :data:`Shape`);
      output element types follow from the type constraints.
    - ``python_kernel(*arrays, **attrs)`` is the numpy kernel run by ONNX Runtime through
      onnxruntime-extensions; ``native`` says the C++ kernels of the op's package
      (:class:`~graphkit.ops.NativeKernels`) serve the op.
    - ``domain`` is the ONNX domain of the op's placeholder node (``custom::<name>``), and
      ``torch_namespace`` the ``torch.library`` namespace of its torch op
      (``torch.ops.<torch_namespace>.<name>``).
    - ``standard_ops`` are standard ONNX ops that compute the op (:class:`StandardOp`):
      ``graphkit rewrite`` treats their nodes as the op's placeholders.
    - ``foreign_ops`` are other libraries' torch ops the op also stands for
      (:class:`ForeignOp`): export writes this op's placeholder for their calls.
    - ``tolerance`` is how close its lowerings are to ``reference``, per dtype (see
      :func:`tolerance_for`); the op's doc says where it departs from torch on purpose.
    - ``channel_linear`` says the output is linear per channel in a weight, plus a bias
      (:class:`ChannelLinear`): ``graphkit simplify`` folds a following BatchNormalization
      or per-channel scale and shift into them.
    """

    name: str
    doc: str
    inputs: tuple[Param, ...]
    outputs: tuple[Param, ...]
    type_constraints: Mapping[str, tuple[str, ...]]
    reference: Callable[..., Any]
    infer_shapes: Callable[[list[Any], Mapping[str, Any]], list[Any]]
    attributes: tuple[Attr, ...] = ()
    torch_forward: Callable[[], Callable[..., Any]] | None = None
    python_kernel: Callable[..., Any] | None = None
    native: bool = False
    decompositions: tuple[Decomposition, ...] = ()
    domain: str = PLACEHOLDER_DOMAIN
    since_version: int = 1
    torch_namespace: str = TORCH_NAMESPACE
    foreign_ops: tuple[ForeignOp, ...] = ()
    standard_ops: tuple[StandardOp, ...] = ()
    # (rtol, atol) by dtype name, over DEFAULT_TOLERANCE: how close every lowering is to
    # ``reference`` (tests/test_edges.py checks it on edge values)
    tolerance: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    channel_linear: ChannelLinear | None = None
    # Filled by __post_init__: attribute lookup by name.
    _attr_index: Mapping[str, Attr] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = []
        if not (isinstance(self.name, str) and self.name.isidentifier()):
            problems.append(f"name {self.name!r} is not an identifier")
        if not (isinstance(self.domain, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", self.domain)):
            problems.append(f"domain {self.domain!r} is not a dotted name like 'custom' or 'acme.vision'")
        elif self.domain in ("ai.onnx", "ai.onnx.ml", "com.microsoft") or self.domain.startswith("graphkit."):
            problems.append(f"domain {self.domain!r} is reserved (ONNX, ONNX Runtime or graphkit's kernel domains)")
        if not (isinstance(self.torch_namespace, str) and self.torch_namespace.isidentifier()):
            problems.append(f"torch_namespace {self.torch_namespace!r} is not an identifier")
        names = [p.name for p in self.inputs + self.outputs] + [a.name for a in self.attributes]
        if len(set(names)) != len(names):
            problems.append(f"duplicate input/output/attribute names in {names}")
        for p in self.inputs + self.outputs:
            if p.type not in self.type_constraints:
                problems.append(f"'{p.name}' uses type '{p.type}' missing from type_constraints")
        for a in self.attributes:
            if not a.required:
                try:
                    a.type.coerce(a.default)
                except TypeError as exc:
                    problems.append(f"attribute '{a.name}' default: {exc}")
        for f in self.foreign_ops:
            ns, _, name = f.name.partition("::")
            if not (ns.isidentifier() and name.isidentifier()):
                problems.append(f"foreign op {f.name!r} is not a torch name like 'torchvision::nms'")
            elif not re.match(rf"{re.escape(name)}(\.[A-Za-z_]\w*)?\(", f.schema):
                problems.append(f"foreign op {f.name}: schema {f.schema!r} does not declare {name}(...)")
            elif ns == self.torch_namespace and name == self.name:
                problems.append(f"foreign op {f.name} is the op's own torch name")
            if not callable(f.to_op):
                problems.append(f"foreign op {f.name}: to_op is not callable")
        if len({f.name for f in self.foreign_ops}) != len(self.foreign_ops):
            problems.append("a foreign op is listed twice")
        for std in self.standard_ops:
            if std.domain not in ("", "ai.onnx", "ai.onnx.ml", "com.microsoft"):
                problems.append(f"standard op {std}: domain {std.domain!r} is not a standard one")
            if not callable(std.to_op):
                problems.append(f"standard op {std}: to_op is not callable")
            if std.inputs is not None and sorted(std.inputs) != list(range(len(std.inputs))):
                problems.append(f"standard op {std}: inputs {std.inputs} is not an order of 0..{len(std.inputs) - 1}")
        if len({(s.domain or "ai.onnx", s.op_type) for s in self.standard_ops}) != len(self.standard_ops):
            problems.append("a standard op is listed twice")
        if self.channel_linear is not None:
            by_name = {p.name: p for p in self.inputs}
            lin = self.channel_linear
            if lin.weight not in by_name:
                problems.append(f"channel_linear: weight {lin.weight!r} is not an input")
            if lin.bias not in by_name:
                problems.append(f"channel_linear: bias {lin.bias!r} is not an input")
        seen_opt = False
        for p in self.inputs:
            if seen_opt and not p.optional:
                problems.append(f"required input '{p.name}' follows an optional one")
            seen_opt = seen_opt or p.optional
        if problems:
            raise OpDefinitionError("; ".join(problems), op=self.qualified_name,
                                    hint="fix the op definition")
        object.__setattr__(self, "_attr_index", {a.name: a for a in self.attributes})

    @property
    def qualified_name(self) -> str:
        return f"{self.domain}::{self.name}"

    def attr(self, name: str) -> Attr:
        return self._attr_index[name]

    def resolve_attrs(self, given: Mapping[str, Any], *, where: str | None = None) -> dict[str, Any]:
        """Check ``given`` against the declared attributes and fill in defaults."""
        unknown = sorted(set(given) - set(self._attr_index))
        if unknown:
            raise OpDefinitionError(
                f"unknown attribute(s) {unknown}; {self.name} takes {sorted(self._attr_index) or 'none'}",
                node=where, op=self.qualified_name, hint="remove them or fix the exporter")
        out: dict[str, Any] = {}
        for a in self.attributes:
            if a.name in given:
                try:
                    out[a.name] = a.type.coerce(given[a.name])
                except TypeError as exc:
                    raise OpDefinitionError(
                        f"attribute '{a.name}' must be {a.type.onnx_name}: {exc}",
                        node=where, op=self.qualified_name, hint="fix the attribute's type") from exc
            elif a.required:
                raise OpDefinitionError(
                    f"missing required attribute '{a.name}'", node=where, op=self.qualified_name,
                    hint=f"add '{a.name}' ({a.type.onnx_name}) to the node")
            else:
                out[a.name] = a.type.coerce(a.default)
        return out

    def decomposition_for(self, opset: int) -> Decomposition | None:
        """The first decomposition valid at ``opset`` (declaration order is preference order)."""
        return next((d for d in self.decompositions if d.supports(opset)), None)
