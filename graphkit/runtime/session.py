"""Open ONNX Runtime sessions with the kernels a model's custom ops need.

- Every node's op is found with ``registry.lookup(domain, op_type)``. Placeholder nodes of
  native ops (``custom::my_add``, ``acme::rms_norm``) and nodes in native kernel domains
  (``graphkit.native``, ``graphkit.native.acme``) run on ONE native library linked for the
  set of op packages they need (``graphkit.runtime.native.library_for``); packages with a
  prebuilt library have it registered as it is. Nothing is built or registered for models
  without such nodes.
- Nodes in Python kernel domains (``graphkit.python``, ``graphkit.python.<domain>``) run
  their op's ``python_kernel`` through onnxruntime-extensions
  (:mod:`graphkit.runtime.python_kernels`), as do ort-extensions' own domains.
- With the caller's own ``options``, nodes in domains no op package knows are left to
  ONNX Runtime (the caller may have registered a library for them).
- Nodes inside If/Loop/Scan bodies and model-local functions count too.

Every node without a kernel is named before ONNX Runtime is touched.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from graphkit._invocation import wording
from graphkit.errors import KernelError, UnsupportedOpError, UsageError
from graphkit.ops import OpRegistry
from graphkit.ops._opdef import split_kernel_domain
from graphkit.ops.tensor_types import numpy_dtype
from graphkit.runtime import _weights
from graphkit.runtime import python_kernels as pk

__all__ = ["open_session", "kernel_needs", "KernelNeeds", "Session", "TensorInfo", "STANDARD_DOMAINS"]

# Domains ONNX Runtime serves itself.
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})
# Marks SessionOptions graphkit already registered kernel libraries on.
_USED_KEY = "graphkit.kernels_registered"


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output: ``shape`` holds ints, symbolic names or None (unknown dim);
    it is None when the rank is unknown. ``dtype`` is None for non-tensor types."""

    name: str
    type: str
    dtype: np.dtype | None
    shape: tuple[int | str | None, ...] | None


@dataclass
class _NodeRef:
    node: onnx.NodeProto
    graph: onnx.GraphProto | None   # None inside a model-local function
    index: int
    depth: int
    display: str


def _walk(model: onnx.ModelProto) -> Iterator[_NodeRef]:
    """Every node: main graph, subgraphs (any depth), model-local functions, in document order
    (a node's subgraphs right after it)."""
    from graphkit.rewrite.graph.walk import ENTER, NODE, walk

    counter = 0
    for event, v in walk(model, nodes=True):
        if event == ENTER:
            # v.data: [the prefix of its nodes' labels, the label of its latest node]
            if v.parent is None:
                where = "" if v.graph is not None else f"function {v.function.domain}::{v.function.name}/"
            else:
                attr = v.attribute.name if v.index < 0 else f"{v.attribute.name}[{v.index}]"
                where = f"{v.parent.data[1]}/{attr}/"
            v.data = [where, ""]
        elif event == NODE:
            n = v.nodes[v.at]
            counter += 1
            base = n.name or f"<unnamed {n.domain or 'ai.onnx'}::{n.op_type} #{counter}>"
            display = v.data[1] = f"{v.data[0]}{base}" if v.data[0] else base
            yield _NodeRef(n, v.graph, v.at, v.depth + (v.function is not None), display)


def _native():
    from graphkit.runtime import native

    return native


