"""OpRegistry: the set of op definitions a rewrite, export or session works with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import onnx.defs

from graphkit.errors import OpDefinitionError
from graphkit.ops._opdef import NATIVE_DOMAIN, PLACEHOLDER_DOMAIN, PYTHON_DOMAIN, OpDef

__all__ = ["OpRegistry", "default_registry", "KERNEL_DOMAINS"]

# Domains whose nodes graphkit knows how to serve, by the lowering they stand for.
KERNEL_DOMAINS = {NATIVE_DOMAIN: "native", PYTHON_DOMAIN: "python"}


class OpRegistry:
    """An explicit, immutable collection of :class:`OpDef` keyed by op name.

    Nothing registers itself: build one from the definitions you want
    (``OpRegistry(custom_ops.ALL_OPS)``), or take :func:`default_registry`.
    """

    def __init__(self, ops: Iterable[OpDef] = ()) -> None:
        self._ops: dict[str, OpDef] = {}
        for op in ops:
            if op.name in self._ops:
                raise OpDefinitionError(f"op '{op.name}' is defined twice", op=op.qualified_name,
                                        hint="give each definition a unique name")
            self._ops[op.name] = op

    def __iter__(self) -> Iterator[OpDef]:
        return iter(self._ops.values())

    def __len__(self) -> int:
        return len(self._ops)

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def get(self, name: str) -> OpDef | None:
        return self._ops.get(name)

    def lookup(self, domain: str, op_type: str) -> OpDef | None:
        """The definition behind a node in the placeholder or a kernel domain, else None."""
        if domain == PLACEHOLDER_DOMAIN or domain in KERNEL_DOMAINS:
            return self._ops.get(op_type)
        return None

    def with_ops(self, *ops: OpDef) -> "OpRegistry":
        """A new registry with ``ops`` added."""
        return OpRegistry([*self._ops.values(), *ops])

    def schemas(self) -> list[onnx.defs.OpSchema]:
        """Schemas of every op in the placeholder and the kernel domains."""
        return [op.onnx_schema(domain) for op in self for domain in
                (PLACEHOLDER_DOMAIN, *KERNEL_DOMAINS)]

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


def default_registry() -> OpRegistry:
    """A registry holding every op shipped in custom_ops/."""
    import custom_ops

    return OpRegistry(custom_ops.ALL_OPS)
