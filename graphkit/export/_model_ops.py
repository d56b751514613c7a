"""The op definitions a torch model uses, so an export (or a verification) knows them.

A model built by a factory may create its ops' :class:`~graphkit.export.TorchOps` (or
autograd Functions) itself, from a package imported inside the factory, after any
registry was built from ``--ops``. :func:`registry_for` adds what the model holds to the
registry the caller passed:

- packages and ops of every ``TorchOps``, ``OpRegistry``, ``OpPackage``, ``OpDef`` or
  graphkit autograd Function reachable from the model: attributes of its modules (one
  level into lists, tuples and dicts), and the closure cells and global names of each
  module class's ``forward``;
- ops already defined in torch (through a TorchOps) in this process, for models that call
  ``torch.ops.<namespace>.<name>`` directly.

An op of the model whose ``domain::name`` the registry already defines differently is an
OpPackageError naming both packages (from :class:`~graphkit.ops.OpRegistry`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from graphkit.ops import OpDef, OpPackage, OpRegistry

__all__ = ["model_ops", "registry_for", "merge"]


def _items_of(obj: Any, out: list[OpPackage | OpDef]) -> None:
    from graphkit.export.torch_ops import TorchOps

    if isinstance(obj, TorchOps):
        obj = obj.registry
    if isinstance(obj, OpRegistry):
        out.extend(obj.packages)
        out.extend(op for op in obj if obj.package_of(op) is None)
    elif isinstance(obj, (OpPackage, OpDef)):
        out.append(obj)
    elif isinstance(obj, type) and issubclass(obj, torch.autograd.Function) \
            and isinstance(getattr(obj, "op", None), OpDef):
        out.append(obj.op)


def _candidates(obj: Any) -> Iterable[Any]:
    yield obj
    if isinstance(obj, (list, tuple, set, frozenset)):
        yield from obj
    elif isinstance(obj, dict):
        yield from obj.values()


def _forward_refs(cls: type) -> Iterable[Any]:
    """Objects the class's ``forward`` closes over or names as globals."""
    fn = getattr(cls, "forward", None)
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue
    glob = getattr(fn, "__globals__", {})
    for name in code.co_names:
        if name in glob:
            yield glob[name]


def model_ops(model: Any) -> list[OpPackage | OpDef]:
    """Packages and loose OpDefs the model holds (see the module docstring), in the order
    found, each once."""
    found: list[OpPackage | OpDef] = []
    if not isinstance(model, torch.nn.Module):
        return found
    classes: list[type] = []
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, (torch.Tensor, torch.nn.Module)):
                continue
            for obj in _candidates(value):
                _items_of(obj, found)
        if type(module) not in classes and type(module).__module__ != "torch.nn.modules" \
                and not type(module).__module__.startswith("torch."):
            classes.append(type(module))
    for cls in classes:
        for ref in _forward_refs(cls):
            for obj in _candidates(ref):
                _items_of(obj, found)
    unique: list[OpPackage | OpDef] = []
    for item in found:
        if not any(item is u for u in unique):
            unique.append(item)
    return unique


def _defined_items() -> list[OpPackage | OpDef]:
    """The ops graphkit has defined in torch right now, each with its package (kernels and
    kernel domains come from it), that package cut down to the ops defined: an op of the
    package that no TorchOps defined must not join an export whose registry left it out
    (its ``foreign_ops`` would take over another library's op)."""
    from graphkit.export import torch_ops

    out: list[OpPackage | OpDef] = []
    defined: dict[int, tuple[OpPackage, list[OpDef]]] = {}
    for op, package in torch_ops.defined_packages():
        if package is None:
            out.append(op)
        else:
            defined.setdefault(id(package), (package, []))[1].append(op)
    for package, ops in defined.values():
        if len(ops) == len(package.ops):
            out.append(package)
        else:
            out.append(dataclasses.replace(package, ops=tuple(o for o in package.ops if o in ops)))
    return out


def merge(registry: OpRegistry, items: Iterable[OpPackage | OpDef], *,
          strict: bool = True) -> OpRegistry:
    """``registry`` plus ``items``.

    Ops the registry already holds (the same or equal definitions) are not added again; of
    a package partly held, the other ops come in as loose definitions. An item defining a
    ``domain::name`` differently from the registry (or from an earlier item) is an
    OpPackageError naming both (``strict``), or is left out."""
    extra: list[OpPackage | OpDef] = []
    for item in items:
        if isinstance(item, OpPackage) and any(item is p for p in (*registry.packages, *extra)):
            continue
        ops = item.ops if isinstance(item, OpPackage) else (item,)
        taken = {op.qualified_name: op for e in extra
                 for op in (e.ops if isinstance(e, OpPackage) else (e,))}
        have = [registry.get(op.qualified_name) or taken.get(op.qualified_name) for op in ops]
        if any(h is not None and h != op for h, op in zip(have, ops)):
            if strict:
                extra.append(item)  # OpRegistry names both definitions
            continue
        if all(h is None for h in have):
            extra.append(item)
        else:
            extra.extend(op for h, op in zip(have, ops) if h is None)
    return registry.with_ops(*extra) if extra else registry


def registry_for(model: Any, registry: OpRegistry) -> OpRegistry:
    """``registry`` plus the ops the model uses (see the module docstring)."""
    registry = merge(registry, model_ops(model), strict=True)
    return merge(registry, _defined_items(), strict=False)
