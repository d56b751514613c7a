"""Memory that C and C++ code freed, handed back to the operating system."""

from __future__ import annotations

import ctypes
import sys

__all__ = ["release_freed_memory"]

_trim: list = []


def release_freed_memory() -> None:
    """Return the C heap's free pages to the operating system (glibc's ``malloc_trim``).

    The ONNX checker and protobuf parse a model into many small C++ allocations; once they
    are freed, glibc keeps the pages for later mallocs, but the Python objects made next
    come from Python's own arenas (mmap), so without this a big model's check stays in the
    process's resident memory while the rewrite's lists are made on top of it. Does nothing
    where the C library has no ``malloc_trim`` (not glibc).
    """
    if not _trim:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None).malloc_trim
                fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _trim.append(fn)
    if _trim[0] is not None:
        _trim[0](0)
