"""graphkit's on-disk build cache, shared by the native kernel builds and torch extensions.

An entry is a directory ``<root>/<area>/<key>/`` (``root`` is ``$GRAPHKIT_CACHE_DIR``,
default ``~/.cache/graphkit``; ``key`` hashes everything the artefact depends on). Inside
it, an artefact ``NAME`` is only trusted when ``NAME.record`` (its size and sha256, written
LAST, atomically) matches the file: a half-written, truncated or corrupted artefact is
rebuilt, never used.

Builders hold :meth:`Entry.lock` (``flock``: the OS releases it if the process dies), build
into :meth:`Entry.temp` files (unique names, so concurrent or killed builds never collide)
and :meth:`Entry.publish` them (``os.replace``, then the record). :func:`announce` prints
the one-line "building kernels (first use)" message with the time it took.

A cache is shared between users: its files are written with the umask's permissions (a
record only its owner could read made every other user's copy look invalid), and a valid
artefact is loaded without the lock or any write. A build this user cannot write is a
NativeBuildError (exit 10); a read-only or full filesystem an OutputError (exit 4); both
name the cache's directory and the fix (:func:`cache_write_error`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from graphkit.errors import GraphkitError, NativeBuildError, OutputError
from graphkit.publish import FULL_ERRNOS, current_umask

__all__ = ["Entry", "announce", "cache_root", "cache_write_error", "elf_problem", "file_digest", "file_lock",
           "full_disk_error", "hash_key", "run_tool"]

_RECORD_SUFFIX = ".record"
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def cache_root() -> Path:
    """The cache root: ``$GRAPHKIT_CACHE_DIR`` or ``~/.cache/graphkit``."""
    env = os.environ.get("GRAPHKIT_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "graphkit"


_OTHER_DIR = "or set $GRAPHKIT_CACHE_DIR to a directory of your own"


def cache_write_error(exc: OSError, where: Path) -> GraphkitError:
    """The error for a write into the build cache at ``where`` that failed: a cache this user
    may not write (another user's) is a NativeBuildError (exit 10); a read-only or full
    filesystem an OutputError (exit 4), as for every file graphkit writes."""
    path = str(where)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return NativeBuildError(f"the kernels must be built, but the build cache is not writable by this user "
                                f"({exc.strerror})", path=path,
                                hint=f"build them once as the cache's owner (e.g. `graphkit run` on the model), {_OTHER_DIR}")
    if exc.errno == errno.EROFS:
        return OutputError("the kernels must be built, but the build cache is on a read-only filesystem",
                           path=path, hint=f"build them where the cache is writable, {_OTHER_DIR}")
    if exc.errno in FULL_ERRNOS:
        return OutputError(f"cannot write the build cache: the disk is full ({exc.strerror})", path=path,
                           hint=f"free some space, {_OTHER_DIR} on another disk")
    return NativeBuildError(f"cannot write the build cache: {exc.strerror or exc}", path=path,
                            hint=f"check the cache directory, {_OTHER_DIR}")


def full_disk_error(where: Path, output: str = "") -> OutputError | None:
    """After a build tool failed writing into ``where``: the OutputError (exit 4) when the disk
    is full (the tool's ``output`` says so, or no space is left there), else None."""
    full = any(text in output for text in ("No space left on device", "Disk quota exceeded", "File too large"))
    if not full:
        try:
            st = os.statvfs(where)
        except OSError:
            return None
        full = st.f_blocks > 0 and st.f_bavail == 0
    return cache_write_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), where) if full else None


