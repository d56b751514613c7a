"""Loading and saving models safely: clear errors, input never touched, atomic writes."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from graphkit.errors import ModelLoadError, OutputError

__all__ = ["load_model", "save_model", "atomic_write", "check_output_path", "weights_files",
           "temporary_path", "sweep_temporaries"]

_PROTOBUF_LIMIT = 2**31 - 1


def load_model(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Parse an ONNX file without loading external weights.

    Raises ModelLoadError for a missing file, a directory, an empty, truncated or
    non-ONNX file.
    """
    return parse_model_bytes(read_model_bytes(path), path)


def read_model_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of an ONNX file, with load_model's errors for what cannot be read."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ModelLoadError("no such file", path=str(p), hint="check the path") from None
    except (OSError, ValueError) as exc:  # ENAMETOOLONG, ELOOP, ENOTDIR, an embedded NUL byte
        raise ModelLoadError(f"cannot open: {getattr(exc, 'strerror', None) or exc}", path=str(p),
                             hint="check the path") from exc
    if stat.S_ISDIR(st.st_mode):
        raise ModelLoadError("is a directory, not an ONNX file", path=str(p),
                             hint="pass the .onnx file inside it")
    if not stat.S_ISREG(st.st_mode):
        # A FIFO, socket or device could block forever or never end: never opened.
        raise ModelLoadError("is not a regular file (a pipe, socket or device)", path=str(p),
                             hint="save the model to a file first")
    if st.st_size > _PROTOBUF_LIMIT:
        raise ModelLoadError(f"is {st.st_size} bytes, over protobuf's 2 GiB limit for one ONNX file",
                             path=str(p), hint="keep the weights in external data files")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"cannot read: {exc.strerror}", path=str(p),
                             hint="check the file's permissions") from exc
    except MemoryError:
        raise ModelLoadError(f"not enough memory to read {st.st_size} bytes", path=str(p),
                             hint="free some memory or raise the process's memory limit") from None
    if not data:
        raise ModelLoadError("file is empty", path=str(p), hint="re-export the model")
    return data