def _load(model: str | os.PathLike[str] | onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    if isinstance(model, onnx.ModelProto):
        return model, None
    if not isinstance(model, (str, os.PathLike)):
        raise UsageError(f"model must be a path or an onnx.ModelProto, not {type(model).__name__}")
    from graphkit.modelio import load_model

    return load_model(model), os.fspath(model)


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # a file name that is not UTF-8 (surrogate-escaped bytes)
        return False
    return True


_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


@dataclass
class _Weights:
    """A model's external data: location -> file, and the bytes of each the model uses."""

    model: str                  # the model file, or what stands for an in-memory one
    files: dict[str, Path]
    extents: dict[str, int]

    def total(self) -> int:
        """The bytes reading them takes (a file named by two locations counts once)."""
        used: dict[Path, int] = {}
        for location, f in self.files.items():
            used[f] = max(used.get(f, 0), self.extents.get(location, 0))
        return sum(used.values())


def _check_external_data(proto: onnx.ModelProto, path: str | None,
                         options: ort.SessionOptions | None) -> _Weights | None:
    """Validate external data the way `graphkit rewrite` does, before ONNX Runtime reads any.

    ONNX Runtime resolves an in-memory model's external data against the folder named in
    the options (``_FOLDER_KEY``), else the working directory.
    """
    from graphkit.external_data import check_external_data, external_tensors

    if not external_tensors(proto):
        return None
    where = path if path is not None else str(Path(_config_entry(options, _FOLDER_KEY) or Path.cwd())
                                              / "<in-memory model>")
    extents: dict[str, int] = {}
    files = check_external_data(proto, where, extents=extents)
    return _Weights(where, files, extents)


def _config_entry(options: ort.SessionOptions | None, key: str) -> str | None:
    if options is None:
        return None
    try:
        return options.get_session_config_entry(key) or None
    except Exception:  # noqa: BLE001 - ORT raises a plain RuntimeError for a key not set
        return None


# Random inputs bigger than this are refused: a model's declared dims (or --dim) are not
# a reason to exhaust the machine's memory.
MAX_RANDOM_BYTES = 1 << 32


def _define_hint() -> str:
    """How to make an op known, in the caller's words (the command's --ops, or the API's registry=)."""
    return wording("pass --ops PACKAGE or install the package that defines it",
                   "pass registry=graphkit.ops.discover(['PACKAGE']) or install the package that defines it")


@dataclass
class _Plan:
    native: list[_NodeRef]
    python: list[_NodeRef]
    extensions: bool
    libraries: list[tuple[Path, str]]          # (library, what it serves, for messages)


def _native_libraries(registry: OpRegistry, packages: Sequence[Any], path: str | None
                      ) -> list[tuple[Path, str]]:
    """Libraries to register for ``packages``: one linked for every package with sources,
    each prebuilt one as it is.

    A domain registered by two of them is a KernelError naming both packages (ONNX Runtime
    refuses a domain registered twice)."""
    compiled = [p for p in packages if p.native.library is None]
    prebuilt = [p for p in packages if p.native.library is not None]
    libraries: list[tuple[Path, str]] = []
    owner: dict[str, str] = {}  # domain -> package(s) serving it
    if compiled:
        lib = _native().library_for(compiled, registry)
        names = ", ".join(p.name for p in compiled)
        libraries.append((lib, names))
        for op in (op for p in compiled for op in p.native_ops()):
            for domain in (op.domain, registry.kernel_domain(op, "native")):
                owner.setdefault(domain, registry.package_of(op).name)
    for p in prebuilt:
        lib = Path(p.native.library)
        if not lib.is_file():
            raise KernelError(f"package {p.name}: its prebuilt native library {lib} does not exist",
                              path=path, hint="build the package's library, or reinstall the package")
        for domain in dict.fromkeys(op.domain for op in p.native_ops()):
            if domain in owner:
                raise KernelError(
                    f"domain '{domain}' is served by two native libraries in this session: package "
                    f"{owner[domain]} and package {p.name} (prebuilt {lib})",
                    path=path, hint="ONNX Runtime registers a domain once: give the prebuilt "
                                    "package's ops their own domain, or run the models separately")
            owner[domain] = p.name
        libraries.append((lib, p.name))
    return libraries


def _plan(model: onnx.ModelProto, registry: OpRegistry, path: str | None, *,
          foreign_ok: bool = False, build: bool = True) -> _Plan:
    """Sort nodes by the kernels they need; raise UnsupportedOpError naming all without one.

    ``foreign_ok``: nodes in domains no op package knows are left to ONNX Runtime (the
    caller's SessionOptions may register a library for them). ``build``: link the native
    libraries the native nodes need (False: only sort)."""
    refs = list(_walk(model))
    functions = {(f.domain, f.name) for f in model.functions}
    function_domains = {f.domain for f in model.functions}
    native, python, problems = [], [], []
    native_packages: dict[int, Any] = {}
    extensions = False
    table = None
    src = path or "MODEL.onnx"
    known_domains = registry.placeholder_domains()
    standard_ops = registry.standard_op_types()
    opset = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), None)

    def fix(op, *, have: str) -> str:
        """How to get a kernel for ``op`` other than the lowering ``have`` the node has."""
        if op is None:
            return _define_hint()
        ways = []
        if op.decompositions:
            ways.append(f"run `graphkit rewrite {src} OUT.onnx` to decompose it")
        if op.native and have != "native":
            ways.append("rewrite with --bind native")
        if op.python_kernel is not None and have != "python":
            ways.append("rewrite with --bind python")
        return ", or ".join(ways) or "give the op a decomposition or a kernel in its op package"

    for ref in refs:
        n = ref.node
        domain = n.domain
        if not isinstance(domain, str) or not isinstance(n.op_type, str):
            # protobuf hands back bytes for a string field that is not UTF-8
            from graphkit.errors import ModelLoadError

            raise ModelLoadError(f"node {ref.display}: its domain or op type is not UTF-8 text",
                                 path=path, hint="fix or re-export the model")
        qualified = f"{domain or 'ai.onnx'}::{n.op_type}"
        if (domain, n.op_type) in standard_ops and opset is not None:
            op, std = registry.standard_op(domain, n.op_type)
            if opset < std.since_opset:  # ONNX Runtime would refuse the whole graph (INVALID_GRAPH)
                problems.append((ref, qualified, f"{std} does not exist at ai.onnx opset {opset} "
                                 f"(it came in opset {std.since_opset})",
                                 f"run `graphkit rewrite {src} OUT.onnx`: it runs it as {op.qualified_name}"))
                continue
        if (domain, n.op_type) in functions or domain in STANDARD_DOMAINS | function_domains:
            continue
        kind = split_kernel_domain(domain)
        op = registry.lookup(domain, n.op_type)
        if kind is not None and kind[0] == "python":
            if op is None:
                problems.append((ref, qualified, "op not defined in the registry", _define_hint()))
                continue
            reason = pk.kernel_problem(op)
            if reason is None and (any(not name for name in n.input) or len(n.input) < len(op.inputs)):
                reason = ("omits an optional input, which onnxruntime-extensions cannot pass "
                          "to a Python kernel")
            if reason is None:
                table = table or pk.python_kernel_table()
                reason = table.conflict(op)
            if reason is not None:
                problems.append((ref, qualified, reason, fix(op, have="python")))
                continue
            python.append(ref)
        elif op is not None and (registry.is_placeholder(domain, n.op_type) or kind is not None
                                 or domain == registry.kernel_domain(op, "native")):
            if not registry.has_native(op):
                problems.append((ref, qualified, "no native kernel", fix(op, have="native")))
                continue
            package = registry.package_of(op)
            native.append(ref)
            native_packages[id(package)] = package
        elif domain in pk.EXTENSIONS_DOMAINS:
            extensions = True
        elif domain in known_domains or kind is not None:
            problems.append((ref, qualified, f"no native kernel: no op package defines {qualified}",
                             _define_hint()))
        elif not foreign_ok:
            problems.append((ref, qualified, f"domain '{domain}' is unknown to ONNX Runtime",
                             f"{_define_hint()}, or re-export the model without the op"))
    libraries: list[tuple[Path, str]] = []
    if native and not problems and build:
        packages = [p for p in registry.packages if id(p) in native_packages]
        libraries = _native_libraries(registry, packages, path)
        served = set()
        checked = True
        for lib, _what in libraries:
            try:
                served |= _native().served_ops(lib)
            except (OSError, AttributeError):
                checked = False  # a prebuilt library: it does not list its ops
        for ref in native if checked else ():
            n = ref.node
            if f"{n.domain}::{n.op_type}" in served:
                continue
            problems.append((ref, f"{n.domain}::{n.op_type}", "no native kernel",
                             fix(registry.lookup(n.domain, n.op_type), have="native")))
    if problems:
        order = {id(r): i for i, r in enumerate(refs)}
        problems.sort(key=lambda p: order[id(p[0])])
        if len(problems) == 1:
            ref, qualified, reason, hint = problems[0]
            raise UnsupportedOpError(reason, node=ref.display,
                                     op=qualified, path=path, hint=hint)
        lines = "; ".join(f"node '{r.display}' ({q}): {why}" for r, q, why, _ in problems)
        hints = list(dict.fromkeys(h for *_, h in problems))
        raise UnsupportedOpError(f"{len(problems)} nodes have no kernel: {lines}", path=path,
                                 hint="; ".join(hints))
    return _Plan(native, python, extensions, libraries)


