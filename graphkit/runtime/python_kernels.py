"""Python kernels (``OpDef.python_kernel``) run by ONNX Runtime through onnxruntime-extensions.

onnxruntime-extensions ("ort-extensions") lets Python functions serve ONNX nodes (its
"PyOp"s). graphkit declares every op with a ``python_kernel`` in the domain
``graphkit.python`` and installs its own invocation handler, which fixes what the stock glue
gets wrong (all measured with onnxruntime-extensions 0.15.2 / ONNX Runtime 1.31.1):

- **Exceptions abort the process.** The C++ side calls the handler inside a ``noexcept``
  kernel, so *any* C++ exception there (a Python exception, but also a malformed result
  tuple, a bad shape, a size mismatch) ends in ``std::terminate`` (rc 134). The handler
  therefore never raises: on failure it returns empty outputs, stores the exception in the
  calling thread's run context and sets that run's ``RunOptions.terminate``; ONNX Runtime
  stops before the next node and graphkit's ``Session.run`` raises :class:`KernelError`
  chained to the original exception. Python kernels run on the thread that called ``run()``
  (sequential execution mode, which graphkit forces for such sessions), so a thread-local
  context is exact and sessions may run from several threads.
- **Outputs went through ``flatten().tolist()``** (45 ms for a 1 MB tensor). The C++ side
  accepts any buffer of the declared element type and memcpys it, so the handler returns the
  kernel's C-contiguous arrays as they are.
- **float16 tensors abort** (the C++ side has no float16 numpy mapping, for inputs or
  outputs). graphkit declares float16 combinations as separate ops (``my_add@f16:T``) taking
  float32, and :func:`graphkit.rewrite.lowering.binding.bind_python_nodes` wraps such nodes in exact Casts (float16 -> float32
  -> float16 is lossless); the handler casts back so the kernel sees and returns float16.
- **FLOAT attributes are printed with 6 digits** (``std::stringstream``). graphkit passes
  FLOAT, INTS and FLOATS attributes as strings (:func:`encode_kernel_attrs`) and decodes them
  exactly; INT and STRING pass natively. ort-extensions requires every declared attribute on
  the node; :func:`graphkit.rewrite.lowering.binding.bind_python_nodes` fills defaults in and converts natural encodings.
- **Declaring an op after a session exists can crash that session.** ort-extensions keeps
  declarations per domain in a ``std::vector`` whose elements ONNX Runtime references for the
  session's lifetime; growing it past its capacity moves them (use after free: measured
  segfault). graphkit reserves room on the first declaration (padding with never-used ops)
  and refuses to grow the table past it while a Python-kernel session is alive.

Several declarations with the same op name and different element types work: ONNX Runtime
picks the kernel by the node's input types. An op with type variables is declared once per
combination of their allowed types (``undefined``/any types do not work for outputs: ONNX
Runtime cannot infer the output type of such a custom op without a shape-inference function).

The declaration table and the hooker are process-wide because ort-extensions' own registry
and its single invocation handler are: one :class:`PythonKernelTable`, created on first use.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import itertools
import os
import sys
import threading
import traceback
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto

from graphkit.errors import KernelError, UnsupportedOpError
from graphkit.ops import AttrType, OpDef
from graphkit.ops._opdef import kernel_domain
from graphkit.ops.tensor_types import numpy_dtype, type_string
from graphkit.runtime._blas import one_blas_thread
from graphkit.ops._encoding import (  # noqa: F401 (re-exported: the kernel attribute encoding)
    F16_TAG,
    decode_kernel_attr,
    decode_list_attr,
    encode_kernel_attr,
    encode_kernel_attrs,
    encode_list_attr,
)

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = [
    "F16_TAG",
    "EXTENSIONS_DOMAINS",
    "encode_list_attr",
    "decode_list_attr",
    "encode_kernel_attr",
    "decode_kernel_attr",
    "encode_kernel_attrs",
    "kernel_problem",
    "python_kernel_table",
    "PythonKernelTable",
    "KernelFailure",
    "RunContext",
    "kernel_run",
]

# Domains served by the onnxruntime-extensions library itself (its C++ ops, foreign PyOps).
EXTENSIONS_DOMAINS = frozenset({"ai.onnx.contrib", "com.microsoft.extensions"})

# The tensor types served: ONNX type string -> onnxruntime-extensions' PyCustomOpDef
# attribute naming it (numpy dtypes come from graphkit.ops.tensor_types). float16 is served
# through float32 (see the module docstring); bfloat16 and the float8 types are not served.
_SERVED: dict[str, str] = {
    "tensor(float)": "dt_float",
    "tensor(double)": "dt_double",
    "tensor(float16)": "dt_float",
    "tensor(int8)": "dt_int8",
    "tensor(int16)": "dt_int16",
    "tensor(int32)": "dt_int32",
    "tensor(int64)": "dt_int64",
    "tensor(uint8)": "dt_uint8",
    "tensor(uint16)": "dt_uint16",
    "tensor(uint32)": "dt_uint32",
    "tensor(uint64)": "dt_uint64",
    "tensor(bool)": "dt_bool",
    "tensor(complex64)": "dt_complex64",
    "tensor(complex128)": "dt_complex128",
    "tensor(string)": "dt_string",
}
_F16 = type_string(TensorProto.FLOAT16)
# More type combinations than this for one op is almost certainly a definition mistake.
_MAX_COMBINATIONS = 64
# First declaration batch: pad the domain's vector to this many entries so that its
# capacity (next power of two on libstdc++/libc++) leaves room for later declarations.
_RESERVE_SIZE = 129


# ---------------------------------------------------------------------------------------
# Attribute encoding (the `graphkit rewrite --bind python` protocol)
# ---------------------------------------------------------------------------------------

def _declared_attr_type(attr_type: AttrType) -> str:
    return "dt_int64" if attr_type is AttrType.INT else "dt_string"


# ---------------------------------------------------------------------------------------
# Declarations
# ---------------------------------------------------------------------------------------

def _type_vars(op: OpDef) -> list[str]:
    seen: dict[str, None] = {}
    for p in op.inputs + op.outputs:
        seen.setdefault(p.type, None)
    return list(seen)


def _combinations(op: OpDef) -> list[dict[str, str]]:
    """Every assignment of a served ONNX type to each of ``op``'s type variables."""
    input_vars = {p.type for p in op.inputs}
    choices = []
    for var in _type_vars(op):
        allowed = [t for t in op.type_constraints[var] if t in _SERVED]
        if var not in input_vars:
            # ONNX Runtime picks a kernel by its input types only: an output-only variable
            # can have one type.
            allowed = allowed[:1]
        choices.append([(var, t) for t in allowed])
    return [dict(c) for c in itertools.product(*choices)] if choices else [{}]


