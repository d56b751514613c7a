"""Which lowering a node gets: the first in preference order that ONNX Runtime can execute.

A decomposition is executable for a node when ONNX Runtime's CPU provider has a kernel
for every standard node it writes, for the element types that reach that node, at the
target opset. ORT casts float16 to float around a node that has a float kernel only
(its InsertCastTransformer), so float16 needs a float kernel. The kernels are ORT's own
table (``get_all_opkernel_def``), read once per process and kept in :func:`ort_kernels`;
tests/test_selection.py checks its verdicts against sessions of tiny models of every op,
lowering, opset and dtype. Native and Python kernels execute every type combination
their op declares (graphkit registers each combination with ORT).

A node for which nothing in the preference order is executable is an
:class:`~graphkit.errors.UnsupportedOpError` naming the node, its dtype, why each
lowering was refused and what would work (another ``--target-opset``, ``--bind``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import onnx
from onnx import helper

from graphkit.errors import GraphkitError, RewriteError, UnsupportedOpError, UsageError
from graphkit.ops.tensor_types import type_string
from graphkit.rewrite.graph.types import TypeTable

if TYPE_CHECKING:
    from graphkit.ops import Decomposition, OpDef, OpRegistry

__all__ = ["KernelTable", "Selection", "ort_kernels", "replacement_problem", "MIN_OPSET", "max_opset",
           "check_target_opset", "dtype_name"]

PROVIDER = "CPUExecutionProvider"
# probe(decomposition, opset) -> (nodes, element types of what they read, looked at shapes)
Probe = Callable[[Any, int], tuple[list[onnx.NodeProto], dict[str, int], bool]]
_FLOAT16, _FLOAT = type_string(onnx.TensorProto.FLOAT16), type_string(onnx.TensorProto.FLOAT)
# Refusals of a lowering the op does not have (not reported as passed over).
_NO_NATIVE, _NO_PYTHON = "has no native kernel", "has no Python kernel"
_ABSENT = frozenset({_NO_NATIVE, _NO_PYTHON})
# Nodes ONNX Runtime turns into initializers when it loads a model: no kernel runs them.
_LOAD_TIME = frozenset({"Constant"})
# The oldest ai.onnx opset ONNX Runtime loads.
MIN_OPSET = 7


def dtype_name(elem: int | None) -> str:
    """TensorProto.DOUBLE -> 'double' (the word users see in messages)."""
    text = type_string(elem) if elem else None
    return text[len("tensor("):-1] if text else "unknown type"


@dataclass(frozen=True)
class _Kernel:
    first: int
    last: int
    types: Mapping[str, frozenset[str]]  # type parameter -> the tensor types this kernel takes


class KernelTable:
    """One execution provider's kernels: (domain, op type) -> version ranges and types."""

    def __init__(self, kernels: Mapping[tuple[str, str], tuple[_Kernel, ...]], version: str) -> None:
        self.kernels = kernels
        self.version = version
        self.domains = frozenset(d for d, _ in kernels)

    def max_opset(self, domain: str = "") -> int:
        """The newest opset of ``domain`` any kernel was registered for (ranges left open count
        as their first version)."""
        return max(max(k.first, k.last if k.last < 10_000 else k.first)
                   for (d, _), ks in self.kernels.items() if d == domain for k in ks)

    def problem(self, node: onnx.NodeProto, opset: int, elem: Mapping[str, int]) -> str | None:
        """Why ORT cannot run ``node`` at ai.onnx ``opset`` with these element types, or None."""
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in self.domains or (domain == "" and node.op_type in _LOAD_TIME):
            return None  # not ORT's: a custom domain is the session's business
        kernels = self.kernels.get((domain, node.op_type))
        if domain != "":
            return None if kernels else f"{domain}::{node.op_type} has no ONNX Runtime kernel"
        try:
            schema = onnx.defs.get_schema(node.op_type, max(1, min(opset, 2**31 - 1)), "")  # a C int
        except onnx.defs.SchemaError:
            return None  # unknown to onnx at this opset: the checker reports it
        since = schema.since_version
        ranges = [k for k in kernels or () if k.first <= since <= k.last]
        if not ranges and (schema.has_function or schema.has_context_dependent_function):
            return None  # ORT expands an op ONNX defines as a function (CastLike) into its body
        if not ranges:
            return f"{node.op_type}-{since} has no kernel in ONNX Runtime {self.version}"
        bound = _bind(schema, node, elem)
        if any(len(ts) > 1 for ts in bound.values()):
            return None  # ill-typed: the checker afterwards names the replacement
        if any(_fits(k, bound) for k in ranges):
            return None
        if any(_FLOAT16 in ts for ts in bound.values()):
            cast = {p: {_FLOAT if t == _FLOAT16 else t for t in ts} for p, ts in bound.items()}
            if any(_fits(k, cast) for k in ranges):
                return None
        got = sorted({t for ts in bound.values() for t in ts})
        takes = sorted({t for k in ranges for ts in k.types.values() for t in ts
                        if t.startswith("tensor(") and t in _COMMON})
        return (f"{node.op_type}-{since} has no {'/'.join(t[7:-1] for t in got)} kernel in ONNX Runtime "
                f"{self.version}" + (f" (takes {', '.join(t[7:-1] for t in takes)})" if takes else ""))


