"""Build (on first use) and locate graphkit's native ONNX Runtime kernel library.

All ``custom_ops/native/*.cc`` and ``custom_ops/<op>/*.cc`` files (except torch
extension sources, ``*_torch.cc``/``*_torch.cpp``) are compiled with the system C++
compiler (``$CXX`` overrides ``c++``) into one ``libgraphkit_ops.so``, which ONNX
Runtime loads with ``SessionOptions.register_custom_ops_library``.

The result is cached under ``$GRAPHKIT_CACHE_DIR`` (default ``~/.cache/graphkit``) in
``native/<key>/``, where ``key`` hashes the sources, the compiler's ``--version``, the
flags and the CPU (the build uses ``-march=native``). Builds hold a file lock and
publish atomically (temporary file, then ``os.replace``), and a library is only used
if it matches the checksum written beside it, so a killed or concurrent build never
leaves a broken library in use.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import importlib.resources
import os
import platform
import shlex
import subprocess
import tempfile
from pathlib import Path

from graphkit.errors import NativeBuildError

__all__ = ["CXX_FLAGS", "LIBRARY_NAME", "cache_dir", "library_path", "served_ops", "sources"]

CXX_FLAGS: tuple[str, ...] = (
    "-O3",
    "-march=native",
    "-std=c++17",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    "-pthread",
)
LIBRARY_NAME = "libgraphkit_ops.so"

_CHECKSUM_SUFFIX = ".sha256"
_STDERR_TAIL = 4000  # characters of compiler output kept in error messages
_BUILD_TIMEOUT = 600  # seconds
_HINT = "install a C++17 compiler (e.g. `apt-get install g++`) or point $CXX at one"


def cache_dir() -> Path:
    """The cache root: ``$GRAPHKIT_CACHE_DIR`` or ``~/.cache/graphkit``."""
    env = os.environ.get("GRAPHKIT_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "graphkit"


def _package_root() -> Path:
    root = Path(str(importlib.resources.files("custom_ops")))
    if not root.is_dir():
        raise NativeBuildError(
            f"the custom_ops sources are not a directory on disk ({root})",
            hint="install graphkit from a source checkout or an unzipped wheel",
        )
    return root


def sources() -> list[Path]:
    """The C++ files compiled into the library, sorted."""
    root = _package_root()
    found = set(root.glob("native/*.cc")) | set(root.glob("*/*.cc"))
    return sorted(p for p in found if not p.name.endswith(("_torch.cc", "_torch.cpp")))


def _hashed_files(root: Path) -> list[Path]:
    """Sources plus the headers they may include (a header change must rebuild)."""
    headers = set(root.glob("*/*.h")) | set(root.glob("*/*.hpp"))
    return sorted(set(sources()) | headers)


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


def _cache_key(root: Path, compiler: list[str]) -> str:
    h = hashlib.sha256()
    for path in _hashed_files(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    h.update(_compiler_version(tuple(compiler)).encode() + b"\0")
    h.update(shlex.join(CXX_FLAGS).encode() + b"\0")
    h.update(_cpu_id().encode())
    return h.hexdigest()[:16]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _is_valid(lib: Path) -> bool:
    """True if ``lib`` exists and matches the checksum its build wrote beside it."""
    try:
        expected = lib.with_name(lib.name + _CHECKSUM_SUFFIX).read_text().strip()
        return _sha256(lib) == expected
    except OSError:
        return False


def _compile(srcs: list[Path], out: Path, compiler: list[str]) -> None:
    cmd = [*compiler, *CXX_FLAGS, *map(str, srcs), "-o", str(out)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_BUILD_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"cannot run the C++ compiler {shlex.join(compiler)!r}: {exc}", hint=_HINT) from exc
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr or proc.stdout or "").strip()[-_STDERR_TAIL:]
        raise NativeBuildError(
            f"building {LIBRARY_NAME} failed (exit status {proc.returncode}): {shlex.join(cmd)}\n{tail}".rstrip(),
            hint=_HINT,
        )


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def library_path(*, rebuild: bool = False) -> Path:
    """Return the path of ``libgraphkit_ops.so``, compiling it first if needed.

    ``rebuild=True`` compiles even if a valid cached library exists. Raises
    :class:`~graphkit.errors.NativeBuildError` if the compiler fails.
    """
    root = _package_root()
    compiler = _compiler()
    build_dir = cache_dir() / "native" / _cache_key(root, compiler)
    lib = build_dir / LIBRARY_NAME
    if not rebuild and _is_valid(lib):
        return lib
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NativeBuildError(f"cannot create the build cache {build_dir}: {exc}",
                               hint="set $GRAPHKIT_CACHE_DIR to a writable directory") from exc
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not rebuild and _is_valid(lib):  # built by another process meanwhile
            return lib
        # Whoever held the lock before us is done: leftovers are from killed builds.
        for stale in build_dir.glob(".*.tmp"):
            stale.unlink(missing_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=build_dir, prefix=f".{LIBRARY_NAME}.", suffix=".tmp")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            _compile(sources(), tmp, compiler)
            digest = _sha256(tmp)
            os.chmod(tmp, 0o755)
            os.replace(tmp, lib)
        finally:
            tmp.unlink(missing_ok=True)
        _write_atomic(lib.with_name(lib.name + _CHECKSUM_SUFFIX), (digest + "\n").encode())
    return lib


def served_ops(path: Path | None = None) -> frozenset[str]:
    """Op names the library serves (its ``graphkit_native_ops()``), building it if needed."""
    lib = ctypes.CDLL(str(path if path is not None else library_path()))
    fn = lib.graphkit_native_ops
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    names = (fn() or b"").decode()
    return frozenset(n for n in names.split(",") if n)
