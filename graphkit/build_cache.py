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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from graphkit.errors import NativeBuildError

__all__ = ["Entry", "announce", "cache_root", "file_digest", "file_lock", "hash_key"]

_RECORD_SUFFIX = ".record"
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def cache_root() -> Path:
    """The cache root: ``$GRAPHKIT_CACHE_DIR`` or ``~/.cache/graphkit``."""
    env = os.environ.get("GRAPHKIT_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "graphkit"


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

    def valid(self, name: str, *, record: str | None = None) -> Path | None:
        """``NAME`` if it exists and matches its record (size and sha256), else None.
        ``record`` names the record file (default ``NAME.record``)."""
        artefact = self.dir / name
        try:
            record = json.loads(self._record_path(name, record).read_text())
            if artefact.stat().st_size != record["size"]:
                return None
            return artefact if file_digest(artefact) == record["sha256"] else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

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
            raise NativeBuildError(f"cannot create the build cache {self.dir}: {exc.strerror or exc}",
                                   hint="set $GRAPHKIT_CACHE_DIR to a writable directory") from exc

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive between threads and processes; released by the OS if the process dies.

        On entry, leftovers of killed builds (``.*.tmp``) are removed: whoever held the
        lock before is done."""
        self.mkdir()
        with file_lock(self.dir / ".lock"):
            for stale in self.dir.glob(".*.tmp"):
                with contextlib.suppress(OSError):
                    stale.unlink()
            yield

    def temp(self, name: str) -> Path:
        """A new unique temporary path in the entry for building ``NAME``."""
        self.mkdir()
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{name}.", suffix=".tmp")
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
