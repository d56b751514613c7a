"""Numerical verification: torch vs ONNX Runtime, model vs model, first diverging node.

- :func:`verify_export` runs a torch model and its exported ONNX file on the same inputs.
- :func:`compare_models` runs two ONNX models (say, before and after a rewrite) on the
  same inputs; both run through :func:`graphkit.runtime.open_session`, so custom:: nodes
  get their kernels.
- :func:`bisect_models` finds the first tensor, in the first model's node order, whose
  value differs between two models that share tensor names. Intermediate tensors are
  exposed as extra graph outputs ``chunk`` at a time (default :data:`CHUNK` = 64): one run
  of each model holds at most ``chunk`` intermediate tensors, never all of them, and the
  search stops at the first chunk holding a difference.

Models holding placeholders of custom ops run on the kernels of the ``registry`` passed
(default: :func:`~graphkit.ops.default_registry`, every discovered package; never a
smaller one); :func:`verify_export` adds the ops the torch model holds. ``bind="python"``
(or ``"native"``) binds every placeholder to that kernel in memory first (tensor names are
kept, the file is not touched), for ops without a native kernel.

Inputs are random with a fixed seed (``Session.random_feeds``: symbolic dimensions from
``dims``, default 1) or given by name. Every comparison is numpy's ``allclose``:
``|actual - expected| <= atol + rtol * |expected|`` element by element, NaN equal to NaN
at the same place. A report's ``passed`` is False on any difference or shape mismatch;
:meth:`VerificationReport.raise_for_mismatch` turns that into a
:class:`~graphkit.errors.VerificationError` (exit code 12).

Importing this module imports neither torch nor onnxruntime; only the functions that need
them do.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from graphkit.errors import UsageError, VerificationError

__all__ = [
    "ATOL",
    "RTOL",
    "CHUNK",
    "TensorDiff",
    "VerificationReport",
    "BisectReport",
    "compare_arrays",
    "verify_export",
    "compare_models",
    "bisect_models",
]

ATOL = 1e-5
RTOL = 1e-5
CHUNK = 64  # intermediate tensors exposed per run by bisect_models


@dataclass(frozen=True)
class TensorDiff:
    """How one tensor of the candidate differs from the reference."""

    name: str
    shape: tuple[int, ...] | None  # the reference's
    dtype: str
    max_abs: float
    max_rel: float
    mismatched: int  # elements outside atol + rtol * |expected|
    total: int
    passed: bool
    note: str = ""

    def format(self) -> str:
        shape = "x".join(map(str, self.shape)) if self.shape else "scalar" if self.shape == () else "?"
        status = "ok" if self.passed else f"MISMATCH ({self.mismatched}/{self.total})"
        note = f"  [{self.note}]" if self.note else ""
        return (f"{self.name:<24} {self.dtype:<8} {shape:<14} {_num(self.max_abs):>10} "
                f"{_num(self.max_rel):>10}  {status}{note}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": None if self.shape is None else list(self.shape),
                "dtype": self.dtype, "max_abs": _json_num(self.max_abs),
                "max_rel": _json_num(self.max_rel), "mismatched": self.mismatched,
                "total": self.total, "passed": self.passed, "note": self.note}


def _num(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def _json_num(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def compare_arrays(name: str, expected: Any, actual: Any, *, atol: float = ATOL,
                   rtol: float = RTOL) -> TensorDiff:
    """Compare ``actual`` with the reference ``expected`` (numpy ``allclose`` semantics,
    NaN equal to NaN at the same place). ``max_rel`` is ``max |a - e| / |e|``: inf where the
    reference is 0 and the values differ."""
    e, a = np.asarray(expected), np.asarray(actual)
    dtype = str(e.dtype)
    notes = [] if a.dtype == e.dtype else [f"dtype {a.dtype} vs {e.dtype}"]
    if e.shape != a.shape:
        notes.append(f"shape {list(a.shape)} vs {list(e.shape)}")
        return TensorDiff(name, tuple(e.shape), dtype, math.inf, math.inf, max(e.size, a.size),
                          max(e.size, a.size), False, "; ".join(notes))
    if e.dtype.kind not in "biufc" or a.dtype.kind not in "biufc":
        bad = int(np.count_nonzero(e != a))
        return TensorDiff(name, tuple(e.shape), dtype, 0.0 if not bad else math.inf,
                          0.0 if not bad else math.inf, bad, e.size, bad == 0, "; ".join(notes))
    e64 = e.astype(np.complex128 if e.dtype.kind == "c" else np.float64)
    a64 = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        same = (e64 == a64) | (np.isnan(e64) & np.isnan(a64))  # equal infinities too
        diff = np.where(same, 0.0, np.abs(a64 - e64))
        diff = np.where(np.isnan(diff), math.inf, diff)  # NaN on one side only
        scale = np.abs(e64)
        rel = np.where(diff == 0, 0.0, np.where(scale > 0, diff / np.where(scale > 0, scale, 1), math.inf))
        ok = diff <= atol + rtol * np.where(np.isfinite(scale), scale, 0)
    bad = int(e.size - np.count_nonzero(ok))
    return TensorDiff(name, tuple(e.shape), dtype, float(diff.max()) if diff.size else 0.0,
                      float(rel.max()) if rel.size else 0.0, bad, int(e.size), bad == 0, "; ".join(notes))


@dataclass(frozen=True)
class VerificationReport:
    """Per output: the candidate against the reference."""

    reference: str
    candidate: str
    atol: float
    rtol: float
    outputs: tuple[TensorDiff, ...]
    inputs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    seed: int | None = None

    @property
    def passed(self) -> bool:
        return all(d.passed for d in self.outputs)

    @property
    def failed(self) -> tuple[TensorDiff, ...]:
        return tuple(d for d in self.outputs if not d.passed)

    def format(self) -> str:
        feeds = ", ".join(f"{k} {'x'.join(map(str, v)) or 'scalar'}" for k, v in self.inputs.items())
        src = f"random inputs, seed {self.seed}" if self.seed is not None else "given inputs"
        lines = [f"{self.reference} vs {self.candidate} ({src}: {feeds or 'none'}; "
                 f"atol {self.atol:g}, rtol {self.rtol:g})",
                 f"{'output':<24} {'dtype':<8} {'shape':<14} {'max abs':>10} {'max rel':>10}  result"]
        lines += [d.format() for d in self.outputs]
        lines.append("all outputs match" if self.passed else
                     f"{len(self.failed)} of {len(self.outputs)} output(s) differ")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "candidate": self.candidate, "atol": self.atol,
                "rtol": self.rtol, "seed": self.seed, "passed": self.passed,
                "inputs": {k: list(v) for k, v in self.inputs.items()},
                "outputs": [d.to_dict() for d in self.outputs]}

    def raise_for_mismatch(self) -> None:
        if self.passed:
            return
        worst = self.failed[0]
        raise VerificationError(
            f"{len(self.failed)} of {len(self.outputs)} output(s) differ from {self.reference}; "
            f"first: '{worst.name}' max abs {_num(worst.max_abs)}, max rel {_num(worst.max_rel)}"
            + (f" ({worst.note})" if worst.note else ""), path=self.candidate,
            hint=f"loosen --atol/--rtol (now {self.atol:g}/{self.rtol:g}) if this is expected "
                 "precision, else bisect the models to find the first diverging node")


# --------------------------------------------------------------------------- inputs


BINDINGS = ("native", "python")


def _resolve(registry: Any) -> Any:
    """The registry every session and rewrite of one call uses: the one passed, else every
    discovered package (resolved once here, so no step falls back to another)."""
    if registry is not None:
        return registry
    from graphkit.ops import default_registry

    return default_registry()


def _session(model: Any, registry: Any, options: Any = None):
    from graphkit.runtime import open_session

    return open_session(model, registry=registry, options=options, unknown_domains=False)


def _external_folder(options: Any, folder: str | None) -> Any:
    import onnxruntime as ort

    options = options or ort.SessionOptions()
    if folder is not None:  # the model runs from memory: external weights stay beside the file
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
    return options


def _bound(model: Any, bind: str | None, registry: Any) -> tuple[Any, str | None]:
    """(model to open, folder of its external data): ``model`` itself when ``bind`` is None,
    else a copy whose placeholders are bound to ``bind`` kernels."""
    if bind is None:
        return model, None
    if bind not in BINDINGS:
        raise UsageError(f"bind must be one of {', '.join(BINDINGS)}, not {bind!r}")
    from graphkit.rewrite import Lowering, rewrite_model

    proto, folder = _model_and_folder(model)
    bound, _ = rewrite_model(proto, registry=registry, lowering=Lowering(bind), check=False,
                             path=None if folder is None else os.fspath(model))
    return bound, folder


def _open(model: Any, bind: str | None, registry: Any):
    target, folder = _bound(model, bind, registry)
    return _session(target, registry, _external_folder(None, folder) if folder else None)


def _feeds(session, inputs: Mapping[str, Any] | None, seed: int, dims: Mapping[str, int] | None):
    if inputs is None:
        return session.random_feeds(seed=seed, dims=dims), seed
    return {k: np.asarray(v) for k, v in inputs.items()}, None


def _label(model: Any, default: str) -> str:
    return os.fspath(model) if isinstance(model, (str, os.PathLike)) else default


# --------------------------------------------------------------------------- torch vs ORT


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _flatten(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flatten(v)]
    return [value]


def verify_export(model: Any, onnx_model: str | os.PathLike[str] | onnx.ModelProto, *,
                  inputs: Mapping[str, Any] | None = None, seed: int = 0,
                  dims: Mapping[str, int] | None = None, atol: float = ATOL, rtol: float = RTOL,
                  registry: Any = None, bind: str | None = None) -> VerificationReport:
    """Run the torch ``model`` and ``onnx_model`` in ONNX Runtime on the same inputs.

    The ONNX model's inputs, in order, are the model's positional arguments (as
    :func:`graphkit.export.export` writes them); its outputs are torch's outputs flattened
    in order. The torch model runs in eval mode under ``torch.no_grad()``.
    """
    import torch

    from graphkit.export._model_ops import registry_for

    registry = registry_for(model, _resolve(registry))
    session = _open(onnx_model, bind, registry)
    feeds, used_seed = _feeds(session, inputs, seed, dims)
    checked = session._check_feeds(feeds)
    args = [torch.from_numpy(np.array(checked[i.name], copy=True)) for i in session.inputs]
    modes = {m: m.training for m in model.modules()} if isinstance(model, torch.nn.Module) else {}
    try:
        if modes:
            model.eval()
        with torch.no_grad():
            expected = _flatten(model(*args))
    finally:
        for m, training in modes.items():
            m.training = training
    actual = session.run(checked)
    names = [o.name for o in session.outputs]
    if len(expected) != len(names):
        raise VerificationError(f"torch returned {len(expected)} output(s), the ONNX model has "
                                f"{len(names)} ({', '.join(names)})", path=_label(onnx_model, "model"),
                                hint="verify the model the file was exported from")
    diffs = []
    for name, want in zip(names, expected):
        want = want.detach().cpu().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
        diffs.append(compare_arrays(name, want, actual[name], atol=atol, rtol=rtol))
    return VerificationReport("torch", _label(onnx_model, "<onnx model>"), atol, rtol, tuple(diffs),
                              {k: tuple(np.shape(v)) for k, v in checked.items()}, used_seed)


# --------------------------------------------------------------------------- ONNX vs ONNX


def _pair_outputs(a_names: Sequence[str], b_names: Sequence[str], b_label: str) -> list[tuple[str, str]]:
    if set(a_names) <= set(b_names):
        return [(n, n) for n in a_names]
    if len(a_names) == len(b_names):
        return list(zip(a_names, b_names))  # renamed outputs: by position
    raise UsageError(f"the models' outputs differ: {list(a_names)} vs {list(b_names)}", path=b_label,
                     hint="compare models with the same outputs (by name or by position)")


def compare_models(a: str | os.PathLike[str] | onnx.ModelProto, b: str | os.PathLike[str] | onnx.ModelProto,
                   *, inputs: Mapping[str, Any] | None = None, seed: int = 0,
                   dims: Mapping[str, int] | None = None, atol: float = ATOL, rtol: float = RTOL,
                   registry: Any = None, bind: str | None = None) -> VerificationReport:
    """Run models ``a`` (the reference) and ``b`` on the same inputs and compare outputs."""
    registry = _resolve(registry)
    sa, sb = _open(a, bind, registry), _open(b, bind, registry)
    feeds, used_seed = _feeds(sa, inputs, seed, dims)
    feeds = sa._check_feeds(feeds)
    if sorted(i.name for i in sb.inputs) != sorted(feeds):
        raise UsageError(f"the models' inputs differ: {sorted(feeds)} vs "
                         f"{sorted(i.name for i in sb.inputs)}", path=_label(b, "model b"),
                         hint="compare models that take the same inputs")
    ya, yb = sa.run(feeds), sb.run(feeds)
    pairs = _pair_outputs(list(ya), list(yb), _label(b, "model b"))
    diffs = tuple(compare_arrays(na if na == nb else f"{na}|{nb}", ya[na], yb[nb], atol=atol, rtol=rtol)
                  for na, nb in pairs)
    return VerificationReport(_label(a, "model a"), _label(b, "model b"), atol, rtol, diffs,
                              {k: tuple(np.shape(v)) for k, v in feeds.items()}, used_seed)


# --------------------------------------------------------------------------- bisect


@dataclass(frozen=True)
class NodeInfo:
    name: str
    op: str  # "Mul", "custom::my_add"
    inputs: tuple[str, ...]

    def format(self) -> str:
        return f"'{self.name}' ({self.op}, inputs {', '.join(self.inputs) or 'none'})"


@dataclass(frozen=True)
class BisectReport:
    """Where two models first diverge, in model a's node order.

    ``compared`` tensors were checked in ``runs`` runs of each model, at most ``chunk``
    intermediate tensors per run (``max_per_run`` is the largest chunk used).
    """

    a: str
    b: str
    shared: int  # tensors both models compute (Constant outputs excluded)
    compared: int
    chunk: int
    runs: int
    max_per_run: int
    first: TensorDiff | None
    node_a: NodeInfo | None
    node_b: NodeInfo | None
    atol: float
    rtol: float

    @property
    def passed(self) -> bool:
        return self.first is None

    def format(self) -> str:
        head = (f"bisect {self.a} vs {self.b}: {self.compared} of {self.shared} shared tensors "
                f"compared in {self.runs} run(s) of each model, at most {self.max_per_run} "
                f"tensors per run (chunk {self.chunk})")
        if self.first is None:
            return head + "\nno shared tensor diverges"
        lines = [head, f"first diverging tensor: {self.first.format().strip()}"]
        if self.node_a is not None:
            lines.append(f"  produced in {self.a} by node {self.node_a.format()}")
        if self.node_b is not None:
            lines.append(f"  produced in {self.b} by node {self.node_b.format()}")
        lines.append("  every shared tensor before it matches")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        def node(n):
            return None if n is None else {"name": n.name, "op": n.op, "inputs": list(n.inputs)}

        return {"a": self.a, "b": self.b, "shared": self.shared, "compared": self.compared,
                "chunk": self.chunk, "runs": self.runs, "max_per_run": self.max_per_run,
                "passed": self.passed, "first": None if self.first is None else self.first.to_dict(),
                "node_a": node(self.node_a), "node_b": node(self.node_b)}

    def raise_for_mismatch(self) -> None:
        if self.first is None:
            return
        raise VerificationError(
            f"tensor '{self.first.name}' is the first to diverge (max abs {_num(self.first.max_abs)})",
            path=self.b, node=None if self.node_b is None else self.node_b.name,
            op=None if self.node_b is None else self.node_b.op,
            hint="check that node's rewrite or kernel")


def _model_and_folder(model: str | os.PathLike[str] | onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    if isinstance(model, onnx.ModelProto):
        return model, None
    from graphkit.modelio import load_model

    return load_model(model), os.path.dirname(os.path.abspath(os.fspath(model)))


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """Tensor name -> the node computing it (Constant nodes left out), in node order."""
    out: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        for name in node.output:
            if name:
                out[name] = node
    return out


def _node_info(node: onnx.NodeProto) -> NodeInfo:
    op = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
    return NodeInfo(node.name or "<unnamed>", op, tuple(node.input))


def _run_with_outputs(work: onnx.ModelProto, names: Sequence[str], folder: str | None, feeds,
                      registry: Any) -> dict[str, np.ndarray]:
    del work.graph.output[:]
    work.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    return _session(work, registry, _external_folder(None, folder)).run(feeds)


def bisect_models(a: str | os.PathLike[str] | onnx.ModelProto, b: str | os.PathLike[str] | onnx.ModelProto,
                  *, inputs: Mapping[str, Any] | None = None, seed: int = 0,
                  dims: Mapping[str, int] | None = None, atol: float = ATOL, rtol: float = RTOL,
                  chunk: int = CHUNK, registry: Any = None, bind: str | None = None) -> BisectReport:
    """The first tensor (in ``a``'s node order) computed by both models whose values differ.

    Only tensors of the main graphs that both models compute under the same name are
    compared (Constant outputs are skipped). Each step runs both models with the next
    ``chunk`` shared tensors as their only outputs; it stops at the first step with a
    difference. Weights stored as external data are not loaded into Python.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise UsageError(f"chunk must be a positive int, not {chunk!r}", hint="for example --chunk 64")
    label_a, label_b = _label(a, "model a"), _label(b, "model b")
    registry = _resolve(registry)
    # Working copies (graph outputs are replaced per chunk); weights in external data files
    # stay there.
    work_a, folder_a = _bound(a, bind, registry) if bind else _model_and_folder(a)
    work_b, folder_b = _bound(b, bind, registry) if bind else _model_and_folder(b)
    if isinstance(a, onnx.ModelProto) and work_a is a:
        work_a = _copy(a)
    if isinstance(b, onnx.ModelProto) and work_b is b:
        work_b = _copy(b)
    prod_a, prod_b = _producers(work_a.graph), _producers(work_b.graph)
    shared = [n for n in prod_a if n in prod_b]
    # Inputs: a's, checked by a session of model a with its own outputs.
    sa = _session(work_a, registry, _external_folder(None, folder_a))
    feeds, _ = _feeds(sa, inputs, seed, dims)
    feeds = sa._check_feeds(feeds)
    del sa
    compared = runs = max_per_run = 0
    for start in range(0, len(shared), chunk):
        names = shared[start:start + chunk]
        ya = _run_with_outputs(work_a, names, folder_a, feeds, registry)
        yb = _run_with_outputs(work_b, names, folder_b, feeds, registry)
        runs += 1
        max_per_run = max(max_per_run, len(names))
        for name in names:
            compared += 1
            diff = compare_arrays(name, ya[name], yb[name], atol=atol, rtol=rtol)
            if not diff.passed:
                return BisectReport(label_a, label_b, len(shared), compared, chunk, runs, max_per_run,
                                    diff, _node_info(prod_a[name]), _node_info(prod_b[name]), atol, rtol)
        del ya, yb
    return BisectReport(label_a, label_b, len(shared), compared, chunk, runs, max_per_run, None,
                        None, None, atol, rtol)

