"""Build (on first use) and locate the native ONNX Runtime kernel libraries of op packages.

Every :class:`~graphkit.ops.OpPackage` with ``NativeKernels(sources=...)`` is compiled with
the system C++ compiler (``$CXX`` overrides ``c++``) against graphkit's kernel header
(:func:`include_dir`, ``#include <graphkit/kernel.h>``); each source becomes an object
file cached by content (the source, the package's headers, graphkit's headers, the
compiler's ``--version``, the flags and the CPU: the build uses ``-march=native``).

A session links ONE library for the set of packages it needs: their objects, graphkit's
``kernel.cc``/``register.cc`` and a generated registration table that registers every
native op in its placeholder domain (``op.domain``) and its native kernel domain, each
domain once, so ops of several packages may share a domain. The link uses
``-Wl,--no-undefined``: a package declaring a native op its sources do not define
(``GRAPHKIT_OPS(name, ...)``) is a clear :class:`~graphkit.errors.NativeBuildError`.

Everything lives in graphkit's build cache (:mod:`graphkit.build_cache`): locked,
published atomically, checksummed before use, so killed or concurrent builds never
leave a broken library in use.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import importlib.resources
import json
import os
import platform
import re
import shlex
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from graphkit import build_cache
from graphkit.errors import GraphkitError, NativeBuildError

if TYPE_CHECKING:
    from graphkit.ops import NativeKernels, OpPackage, OpRegistry

__all__ = ["CXX_FLAGS", "LINK_FLAGS", "LIBRARY_NAME", "cache_dir", "include_dir", "library_for",
           "library_path", "op_types", "package_id", "served_ops"]

# Compile flags of every object (graphkit's and packages'); packages add their cxx_flags.
CXX_FLAGS: tuple[str, ...] = (
    "-O3",
    "-march=native",
    "-std=c++17",
    "-fPIC",
    "-fvisibility=hidden",
    "-pthread",
)
LINK_FLAGS: tuple[str, ...] = ("-shared", "-pthread", "-Wl,--no-undefined")
LIBRARY_NAME = "libgraphkit_ops.so"

_KEY_VERSION = "2"  # bump when the build recipe or the cache layout changes
_BUILD_TIMEOUT = 600  # seconds per compiler run
_STDERR_TAIL = 2000  # characters of compiler output kept in messages that cannot be parsed
_HINT = "install a C++17 compiler (e.g. `apt-get install g++`) or point $CXX at one"
_DIAGNOSTIC = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?:fatal )?error:\s*(?P<msg>.*)$")


def cache_dir() -> Path:
    """The cache root: ``$GRAPHKIT_CACHE_DIR`` or ``~/.cache/graphkit``."""
    return build_cache.cache_root()


def _cpp_dir() -> Path:
    root = Path(str(importlib.resources.files("graphkit.runtime"))) / "cpp"
    if not root.is_dir():
        raise NativeBuildError(f"graphkit's C++ kernel sources are not a directory on disk ({root})",
                               hint="install graphkit from a source checkout or an unzipped wheel")
    return root


def include_dir() -> Path:
    """The directory to pass with ``-I`` so that ``#include <graphkit/kernel.h>`` works."""
    return _cpp_dir() / "include"


def _graphkit_headers() -> list[Path]:
    return sorted((include_dir() / "graphkit").glob("*.h"))


def package_id(package: OpPackage) -> str:
    """The package's name as a C identifier (``GRAPHKIT_PACKAGE_ID``)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", package.name)


def _opset_symbol(package: OpPackage, op_name: str) -> str:
    return f"graphkit_opset__{package_id(package)}__{op_name}"


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CXX") or "c++")


@functools.lru_cache(maxsize=8)
def _compiler_version(compiler: tuple[str, ...]) -> str:
    try:
        proc = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"cannot run the C++ compiler {shlex.join(compiler)!r}: {exc}", hint=_HINT) from exc
    return f"{proc.returncode}\n{proc.stdout}{proc.stderr}"


def _cpu_id() -> str:
    """What -march=native depends on: the architecture and the CPU's feature flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.machine()}\n{flags}"


# ---- objects --------------------------------------------------------------------------


