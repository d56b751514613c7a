"""Finding op packages: graphkit's own, installed distributions, ``--ops`` and ``$GRAPHKIT_OPS``.

Every command and API builds its :class:`~graphkit.ops.OpRegistry` here, from (in this order)

1. graphkit's built-in package (the importable ``graphkit_ops``, shipped from custom_ops/),
2. every installed distribution declaring an entry point in the ``graphkit.ops`` group,
3. the packages named in ``$GRAPHKIT_OPS`` (comma-separated),
4. the packages named with ``ops=`` here, then the ``graphkit`` command's ``--ops`` (while
   the command runs, :func:`graphkit._invocation.command_line`: a model factory's
   ``TorchOps()`` sees them as it sees ``$GRAPHKIT_OPS``).

A package is named as ``MODULE``, ``MODULE:ATTR``, ``FILE.py``, ``FILE.py:ATTR``, or a
package ``FOLDER`` (``FOLDER:ATTR``); the attribute (default ``PACKAGE``) is an
:class:`~graphkit.ops.OpPackage` or a function returning one. A folder holding
``__init__.py`` is that package (imported from the folder above it, so ``--ops myops`` run
beside ``myops/`` works); any other name that is not a file is a module name
(:func:`graphkit.usercode.import_user_code` has the whole rule). graphkit's own package
goes through exactly this loader.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from typing import Any

from graphkit._invocation import command_ops
from graphkit.errors import GraphkitError, OpPackageError
from graphkit.ops._package import OpPackage
from graphkit.ops._registry import OpRegistry

__all__ = ["ENTRY_POINT_GROUP", "ENV_VAR", "BUILTIN_PACKAGE", "discover", "load_package",
           "default_registry"]

ENTRY_POINT_GROUP = "graphkit.ops"
ENV_VAR = "GRAPHKIT_OPS"
BUILTIN_PACKAGE = "graphkit_ops"
_DEFAULT_ATTR = "PACKAGE"
_EXAMPLE = "--ops acme_ops, --ops acme_ops:PACKAGE or --ops ./my_ops.py"


def _split(spec: str) -> tuple[str, str]:
    """'pkg.mod:ATTR' -> ('pkg.mod', 'ATTR'); a Windows drive letter is not an attribute."""
    head, sep, tail = spec.rpartition(":")
    if sep and tail.isidentifier() and head and not (len(head) == 1 and head.isalpha()):
        return head, tail
    return spec, _DEFAULT_ATTR


def _as_package(obj: object, where: str) -> OpPackage:
    if callable(obj) and not isinstance(obj, OpPackage):
        try:
            obj = obj()
        except GraphkitError:
            raise
        except Exception as exc:  # the package's own code failed
            raise OpPackageError(f"op package {where} failed to load: {type(exc).__name__}: {exc}",
                                 hint="fix the package (rerun with --debug for the traceback)") from exc
    if not isinstance(obj, OpPackage):
        raise OpPackageError(f"op package {where} is a {type(obj).__name__}, not an OpPackage",
                             hint="point it at a graphkit.ops.OpPackage object "
                                  f"(for example MODULE:{_DEFAULT_ATTR})")
    return obj


def _with_origin(package: OpPackage, origin: str) -> OpPackage:
    if package.origin:
        return package
    object.__setattr__(package, "origin", origin)  # origin is not part of its identity
    return package


def load_package(spec: str, *, origin: str = "--ops") -> OpPackage:
    """Import the op package named by ``spec`` (``MODULE[:ATTR]``, ``FILE.py[:ATTR]`` or ``FOLDER[:ATTR]``).

    Raises OpPackageError (one line, naming the package and its exception) when it cannot
    be imported or does not hold an OpPackage.
    """
    from graphkit.usercode import import_user_code

    if not isinstance(spec, str) or not spec.strip():
        raise OpPackageError(f"empty op package name from {origin}", hint=f"for example {_EXAMPLE}")
    source, attr = _split(spec.strip())
    where = f"'{spec}' (from {origin})"
    try:
        module = import_user_code(source, what=f"op package {where}", failure=OpPackageError,
                                  example=_EXAMPLE)
    except OpPackageError:
        raise
    except GraphkitError as exc:  # not found
        raise OpPackageError(exc.message, path=exc.path, hint=exc.hint) from exc
    if not hasattr(module, attr):
        raise OpPackageError(f"op package {where} has no attribute {attr!r}",
                             hint=f"define {attr} = OpPackage(...) in {source}, or name the "
                                  "attribute: MODULE:ATTR")
    return _with_origin(_as_package(getattr(module, attr), where), origin)


def _entry_points() -> list[tuple[str, Any]]:
    from importlib.metadata import entry_points

    found = entry_points(group=ENTRY_POINT_GROUP)
    return sorted(((f"{ep.name} = {ep.value}", ep) for ep in found), key=lambda e: e[0])


def _load_entry_point(label: str, ep) -> OpPackage:
    dist = getattr(getattr(ep, "dist", None), "name", None)
    where = f"'{label}' (entry point of {dist or 'an installed distribution'})"
    try:
        obj = ep.load()
    except Exception as exc:  # noqa: BLE001 - any import failure of a third-party package
        raise OpPackageError(f"op package {where} failed to import: {type(exc).__name__}: {exc}",
                             hint=f"fix or uninstall {dist or 'the distribution'} "
                                  "(rerun with --debug for the traceback)") from exc
    package = _as_package(obj, where)
    if not package.version and dist:
        from importlib.metadata import version

        try:
            object.__setattr__(package, "version", version(dist))
        except Exception:  # noqa: BLE001 - metadata without a version
            pass
    return _with_origin(package, f"entry point of {dist}" if dist else "entry point")


def env_specs(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The package names listed in ``$GRAPHKIT_OPS`` (comma-separated)."""
    text = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return tuple(s.strip() for s in text.split(",") if s.strip())


