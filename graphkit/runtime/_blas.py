"""One BLAS thread while a Python kernel runs: ONNX Runtime's intra-op threads own the cores.

A Python kernel runs on the thread that called ``run()``; numpy's BLAS (OpenBLAS in numpy's
wheels) would start one thread per core for a matmul, while ONNX Runtime's intra-op workers
(``intra_op_num_threads``) spin waiting for work: with both at the core count they fight
(measured on 16 cores: the deform_conv2d Python kernel 62 ms at 1 ORT thread, 172 ms at 16).
:func:`one_blas_thread` sets every loaded BLAS and OpenMP runtime (torch's) to one thread for
its block (threadpoolctl) and
puts the previous counts back when the last overlapping block (any thread) ends, so kernels
of sessions running at once never restore each other's setting halfway.

Known limit (measured, numpy 2.4's OpenBLAS 0.3.31): once the main thread has changed
OpenBLAS's thread count, a change made from another thread is ignored. Kernels of sessions
run from the main thread (the usual case), or only from other threads, are limited;
a process mixing both keeps BLAS's own count in the other threads' kernels.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["one_blas_thread"]

_lock = threading.Lock()
_depth = 0
_limiter: Any = None  # threadpoolctl's limiter of the outermost block
_controller: Any = None
_modules_seen = -1  # len(sys.modules) when _controller scanned the loaded libraries


def _limit() -> Any:
    global _controller, _modules_seen
    try:
        import threadpoolctl
    except ImportError:  # a dependency; without it BLAS keeps its own setting
        return None
    # Scanning the loaded libraries takes ~1 ms: again only after an import (a kernel's
    # first torch or scipy call loads another BLAS / OpenMP runtime).
    if _controller is None or len(sys.modules) != _modules_seen:
        _controller = threadpoolctl.ThreadpoolController()
        _modules_seen = len(sys.modules)
    return _controller.limit(limits=1)


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS single-threaded inside the block (process-wide, as BLAS settings are)."""
    global _depth, _limiter
    with _lock:
        if _depth == 0:
            _limiter = _limit()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _limiter is not None:
                _limiter.restore_original_limits()
                _limiter = None
