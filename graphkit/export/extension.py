"""Build and load torch C++ extensions shipped as package data, once per machine.

:func:`load_extension` compiles the sources with ``torch.utils.cpp_extension.load`` into
``$GRAPHKIT_CACHE_DIR/torch_ext/<name>-<key>/`` (default ``~/.cache/graphkit``), where
``key`` hashes the sources, the torch and Python versions and the compiler flags, so a
machine compiles each source version once. The cache is graphkit's build cache
(:mod:`graphkit.build_cache`, shared with the native kernel builds): builds are serialised
by the entry's lock (several processes may ask at once); a finished build is marked by
``graphkit-build.json``, written last, which records the library's size and sha256, and
later loads import the library directly (after checking it against that record) without
running the build system; a corrupt or half-written entry is rebuilt. Failures become
:class:`~graphkit.errors.NativeBuildError` with the compiler's last lines and a hint.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.machinery
import importlib.resources
import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator, Sequence
from pathlib import Path

from graphkit import build_cache
from graphkit.errors import NativeBuildError

__all__ = ["load_extension", "cache_dir", "extension_build_dir", "CXX_FLAGS"]

log = logging.getLogger(__name__)

# -O3, no debug info, no asserts. The build is dominated by parsing torch's headers, which
# the sources keep small (see custom_ops/*/..._torch.cpp); these flags do not lengthen it.
CXX_FLAGS: tuple[str, ...] = ("-O3", "-DNDEBUG", "-g0")
_MARKER = "graphkit-build.json"
_LOG = "build.log"
_KEY_VERSION = "2"  # bump when the layout of the cache or the build recipe changes
_TAIL_LINES = 25
_BUILD_TIMEOUT = 1200  # seconds: torch's headers make a cold build slow on small machines

_thread_lock = threading.Lock()


cache_dir = build_cache.cache_root  # graphkit's cache root
_file_lock = build_cache.file_lock


def load_extension(name: str, package: str, sources: Sequence[str]) -> types.ModuleType:
    """Build (once per machine and source version) and import a torch C++ extension.

    ``sources`` are file names inside the importable ``package`` (read with
    importlib.resources, so installed and zipped packages work); ``.cpp``/``.cc`` files are
    compiled, anything else (headers) is copied beside them. The loaded module is cached
    in-process. Raises NativeBuildError when the sources are missing or do not compile.
    """
    if not name.isidentifier():
        raise NativeBuildError(f"extension name {name!r} is not a Python identifier",
                               hint="use letters, digits and underscores")
    if isinstance(sources, str):
        sources = [sources]
    return _load_cached(name, package, tuple(sources))


@functools.cache
def _load_cached(name: str, package: str, sources: tuple[str, ...]) -> types.ModuleType:
    return _load(name, package, sources)


def _read_sources(package: str, sources: tuple[str, ...]) -> dict[str, bytes]:
    if not sources:
        raise NativeBuildError(f"extension sources for package {package} are empty",
                               hint="list at least one .cpp file")
    try:
        root = importlib.resources.files(package)
    except (ModuleNotFoundError, TypeError) as exc:
        raise NativeBuildError(f"cannot find package {package!r} holding the extension sources",
                               hint=f"install the package {package} that holds the extension sources") from exc
    out: dict[str, bytes] = {}
    for src in sources:
        if Path(src).name != src:
            raise NativeBuildError(f"extension source {src!r} must be a plain file name in {package}",
                                   hint="list files that sit beside the package's __init__.py")
        try:
            out[src] = (root / src).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise NativeBuildError(f"extension source {src} not found in package {package}",
                                   hint="reinstall graphkit so its package data (*.cpp) is present"
                                   ) from exc
    return out


def _build_key(name: str, contents: dict[str, bytes]) -> str:
    import torch

    return build_cache.hash_key(
        _KEY_VERSION, name, torch.__version__, getattr(torch.version, "git_version", ""),
        sys.implementation.cache_tag, platform.machine(), sys.platform,
        os.environ.get("CXX", "c++"), *CXX_FLAGS,
        *(part for src in sorted(contents) for part in (src, contents[src])))


def _entry(name: str, key: str) -> build_cache.Entry:
    return build_cache.Entry("torch_ext", f"{name}-{key}")


def extension_build_dir(name: str, package: str, sources: Sequence[str]) -> Path:
    """Where :func:`load_extension` builds (or has built) this extension."""
    contents = _read_sources(package, tuple(sources))
    return _entry(name, _build_key(name, contents)).dir


def _load(name: str, package: str, sources: tuple[str, ...]) -> types.ModuleType:
    import torch  # noqa: F401  (libtorch must be loaded before the extension)

    contents = _read_sources(package, sources)
    key = _build_key(name, contents)
    entry = _entry(name, key)
    build_dir = entry.dir
    module_name = f"graphkit_{name}_{key[:8]}"

    module = _import_marked(build_dir, module_name)
    if module is not None:
        return module
    with _thread_lock, entry.lock():
        module = _import_marked(build_dir, module_name)  # built while we waited
        if module is not None:
            return module
        _clear_outputs(entry)
        module = _build(name, package, contents, build_dir, module_name)
        _seal(entry)
        return module


def _clear_outputs(entry: build_cache.Entry) -> None:
    """Before a build: remove the marker, then every output of an earlier build (a library,
    objects, ninja's state) so that the build system cannot call a damaged one up to date."""
    entry.invalidate("", record=_MARKER)
    if not entry.dir.is_dir():
        return
    for p in entry.dir.iterdir():
        if p.is_file() and (p.suffix in (".so", ".o", ".pyd", ".dylib") or p.name in (".ninja_log", ".ninja_deps")):
            with contextlib.suppress(OSError):
                p.unlink()


def _seal(entry: build_cache.Entry) -> None:
    """Make sure the marker records the library's size and sha256 before the lock is
    released (a build step that wrote a marker without them gets them added)."""
    info = entry.record("", record=_MARKER)
    library = info.get("library")
    if isinstance(library, str) and not {"size", "sha256"} <= info.keys() and entry.path(library).is_file():
        entry.write_record(library, record=_MARKER, **info)


def _import_marked(build_dir: Path, module_name: str) -> types.ModuleType | None:
    """The finished build's module, or None when there is none (or it is unusable: the
    library does not match the size and sha256 its marker records)."""
    entry = build_cache.Entry.at(build_dir)
    info = entry.record("", record=_MARKER)
    library = info.get("library")
    if info.get("module") != module_name or not isinstance(library, str):
        return None
    lib = entry.valid(library, record=_MARKER, elf="shared")
    if lib is None:  # checked before it is mapped: a truncated library would die of SIGBUS
        log.warning("cached extension %s is missing or corrupt; rebuilding", build_dir / library)
        return None
    try:
        return _import_library(module_name, lib)
    except ImportError as exc:
        log.warning("cached extension %s cannot be imported (%s); rebuilding", lib, exc)
        entry.invalidate(library, record=_MARKER)
        return None


def _import_library(module_name: str, lib: Path) -> types.ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(module_name, str(lib))
    spec = importlib.util.spec_from_file_location(module_name, lib, loader=loader)
    if spec is None:
        raise ImportError(f"cannot create an import spec for {lib}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """Make sure ``ninja`` is found even when the venv's bin/ is not on PATH."""
    if shutil.which("ninja"):
        yield
        return
    candidates = [Path(sys.executable).parent]
    with contextlib.suppress(ImportError, AttributeError):
        import ninja  # the PyPI package

        candidates.insert(0, Path(ninja.BIN_DIR))
    extra = next((str(d) for d in candidates if (d / "ninja").exists()), None)
    if extra is None:
        raise NativeBuildError("the ninja build tool is not installed",
                               hint="pip install ninja (torch C++ extensions need it)")
    old = os.environ.get("PATH")
    os.environ["PATH"] = extra + os.pathsep + (old or "")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = old


def _tail(text: str, n: int = _TAIL_LINES) -> str:
    """The compiler's diagnostics from torch's build error (its last ``n`` lines), without
    the torch prefix, ninja's progress and the (very long) compiler command lines."""
    text = text.split(": ", 1)[1] if text.startswith("Error building extension") else text
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    noise = ("FAILED:", "ninja: build stopped")
    kept = [ln for ln in lines
            if not ln.startswith(noise) and not re.match(r"^(\[\d+/\d+\] )?\S*(c\+\+|g\+\+|clang\+\+|cc|gcc)\s", ln)]
    return "\n".join((kept or lines)[-n:])


def _build(name: str, package: str, contents: dict[str, bytes], build_dir: Path,
           module_name: str) -> types.ModuleType:
    cxx = os.environ.get("CXX", "c++")
    if not shutil.which(cxx.split()[0]):
        raise NativeBuildError(f"no C++ compiler: '{cxx}' is not on PATH",
                               hint="install g++ (or set CXX) to build graphkit's torch extensions")
    # We hold the lock, so a leftover torch FileBaton from a killed build is stale; torch
    # would wait on it forever.
    with contextlib.suppress(FileNotFoundError):
        (build_dir / "lock").unlink()
    src_dir = build_dir / "src"
    src_dir.mkdir(exist_ok=True)
    compiled = []
    for src, data in contents.items():
        (src_dir / src).write_bytes(data)
        if src.endswith((".cpp", ".cc", ".cxx")):
            compiled.append(str(src_dir / src))
    if not compiled:
        raise NativeBuildError(f"extension {name} lists no .cpp source", op=name,
                               hint=f"add the .cpp file to the sources given for {package}")

    log.info("building torch extension %s in %s (first use on this machine)", name, build_dir)
    start = time.perf_counter()
    spec = json.dumps({"module": module_name, "sources": compiled, "flags": list(CXX_FLAGS),
                       "build_dir": str(build_dir)})
    try:
        with build_cache.announce(f"{package} (torch extension {name})"), _ninja_on_path():
            # In a child process run like a compiler: ninja and the compilers die with graphkit.
            proc = build_cache.run_tool([sys.executable, "-m", "graphkit.export._extension_child", spec],
                                        timeout=_BUILD_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise NativeBuildError(f"building the torch extension '{name}' took over {_BUILD_TIMEOUT} s",
                               path=str(build_dir), hint="check the machine's load and the compiler") from exc
    if proc.returncode != 0:
        output = (proc.stderr or proc.stdout or "").strip()
        full = build_cache.full_disk_error(build_dir, output)
        if full is not None:
            raise full
        with contextlib.suppress(OSError):
            (build_dir / _LOG).write_text(output)
        raise NativeBuildError(
            f"cannot build the torch extension '{name}' from {package} "
            f"({', '.join(contents)}):\n{_tail(output)}",
            path=str(build_dir),
            hint=f"fix the C++ source; the full compiler output is in {build_dir / _LOG}")
    seconds = time.perf_counter() - start
    # torch names the library <module>.so (the first of these that exists).
    candidates = [build_dir / f"{module_name}{suffix}" for suffix in (".so", *importlib.machinery.EXTENSION_SUFFIXES)]
    lib = next((c for c in candidates if c.is_file()), candidates[0])
    problem = build_cache.elf_problem(lib, "shared") if lib.is_file() else "no library was written"
    if problem is not None:
        raise NativeBuildError(f"the torch extension '{name}' was built but its library {lib} is damaged: "
                               f"{problem}", path=str(build_dir),
                               hint=f"delete {build_dir} and run again")
    # The marker is the library's record (size, sha256), written last and atomically.
    build_cache.Entry.at(build_dir).write_record(
        lib.name, record=_MARKER, module=module_name, library=lib.name, name=name, package=package,
        sources=sorted(contents), flags=list(CXX_FLAGS), build_seconds=round(seconds, 2))
    log.info("built torch extension %s in %.1f s", name, seconds)
    return _import_library(module_name, lib)