@dataclass(frozen=True)
class KernelNeeds:
    """What a model's nodes need besides ONNX Runtime's own kernels (open_session's sorting).

    ``native`` and ``python`` count the nodes (``domain::op``) served by native libraries
    and by Python kernels (which need graphkit at run time); ``packages`` are the op
    packages whose native kernels serve the native ones; ``extensions``: nodes of
    onnxruntime-extensions' own domains."""

    native: Mapping[str, int]
    python: Mapping[str, int]
    packages: tuple[Any, ...]
    extensions: bool


def kernel_needs(model: onnx.ModelProto, registry: OpRegistry, *, path: str | None = None) -> KernelNeeds:
    """Sort ``model``'s nodes by the kernels they need, building nothing. Raises
    UnsupportedOpError naming every node without a kernel, as open_session does."""
    plan = _plan(model, registry, path, build=False)

    def count(refs: list[_NodeRef]) -> dict[str, int]:
        return dict(collections.Counter(f"{r.node.domain}::{r.node.op_type}" for r in refs))

    packages = {id(p): p for r in plan.native
                for p in (registry.package_of(registry.lookup(r.node.domain, r.node.op_type)),)}
    return KernelNeeds(count(plan.native), count(plan.python),
                       tuple(p for p in registry.packages if id(p) in packages), plan.extensions)