_COMMON = frozenset(f"tensor({t})" for t in ("float16", "float", "double", "int32", "int64", "bool"))


def _bind(schema: onnx.defs.OpSchema, node: onnx.NodeProto, elem: Mapping[str, int]) -> dict[str, set[str]]:
    """Type parameter -> the tensor types the node's inputs and outputs give it."""
    bound: dict[str, set[str]] = {}
    for formals, actuals in ((schema.inputs, node.input), (schema.outputs, node.output)):
        if not formals:
            continue
        variadic = formals[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
        for i, name in enumerate(actuals):
            if not name or name not in elem:
                continue
            if i >= len(formals) and not variadic:
                break
            formal = formals[min(i, len(formals) - 1)]
            text = type_string(elem[name])
            if text:
                bound.setdefault(formal.type_str, set()).add(text)
    return bound


def _fits(kernel: _Kernel, bound: Mapping[str, set[str]]) -> bool:
    return all(ts <= kernel.types[p] for p, ts in bound.items() if p in kernel.types)


@functools.lru_cache(maxsize=1)
def ort_kernels() -> KernelTable | None:
    """ONNX Runtime's CPU kernels, read once per process; None when this ORT build does not
    list them. The table is kept in graphkit's cache per ORT version (plain JSON data), so a
    rewrite does not import ORT (~50 ms) to read it again."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("onnxruntime")
    except importlib.metadata.PackageNotFoundError:
        version = None
    cached = None
    if version is not None:
        from graphkit.build_cache import cache_root, hash_key

        cached = cache_root() / "ort-kernels" / f"{hash_key(version, PROVIDER, _CACHE_FORMAT)}.json"
        table = _read_table(cached, version)
        if table is not None:
            return table
    table = _live_table()
    if table is not None and cached is not None:
        _write_table(cached, table)
    return table


_CACHE_FORMAT = 1


def _live_table() -> KernelTable | None:
    try:
        import onnxruntime
        from onnxruntime.capi import _pybind_state
        defs = _pybind_state.get_all_opkernel_def()
    except (ImportError, AttributeError):
        return None
    table: dict[tuple[str, str], list[_Kernel]] = {}
    for d in defs:
        if d.provider != PROVIDER:
            continue
        first, last = d.version_range
        table.setdefault((d.domain, d.op_name), []).append(
            _Kernel(first, last, {p: frozenset(ts) for p, ts in d.type_constraints.items()}))
    return KernelTable({k: tuple(v) for k, v in table.items()}, onnxruntime.__version__)


def _read_table(path: Any, version: str) -> KernelTable | None:
    """The cached table, or None when it is missing, unreadable or not this version's."""
    import json

    try:
        data = json.loads(path.read_text())
        if data["version"] != version or data["format"] != _CACHE_FORMAT:
            return None
        kernels = {(d, o): tuple(_Kernel(int(a), int(b), {p: frozenset(ts) for p, ts in types.items()})
                                 for a, b, types in entries)
                   for d, o, entries in data["kernels"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return KernelTable(kernels, version)


def _write_table(path: Any, table: KernelTable) -> None:
    """Best effort: a cache that cannot be written is read from ORT next time."""
    import json

    from graphkit.errors import GraphkitError
    from graphkit.publish import atomic_write

    data = {"format": _CACHE_FORMAT, "version": table.version,
            "kernels": [[d, o, [[k.first, k.last, {p: sorted(ts) for p, ts in k.types.items()}] for k in ks]]
                        for (d, o), ks in sorted(table.kernels.items())]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as tmp:
            tmp.write_text(json.dumps(data, separators=(",", ":")))
    except (OSError, GraphkitError):
        pass


def max_opset() -> int:
    """The newest ai.onnx opset both the onnx version converter and ONNX Runtime support."""
    newest = onnx.defs.onnx_opset_version()
    table = ort_kernels()
    return newest if table is None else min(newest, table.max_opset())


def check_target_opset(opset: object) -> int:
    """``opset`` if it is an ai.onnx opset both the onnx version converter and ONNX Runtime
    support (MIN_OPSET..max_opset()), else a UsageError naming the range."""
    newest = max_opset()
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= newest:
        raise UsageError(f"--target-opset {opset!r} is outside the ai.onnx opsets the onnx version converter "
                         f"and ONNX Runtime support ({MIN_OPSET}..{newest})",
                         hint=f"pick one in {MIN_OPSET}..{newest}, or omit it to keep the model's opset")
    return opset


def replacement_problem(nodes: list[onnx.NodeProto], input_types: Mapping[str, int], opset: int,
                        table: KernelTable | None = None) -> str | None:
    """Why ORT cannot run the replacement ``nodes`` (fed tensors of ``input_types``), or None."""
    table = ort_kernels() if table is None else table
    if table is None:
        return None
    elem = dict(input_types)
    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info(n, t, None)
                                               for n, t in input_types.items()], [])
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    # What inference cannot type is judged with what is known; the strict checks afterwards
    # report a broken replacement.
    for name, tp in TypeTable.inferred(probe).items():
        elem.setdefault(name, tp.tensor_type.elem_type)
    for node in nodes:
        problem = table.problem(node, opset, elem)
        if problem is not None:
            return problem
    return None


class Selection:
    """Per node, the first lowering in ``prefer`` order that ONNX Runtime can execute.

    ``probe(dec, opset)`` builds a decomposition of the node at hand without adding it
    to the model and returns (nodes, element types of the tensors they read, whether the
    build looked at shapes); verdicts are cached per op, decomposition, opset, input
    types and attributes (per node where the build looked at shapes).
    """

    def __init__(self, registry: OpRegistry, prefer: tuple[Any, ...], opset: int, path: str | None) -> None:
        self.registry = registry
        self.prefer = prefer
        self.opset = opset
        self.path = path
        # op -> why lowerings before the chosen one were passed over (distinct, in order seen)
        self.passed_over: dict[str, list[str]] = {}
        self._verdicts: dict[tuple, str | None] = {}

    def choose(self, op: OpDef, node: onnx.NodeProto, attrs: Mapping[str, Any],
               in_types: tuple[int | None, ...], probe: Probe) -> tuple[Any, Decomposition | None]:
        """(lowering, decomposition or None) for ``node``. A decomposition whose build refuses
        this node (raises a GraphkitError) is passed over like one ONNX Runtime cannot run;
        when nothing fits, that refusal (a RewriteError) is raised, else an UnsupportedOpError.
        Any other exception from a build is a RewriteError at once (a bug, not a refusal)."""
        reasons: list[str] = []
        unbuilt: list[tuple[Decomposition, GraphkitError]] = []
        for how in self.prefer:
            if how.value == "decompose":
                valid = [d for d in op.decompositions if d.supports(self.opset)]
                if not valid:
                    ranges = ", ".join(f"{d.name}: opset {d.min_opset}..{d.max_opset or ''}"
                                       for d in op.decompositions)
                    reasons.append(f"no decomposition valid at opset {self.opset}"
                                   + (f" (has {ranges})" if ranges else ""))
                for dec in valid:
                    problem, error = self._verdict(op, node, attrs, in_types, dec, self.opset, probe)
                    if problem is None:
                        return self._chosen(op, reasons, how, dec)
                    reasons.append(f"decomposition '{dec.name}' at opset {self.opset}: {problem}")
                    if error is not None:
                        unbuilt.append((dec, error))
            elif how.value == "native":
                if self.registry.has_native(op):
                    return self._chosen(op, reasons, how, None)
                reasons.append(_NO_NATIVE if not op.native else
                               "declares a native kernel but is not registered through an OpPackage "
                               "with NativeKernels")
            elif how.value == "python":
                if op.python_kernel is not None:
                    return self._chosen(op, reasons, how, None)
                reasons.append(_NO_PYTHON)
        if unbuilt:
            raise self._build_failed(node, *unbuilt[0], reasons)
        raise self._nothing_fits(op, node, attrs, in_types, probe, reasons)

    def _chosen(self, op: OpDef, reasons: list[str], how: Any, dec: Decomposition | None
                ) -> tuple[Any, Decomposition | None]:
        refused = [r for r in reasons if r not in _ABSENT]  # what the op has but could not use
        if refused:
            seen = self.passed_over.setdefault(op.qualified_name, [])
            seen.extend(r for r in refused if r not in seen)
        return how, dec

    def problem(self, op: OpDef, node: onnx.NodeProto, attrs: Mapping[str, Any],
                in_types: tuple[int | None, ...], dec: Decomposition, opset: int, probe: Probe) -> str | None:
        """Why ORT cannot run ``dec`` of ``node`` at ``opset`` (or it cannot be built), or None."""
        return self._verdict(op, node, attrs, in_types, dec, opset, probe)[0]

    def _verdict(self, op: OpDef, node: onnx.NodeProto, attrs: Mapping[str, Any],
                 in_types: tuple[int | None, ...], dec: Decomposition, opset: int, probe: Probe
                 ) -> tuple[str | None, GraphkitError | None]:
        """(:meth:`problem`, the GraphkitError by which its build refused the node or None);
        verdicts of builds that did not look at shapes are cached. Any other exception from the
        build is a bug in the decomposition: a RewriteError naming it."""
        key = (op.qualified_name, dec.name, opset, in_types, repr(sorted(attrs.items())), len(node.input),
               len(node.output))
        if key in self._verdicts:
            return self._verdicts[key], None
        try:
            nodes, known, used_shapes = probe(dec, opset)
        except GraphkitError as exc:  # the decomposition refuses this node: the next lowering may take it
            return f"cannot be built: {exc.message}", exc
        except Exception as exc:  # noqa: BLE001 - anything else is a bug, not a refusal: never hidden by a kernel
            raise RewriteError(f"decomposition '{dec.name}' raised {type(exc).__name__}: {exc}: a bug in the op's "
                               "decomposition (a decomposition refuses a node by raising graphkit's RewriteError)",
                               path=self.path, node=node.name or "<unnamed>", op=f"{node.domain}::{node.op_type}",
                               hint="fix the decomposition; --debug shows where it raised") from exc
        verdict = replacement_problem(nodes, known, opset)
        if not used_shapes:
            self._verdicts[key] = verdict
        return verdict, None

    def _build_failed(self, node: onnx.NodeProto, dec: Decomposition, exc: GraphkitError,
                      reasons: list[str]) -> RewriteError:
        """The error of a node whose lowerings are all refused, one decomposition because its
        build refused the node with ``exc``: that refusal, naming the node and the other reasons."""
        others = [r for r in reasons if not r.startswith(f"decomposition '{dec.name}' at ")]
        hint = exc.hint or ("allow a kernel with --prefer or choose one with --bind native|python, "
                            "if the op has one")
        error = RewriteError(f"decomposition '{dec.name}': {exc.message}"
                             + (f"; other lowerings: {'; '.join(others)}" if others else ""),
                             path=self.path, node=node.name or "<unnamed>", op=f"{node.domain}::{node.op_type}",
                             hint=hint)
        error.__cause__ = exc
        return error

    def _nothing_fits(self, op: OpDef, node: onnx.NodeProto, attrs: Mapping[str, Any],
                      in_types: tuple[int | None, ...], probe: Probe, reasons: list[str]) -> UnsupportedOpError:
        dtypes = sorted({dtype_name(t) for t in in_types if t})
        works = []
        newest = max_opset()
        in_prefer = {h.value for h in self.prefer}
        for dec in op.decompositions:
            if "decompose" not in in_prefer and dec.supports(self.opset) and \
                    self.problem(op, node, attrs, in_types, dec, self.opset, probe) is None:
                works.append(f"--prefer decompose (decomposition '{dec.name}')")
                continue
            last = min(dec.max_opset or newest, newest)
            for opset in _other_opsets(dec.min_opset, last, self.opset):
                if self.problem(op, node, attrs, in_types, dec, opset, probe) is None:
                    works.append(f"--target-opset {opset} (decomposition '{dec.name}')")
                    break
        if self.registry.has_native(op):
            works.append("--bind native")
        if op.python_kernel is not None:
            works.append("--bind python")
        others = [h for h in ("decompose", "native", "python") if h not in in_prefer]
        hint = ("would work: " + ", ".join(works) if works else
                f"no lowering of {op.name} runs in ONNX Runtime for {'/'.join(dtypes)}: add one to its definition")
        if works and others:
            hint += f"; allow another lowering ({', '.join(others)}) with --prefer"
        message = "; ".join(reasons)
        if any("decomposition '" in r for r in reasons):
            message = f"no lowering ONNX Runtime can execute for {'/'.join(dtypes) or 'its inputs'}: {message}"
        return UnsupportedOpError(message, path=self.path, node=node.name or "<unnamed>",
                                  op=f"{node.domain}::{node.op_type}", hint=hint)


def _other_opsets(first: int, last: int, current: int) -> Iterable[int]:
    """Opsets from ``first`` to ``last``, nearest to ``current`` first, ``current`` excluded."""
    return sorted((o for o in range(max(first, MIN_OPSET), last + 1) if o != current),
                  key=lambda o: (abs(o - current), o))