def _signature(op: OpDef) -> tuple:
    return (tuple(p.type for p in op.inputs), tuple(p.type for p in op.outputs),
            tuple((a.name, a.type) for a in op.attributes),
            tuple(sorted((k, tuple(v)) for k, v in op.type_constraints.items())))


def kernel_problem(op: OpDef) -> str | None:
    """Why ``op`` cannot run as a Python kernel, or None."""
    if op.python_kernel is None:
        return "no Python kernel"
    combos = _combinations(op)
    if not combos:
        types = sorted({t for v in op.type_constraints.values() for t in v})
        return f"none of its types {types} can pass through onnxruntime-extensions"
    if len(combos) > _MAX_COMBINATIONS:
        return f"its type constraints give {len(combos)} type combinations (at most {_MAX_COMBINATIONS})"
    return None


class _Contract(Exception):
    """A kernel broke its contract (wrong output count, type or dtype; unreadable attribute)."""

    def __init__(self, message: str, hint: str = "fix the kernel's return value") -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(eq=False)
class _Declaration:
    """One ort-extensions PyOp: an op with one concrete type per type variable."""

    op: OpDef                       # the definition first declared under this name
    op_type: str                    # node op_type in the graphkit.python domain
    combo: Mapping[str, str]        # type variable -> ONNX type the kernel sees
    in_f16: tuple[bool, ...]        # inputs that arrive as float32 and are float16 for the kernel
    out_f16: tuple[bool, ...]
    out_dtypes: tuple[np.dtype, ...]
    out_string: tuple[bool, ...]
    attr_types: tuple[tuple[str, AttrType], ...]
    native_def: Any = None          # the PyCustomOpDef: C++ holds a raw pointer to it

    def __post_init__(self) -> None:
        self.k_id = id(self)
        self.empty = (self.k_id,) + ([0], []) * max(1, len(self.out_dtypes))
        self.describe = ", ".join(f"{v}={t[7:-1]}" for v, t in self.combo.items())

    def decode_attrs(self, attrs: Mapping[str, str]) -> dict[str, Any]:
        out = {}
        for name, attr_type in self.attr_types:
            try:
                out[name] = decode_kernel_attr(attrs[name], attr_type)
            except (KeyError, ValueError) as exc:
                raise _Contract(f"attribute '{name}' ({attr_type.onnx_name}) is not in the "
                                f"kernel encoding: {exc}",
                                hint="write attributes with encode_kernel_attrs") from None
        return out

    def pack(self, op: OpDef, result: Any) -> tuple:
        """The ``(k_id, shape0, data0, ...)`` tuple ort-extensions expects, without copies."""
        outs = result if isinstance(result, tuple) else (result,)
        if len(outs) != len(self.out_dtypes):
            raise _Contract(f"returned {len(outs)} output(s), expected {len(self.out_dtypes)} "
                            f"({', '.join(p.name for p in op.outputs)})")
        packed: list = [self.k_id]
        for i, arr in enumerate(outs):
            name = op.outputs[i].name
            if not isinstance(arr, np.ndarray):
                if not isinstance(arr, np.generic):
                    raise _Contract(f"output '{name}' is a {type(arr).__name__}, expected a numpy array")
                arr = np.asarray(arr)
            if self.out_string[i]:
                if arr.dtype.kind not in "OUS":
                    raise _Contract(f"output '{name}' has dtype {arr.dtype}, expected strings")
                packed += [arr.shape, [str(s) for s in arr.ravel().tolist()]]
                continue
            if arr.dtype != self.out_dtypes[i]:
                raise _Contract(f"output '{name}' has dtype {arr.dtype}, expected "
                                f"{self.out_dtypes[i]} (type {op.outputs[i].type})")
            if self.out_f16[i]:
                arr = arr.astype(np.float32)  # exact; a Cast back to float16 follows the node
            elif not arr.flags.c_contiguous:
                arr = arr.copy(order="C")
            packed += [arr.shape, arr]
        return tuple(packed)


