"""OpRegistry: the set of op definitions a rewrite, export or session works with."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

import onnx.defs

from graphkit.errors import OpDefinitionError, OpPackageError, UsageError
from graphkit.ops._opdef import OpDef, StandardOp, kernel_domain, split_kernel_domain
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
        # (domain, op type) -> the ops that compute that standard op (two: an error when used)
        self._standard: dict[tuple[str, str], list[tuple[OpDef, StandardOp]]] = {}
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
        for std in op.standard_ops:
            for domain in (("", "ai.onnx") if std.domain in ("", "ai.onnx") else (std.domain,)):
                self._standard.setdefault((domain, std.op_type), []).append((op, std))
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

    def standard_op(self, domain: str, op_type: str) -> tuple[OpDef, StandardOp] | None:
        """(op, its StandardOp) if nodes ``domain::op_type`` are a standard op an op of this
        registry computes (``OpDef.standard_ops``), else None; OpPackageError if two ops claim it."""
        found = self._standard.get((domain, op_type)) if self._standard else None
        if not found:
            return None
        if len(found) > 1:
            (a, std), (b, _) = found[:2]
            raise OpPackageError(f"standard op {std} is claimed by two ops: {a.qualified_name} and "
                                 f"{b.qualified_name}", op=b.qualified_name,
                                 hint="drop it from the standard_ops of one of them, or leave one package out")
        return found[0]

    def standard_op_types(self) -> frozenset[tuple[str, str]]:
        """Every (domain, op type) of a standard op an op here computes ("" and "ai.onnx" both)."""
        return frozenset(self._standard)

    def has_native(self, op: OpDef) -> bool:
        """True if ``op`` has a native kernel here: it declares one and its package brings
        NativeKernels (a loose OpDef's ``native`` flag has no kernel behind it)."""
        package = self.package_of(op)
        return op.native and package is not None and package.native is not None

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
        """Make onnx's checker and shape inference know these ops inside the block.

        Safe from several threads at once. onnx keeps ONE process-wide schema table that
        is not thread-safe: its checker and shape inference read it (and call back into
        Python for graphkit's shape functions, which lets other threads run), so a schema
        added or removed meanwhile can crash the process. graphkit therefore keeps a
        reference-counted table of the schemas it registered, guarded by one process-wide
        lock that works like a reader/writer lock:

        * every thread inside an ``onnx_schemas()`` block is a *reader* of onnx's table;
          readers run concurrently, nothing serialises their checks;
        * a schema identical to one graphkit already registered (same domain, name,
          version, signature and shape function) is shared: its count goes up, nothing is
          written, so in steady state (the same ops again and again) blocks never wait;
        * a schema that is new (or replaces one no block uses any more) is written only
          when no other thread is inside a block (a thread that waits to write while it is
          inside a block itself is not reading at that moment); writers go before new
          readers, so a writer is never starved;
        * a schema whose count drops to zero stays registered until no thread is inside
          a block; it is then removed (so, used from one thread, a block leaves onnx's
          table as it found it), or shared again by the next block that needs it;
        * two registries that define one ``domain::name`` at one version with different
          signatures (or shape functions) in blocks at the same time are an
          :class:`~graphkit.errors.OpDefinitionError`: onnx can only know one of them;
        * a schema registered by someone else than graphkit is used as it is, never
          removed.

        onnx calls made outside any block while another thread registers or removes a
        schema are not covered (graphkit makes none that run graphkit's shape functions).
        """
        items = []
        for op in self:
            for domain in dict.fromkeys((op.domain, self.kernel_domain(op, "native"),
                                         self.kernel_domain(op, "python"))):
                schema = build_schema(op, domain)
                items.append(((domain, op.name, op.since_version), _fingerprint(op, schema), schema))
        held = _SCHEMAS.acquire(items)
        try:
            yield
        finally:
            _SCHEMAS.release(held)


def _fingerprint(op: OpDef, schema: onnx.defs.OpSchema) -> tuple:
    """What makes two schemas of one (domain, name, version) interchangeable."""
    def params(ps):
        return tuple((p.name, p.type_str, int(p.option)) for p in ps)

    attrs = tuple(sorted((name, int(a.type), bool(a.required), a.default_value.SerializeToString())
                         for name, a in schema.attributes.items()))
    constraints = tuple((c.type_param_str, tuple(c.allowed_type_strs)) for c in schema.type_constraints)
    infer = getattr(op.infer_shapes, "__code__", op.infer_shapes)
    return params(schema.inputs), params(schema.outputs), attrs, constraints, infer


class _Slot:
    __slots__ = ("fingerprint", "refs")

    def __init__(self, fingerprint: tuple) -> None:
        self.fingerprint = fingerprint
        self.refs = 0


class _SchemaTable:
    """graphkit's process-wide, reference-counted view of onnx's schema table (see
    :meth:`OpRegistry.onnx_schemas`)."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._slots: dict[tuple[str, str, int], _Slot] = {}
        self._readers: dict[int, int] = {}   # thread ident -> block depth
        self._parked: set[int] = set()       # readers waiting to write (not reading)
        self._waiting_writers = 0

    def _active_others(self, me: int) -> bool:
        return any(t != me and t not in self._parked for t in self._readers)

    def _conflicts(self, items) -> None:
        for key, fp, _ in items:
            slot = self._slots.get(key)
            if slot is not None and slot.refs > 0 and slot.fingerprint != fp:
                domain, name, version = key
                raise OpDefinitionError(
                    f"{domain}::{name} (version {version}) is in use with another definition in "
                    f"this process (from another op registry, on another thread); onnx knows one "
                    f"schema per domain, name and version", op=f"{domain}::{name}",
                    hint="give one of the ops another domain or since_version, or do not use both "
                         "definitions at the same time")

    def _needs_write(self, key, fp) -> bool:
        slot = self._slots.get(key)
        if slot is not None:
            return slot.fingerprint != fp  # refs == 0 here (conflicts were checked)
        domain, name, version = key
        return not onnx.defs.has(name, version, domain)  # else: someone else's schema, used as is

    def _remove(self, key) -> None:
        domain, name, version = key
        del self._slots[key]
        with contextlib.suppress(Exception):
            onnx.defs.deregister_schema(name, version, domain)

    def _flush(self, keep: set = frozenset()) -> None:
        """Remove unused schemas; only while no other thread reads (none inside a block,
        or all of them parked)."""
        for key in [k for k, slot in self._slots.items() if slot.refs == 0 and k not in keep]:
            self._remove(key)

    def acquire(self, items) -> list:
        me = threading.get_ident()
        with self._cv:
            if me not in self._readers:
                while self._waiting_writers:  # writers first: they wait for readers to leave
                    self._cv.wait()
            self._conflicts(items)
            if any(self._needs_write(key, fp) for key, fp, _ in items):
                self._waiting_writers += 1
                parked = me in self._readers
                if parked:
                    self._parked.add(me)
                try:
                    while self._active_others(me):
                        self._cv.wait()
                finally:
                    self._waiting_writers -= 1
                    self._parked.discard(me)
                    self._cv.notify_all()
                # No other thread reads onnx's table now, and none can start: we hold the lock.
                self._conflicts(items)
                self._flush(keep={key for key, _, _ in items})
                for key, fp, schema in items:
                    if not self._needs_write(key, fp):
                        continue
                    if key in self._slots:
                        self._remove(key)
                    try:
                        onnx.defs.register_schema(schema)
                    except Exception as exc:  # noqa: BLE001 - onnx refuses it (e.g. a clash)
                        raise OpDefinitionError(
                            f"onnx refuses the schema of {key[0]}::{key[1]}: {exc}",
                            op=f"{key[0]}::{key[1]}", hint="check the op definition") from exc
                    self._slots[key] = _Slot(fp)
            held = []
            for key, _, _ in dict((k, (k, f, s)) for k, f, s in items).values():
                slot = self._slots.get(key)
                if slot is not None:
                    slot.refs += 1
                    held.append(key)
            self._readers[me] = self._readers.get(me, 0) + 1
            return held

    def release(self, held: list) -> None:
        me = threading.get_ident()
        with self._cv:
            for key in held:
                slot = self._slots.get(key)
                if slot is not None:
                    slot.refs -= 1
            depth = self._readers.get(me, 0) - 1
            if depth > 0:
                self._readers[me] = depth
            else:
                self._readers.pop(me, None)
            if not self._readers:
                self._flush()
            self._cv.notify_all()


_SCHEMAS = _SchemaTable()