def _tensor_info(arg: Any, proto_types: Mapping[str, onnx.TypeProto]) -> TensorInfo:
    shape: tuple[int | str | None, ...] | None = None
    tp = proto_types.get(arg.name)
    if tp is not None:
        if tp.HasField("tensor_type") and tp.tensor_type.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else
                          (d.dim_param if d.HasField("dim_param") else None)
                          for d in tp.tensor_type.shape.dim)
    elif arg.shape is not None:
        shape = tuple(arg.shape)
    return TensorInfo(arg.name, arg.type, numpy_dtype(arg.type), shape)


class Session:
    """An ONNX Runtime session with graphkit's kernels; create it with :func:`open_session`.

    ``inputs`` and ``outputs`` describe the model's tensors (:class:`TensorInfo`); ``path``
    is the model file, None for an in-memory model. ``run`` may be called from several
    threads at once.
    """

    def __init__(self, sess: ort.InferenceSession, model: onnx.ModelProto, *, path: str | None,
                 python_ops: Mapping[str, Any], python_nodes: Mapping[str, list[str]],
                 python_kernels: bool, mapped: tuple[str, tuple[str, ...]] | None = None) -> None:
        self._sess = sess
        self.path = path
        self._python_kernels = python_kernels
        self._python_ops = dict(python_ops)
        self._python_nodes = {k: list(v) for k, v in python_nodes.items()}
        types = {vi.name: vi.type for vi in (*model.graph.input, *model.graph.output)}
        self.inputs: tuple[TensorInfo, ...] = tuple(_tensor_info(a, types) for a in sess.get_inputs())
        self.outputs: tuple[TensorInfo, ...] = tuple(_tensor_info(a, types) for a in sess.get_outputs())
        self._input_index = {i.name: i for i in self.inputs}
        self._output_names = [o.name for o in self.outputs]
        self._mapped = mapped  # (model, external-data locations) ONNX Runtime maps, if any

    def __repr__(self) -> str:
        return (f"Session({self.path or '<model>'}, inputs={[i.name for i in self.inputs]}, "
                f"outputs={self._output_names})")

    # -- feeds ----------------------------------------------------------------------------

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(feeds, Mapping):
            raise UsageError(f"feeds must be a mapping of input name to numpy array, not "
                             f"{type(feeds).__name__}")
        if len(feeds) != len(self._input_index) or any(n not in feeds for n in self._input_index):
            expected = list(self._input_index)
            missing = [n for n in expected if n not in feeds]
            extra = [n for n in feeds if n not in self._input_index]
            parts = ([f"missing input(s) {missing}"] if missing else []) + \
                    ([f"unknown input(s) {extra}"] if extra else [])
            raise UsageError("; ".join(parts) + f"; the model takes {expected}",
                             path=self.path, hint="pass exactly the model's inputs, by name")
        out = {}
        for name, value in feeds.items():
            info = self._input_index[name]
            if isinstance(value, np.generic):
                value = np.asarray(value)
            if info.dtype is not None:
                if not isinstance(value, np.ndarray):
                    raise UsageError(f"input '{name}' is a {type(value).__name__}; expected a numpy "
                                     f"array of {info.dtype}", path=self.path)
                if value.dtype != info.dtype and not (info.dtype.kind == "O" and value.dtype.kind in "OUS"):
                    raise UsageError(f"input '{name}' has dtype {value.dtype}; expected "
                                     f"{'strings' if info.dtype.kind == 'O' else info.dtype}",
                                     path=self.path, hint="convert it with .astype(...)")
                shape = info.shape
                if shape is not None and (value.ndim != len(shape) or any(
                        isinstance(d, int) and d >= 0 and d != s for d, s in zip(shape, value.shape))):
                    want = "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
                    what = "rank" if value.ndim != len(shape) else "shape"
                    raise UsageError(f"input '{name}' has shape {list(value.shape)}; expected "
                                     f"{want}" + (f" (rank {len(shape)})" if what == "rank" else ""),
                                     path=self.path)
            out[name] = value
        return out

    def random_feeds(self, seed: int = 0, dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        """Random inputs (fixed ``seed``); symbolic dims take ``dims[name]``, default 1."""
        dims = dict(dims or {})
        for k, v in dims.items():
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise UsageError(f"dimension {k}={v!r} must be a non-negative int")
        used = {d for i in self.inputs for d in (i.shape or ()) if isinstance(d, str)}
        unknown = sorted(set(dims) - used)
        if unknown:
            raise UsageError(f"dimension(s) {unknown} match no input dimension; the inputs use "
                             f"{sorted(used) or 'none'}", path=self.path)
        rng = np.random.default_rng(seed)
        feeds = {}
        total = 0
        for info in self.inputs:
            if info.dtype is None:
                raise UsageError(f"cannot make a random value for input '{info.name}' of type "
                                 f"{info.type}", path=self.path, hint="pass the inputs explicitly")
            shape = tuple(d if isinstance(d, int) and d >= 0 else
                          (dims.get(d, 1) if isinstance(d, str) else 1) for d in (info.shape or ()))
            total += math.prod(shape) * max(info.dtype.itemsize, 1)  # Python ints: no overflow
            if total > MAX_RANDOM_BYTES:
                raise UsageError(f"random input '{info.name}' of shape {list(shape)} would take the random "
                                 f"inputs over {MAX_RANDOM_BYTES >> 30} GiB", path=self.path,
                                 hint="pass smaller --dim values, or the inputs with --inputs")
            kind = info.dtype.kind
            if kind == "f":
                value = rng.standard_normal(shape).astype(info.dtype)
            elif kind in "iu":
                value = rng.integers(0, 10, size=shape).astype(info.dtype)
            elif kind == "b":
                value = rng.random(shape) < 0.5
            elif kind == "c":
                value = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(info.dtype)
            elif kind == "O":
                value = np.array([str(v) for v in rng.integers(0, 10, size=shape).ravel()],
                                 dtype=object).reshape(shape)
            else:
                raise UsageError(f"cannot make a random value for input '{info.name}' of dtype "
                                 f"{info.dtype}", path=self.path, hint="pass the inputs explicitly")
            feeds[info.name] = value
        return feeds

    # -- running --------------------------------------------------------------------------

    def run(self, feeds: Mapping[str, np.ndarray] | None = None,
            output_names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run the model; returns the outputs by name (all, or ``output_names`` in order)."""
        checked = self._check_feeds({} if feeds is None else feeds)
        if output_names is None:
            names = self._output_names
        else:
            if isinstance(output_names, str):
                output_names = [output_names]
            names = list(output_names)
            unknown = [n for n in names if n not in self._output_names]
            if unknown:
                raise UsageError(f"unknown output(s) {unknown}; the model gives {self._output_names}",
                                 path=self.path)
        guard = _weights.sigbus_reported(*self._mapped) if self._mapped else contextlib.nullcontext()
        if not self._python_kernels:
            try:
                with guard:
                    return dict(zip(names, self._sess.run(names, checked)))
            except Exception as exc:  # noqa: BLE001 - ORT raises several unrelated classes
                raise self._ort_error(exc) from exc
        ro = ort.RunOptions()
        ctx = pk.RunContext(ro, self._python_ops)
        with pk.kernel_run(ctx), guard:
            try:
                values = self._sess.run(names, checked, ro)
            except Exception as exc:  # noqa: BLE001 - ORT raises several unrelated classes
                if ctx.failure is None:
                    raise self._ort_error(exc) from exc
        if ctx.failure is not None:
            self._raise_failure(ctx.failure)
        return dict(zip(names, values))

    def _ort_error(self, exc: Exception) -> KernelError:
        node = re.search(r"Name:'([^']*)'", str(exc))
        return KernelError(f"ONNX Runtime failed: {exc}", path=self.path,
                           node=node.group(1) if node else None,
                           hint="check the inputs and the failing node")

    def _raise_failure(self, failure: pk.KernelFailure) -> None:
        """Re-raise a Python kernel's failure: KernelError chained to the kernel's exception."""
        if isinstance(failure.exc, (KeyboardInterrupt, SystemExit)):
            raise failure.exc
        nodes = self._python_nodes.get(failure.op_name, [])
        err = failure.to_error(nodes[0] if len(nodes) == 1 else None, self.path)
        if failure.contract:
            raise err from None
        raise err from failure.exc


def _session_error(exc: Exception, path: str | None, libraries: Sequence[tuple[Path, str]], *,
                   own_options: bool) -> KernelError:
    """The KernelError for a session ONNX Runtime refused. A custom-op domain registered twice
    (ORT says only "Domain already set in registry") is named with the libraries graphkit
    registered and what registered the domain before them."""
    text = str(exc)
    if "already set in registry" not in text:
        return KernelError(f"ONNX Runtime cannot create the session: {text}", path=path,
                           hint="the message names the failing node")
    ours = []
    for lib, what in libraries:
        try:
            domains = sorted({op.split("::")[0] for op in _native().served_ops(lib)})
        except (OSError, AttributeError):  # a prebuilt library does not list its ops
            domains = []
        ours.append(f"{lib} (kernels of {what}" + (f"; domains {', '.join(domains)})" if domains else ")"))
    registered = "; ".join(ours) or "onnxruntime-extensions' Python kernels"
    if own_options:
        return KernelError(
            "a custom-op library was registered twice: the SessionOptions passed as options= already "
            f"register a domain that graphkit registers for this model's kernels, {registered} (ONNX "
            f"Runtime says only '{text.strip()}')", path=path,
            hint="drop your own register_custom_ops_library call (open_session registers the kernels the "
                 "model needs), or create the onnxruntime.InferenceSession yourself")
    return KernelError(f"two kernel libraries register one custom-op domain: {registered} (ONNX Runtime "
                       f"says only '{text.strip()}')", path=path,
                       hint="give the ops of one package their own domain, or run the models separately")


def open_session(model: str | os.PathLike[str] | onnx.ModelProto, *,
                 registry: OpRegistry | None = None, threads: int | None = None,
                 providers: Sequence[Any] | None = None,
                 options: ort.SessionOptions | None = None,
                 unknown_domains: bool | None = None) -> Session:
    """Open ``model`` in ONNX Runtime with every kernel its nodes need registered.

    ``threads`` sets the intra-op thread count; ``options`` (a fresh SessionOptions, used
    once) lets callers set anything else; ``providers`` defaults to the CPU provider.
    ``unknown_domains``: leave nodes of domains no op package knows to ONNX Runtime (the
    caller registered a library for them on ``options``) instead of refusing them; by
    default, only when ``options`` are given.
    External data up to ``$GRAPHKIT_WEIGHTS_READ_LIMIT`` (default 2 GiB) is read into memory,
    never mapped, so a weights file rewritten in place meanwhile cannot fault; above it ONNX
    Runtime maps it and a fault is one line and exit 135 (:mod:`graphkit.runtime._weights`).
    Raises ModelLoadError (unreadable file; external data outside the model's directory,
    missing or too short, refused before anything reads it), UnsupportedOpError (nodes without a kernel,
    named before ONNX Runtime is touched) and KernelError (ONNX Runtime refused the session).
    """
    proto, path = _load(model)
    weights = _check_external_data(proto, path, options)
    if registry is None:
        from graphkit.ops import default_registry

        registry = default_registry()
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
        raise UsageError(f"threads must be a non-negative int, not {threads!r}",
                         hint="0 lets ONNX Runtime choose")
    foreign_ok = options is not None if unknown_domains is None else bool(unknown_domains)
    plan = _plan(proto, registry, path, foreign_ok=foreign_ok)

    # Ops by domain::name (two packages may both have an op called rms_norm); the nodes of
    # each by op name, which is what a Python kernel's failure reports.
    python_ops = {}
    python_nodes: dict[str, list[str]] = {}
    for r in plan.python:
        op = registry.lookup(r.node.domain, r.node.op_type)
        python_ops[op.qualified_name] = op
        python_nodes.setdefault(op.name, []).append(r.display)
    source: str | bytes | None = path
    if path is not None and not _utf8(path):
        # ONNX Runtime takes a path as UTF-8 text only: hand it the bytes read from the file.
        source = proto.SerializeToString()
    if plan.python:
        work = proto
        if path is None:  # never modify the caller's model
            work = onnx.ModelProto()
            work.CopyFrom(proto)
            libraries = plan.libraries
            plan = _plan(work, registry, path, foreign_ok=foreign_ok, build=False)
            plan.libraries = libraries
        from graphkit.rewrite.lowering.binding import PythonNode, bind_python_nodes

        refs = [PythonNode(r.node, r.graph, r.index, r.depth, r.display) for r in plan.python]
        if bind_python_nodes(work, registry, refs) or path is None:
            source = work.SerializeToString()
    elif path is None:
        source = proto.SerializeToString()

    so = options if options is not None else ort.SessionOptions()
    try:
        so.get_session_config_entry(_USED_KEY)
    except Exception:  # noqa: BLE001 - absent: a fresh SessionOptions
        pass
    else:
        raise UsageError("these SessionOptions were already used by open_session",
                         hint="pass a new onnxruntime.SessionOptions to each open_session call")
    so.add_session_config_entry(_USED_KEY, "1")
    if threads is not None:
        so.intra_op_num_threads = threads
    if isinstance(source, bytes) and path is not None:
        # The model is loaded from memory: external data stays relative to the file.
        so.add_session_config_entry(_FOLDER_KEY, str(Path(path).resolve().parent))
    mapped: tuple[str, ...] = ()
    if weights is not None:
        if weights.total() <= _weights.read_limit():
            # Read, never mapped: a weights file rewritten in place meanwhile cannot fault (SIGBUS).
            data = _weights.read_external_data(weights.files, weights.extents, weights.model)
            so.add_external_initializers_from_files_in_memory(list(data), list(data.values()),
                                                              [len(b) for b in data.values()])
        else:
            mapped = tuple(sorted(weights.files))

    lease = None
    try:
        for lib, what in plan.libraries:
            try:
                so.register_custom_ops_library(str(lib))
            except Exception as exc:  # noqa: BLE001
                raise KernelError(f"cannot register the native kernel library of {what} ({lib}): {exc}",
                                  path=path, hint="a domain may be registered twice (by your own "
                                                  "SessionOptions?); or rebuild it (delete its cache)") from exc
        if plan.python or plan.extensions:
            # Python kernels run on the caller's thread only in sequential mode: that is what
            # lets a kernel's exception reach the right run() call.
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            table = pk.python_kernel_table()
            table.declare(op for op in python_ops.values())
            try:
                lease = table.attach(so)
            except Exception as exc:  # noqa: BLE001
                raise KernelError(f"cannot register onnxruntime-extensions: {exc}", path=path,
                                  hint="a domain is registered twice: the native library and an "
                                       "@onnx_op may not share a domain") from exc
        try:
            with _weights.sigbus_reported(weights.model, mapped) if mapped else contextlib.nullcontext():
                sess = ort.InferenceSession(source, so, providers=list(providers or ["CPUExecutionProvider"]))
        except Exception as exc:  # noqa: BLE001 - ORT raises several unrelated classes
            raise _session_error(exc, path, plan.libraries, own_options=options is not None) from exc
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    if lease is not None:
        lease.bind(sess)
    return Session(sess, proto, path=path, python_ops=python_ops, python_nodes=python_nodes,
                   python_kernels=bool(plan.python or plan.extensions),
                   mapped=(weights.model, mapped) if mapped else None)
