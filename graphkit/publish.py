"""Publishing files without ever losing data: unique temporaries, atomic writes, leftovers swept.

Every file graphkit writes (models, external-data files) goes through here: written to a
recognisable temporary beside its target, then published (os.replace for a model, a
no-replace os.link for weights), with signals deferred while publishing; temporaries of
killed runs are removed by later runs once their owner is gone. A read-only or full
filesystem is an OutputError (exit 4, :func:`write_error`); removing a temporary never
raises (:func:`remove_quietly`), so a cleanup never hides the error that caused it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from graphkit.errors import OutputError

__all__ = ["atomic_write", "current_umask", "refuse_special_output", "remove_quietly", "signals_deferred",
           "sweep_temporaries", "temporary_path", "unwritable_dir_error", "write_error", "FULL_ERRNOS",
           "STALE_AFTER_S"]


# A full disk: no space, over quota, or over the file size limit (RLIMIT_FSIZE).
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


def write_error(exc: OSError, path: str | os.PathLike[str], doing: str = "cannot write") -> OutputError:
    """The OutputError (exit 4) for a failed write of ``path``: a full disk and a read-only
    filesystem are named as such, with their fix."""
    if exc.errno in FULL_ERRNOS:
        return OutputError(f"{doing}: the disk is full ({exc.strerror})", path=os.fspath(path),
                           hint="free some space or choose another location")
    if exc.errno == errno.EROFS:
        return OutputError(f"{doing}: the filesystem is read-only", path=os.fspath(path),
                           hint="choose a location on a writable filesystem")
    return OutputError(f"{doing}: {exc.strerror or exc}", path=os.fspath(path), hint="choose a writable location")


def unwritable_dir_error(directory: str | os.PathLike[str], raw: str, what: str = "output directory"
                         ) -> OutputError | None:
    """An OutputError when ``directory`` cannot be written (a read-only filesystem named as
    such), before any work; None when it can."""
    if os.access(directory, os.W_OK):
        return None
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return OutputError(f"the {what} is on a read-only filesystem", path=raw,
                           hint="choose a location on a writable filesystem")
    return OutputError(f"{what} is not writable", path=raw, hint="choose a writable location")


def remove_quietly(path: str | os.PathLike[str]) -> None:
    """Remove ``path`` if it is there; a cleanup never raises, so it never hides the first error
    (removing a temporary that was never created on a read-only filesystem is EROFS, not ENOENT)."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def current_umask() -> int:
    """The process's umask; read from /proc where it can be (setting it to read it races with
    other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- temporaries ---------------------------------------------------------------------------------
#
# Every file graphkit writes is first written to a temporary beside it, named
# ``.<name>.graphkit-<pid>-<host>-<random>.tmp``: recognisable as graphkit's, unique per
# process and call, and naming its owner. A run killed with SIGKILL leaves it behind; later
# runs writing into the same directory remove it once its owner is gone (see sweep_temporaries).

_TMP_RE = re.compile(r"^\.(?P<name>.*)\.graphkit-(?P<pid>[0-9]+)-(?P<host>[0-9a-f]{8})-[0-9a-f]+\.tmp$", re.S)
# What graphkit 0.x left: `.<name>.graphkit-tmp` (weights) and mkstemp's `.<name>.<8 chars>.tmp` (models).
_LEGACY_WEIGHTS = ".graphkit-tmp"
_LEGACY_MODEL_RE = re.compile(r"^\.(?P<name>.*)\.[a-z0-9_]{8}\.tmp$", re.S)
# A temporary whose owner is alive is never removed, unless nothing touched it for this long
# (the pid was reused: graphkit writes its temporaries without pause, then publishes them).
STALE_AFTER_S = 3600.0

_host_tag_cache: list[str] = []


def _host_tag() -> str:
    """8 hex digits naming this host and pid namespace: a pid means something only there."""
    if not _host_tag_cache:
        import hashlib
        import socket

        parts = [socket.gethostname()]
        for f in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
            with contextlib.suppress(OSError):
                parts.append(Path(f).read_text().strip() if "boot_id" in f else str(os.stat(f).st_ino))
        _host_tag_cache.append(hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8])
    return _host_tag_cache[0]


def temporary_path(target: str | os.PathLike[str]) -> Path:
    """A fresh temporary name beside ``target``, recognisable as graphkit's and naming this process."""
    target = Path(target)
    name = target.name
    if len(os.fsencode(name)) > 160:  # keep the temporary's name under NAME_MAX
        name = os.fsdecode(os.fsencode(name)[:160])
    return target.with_name(f".{name}.graphkit-{os.getpid()}-{_host_tag()}-{secrets.token_hex(6)}.tmp")