def parse_model_bytes(data: bytes, path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Parse a serialized ONNX model read from ``path``, with load_model's errors."""
    p = Path(path)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelLoadError("not an ONNX model or truncated (protobuf parse failed)", path=str(p),
                             hint="re-export the model or check the file was copied whole") from exc
    except MemoryError:
        raise ModelLoadError("not enough memory to parse the model", path=str(p),
                             hint="free some memory or raise the process's memory limit") from None
    # A file cut at a field boundary parses; what it lost shows as missing parts.
    if not model.HasField("graph") or not model.opset_import or model.ir_version <= 0:
        missing = [name for name, ok in (("graph", model.HasField("graph")),
                                         ("opset_import", bool(model.opset_import)),
                                         ("ir_version", model.ir_version > 0)) if not ok]
        raise ModelLoadError(f"not an ONNX model or truncated (missing {', '.join(missing)})",
                             path=str(p), hint="re-export the model or check the file was copied whole")
    return model


def _umask() -> int:
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


def sweep_temporaries(directory: str | os.PathLike[str], names: tuple[str, ...] = ()) -> list[Path]:
    """Remove graphkit temporaries in ``directory`` left by killed runs; returns what it removed.

    A temporary is removed when its owner (the pid in its name, on this host) is dead, or when
    nothing changed it for STALE_AFTER_S. Legacy temporaries (no owner in the name) are removed
    only for the files in ``names`` and only once stale. Never raises.
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
        if not stat.S_ISREG(st.st_mode):
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


def _missing_parent_error(target: Path, raw: str) -> OutputError:
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
    """
    raw = os.fspath(path)
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    refuse_special_output(target, raw)
    if not parent.is_dir():
        raise _missing_parent_error(target, raw)
    sweep_temporaries(parent, (target.name,))
    tmp = temporary_path(target)
    try:
        try:
            existing = os.stat(target)
        except OSError:
            existing = None
        mode = existing.st_mode & 0o7777 if existing is not None and stat.S_ISREG(existing.st_mode) \
            else 0o666 & ~_umask()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as exc:
            raise OutputError(f"cannot write to the output directory: {exc.strerror}", path=raw,
                              hint="choose a writable location") from exc
        os.close(fd)
        os.chmod(tmp, mode)
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        refuse_special_output(target, raw)  # created while we worked: still never replaced
        os.replace(tmp, target)
    except OSError as exc:
        hint = "free some space" if exc.errno in (errno.ENOSPC, errno.EFBIG) else "choose a writable location"
        raise OutputError(f"cannot write: {exc.strerror or exc}", path=raw, hint=hint) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    return a.exists() and b.exists() and os.path.samefile(a, b)


def check_output_path(output: str | os.PathLike[str], input_path: str | os.PathLike[str] | None,
                      *, inputs: tuple[tuple[str | os.PathLike[str], str], ...] = ()) -> None:
    """Refuse to overwrite the input or write into a missing directory, before any work.

    ``inputs`` lists other files read, as (path, what) pairs: the output must be none of them.
    """
    out = Path(output)
    try:
        refuse_special_output(out, os.fspath(output))
        _check_output_path(out, input_path, inputs)
    except (OSError, RuntimeError, ValueError) as exc:  # ELOOP, ENAMETOOLONG, NUL byte
        raise OutputError(f"unusable output path: {getattr(exc, 'strerror', None) or exc}", path=str(out),
                          hint="choose another output path") from exc


def _check_output_path(out: Path, input_path, inputs) -> None:
    if input_path is not None:
        if _same_file(out, Path(input_path)):
            raise OutputError("output is the input file", path=str(out),
                              hint="write to a new file; graphkit never overwrites its input")
    for other, what in inputs:
        if _same_file(out, Path(other)):
            raise OutputError(f"output is the {what}", path=str(out),
                              hint="write to a new file; graphkit never overwrites what it reads")
    if out.is_dir():
        raise OutputError("output path is a directory", path=str(out), hint="give a file name")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise _missing_parent_error(out, str(out))
    if not os.access(parent, os.W_OK):
        raise OutputError("output directory is not writable", path=str(out),
                          hint="choose a writable location")


def weights_files(files: dict[str, Path], output: str | os.PathLike[str]) -> tuple[tuple[Path, str], ...]:
    """The external-data files an output at ``output`` must not replace: the input's own
    (``files``: location -> file, from check_external_data) and those it will need beside it."""
    out_dir = Path(output).resolve().parent
    return tuple((f, f"external data file '{location}' of the input") for location, f in files.items()) + \
        tuple((out_dir / location, f"external data file '{location}' the output needs")
              for location in files)


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str], *,
               input_path: str | os.PathLike[str] | None = None, external_data: str = "auto") -> None:
    """Write ``model`` to ``path`` atomically; never over ``input_path``.

    Weights kept in external files next to ``input_path`` are validated (never read) and
    made valid from the output's directory: hard-linked where possible, else copied
    (``external_data``: "auto", "link" or "copy"). Nothing partial is left on failure.
    """
    from graphkit.external_data import check_external_data, external_tensors, place_external_data

    check_output_path(path, input_path)
    created: list[Path] = []
    placed: dict[Path, tuple[int, int]] = {}
    if external_tensors(model):
        if input_path is None:
            raise OutputError("the model references external data but its source is unknown", path=str(path),
                              hint="pass input_path= so the weights can be found")
        files = check_external_data(model, input_path)
        check_output_path(path, input_path, inputs=weights_files(files, path))
        out_dir = Path(path).resolve().parent
        if out_dir != Path(input_path).resolve().parent:
            created = place_external_data(files, out_dir, external_data, placed=placed)
    mine: list[tuple[int, int]] = []
    try:
        if model.ByteSize() > _PROTOBUF_LIMIT:
            raise OutputError("model is over protobuf's 2 GiB limit and has inline weights",
                              path=str(path), hint="move its weights to external data first")
        with atomic_write(path) as tmp:
            tmp.write_bytes(model.SerializeToString())
            st = os.stat(tmp)
            mine.append((st.st_dev, st.st_ino))
        # Published: its weights must still be the files placed for it (no other job's).
        for target, ident in placed.items():
            try:
                st = os.stat(target)
                now = (st.st_dev, st.st_ino)
            except OSError:
                now = None
            if now != ident:
                if _is(path, mine):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                raise OutputError(f"its weights file '{target.name}' was removed or replaced by another "
                                  "process while the model was written", path=str(path),
                                  hint="write each job's output into its own directory")
    except BaseException:
        if not _is(path, mine):  # never published (or withdrawn): nothing partial stays
            for f in created:
                with contextlib.suppress(OSError):
                    f.unlink()
        raise


def _is(path: str | os.PathLike[str], identity: list[tuple[int, int]]) -> bool:
    """Whether ``path`` is the file of ``identity`` (a one-element list, or empty)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return bool(identity) and (st.st_dev, st.st_ino) == identity[0]