@dataclass
class _Unit:
    """One source to compile into a cached object."""

    label: str                 # the package name ("graphkit" for graphkit's own files)
    source: Path
    flags: tuple[str, ...]
    depends: tuple[Path, ...]  # files whose content the object depends on (source included)
    key: str = ""

    @property
    def entry(self) -> build_cache.Entry:
        return build_cache.Entry("native/obj", self.key)

    @property
    def name(self) -> str:
        return self.source.stem + ".o"


def _base_key(compiler: list[str], extra_flags: Sequence[str]) -> str:
    return build_cache.hash_key(_KEY_VERSION, shlex.join(compiler), _compiler_version(tuple(compiler)),
                                shlex.join(CXX_FLAGS), shlex.join(extra_flags), _cpu_id(),
                                *_graphkit_headers())


def _build_options(package: OpPackage) -> NativeKernels:
    """``package.native`` with its ``build_options()`` added; NativeBuildError naming the
    package when they cannot be computed (a module only the build needs is missing)."""
    try:
        return package.native.resolved()
    except ImportError as exc:
        module = exc.name or str(exc)
        raise NativeBuildError(f"package {package.name}: building its native kernels needs the Python module "
                               f"'{module}', which cannot be imported: {exc}",
                               hint=f"install the Python package that provides '{module}' into this environment, "
                                    "or lower the ops another way (--bind python, or decompose)") from exc
    except GraphkitError as exc:
        raise NativeBuildError(f"package {package.name}: {exc.message}", hint=exc.hint) from exc
    except Exception as exc:  # noqa: BLE001 - the package's own code: any failure is the package's
        raise NativeBuildError(f"package {package.name}: NativeKernels(build_options=...) raised "
                               f"{type(exc).__name__}: {exc}", hint="fix the package's build_options") from exc


def _units(packages: Sequence[OpPackage], natives: Sequence[NativeKernels], base: str,
           extra_flags: Sequence[str]) -> list[_Unit]:
    inc = ("-I", str(include_dir()))
    cpp = _cpp_dir()
    units = [_Unit("graphkit", cpp / name, (*CXX_FLAGS, *inc, *extra_flags), (cpp / name,))
             for name in ("kernel.cc", "register.cc")]
    for package, native in zip(packages, natives):
        flags = (*CXX_FLAGS, *inc, *(f"-I{d}" for d in native.include_paths()),
                 f"-DGRAPHKIT_PACKAGE_ID={package_id(package)}", *native.cxx_flags, *extra_flags)
        try:
            depends = tuple(native.hashed())
            for src in native.compiled():
                units.append(_Unit(package.name, src, flags, (src, *depends)))
        except OSError as exc:
            raise NativeBuildError(f"package {package.name}: cannot read its kernel sources: {exc}",
                                   hint="check NativeKernels(root=..., sources=...)") from exc
    for unit in units:
        try:
            unit.key = build_cache.hash_key(base, unit.label, unit.source.name, shlex.join(unit.flags),
                                            *(p.read_bytes() for p in unit.depends), *map(str, unit.depends))
        except OSError as exc:
            raise NativeBuildError(f"package {unit.label}: cannot read {exc.filename}: {exc.strerror}",
                                   hint="check NativeKernels(root=..., sources=..., headers=...)") from exc
    return units