def hash_key(*parts: object, length: int = 16) -> str:
    """A hex key over ``parts`` (bytes, str, paths (their content) or anything ``str()``-able),
    each length-prefixed so that no two part lists hash alike."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            data = part.as_posix().encode() + b"\0" + part.read_bytes()
        elif isinstance(part, bytes):
            data = part
        else:
            data = str(part).encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:length]


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Entry:
    """One cache entry: ``<root>/<area>/<key>/``."""

    def __init__(self, area: str, key: str, *, root: Path | None = None) -> None:
        self.dir = (root if root is not None else cache_root()) / area / key

    @classmethod
    def at(cls, directory: Path) -> "Entry":
        """The entry whose directory is ``directory``."""
        entry = cls.__new__(cls)
        entry.dir = Path(directory)
        return entry

    def __repr__(self) -> str:
        return f"Entry({self.dir})"

    def path(self, name: str) -> Path:
        return self.dir / name

    def _record_path(self, name: str, record: str | None) -> Path:
        return self.dir / (record if record is not None else name + _RECORD_SUFFIX)

    def valid(self, name: str, *, record: str | None = None, elf: str | None = None) -> Path | None:
        """``NAME`` if it exists and matches its record (size and sha256), else None.
        ``record`` names the record file (default ``NAME.record``). ``elf`` ("shared" or
        "object"): the file must also be a whole ELF file of that kind for this machine
        (:func:`elf_problem`), so that a damaged file whose record was rewritten to match
        is not loaded either."""
        artefact = self.dir / name
        try:
            record = json.loads(self._record_path(name, record).read_text())
            if artefact.stat().st_size != record["size"]:
                return None
            if file_digest(artefact) != record["sha256"]:
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if elf is not None and elf_problem(artefact, elf) is not None:
            return None
        return artefact

    def record(self, name: str, *, record: str | None = None) -> dict:
        """The record of ``NAME`` (extra fields included); {} if there is none."""
        try:
            return json.loads(self._record_path(name, record).read_text())
        except (OSError, ValueError):
            return {}

    def invalidate(self, name: str, *, record: str | None = None) -> None:
        with contextlib.suppress(OSError):
            self._record_path(name, record).unlink()

    def mkdir(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cache_write_error(exc, self.dir) from exc

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive between threads and processes; released by the OS if the process dies.

        Only builders take it: loading a valid artefact needs neither the lock nor write
        access. On entry, leftovers of killed builds (``.*.tmp``) are removed: whoever held
        the lock before is done. An OSError while it is held (the build writing into the
        entry) becomes :func:`cache_write_error`."""
        self.mkdir()
        try:
            with file_lock(self.dir / ".lock"):
                for stale in self.dir.glob(".*.tmp"):
                    with contextlib.suppress(OSError):
                        stale.unlink()
                yield
        except OSError as exc:
            where = Path(os.fsdecode(exc.filename)) if isinstance(exc.filename, (str, bytes)) else self.dir
            raise cache_write_error(exc, self.dir if where.parent == self.dir else where) from exc

    def temp(self, name: str) -> Path:
        """A new unique temporary path in the entry for building ``NAME``, with the umask's
        permissions (mkstemp's 0600 would hide the artefact from the cache's other users)."""
        self.mkdir()
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{name}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o666 & ~current_umask())
        finally:
            os.close(fd)
        return Path(tmp)

    def publish(self, tmp: Path, name: str, /, **extra: object) -> Path:
        """Move ``tmp`` to ``NAME`` atomically, then write its record (last)."""
        artefact = self.dir / name
        self.invalidate(name)
        digest = file_digest(tmp)
        size = tmp.stat().st_size
        os.replace(tmp, artefact)
        self.write_record(name, size=size, sha256=digest, **extra)
        return artefact

    def write_record(self, name: str, /, *, record: str | None = None, **fields: object) -> None:
        """Write ``NAME.record`` (or ``record``) atomically, last: ``size`` and ``sha256`` of
        the artefact are computed when not given."""
        artefact = self.dir / name
        if "sha256" not in fields:
            fields["sha256"] = file_digest(artefact)
        if "size" not in fields:
            fields["size"] = artefact.stat().st_size
        data = json.dumps(fields, indent=1).encode()
        target = self._record_path(name, record)
        tmp = self.temp(target.name)
        try:
            tmp.write_bytes(data)
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` between threads and processes (``flock``: released by
    the OS if the process dies)."""
    with _thread_locks_guard:
        tlock = _thread_locks.setdefault(str(path), threading.Lock())
    with tlock:
        fh = open(path, "a+b")  # noqa: SIM115
        try:
            try:
                import fcntl
            except ImportError:  # Windows
                import msvcrt

                while True:
                    try:
                        msvcrt.locking(fh.fileno(), msvcrt.LK_LOCK, 1)
                        break
                    except OSError:
                        time.sleep(0.1)
            else:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            yield
        finally:
            fh.close()  # releases the lock


@contextlib.contextmanager
def announce(what: str) -> Iterator[None]:
    """Print ``graphkit: building kernels for WHAT (first use)...`` to stderr, then the time
    the block took (or that it failed). Use it once per actual build."""
    stream = sys.stderr
    stream.write(f"graphkit: building kernels for {what} (first use)...")
    stream.flush()
    start = time.perf_counter()
    ok = False
    try:
        yield
        ok = True
    finally:
        took = time.perf_counter() - start
        stream.write(f" done in {took:.1f} s\n" if ok else f" failed after {took:.1f} s\n")
        stream.flush()


# ---- ELF sanity: what the loader would trip on, found before it maps the file ------------------

_ELF_TYPES = {"object": 1, "shared": 3}


@functools.lru_cache(maxsize=1)
def _host_elf() -> tuple[int, int, int] | None:
    """(class, byte order, machine) of the running interpreter, None off ELF platforms."""
    try:
        with open("/proc/self/exe", "rb") as f:
            head = f.read(20)
    except OSError:
        head = b""
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    order = "<" if head[5] == 1 else ">"
    return head[4], head[5], struct.unpack_from(order + "H", head, 18)[0]


def elf_problem(path: Path, kind: str = "shared") -> str | None:
    """Why ``path`` is not a whole ELF ``kind`` file ("shared" library or relocatable
    "object") for this machine, or None when it looks whole (or the platform is not ELF).

    Checks the header (magic, class, byte order, machine, type) and that every program
    header's and section's bytes lie inside the file: a truncated library whose header
    survived is found here, before ``dlopen`` maps it (and dies of SIGBUS)."""
    host = _host_elf()
    if host is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"
    size = len(data)
    if size < 52 or data[:4] != b"\x7fELF":
        return "not an ELF file" + (" (empty)" if size == 0 else "")
    cls, order_byte = data[4], data[5]
    if (cls, order_byte) != host[:2]:
        return "an ELF file for another machine (word size or byte order)"
    o = "<" if order_byte == 1 else ">"
    try:
        if cls == 2:
            e_type, machine = struct.unpack_from(o + "HH", data, 16)
            phoff, shoff = struct.unpack_from(o + "QQ", data, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(o + "HHHH", data, 54)
        else:
            e_type, machine = struct.unpack_from(o + "HH", data, 16)
            phoff, shoff = struct.unpack_from(o + "II", data, 28)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(o + "HHHH", data, 42)
        if machine != host[2]:
            return f"an ELF file for another machine (e_machine {machine}, this one {host[2]})"
        if e_type != _ELF_TYPES[kind]:
            return f"an ELF file of another type ({e_type}, expected {_ELF_TYPES[kind]}: {kind})"
        if phnum and phoff + phnum * phentsize > size:
            return "truncated (its program headers lie past the end)"
        if shnum and shoff + shnum * shentsize > size:
            return "truncated (its section headers lie past the end)"
        for i in range(phnum):
            at = phoff + i * phentsize
            if cls == 2:
                offset, filesz = struct.unpack_from(o + "Q", data, at + 8)[0], struct.unpack_from(o + "Q", data, at + 32)[0]
            else:
                offset, filesz = struct.unpack_from(o + "I", data, at + 4)[0], struct.unpack_from(o + "I", data, at + 16)[0]
            if offset + filesz > size:
                return "truncated (a loadable segment lies past the end)"
        for i in range(shnum):
            at = shoff + i * shentsize
            if cls == 2:
                sh_type = struct.unpack_from(o + "I", data, at + 4)[0]
                offset, length = struct.unpack_from(o + "QQ", data, at + 24)
            else:
                sh_type = struct.unpack_from(o + "I", data, at + 4)[0]
                offset, length = struct.unpack_from(o + "II", data, at + 16)
            if sh_type != 8 and offset + length > size:  # 8: SHT_NOBITS (.bss) has no bytes
                return "truncated (a section lies past the end)"
    except struct.error:
        return "truncated (its headers lie past the end)"
    return None


# ---- tools that die with graphkit -------------------------------------------------------------

# The tool runs in a process group of its own under a small sh that also starts a watcher: the
# watcher reads sh's stdin, a pipe only graphkit holds open. When graphkit dies (even of
# SIGKILL) the pipe closes and the watcher kills the whole group: the compiler driver and
# every process it started (cc1plus, as, ld), so nothing writes into the cache afterwards.
_WATCHED = (
    '"$@" </dev/null 3<&- & c=$!\n'
    '( read _ <&3 ; kill -KILL 0 ) >/dev/null 2>&1 & w=$!\n'
    'exec 3<&-\n'
    'wait "$c"; s=$?\n'
    'kill "$w" 2>/dev/null\n'
    'exit "$s"\n'
)


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL when graphkit's thread that started the tool dies (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def run_tool(cmd: list[str], *, timeout: float) -> subprocess.CompletedProcess:
    """Run a build tool (compiler, linker), capturing its output as text, so that it and
    every process it starts die with graphkit (SIGKILL included) or on ``timeout``
    (subprocess.TimeoutExpired) or on an exception in this thread (KeyboardInterrupt)."""
    if os.name != "posix" or not os.path.exists("/bin/sh"):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    alive_r, alive_w = os.pipe()  # graphkit holds the write end; sh's stdin, then fd 3
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", "exec 3<&0 </dev/null\n" + _WATCHED, "sh", *cmd],
            stdin=alive_r, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    finally:
        os.close(alive_r)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        with contextlib.suppress(Exception):
            proc.communicate(timeout=5)
        raise
    finally:
        os.close(alive_w)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