@dataclass
class KernelFailure:
    """A Python kernel's exception, kept for ``Session.run`` to re-raise."""

    op: str                 # "graphkit.python::name"
    op_name: str            # OpDef name (a foreign op's op_type)
    types: str              # "T=float" or "" for foreign ops
    inputs: str             # "float32[2,3], float32[3]"
    exc: BaseException
    contract: bool = False  # the kernel ran but broke its contract (not an exception of its own)

    def to_error(self, node: str | None = None, path: str | None = None) -> KernelError:
        typed = f" ({self.types})" if self.types else ""
        if self.contract:
            return KernelError(f"Python kernel{typed}: {self.exc}", op=self.op, node=node,
                               path=path, hint=getattr(self.exc, "hint", None))
        msg = str(self.exc)
        return KernelError(f"Python kernel{typed} raised {type(self.exc).__name__}"
                           f"{': ' + msg if msg else ''} (inputs {self.inputs or 'none'})",
                           op=self.op, node=node, path=path,
                           hint="see the chained exception's traceback")


def _describe_feed(feed: Sequence[Any]) -> str:
    parts = []
    for x in feed:
        shape = getattr(x, "shape", None)
        dtype = getattr(x, "dtype", None)
        parts.append(f"{dtype}[{','.join(map(str, shape))}]" if shape is not None else type(x).__name__)
    return ", ".join(parts)


class RunContext:
    """What one ``Session.run`` call lends the kernels it runs on this thread."""

    __slots__ = ("run_options", "ops", "failure")

    def __init__(self, run_options: "ort.RunOptions", ops: Mapping[str, OpDef]) -> None:
        self.run_options = run_options
        self.ops = {op.qualified_name: op for op in ops.values()}
        self.failure: KernelFailure | None = None


_tls = threading.local()


class kernel_run:
    """Context manager making ``ctx`` the current run context of this thread (re-entrant)."""

    __slots__ = ("ctx", "_prev")

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def __enter__(self) -> RunContext:
        self._prev = getattr(_tls, "ctx", None)
        _tls.ctx = self.ctx
        return self.ctx

    def __exit__(self, *exc: object) -> None:
        _tls.ctx = self._prev