def _run(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    """Run the compiler; it (and whatever it starts) dies with graphkit, SIGKILL included."""
    try:
        return build_cache.run_tool(cmd, timeout=_BUILD_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"cannot run the C++ compiler {cmd[0]!r} ({what}): {exc}", hint=_HINT) from exc


def _write_log(entry: build_cache.Entry, name: str, cmd: list[str], proc: subprocess.CompletedProcess) -> Path:
    log = entry.path(name)
    try:
        log.write_text(f"$ {shlex.join(cmd)}\n# exit status {proc.returncode}\n{proc.stdout}{proc.stderr}")
    except OSError:
        pass
    return log


def _compile(unit: _Unit, compiler: list[str], rebuild: bool) -> Path:
    entry = unit.entry
    if not rebuild and (found := entry.valid(unit.name, elf="object")) is not None:
        return found
    with entry.lock():
        if not rebuild and (found := entry.valid(unit.name, elf="object")) is not None:  # built meanwhile
            return found
        tmp = entry.temp(unit.name)
        try:
            cmd = [*compiler, *unit.flags, "-c", str(unit.source), "-o", str(tmp)]
            proc = _run(cmd, f"compiling {unit.source.name}")
            if proc.returncode != 0 or tmp.stat().st_size == 0:
                _raise_if_disk_full(entry, proc)
                log = _write_log(entry, unit.source.stem + ".log", cmd, proc)
                raise _compile_error(unit, proc, log)
            return entry.publish(tmp, unit.name, source=str(unit.source), package=unit.label)
        finally:
            tmp.unlink(missing_ok=True)


def _raise_if_disk_full(entry: build_cache.Entry, proc: subprocess.CompletedProcess) -> None:
    """A compiler or linker that failed for want of space is exit 4, not a C++ error."""
    error = build_cache.full_disk_error(entry.dir, f"{proc.stdout}{proc.stderr}")
    if error is not None:
        raise error


def _compile_error(unit: _Unit, proc: subprocess.CompletedProcess, log: Path) -> NativeBuildError:
    output = f"{proc.stderr}\n{proc.stdout}"
    for line in output.splitlines():
        m = _DIAGNOSTIC.match(line.strip())
        if m:
            where = f"{m['file']}:{m['line']}" + (f":{m['col']}" if m["col"] else "")
            return NativeBuildError(f"package {unit.label}: {where}: error: {m['msg'].strip()}",
                                    hint=f"fix the C++ source; the full compiler output is in {log}")
    tail = output.strip()[-_STDERR_TAIL:]
    return NativeBuildError(
        f"package {unit.label}: compiling {unit.source} failed (exit status {proc.returncode})"
        + (f": {tail}" if tail else ""),
        hint=f"{_HINT}; the full compiler output is in {log}")


# ---- the registration table and the link ----------------------------------------------------


def _link_libraries(natives: Sequence[NativeKernels], relocatable: bool = False) -> tuple[list[str], list[str]]:
    """The packages' ``-L``/rpath/``-l`` link arguments, and what identifies the libraries
    they name (path, size, mtime) for the cache key: a reinstalled BLAS relinks.
    ``relocatable``: the run-time search path is the library's own directory (``$ORIGIN``),
    where whoever ships it puts the libraries it links, instead of where they are now."""
    args: list[str] = []
    identity: list[str] = []
    for native in natives:
        dirs = native.library_paths()
        for d in dirs:
            args += [f"-L{d}", "-Wl,-rpath,$ORIGIN" if relocatable else f"-Wl,-rpath,{d}"]
        for name in native.libraries:
            args.append(f"-l{name}")
            for d in dirs:
                for candidate in (d / f"lib{name}.so", d / f"lib{name}.a"):
                    with contextlib.suppress(OSError):
                        st = candidate.stat()
                        identity.append(f"{candidate}:{st.st_size}:{st.st_mtime_ns}")
    return list(dict.fromkeys(args)), identity



def _table(packages: Sequence[OpPackage], registry: OpRegistry | None) -> tuple[str, list[str]]:
    """The generated C++ registration table and the ``domain::name`` pairs it serves."""
    from graphkit.ops._opdef import kernel_domain

    domains: dict[str, list[str]] = {}
    served: list[str] = []
    symbols: list[str] = []
    for package in packages:
        for op in package.native_ops():
            symbol = _opset_symbol(package, op.name)
            symbols.append(symbol)
            kd = registry.kernel_domain(op, "native") if registry is not None else kernel_domain("native", op.domain)
            for domain in dict.fromkeys((op.domain, kd)):
                if symbol not in domains.setdefault(domain, []):
                    domains[domain].append(symbol)
                    served.append(f"{domain}::{op.name}")
    lines = ["// Generated by graphkit.runtime.native: the registration table of one library.",
             '#include "graphkit/kernel.h"', ""]
    lines += [f'extern "C" const gk::OpSet* {s}(void);' for s in dict.fromkeys(symbols)]
    lines += ["", "namespace gk {", "namespace {"]
    for i, (_, syms) in enumerate(domains.items()):
        lines.append(f"const OpSetFn kDomain{i}[] = {{{', '.join('&' + s for s in syms)}}};")
    lines += ["}  // namespace", "extern const DomainEntry kRegistration[] = {"]
    for i, (domain, syms) in enumerate(domains.items()):
        lines.append(f"    {{{json.dumps(domain)}, kDomain{i}, {len(syms)}}},")
    if not domains:
        lines.append("    {nullptr, nullptr, 0},")
    lines += ["};", f"extern const size_t kRegistrationCount = {len(domains)};",
              f"extern const char* const kServedOps = {json.dumps(','.join(served))};", "}  // namespace gk", ""]
    return "\n".join(lines), served


def _link_error(packages: Sequence[OpPackage], proc: subprocess.CompletedProcess, log: Path) -> NativeBuildError:
    output = f"{proc.stderr}\n{proc.stdout}"
    missing, doubled = [], []
    for package in packages:
        for op in package.native_ops():
            symbol = _opset_symbol(package, op.name)
            if re.search(rf"undefined (reference|symbol)[^\n]*\b{re.escape(symbol)}\b", output):
                missing.append(f"package {package.name} declares native kernels for {op.qualified_name} "
                               f"but its sources define no GRAPHKIT_OPS({op.name}, ...)")
            elif re.search(rf"multiple definition[^\n]*\b{re.escape(symbol)}\b", output):
                doubled.append(f"package {package.name} defines GRAPHKIT_OPS({op.name}, ...) more than once")
    if missing or doubled:
        return NativeBuildError("; ".join(missing + doubled),
                                hint="add GRAPHKIT_OPS(<op name>, gk::make_op<Kernel>(), ...) to the package's "
                                     f"sources, or set native=False on the op (linker output: {log})")
    undefined = re.findall(r"undefined (?:reference|symbol)[^`'\"]*[`'\"]([^`'\"]+)[`'\"]", output)
    names = ", ".join(p.name for p in packages)
    if undefined:
        return NativeBuildError(f"linking the kernels of {names} failed: undefined symbol "
                                f"{', '.join(dict.fromkeys(undefined))}",
                                hint=f"define it in the package's sources or link what defines it via "
                                     f"NativeKernels(cxx_flags=...); the full linker output is in {log}")
    tail = output.strip()[-_STDERR_TAIL:]
    return NativeBuildError(f"linking the kernels of {names} failed (exit status {proc.returncode})"
                            + (f": {tail}" if tail else ""), hint=f"{_HINT}; the full linker output is in {log}")


def library_for(packages: Iterable[OpPackage], registry: OpRegistry | None = None, *,
                extra_flags: Sequence[str] = (), rebuild: bool = False, relocatable: bool = False) -> Path:
    """The library serving every native op of ``packages`` (compiled ones), building it if needed.

    ``registry`` decides the kernel domains (default: graphkit's naming). ``extra_flags``
    are added to every compile (part of the cache key). ``relocatable``: a library for
    shipping (``graphkit deploy``), which finds the libraries the packages link (a BLAS) in
    its own directory: it loads only once they are copied beside it, so it is not tried here.
    Raises NativeBuildError.
    """
    pkgs = sorted({id(p): p for p in packages}.values(), key=lambda p: p.name)
    for p in pkgs:
        if p.native is None or p.native.library is not None:
            raise NativeBuildError(f"package {p.name} has no kernel sources to build",
                                   hint="prebuilt libraries are registered as they are")
    natives = [_build_options(p) for p in pkgs]
    compiler = _compiler()
    base = _base_key(compiler, extra_flags)
    units = _units(pkgs, natives, base, extra_flags)
    table, _ = _table(pkgs, registry)
    link_args, link_identity = _link_libraries(natives, relocatable)
    key = build_cache.hash_key(base, table, shlex.join(LINK_FLAGS), shlex.join(link_args), *link_identity,
                               *(u.key for u in units))
    entry = build_cache.Entry("native/lib", key)
    if not rebuild and (found := entry.valid(LIBRARY_NAME, elf="shared")) is not None:
        return found
    with entry.lock():
        if not rebuild and (found := entry.valid(LIBRARY_NAME, elf="shared")) is not None:
            return found  # built meanwhile
        # Not there, or damaged (size, sha256 or ELF structure): build it anew.
        entry.invalidate(LIBRARY_NAME)
        lib = _build_library(entry, pkgs, units, compiler, table, extra_flags, link_args, rebuild)
        problem = None if relocatable else _load_problem(lib)
        if problem is not None:
            entry.invalidate(LIBRARY_NAME)
            raise NativeBuildError(
                f"the native kernel library {lib} was just built but cannot be loaded: {problem}",
                path=str(lib), hint=f"check the C++ compiler ($CXX, now {shlex.join(compiler)!r}) and its "
                                    f"linker; delete {entry.dir} and run again")
        return lib


def _load_problem(lib: Path) -> str | None:
    """Why a freshly built library cannot be loaded (dlopen's message), None when it loads.
    Tried in a child process: never this one, which may hold an older library of that name."""
    import sys

    try:
        proc = build_cache.run_tool([sys.executable, "-S", "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])",
                                     str(lib)], timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return None if isinstance(exc, OSError) else str(exc)
    if proc.returncode == 0:
        return None
    last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return last.removeprefix("OSError: ")


def _build_library(entry: build_cache.Entry, pkgs: Sequence[OpPackage], units: list[_Unit],
                   compiler: list[str], table: str, extra_flags: Sequence[str], link_args: Sequence[str],
                   rebuild: bool) -> Path:
    with build_cache.announce(", ".join(p.name for p in pkgs) or "no packages"):
        workers = max(1, min(len(units), os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            futures = [pool.submit(_compile, u, compiler, rebuild) for u in units]
            objects = [f.result() for f in futures]  # the first failure, in source order
        table_src = entry.temp("registration.cc")
        table_obj = entry.temp("registration.o")
        tmp = entry.temp(LIBRARY_NAME)
        try:
            table_src.write_text(table)
            cmd = [*compiler, *CXX_FLAGS, "-I", str(include_dir()), *extra_flags, "-x", "c++", "-c",
                   str(table_src), "-o", str(table_obj)]
            proc = _run(cmd, "compiling the registration table")
            if proc.returncode != 0:
                _raise_if_disk_full(entry, proc)
                raise _compile_error(_Unit("graphkit", entry.path("registration.cc"), (), ()), proc,
                                     _write_log(entry, "registration.log", cmd, proc))
            cmd = [*compiler, *LINK_FLAGS, *map(str, objects), str(table_obj), *link_args, "-o", str(tmp)]
            proc = _run(cmd, "linking")
            if proc.returncode != 0 or tmp.stat().st_size == 0:
                _raise_if_disk_full(entry, proc)
                raise _link_error(pkgs, proc, _write_log(entry, "link.log", cmd, proc))
            problem = build_cache.elf_problem(tmp, "shared")
            if problem is not None:
                raise NativeBuildError(f"the linker wrote a damaged library {tmp}: {problem}",
                                       path=str(tmp), hint=f"{_HINT}; then run again")
            os.chmod(tmp, 0o755)
            with contextlib.suppress(OSError):  # kept for reading, never compiled from
                entry.path("registration.cc").write_text(table)
            return entry.publish(tmp, LIBRARY_NAME, packages=[p.name for p in pkgs])
        finally:
            tmp.unlink(missing_ok=True)
            table_obj.unlink(missing_ok=True)
            table_src.unlink(missing_ok=True)


def _builtin_package() -> OpPackage:
    from graphkit.ops._discovery import BUILTIN_PACKAGE, load_package

    return load_package(BUILTIN_PACKAGE, origin="built-in")


def library_path(*, rebuild: bool = False) -> Path:
    """The library of graphkit's own ops (``graphkit_ops``), compiling it first if needed.

    It is the library a session links when graphkit's ops are the only native ones it
    needs. ``rebuild=True`` compiles even if valid cached files exist.
    """
    return library_for([_builtin_package()], rebuild=rebuild)


def op_types(path: Path) -> dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]]:
    """``domain::name`` -> the (input, output) element types (ONNX TensorProto numbers) of each
    kernel of the library at ``path``, read from its ``graphkit_native_op_types()``."""
    fn = ctypes.CDLL(str(path)).graphkit_native_op_types
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    out: dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]] = {}
    for entry in filter(None, (fn() or b"").decode().split(";")):
        name, _, kernels = entry.partition("=")
        out[name] = [tuple(tuple(int(t) for t in side.split(",") if t) for side in k.split(">"))
                     for k in kernels.split("|") if k]
    return out


def served_ops(path: Path | None = None) -> frozenset[str]:
    """``domain::name`` of every op the library at ``path`` registers (default:
    :func:`library_path`), read from its ``graphkit_native_ops()``."""
    lib = ctypes.CDLL(str(path if path is not None else library_path()))
    fn = lib.graphkit_native_ops
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    names = (fn() or b"").decode()
    return frozenset(n for n in names.split(",") if n)