def _owner_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # another user's live process (or an absurd pid: treat as dead)
    return True


def sweep_temporaries(directory: str | os.PathLike[str], names: tuple[str, ...] = (), *,
                      directories: bool = False) -> list[Path]:
    """Remove graphkit temporaries in ``directory`` left by killed runs; returns what it removed.

    A temporary is removed when its owner (the pid in its name, on this host) is dead, or when
    nothing changed it for STALE_AFTER_S. Legacy temporaries (no owner in the name) are removed
    only for the files in ``names`` and only once stale. ``directories``: temporary folders
    (named the same way, ``graphkit deploy``'s) too. Never raises.
    """
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith(".") or not name.endswith("tmp"):
            continue
        m = _TMP_RE.match(name)
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        folder = directories and m is not None and stat.S_ISDIR(st.st_mode)
        if not stat.S_ISREG(st.st_mode) and not folder:
            continue
        stale = now - max(st.st_mtime, st.st_ctime) > STALE_AFTER_S
        if m is not None:
            dead = m["host"] == _host_tag() and not _owner_alive(int(m["pid"]))
            if not (dead or stale):
                continue
        else:
            legacy = name[:-len(_LEGACY_WEIGHTS)][1:] if name.endswith(_LEGACY_WEIGHTS) else None
            if legacy is None:
                lm = _LEGACY_MODEL_RE.match(name)
                legacy = lm["name"] if lm else None
            if legacy is None or legacy not in names or not stale:
                continue
        with contextlib.suppress(OSError):
            if folder:
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP back (in this thread) for a few system calls that must
    not be separated: publishing a file and recording that it was published."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def refuse_special_output(target: Path, raw: str | None = None) -> None:
    """An output that is a FIFO, device or socket, or ends with a slash, is never written."""
    raw = os.fspath(raw if raw is not None else target)
    if isinstance(raw, bytes):
        raw = os.fsdecode(raw)
    if raw.endswith(("/", os.sep)) or raw.endswith(("/.", "/..")) or raw in (".", ".."):
        raise OutputError("output path has a trailing slash: it names a directory, not a file", path=raw,
                          hint="give a file name without a trailing slash")
    try:
        st = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISDIR(st.st_mode):
        raise OutputError("output path is a directory", path=raw, hint="give a file name")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else
                "a character device" if stat.S_ISCHR(st.st_mode) else
                "a block device" if stat.S_ISBLK(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise OutputError(f"output path is {kind}; graphkit writes only regular files", path=raw,
                          hint="write to a regular file and copy it there yourself")


def missing_parent_error(target: Path, raw: str) -> OutputError:
    parent = target.parent if str(target.parent) else Path(".")
    for ancestor in (parent, *parent.parents):
        try:
            st = os.stat(ancestor)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            break
        if not stat.S_ISDIR(st.st_mode):
            return OutputError(f"'{ancestor}' is a file, not a directory", path=raw,
                               hint="choose an output path inside a directory")
        break
    return OutputError("output directory does not exist", path=raw, hint=f"create {parent} first")


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` atomically.

    On any error (or signal) the temporary file is removed and ``path`` is left as it was.
    The temporary is named by temporary_path; leftovers of killed runs in the directory are
    swept first. An existing FIFO, device or socket at ``path`` is refused, never replaced.
    A symlink at ``path`` is replaced by the new regular file; its target is left untouched.
    A read-only or full filesystem is an OutputError (exit 4) naming ``path``.
    """
    raw = os.fspath(path)
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    refuse_special_output(target, raw)
    if not parent.is_dir():
        raise missing_parent_error(target, raw)
    sweep_temporaries(parent, (target.name,))
    tmp = temporary_path(target)
    try:
        try:
            existing = os.stat(target)
        except OSError:
            existing = None
        mode = existing.st_mode & 0o7777 if existing is not None and stat.S_ISREG(existing.st_mode) \
            else 0o666 & ~current_umask()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as exc:
            raise write_error(exc, raw, "cannot write to the output directory") from exc
        os.close(fd)
        os.chmod(tmp, mode)
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        refuse_special_output(target, raw)  # created while we worked: still never replaced
        os.replace(tmp, target)
    except OSError as exc:
        raise write_error(exc, raw) from exc
    finally:
        remove_quietly(tmp)