def _report_orphan(failure: KernelFailure) -> None:
    """A kernel failed outside graphkit's Session.run: nothing can raise; say it loudly."""
    try:
        sys.stderr.write(f"graphkit: {failure.to_error()}; it ran outside graphkit's "
                         f"Session.run, so its outputs are EMPTY tensors\n")
        traceback.print_exception(type(failure.exc), failure.exc, failure.exc.__traceback__)
    except BaseException:  # noqa: BLE001 - never let anything escape into C++
        pass


def _tune_malloc() -> bool:
    """Keep glibc from returning freed array memory to the OS after every kernel call.

    A Python kernel call allocates several tensor-sized numpy arrays (the inputs ort-extensions
    copies, the kernel's results) and frees them. With glibc's dynamic thresholds the freed
    top of the heap is trimmed each time, so the next call page-faults all of it again:
    measured 1.7 ms instead of 0.13 ms for my_add on 1x16x128x128 float32. Fixed thresholds
    (mmap above 32 MiB, trim above 128 MiB of free heap) avoid that; the process keeps up to
    128 MiB of freed memory for reuse. Process-wide; set GRAPHKIT_MALLOC_TUNING=0 to skip it.
    """
    if os.environ.get("GRAPHKIT_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 128 << 20))


@contextlib.contextmanager
def _environment_kept(name: str) -> Iterator[None]:
    """Undo whatever the block does to environment variable ``name``."""
    before = os.environ.get(name)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


# Heavy packages onnxruntime_extensions imports if it can, for converters Python kernels never use.
_UNNEEDED = ("torch", "transformers")


class _NoTorch(importlib.abc.MetaPathFinder):
    def __init__(self, blocked: Sequence[str]) -> None:
        self.blocked = frozenset(blocked)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".", 1)[0] in self.blocked:
            raise ImportError(f"{name} is not imported while graphkit loads onnxruntime-extensions")
        return None


@contextlib.contextmanager
def _without_torch() -> Iterator[None]:
    """Inside the block, ``import torch`` and ``import transformers`` fail (unless loaded already).

    onnxruntime_extensions imports torch (~1 s and hundreds of MB) and transformers (~0.9 s)
    on import when it can, only for its Whisper pre-processing and tokenizer converters,
    which Python kernels never use; it handles the ImportError. Those converters stay
    unavailable in this process if the package was not imported before the first
    Python-kernel session (an export's load check opens one).
    """
    blocked = [name for name in _UNNEEDED if name not in sys.modules]
    if not blocked:
        yield
        return
    finder = _NoTorch(blocked)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


