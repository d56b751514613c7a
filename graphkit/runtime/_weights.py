"""External data handed to ONNX Runtime read, not mapped, so that a weights file rewritten in
place while a session runs cannot kill the process.

ONNX Runtime maps external-data files and computes on the mapping: when another process
truncates or rewrites the file meanwhile (``cat new.bin > w.bin``), the next access to a page
no longer backed by the file is SIGBUS, and the process dies without a word. So graphkit reads
the bytes the model uses (with ``read``, never ``mmap``) and gives them to ONNX Runtime
(``add_external_initializers_from_files_in_memory``), which copies them into its own memory;
graphkit's buffers are dropped once the session exists. A file that changes while it is read
is read again: the session gets one version of it, never a mix of two. Cost: the weights are read once before
the session is created, and live in the process's private memory (twice their size while the
session is created) instead of the shared page cache.

Models whose external data exceeds :func:`read_limit` (``$GRAPHKIT_WEIGHTS_READ_LIMIT``,
default 2 GiB; 0 maps always) are mapped as ONNX Runtime does. There a SIGBUS while the
session is created or runs is reported (:func:`sigbus_reported`): one line on stderr naming
the external-data files, exit 135 (128 + SIGBUS), Linux only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from graphkit.errors import ModelLoadError, UsageError

__all__ = ["DEFAULT_READ_LIMIT", "ENV_VAR", "read_external_data", "read_limit", "sigbus_reported"]

ENV_VAR = "GRAPHKIT_WEIGHTS_READ_LIMIT"
DEFAULT_READ_LIMIT = 2 << 30
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_HINT = "replace a weights file by renaming a new one over it (mv), never in place, while a model runs"


def read_limit() -> int:
    """The most external-data bytes a session reads into memory (``$GRAPHKIT_WEIGHTS_READ_LIMIT``:
    bytes, or a number with K, M, G or T; default 2 GiB); above it ONNX Runtime maps the files."""
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return DEFAULT_READ_LIMIT
    m = re.fullmatch(r"(\d+)\s*([kmgt]?)(?:i?b)?", text.lower())
    if m is None:
        raise UsageError(f"${ENV_VAR}={text!r} is not a size", hint="give bytes or a size such as 512M or 4G")
    return int(m[1]) * _UNITS[m[2]]


def read_external_data(files: Mapping[str, Path], extents: Mapping[str, int],
                       model: str) -> dict[str, np.ndarray]:
    """location -> the first ``extents[location]`` bytes of its file, read (never mapped).

    A file that changes while it is read (its size, mtime or ctime differ after) is read
    again, up to three times: the bytes are one version of the file, never a mix of two.
    Still changing, or shorter than the model needs, it is a ModelLoadError."""
    out: dict[str, np.ndarray] = {}
    done: dict[Path, np.ndarray] = {}
    for location, path in files.items():
        need = extents.get(location, 0)
        have = done.get(path)
        if have is None or len(have) < need:
            have = done[path] = _read_settled(path, need, location, model)
        out[location] = have
    return out


def _read_settled(path: Path, need: int, location: str, model: str) -> np.ndarray:
    buf = np.empty(need, np.uint8)
    for attempt in range(3):
        if attempt:
            time.sleep(0.1 * attempt)  # let the writer finish
        try:
            with open(path, "rb", buffering=0) as fh:
                before = _version(os.fstat(fh.fileno()))
                got, view = 0, memoryview(buf)
                while got < need:
                    n = fh.readinto(view[got:])
                    if not n:
                        break
                    got += n
                after = _version(os.fstat(fh.fileno()))
        except OSError as exc:
            raise ModelLoadError(f"cannot read external data file '{location}': {exc.strerror or exc}",
                                 path=model, hint="check the weights file next to the model") from exc
        if before == after and got == need:
            return buf
    if got < need:
        raise ModelLoadError(f"external data file '{location}' was truncated while it was read "
                             f"({got} of the {need} bytes the model uses)", path=model, hint=_HINT)
    raise ModelLoadError(f"external data file '{location}' kept changing while it was read", path=model,
                         hint=_HINT)


def _version(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


# -- SIGBUS on mapped weights: one line, exit 135 ----------------------------------------------------

_guard = threading.Lock()
_active: dict[int, tuple[str, tuple[str, ...]]] = {}  # one per block in progress: (model, locations)
_next = 0
_saved: ctypes.Array | None = None  # the sigaction ours replaced, restored when the last block ends
_SIGACTION_SIZE = 512  # larger than struct sigaction on every Linux ABI
_first = threading.Lock()  # taken by the first faulting thread
_handler = None  # the C function pointer (kept alive while installed)
_libc = None


def _on_sigbus(signum: int) -> None:
    """Runs in the faulting thread: say which files were mapped, then exit like the signal would.
    Several threads may fault at once: the first reports, the others wait for the exit."""
    if not _first.acquire(blocking=False):
        while True:
            time.sleep(1)
    parts = [f"{model}: external data file(s) {', '.join(repr(loc) for loc in locations)}"
             for model, locations in list(_active.values())]
    line = (f"graphkit: error: {'; '.join(parts) or 'external data'}: bus error: a weights file ONNX Runtime "
            f"had mapped was truncated or rewritten in place while the model ran ({_HINT}; or raise "
            f"${ENV_VAR} so graphkit reads the weights instead of mapping them)\n")
    with contextlib.suppress(OSError):
        os.write(2, line.encode(errors="replace"))
    os._exit(128 + signum)


def _install() -> bool:
    global _saved, _handler, _libc
    if _handler is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.signal.restype = ctypes.c_void_p
        _libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        _libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        _handler = ctypes.CFUNCTYPE(None, ctypes.c_int)(_on_sigbus)
    saved = ctypes.create_string_buffer(_SIGACTION_SIZE)
    if _libc.sigaction(signal.SIGBUS, None, saved) != 0:
        return False
    _saved = saved
    _libc.signal(signal.SIGBUS, ctypes.cast(_handler, ctypes.c_void_p))
    return True


@contextlib.contextmanager
def sigbus_reported(model: str, locations: tuple[str, ...]) -> Iterator[None]:
    """While the block runs, a SIGBUS (a mapped weights file truncated) prints one line naming
    ``locations`` of ``model`` and exits 135; the handler it replaced is restored after.
    Nothing on platforms other than Linux."""
    if not sys.platform.startswith("linux"):
        yield
        return
    global _next
    with _guard:
        key = None
        if _active or _install():
            key, _next = _next, _next + 1
            _active[key] = (model, locations)
    try:
        yield
    finally:
        if key is not None:
            with _guard:
                del _active[key]
                if not _active:
                    _libc.sigaction(signal.SIGBUS, _saved, None)