def discover(ops: Sequence[str] | str = (), *, builtins: bool = True, entry_points: bool = True,
             environment: bool = True) -> OpRegistry:
    """The registry of every op package graphkit can see (see the module docstring).

    ``ops`` adds packages by name (what ``--ops`` takes); with ``environment``, so do
    ``$GRAPHKIT_OPS`` and, while the ``graphkit`` command runs, its ``--ops``. Results are
    cached per process for the same names and environment.
    """
    if isinstance(ops, str):
        ops = (ops,)
    if environment:
        ops = (*ops, *(spec for spec in command_ops() if spec not in ops))
    # Entry points are listed on every call (about a millisecond), so a package installed
    # or put on sys.path later is seen; loading is cached by what was found.
    points = tuple(_entry_points()) if entry_points else ()
    return _discover(tuple(ops), builtins, points, env_specs() if environment else ())


@functools.lru_cache(maxsize=32)
def _discover(ops: tuple[str, ...], builtins: bool, points: tuple[tuple[str, Any], ...],
              env: tuple[str, ...]) -> OpRegistry:
    packages: list[OpPackage] = []
    if builtins:
        packages.append(load_package(BUILTIN_PACKAGE, origin="built-in"))
    packages += [_load_entry_point(label, ep) for label, ep in points]
    packages += [load_package(spec, origin=f"${ENV_VAR}") for spec in env]
    packages += [load_package(spec, origin="--ops") for spec in ops]
    return OpRegistry(_unique(packages))


def _unique(packages: Iterable[OpPackage]) -> list[OpPackage]:
    """One package reached twice (an entry point and --ops naming the same module) counts once."""
    out: list[OpPackage] = []
    for p in packages:
        if not any(p is q for q in out):
            out.append(p)
    return out


def default_registry() -> OpRegistry:
    """graphkit's ops plus every installed op package and those in ``$GRAPHKIT_OPS``."""
    return discover()
