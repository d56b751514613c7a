"""OpPackage: a set of op definitions shipped together, with the C++ kernels that serve them.

graphkit's own ops are one such package (``graphkit_ops``); a user's ops are another.
Packages are found by :func:`graphkit.ops.discover` and combined into an
:class:`~graphkit.ops.OpRegistry`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from graphkit.errors import OpDefinitionError
from graphkit.ops._opdef import OpDef

__all__ = ["NativeKernels", "OpPackage"]

_HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".inc")
_SOURCE_SUFFIXES = (".cc", ".cpp", ".cxx", ".c")
# What NativeKernels.build_options() may return.
_BUILD_OPTIONS = ("include_dirs", "library_dirs", "libraries")


@dataclass(frozen=True)
class NativeKernels:
    """The C++ ONNX Runtime kernels of an op package.

    Either ``sources`` (paths relative to ``root``) that graphkit compiles on first use
    against its kernel header (``graphkit.runtime.native.include_dir()``), each native op
    defining its kernels with ``GRAPHKIT_OPS(<op name>, ...)``; or ``library``, a prebuilt
    ONNX Runtime custom-op library (it exports ``RegisterCustomOps``) that registers the
    package's native ops in their own domain, which then no other package may use.

    ``headers`` lists the files the sources include (a change rebuilds); by default every
    header under ``root``. ``cxx_flags`` are appended to graphkit's compiler flags.

    A native library the kernels call (a BLAS shipped in a wheel, say) is linked with
    ``libraries`` (names as for ``-l``) found in ``library_dirs``, which also go on the built
    library's run-time search path (rpath), so it loads without ``LD_LIBRARY_PATH``;
    ``include_dirs`` are passed with ``-I`` to the package's compiles. Relative directories
    are taken from ``root``.

    ``build_options``, when given, is called by the build (never at import time) and returns
    more of these three (``{"include_dirs": ..., "library_dirs": ..., "libraries": ...}``):
    the place to import a package only the build needs, such as a BLAS wheel.
    """

    root: str | os.PathLike[str] | None = None
    sources: tuple[str, ...] = ()
    headers: tuple[str, ...] | None = None
    cxx_flags: tuple[str, ...] = ()
    library: str | os.PathLike[str] | None = None
    include_dirs: tuple[str | os.PathLike[str], ...] = ()
    library_dirs: tuple[str | os.PathLike[str], ...] = ()
    libraries: tuple[str, ...] = ()
    build_options: Callable[[], Mapping[str, Sequence[str | os.PathLike[str]]]] | None = None

    def __post_init__(self) -> None:
        for name in ("sources", "cxx_flags", "include_dirs", "library_dirs", "libraries"):
            value = getattr(self, name)
            if isinstance(value, (str, os.PathLike)):
                object.__setattr__(self, name, (value,))
            else:
                object.__setattr__(self, name, tuple(value))
        if isinstance(self.headers, str):
            object.__setattr__(self, "headers", (self.headers,))
        elif self.headers is not None:
            object.__setattr__(self, "headers", tuple(self.headers))
        if (self.library is None) == (not self.sources):
            raise OpDefinitionError("NativeKernels takes either sources or a prebuilt library",
                                    hint="pass sources=(...) with root=..., or library=PATH")
        if self.sources and self.root is None:
            raise OpDefinitionError("NativeKernels sources need a root directory",
                                    hint="pass root=Path(__file__).parent")
        if self.build_options is not None and not callable(self.build_options):
            raise OpDefinitionError(f"build_options is a {type(self.build_options).__name__}, not a function",
                                    hint="pass a function returning {'include_dirs': ..., 'library_dirs': ..., "
                                         "'libraries': ...}")
        if self.library is not None and (self.include_dirs or self.library_dirs or self.libraries
                                         or self.build_options is not None):
            raise OpDefinitionError("include_dirs, library_dirs, libraries and build_options apply to kernel sources, "
                                    "not to a prebuilt library",
                                    hint="link the prebuilt library against what it needs when you build it")
        for lib in self.libraries:
            if not (isinstance(lib, str) and re.fullmatch(r"[A-Za-z0-9_+][A-Za-z0-9_+.\-]*", lib)
                    and not lib.startswith("lib") and not re.search(r"\.(so|a|dylib)(\.[0-9.]*)?$", lib)):
                raise OpDefinitionError(f"library {lib!r} must be a name as passed to -l (e.g. 'openblas' for "
                                        "libopenblas.so)", hint="drop the 'lib' prefix, the suffix and the directory")
        for src in self.sources:
            if Path(src).is_absolute() or ".." in Path(src).parts:
                raise OpDefinitionError(f"kernel source {src!r} must be a relative path inside root",
                                        hint="list files below the package directory")
            if not src.endswith(_SOURCE_SUFFIXES + _HEADER_SUFFIXES):
                raise OpDefinitionError(f"kernel source {src!r} is not a C++ file",
                                        hint=f"use one of {', '.join(_SOURCE_SUFFIXES)}")

    def resolved(self) -> NativeKernels:
        """These kernels with what ``build_options()`` returns added (checked as if given
        directly); ``self`` without build_options. Raises what build_options raises."""
        if self.build_options is None:
            return self
        extra = self.build_options()
        unknown = sorted(set(extra) - set(_BUILD_OPTIONS)) if isinstance(extra, Mapping) else None
        if unknown is None or unknown:
            raise OpDefinitionError(f"build_options() returned {extra!r}", hint=f"return a mapping with keys among "
                                    f"{', '.join(_BUILD_OPTIONS)}")
        merged = {}
        for name in _BUILD_OPTIONS:
            value = extra.get(name, ())
            merged[name] = (*getattr(self, name), *((value,) if isinstance(value, (str, os.PathLike)) else value))
        return dataclasses.replace(self, build_options=None, **merged)

    @property
    def root_path(self) -> Path:
        return Path(self.root) if self.root is not None else Path(self.library).parent

    def _dirs(self, dirs: tuple[str | os.PathLike[str], ...]) -> list[Path]:
        return [Path(d) if Path(d).is_absolute() else self.root_path / d for d in dirs]

    def include_paths(self) -> list[Path]:
        """``include_dirs`` as absolute paths."""
        return self._dirs(self.include_dirs)

    def library_paths(self) -> list[Path]:
        """``library_dirs`` as absolute paths."""
        return self._dirs(self.library_dirs)

    def compiled(self) -> list[Path]:
        """The files compiled (absolute paths), in declaration order."""
        return [self.root_path / s for s in self.sources if s.endswith(_SOURCE_SUFFIXES)]

    def hashed(self) -> list[Path]:
        """Every file whose content the build depends on: sources and headers, sorted."""
        root = self.root_path
        if self.headers is not None:
            headers = {root / h for h in self.headers}
        else:
            headers = {p for p in root.rglob("*") if p.suffix in _HEADER_SUFFIXES and p.is_file()}
        return sorted({root / s for s in self.sources} | headers)


@dataclass(frozen=True)
class OpPackage:
    """Op definitions shipped together, with their native kernels (if any).

    ``name`` identifies the package in messages, in ``graphkit ops`` and in the build
    cache (an identifier such as ``acme_ops``). Every op with ``native=True`` is served by
    ``native``. ``origin`` says where discovery found the package (filled in by it).
    """

    name: str
    ops: tuple[OpDef, ...]
    native: NativeKernels | None = None
    version: str = ""
    doc: str = ""
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.ops, OpDef):
            object.__setattr__(self, "ops", (self.ops,))
        elif not isinstance(self.ops, tuple):
            object.__setattr__(self, "ops", tuple(self.ops))
        problems = []
        if not (isinstance(self.name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", self.name)):
            problems.append(f"package name {self.name!r} must be a name like 'acme_ops'")
        seen: dict[str, OpDef] = {}
        for op in self.ops:
            if not isinstance(op, OpDef):
                problems.append(f"ops holds a {type(op).__name__}, not an OpDef")
                continue
            if op.qualified_name in seen:
                problems.append(f"{op.qualified_name} is defined twice")
            seen[op.qualified_name] = op
        if self.native is not None and not isinstance(self.native, NativeKernels):
            problems.append(f"native is a {type(self.native).__name__}, not NativeKernels")
        native_ops = [op.qualified_name for op in self.ops if isinstance(op, OpDef) and op.native]
        if native_ops and self.native is None:
            problems.append(f"{', '.join(native_ops)} declare native=True but the package has no "
                            "NativeKernels")
        if problems:
            raise OpDefinitionError("; ".join(problems), op=f"package {self.name}",
                                    hint="fix the OpPackage definition")

    def __repr__(self) -> str:
        return f"OpPackage({self.name!r}, ops=[{', '.join(op.qualified_name for op in self.ops)}])"

    def native_ops(self) -> list[OpDef]:
        return [op for op in self.ops if op.native]

    def describe(self) -> str:
        """``name`` plus where it came from, for messages."""
        return f"{self.name} ({self.origin})" if self.origin else self.name