class PythonKernelTable:
    """The process-wide declarations of graphkit's Python kernels and the invocation hooker.

    Process-wide because ort-extensions' PyOp registry and its single invocation handler
    are: declarations cannot be removed, and every session that registers the library sees
    all of them. Use :func:`python_kernel_table`.
    """

    def __init__(self) -> None:
        with _environment_kept("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"), _without_torch():
            # onnxruntime_extensions sets that variable to "python" on import, which would make
            # every child process parse protobuf in pure Python (slowly, and more strictly).
            import onnxruntime_extensions  # noqa: F401 - loads the library, installs its own hooker
        from onnxruntime_extensions import _ocos

        self._ocos = _ocos
        self._lock = threading.RLock()
        self._decls: dict[int, _Declaration] = {}
        # Declarations by qualified op name (domain::name).
        self._by_name: dict[str, tuple[tuple, list[_Declaration]]] = {}
        # Entries in ort-extensions' vector of each graphkit.python[.<domain>] domain; this
        # assumes only graphkit declares ops there (nobody else has a reason to).
        self._size: dict[str, int] = {}
        self._capacity: dict[str, int] = {}
        self._live = 0        # sessions (alive or being created) that reference those entries
        self._hooked = False
        self._padding: list[Any] = []
        _tune_malloc()

    # -- declarations ---------------------------------------------------------------------

    @property
    def library_path(self) -> str:
        return self._ocos.get_library_path()

    def declared(self, name: str) -> bool:
        """Whether ``name`` (``domain::op``, or a bare name for the ``custom`` domain) is declared."""
        return (name if "::" in name else f"custom::{name}") in self._by_name

    def conflict(self, op: OpDef) -> str | None:
        """Why ``op`` cannot be declared next to what this process already declared, or None."""
        entry = self._by_name.get(op.qualified_name)
        if entry is not None and entry[0] != _signature(op):
            return ("another definition of this op, with a different signature, was already "
                    "declared to onnxruntime-extensions in this process (its registry is "
                    "process-wide); rename the op or use one definition per process")
        return None

    def _grow(self, domain: str) -> None:
        size, capacity = self._size.get(domain, 0), self._capacity.get(domain, 0)
        if size == capacity:
            self._capacity[domain] = (max(1, capacity * 2) if sys.platform != "win32"
                                      else max(capacity + 1, capacity + capacity // 2))
        self._size[domain] = size + 1

    def _push(self, domain: str, op_type: str, inputs: list[int], outputs: list[int],
              attrs: dict[str, int], obj_id: int) -> Any:
        d = self._ocos.PyCustomOpDef()
        d.op_type = f"{domain}::{op_type}"
        d.obj_id = obj_id
        d.input_types = inputs
        d.output_types = outputs
        d.attrs = attrs
        self._ocos.add_custom_op(d)
        self._grow(domain)
        return d

    def _plan(self, op: OpDef) -> list[_Declaration]:
        decls = []
        attr_types = tuple((a.name, a.type) for a in op.attributes)
        for combo in _combinations(op):
            f16 = sorted(v for v, t in combo.items() if t == _F16)
            decls.append(_Declaration(
                op=op,
                op_type=f"{op.name}{F16_TAG}{'+'.join(f16)}" if f16 else op.name,
                combo=combo,
                in_f16=tuple(combo[p.type] == _F16 for p in op.inputs),
                out_f16=tuple(combo[p.type] == _F16 for p in op.outputs),
                out_dtypes=tuple(numpy_dtype(combo[p.type]) for p in op.outputs),
                out_string=tuple(combo[p.type] == "tensor(string)" for p in op.outputs),
                attr_types=attr_types))
        return decls

    def declare(self, ops: Iterable[OpDef]) -> None:
        """Declare every op of ``ops`` not declared yet (all its type combinations)."""
        with self._lock:
            todo = {op.qualified_name: op for op in ops if op.qualified_name not in self._by_name}
            for op in todo.values():
                problem = kernel_problem(op)
                if problem:
                    raise UnsupportedOpError(problem, op=f"{kernel_domain('python', op.domain)}::{op.name}",
                                             hint="decompose it or bind it to the native kernel")
            plans = {name: self._plan(op) for name, op in todo.items()}
            by_domain: dict[str, int] = {}
            for name, decls in plans.items():
                domain = kernel_domain("python", todo[name].domain)
                by_domain[domain] = by_domain.get(domain, 0) + len(decls)
            for domain, count in by_domain.items():
                size, capacity = self._size.get(domain, 0), self._capacity.get(domain, 0)
                if size and size + count > capacity and self._live:
                    raise KernelError(
                        f"cannot declare {count} more Python kernel(s) while Python-kernel sessions "
                        f"are alive: onnxruntime-extensions' table for {domain} is full "
                        f"({size} of {capacity}) and growing it would invalidate them",
                        op=", ".join(n for n in plans if kernel_domain("python", todo[n].domain) == domain),
                        hint="open sessions for every op earlier, or close the other sessions first")
            d = self._ocos.PyCustomOpDef
            for name, decls in plans.items():
                op = todo[name]
                domain = kernel_domain("python", op.domain)
                first = not self._size.get(domain)
                for decl in decls:
                    ins = [getattr(d, _SERVED[decl.combo[p.type]]) for p in op.inputs]
                    outs = [getattr(d, _SERVED[decl.combo[p.type]]) for p in op.outputs]
                    attrs = {a.name: getattr(d, _declared_attr_type(a.type)) for a in op.attributes}
                    decl.native_def = self._push(domain, decl.op_type, ins, outs, attrs, decl.k_id)
                    self._decls[decl.k_id] = decl
                self._by_name[name] = (_signature(op), decls)
                if first:  # room for later declarations in this domain (see the module docstring)
                    f = d.dt_float
                    while self._size[domain] < _RESERVE_SIZE:
                        pad = self._push(domain, f"_graphkit_reserved_{self._size[domain]}", [f], [f], {}, 0)
                        self._padding.append(pad)

    # -- sessions -------------------------------------------------------------------------

    def attach(self, so: "ort.SessionOptions") -> "_Lease":
        """Register the ort-extensions library on ``so``, installing the hooker on first use.

        The returned lease counts a session referencing the table; release it when the
        session is gone (or was never created).
        """
        with self._lock:
            if not self._hooked:
                self._ocos.PyCustomOpDef.install_hooker(self._invoke)
                self._hooked = True
            self._live += 1
            lease = _Lease(self)
            try:
                so.register_custom_ops_library(self.library_path)
            except BaseException:
                lease.release()
                raise
            return lease

    def _release(self) -> None:
        with self._lock:
            self._live -= 1

    # -- the hooker (called by ort-extensions' C++; must never raise) ---------------------

    def _invoke(self, k_id: int, feed: list, attrs: dict) -> tuple:
        decl = self._decls.get(k_id)
        if decl is None:
            return self._foreign(k_id, feed, attrs)
        ctx = getattr(_tls, "ctx", None)
        op = decl.op
        try:
            if ctx is not None:
                op = ctx.ops.get(op.qualified_name, op)
            kwargs = decl.decode_attrs(attrs) if decl.attr_types else {}
            args = feed
            if True in decl.in_f16:
                args = [x.astype(np.float16) if f else x for x, f in zip(feed, decl.in_f16)]
            with one_blas_thread():  # ORT's intra-op threads own the cores (see _blas.py)
                result = op.python_kernel(*args, **kwargs)
            return decl.pack(op, result)
        except BaseException as exc:  # noqa: BLE001 - anything escaping aborts the process
            try:
                failure = KernelFailure(
                    op=f"{kernel_domain('python', op.domain)}::{op.name}", op_name=op.name, types=decl.describe,
                    inputs=_describe_feed(feed), exc=exc, contract=isinstance(exc, _Contract))
                self._fail(ctx, failure)
            except BaseException:  # noqa: BLE001
                pass
            return decl.empty

    def _foreign(self, k_id: int, feed: list, attrs: dict) -> tuple:
        """Another user's @onnx_op: ort-extensions' own handler, made safe inside graphkit runs."""
        handler = self._ocos._on_pyop_invocation
        ctx = getattr(_tls, "ctx", None)
        if ctx is None:
            return handler(k_id, feed, attrs)  # upstream behaviour, unchanged
        try:
            return handler(k_id, feed, attrs)
        except BaseException as exc:  # noqa: BLE001
            n_out = 1
            name = f"#{k_id}"
            try:
                od = self._ocos.Opdef._odlist.get(k_id)
                if od is not None:
                    name = od.op_type
                    n_out = max(1, len(od._nativedef.output_types))
                op_type = name if "::" in name else f"{self._ocos.default_opset_domain()}::{name}"
                self._fail(ctx, KernelFailure(op=op_type, op_name=name, types="",
                                              inputs=_describe_feed(feed), exc=exc))
            except BaseException:  # noqa: BLE001
                pass
            return (k_id,) + ([0], []) * n_out

    @staticmethod
    def _fail(ctx: RunContext | None, failure: KernelFailure) -> None:
        if ctx is None:
            _report_orphan(failure)
            return
        if ctx.failure is None:
            ctx.failure = failure
        ctx.run_options.terminate = True


class _Lease:
    __slots__ = ("_table", "_done", "__weakref__")

    def __init__(self, table: PythonKernelTable) -> None:
        self._table = table
        self._done = False

    def release(self) -> None:
        if not self._done:
            self._done = True
            self._table._release()

    def bind(self, session: object) -> None:
        """Release when ``session`` is collected."""
        weakref.finalize(session, self.release)


_table: PythonKernelTable | None = None
_table_lock = threading.Lock()


def python_kernel_table() -> PythonKernelTable:
    """The process-wide table, created (importing onnxruntime-extensions) on first use."""
    global _table
    if _table is None:
        with _table_lock:
            if _table is None:
                _table = PythonKernelTable()
    return _table
