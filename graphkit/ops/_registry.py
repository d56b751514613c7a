"""OpRegistry: the set of op definitions a rewrite, export or session works with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import onnx.defs

from graphkit.errors import OpPackageError, UsageError
from graphkit.ops._opdef import OpDef, kernel_domain, split_kernel_domain
from graphkit.ops._package import OpPackage
from graphkit.ops._schema import build_schema

__all__ = ["OpRegistry"]


class OpRegistry:
    """An explicit, immutable collection of :class:`OpDef` keyed by ``domain::name``.

    Nothing registers itself: build one from packages and loose definitions
    (``OpRegistry([MY_PACKAGE, OTHER_OP])``), or let :func:`graphkit.ops.discover` build
    it from graphkit's ops, installed packages, ``--ops`` and ``$GRAPHKIT_OPS``. Two
    definitions of one ``domain::name`` are an :class:`~graphkit.errors.OpPackageError`
    naming both packages.
    """

    def __init__(self, items: Iterable[OpDef | OpPackage] = ()) -> None:
        self._ops: dict[tuple[str, str], OpDef] = {}
        self._package: dict[tuple[str, str], OpPackage | None] = {}
        self._packages: list[OpPackage] = []
        for item in items:
            if isinstance(item, OpPackage):
                if any(item is p for p in self._packages):
                    continue
                self._packages.append(item)
                for op in item.ops:
                    self._add(op, item)
            elif isinstance(item, OpDef):
                self._add(item, None)
            else:
                raise UsageError(f"an OpRegistry holds OpDef and OpPackage objects, not "
                                 f"{type(item).__name__}")

    def _add(self, op: OpDef, package: OpPackage | None) -> None:
        key = (op.domain, op.name)
        if key in self._ops:
            if self._ops[key] is op and self._package[key] is package:
                return
            first = self._package[key]
            raise OpPackageError(
                f"{op.qualified_name} is defined by two packages: "
                f"{first.describe() if first else 'a loose OpDef'} and "
                f"{package.describe() if package else 'a loose OpDef'}",
                op=op.qualified_name,
                hint="remove one of them (uninstall it, or drop it from --ops / $GRAPHKIT_OPS), "
                     "or give one op another domain")
        self._ops[key] = op
        self._package[key] = package

    def __iter__(self) -> Iterator[OpDef]:
        return iter(self._ops.values())

    def __len__(self) -> int:
        return len(self._ops)

    def __contains__(self, name: object) -> bool:
        if isinstance(name, OpDef):
            return self._ops.get((name.domain, name.name)) is name
        return any(op.name == name or op.qualified_name == name for op in self._ops.values())

    def __repr__(self) -> str:
        return f"OpRegistry({', '.join(op.qualified_name for op in self)})"

    @property
    def packages(self) -> tuple[OpPackage, ...]:
        return tuple(self._packages)

    def package_of(self, op: OpDef) -> OpPackage | None:
        """The package that brought ``op`` (None for a loose definition)."""
        return self._package.get((op.domain, op.name))

    def get(self, name: str) -> OpDef | None:
        """The op called ``name`` (``"rms_norm"`` or ``"acme::rms_norm"``), None if there is none.

        A bare name defined in several domains is a UsageError: qualify it.
        """
        if "::" in name:
            domain, _, op_type = name.rpartition("::")
            return self._ops.get((domain, op_type))
        found = [op for op in self._ops.values() if op.name == name]
        if len(found) > 1:
            raise UsageError(f"op name '{name}' is defined in several domains: "
                             f"{', '.join(op.qualified_name for op in found)}",
                             hint="qualify it as DOMAIN::NAME")
        return found[0] if found else None

    def lookup(self, domain: str, op_type: str) -> OpDef | None:
        """The definition behind a node: its placeholder domain or a kernel domain, else None."""
        op = self._ops.get((domain, op_type))
        if op is not None:
            return op
        kind = split_kernel_domain(domain)
        return self._ops.get((kind[1], op_type)) if kind is not None else None

    def is_placeholder(self, domain: str, op_type: str) -> bool:
        """True if a node ``domain::op_type`` is the placeholder of an op of this registry."""
        return (domain, op_type) in self._ops

    def placeholder_domains(self) -> frozenset[str]:
        """Every domain that holds an op of this registry."""
        return frozenset(domain for domain, _ in self._ops)

    def kernel_domain(self, op: OpDef, kind: str) -> str:
        """The domain a node is bound to for a ``kind`` ("native"/"python") kernel of ``op``.

        Ops served by a prebuilt native library keep their own domain (the library
        registers it)."""
        package = self.package_of(op)
        if kind == "native" and package is not None and package.native is not None \
                and package.native.library is not None:
            return op.domain
        return kernel_domain(kind, op.domain)

    def with_ops(self, *items: OpDef | OpPackage) -> "OpRegistry":
        """A new registry with ``items`` added."""
        loose = [op for op in self if self.package_of(op) is None]
        return OpRegistry([*self._packages, *loose, *items])

    def schemas(self) -> list[onnx.defs.OpSchema]:
        """Schemas of every op in its own domain and in its kernel domains."""
        out = []
        for op in self:
            domains = dict.fromkeys((op.domain, self.kernel_domain(op, "native"),
                                     self.kernel_domain(op, "python")))
            out += [build_schema(op, domain) for domain in domains]
        return out

    @contextlib.contextmanager
    def onnx_schemas(self) -> Iterator[None]:
        """Make onnx's checker and shape inference know these ops, only inside the block."""
        added = []
        try:
            for schema in self.schemas():
                if onnx.defs.has(schema.name, schema.since_version, schema.domain):
                    continue  # an identical registration is already active (nested use)
                onnx.defs.register_schema(schema)
                added.append(schema)
            yield
        finally:
            for schema in reversed(added):
                onnx.defs.deregister_schema(schema.name, schema.since_version, schema.domain)
