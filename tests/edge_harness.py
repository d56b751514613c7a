"""Edge-value harness: every op graphkit defines and every ATen gap filler, in every
lowering, against torch eager on a grid of hard values, per dtype.

The grid (per dtype): +-0, the smallest and largest subnormals, the smallest normal, +-1
and small integers and halves, values near the dtype's overflow (max, sqrt(max)) and
underflow (sqrt(tiny)), huge and tiny magnitudes, +-inf, NaN of both signs, integer
extremes for integer dtypes, then ``examples`` random draws (log-uniform magnitudes, both
signs). Binary inputs get the cross product of the special values plus random pairs.

A case passes when the lowering's output has torch's dtype and shape, NaN exactly where
torch has NaN, torch's sign bit elsewhere (zeros and infinities included) and
|got - want| <= atol + rtol * scale, with (rtol, atol) the op's declared tolerance for the
dtype (:func:`graphkit.ops._opdef.tolerance_for`) and scale = |want| (for graphkit's ops, the
larger of |want| and |reference(|inputs|)|, the sum of the magnitudes a sum of products
rounds against).

Each lowered model is built once per (op, lowering, opset, dtype) and fed the whole grid:
in one batch for graphkit's elementwise ops, in runs of the example's shape for a gap
filler (whose examples fix the shapes the symbolic sees) and for deform_conv2d.

``python bench/edges.py`` prints the table; tests/test_edges.py asserts it.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ENV_EXAMPLES = "GRAPHKIT_EDGE_EXAMPLES"
DEFAULT_EXAMPLES = 32
FLOAT_DTYPES = ("float16", "float32", "float64")
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")
LATEST_OPSET = 21  # newest opset the custom-op lowerings are tried at


def budget() -> int:
    """Random draws per dtype: GRAPHKIT_EDGE_EXAMPLES (default 32). A budget above the
    default also tries every opset and every example (nightly-style)."""
    return int(os.environ.get(ENV_EXAMPLES, DEFAULT_EXAMPLES))


def thorough() -> bool:
    return budget() > DEFAULT_EXAMPLES


# --------------------------------------------------------------------------- the grid


def _seed(*parts: object) -> int:
    """A fixed seed per case (``hash`` of a str changes from process to process)."""
    return zlib.crc32(repr(parts).encode())


def special_values(dtype: str) -> np.ndarray:
    """The hand-picked hard values of ``dtype`` (floats: signed, ordered by interest)."""
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        values = [0, 1, 2, 7, 100, info.max, info.max - 1, info.min, info.min + 1]
        values += [-1, -2, -7, -100] if dt.kind == "i" else [3, 255]
        return np.array([v for v in values if info.min <= v <= info.max], dtype=dt)
    info = np.finfo(dt)
    sub = float(info.smallest_subnormal)
    tiny, big = float(info.tiny), float(info.max)
    magnitudes = [0.0, 1.0, 0.5, 1.5, 2.0, 2.5, 3.0, 7.25, 20.0, 100.0, 1e-3, 1e-8, 1e4,
                  sub, tiny - sub, tiny, math.sqrt(tiny), float(info.eps), 1.0 - float(info.eps) / 2,
                  math.sqrt(big), big / 2, big, math.pi, 1e10, 1e-20, 1e20, 1e38, 1e-30, 1e300, 1e-300]
    with np.errstate(over="ignore", under="ignore"):
        mags = np.array(magnitudes, np.float64).astype(dt)
    mags = mags[np.isfinite(mags) & ((mags != 0) | (np.arange(len(mags)) == 0))]
    mags = np.array(list(dict.fromkeys(mags.tolist())), dt)
    signed = np.concatenate([mags, -mags])
    nan = np.array([np.nan], dt)
    return np.concatenate([signed, np.array([np.inf, -np.inf], dt), nan, -nan])


def random_values(dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        small = rng.integers(max(info.min, -1000), min(info.max, 1000), n // 2, endpoint=True)
        wide = rng.integers(info.min, info.max, n - n // 2, endpoint=True, dtype=np.int64 if dt.kind == "i" else np.uint64)
        return np.concatenate([small, wide]).astype(dt)
    info = np.finfo(dt)
    top = math.log10(float(info.max))
    exponent = rng.uniform(-top, top, n)
    exponent[: n // 2] = rng.uniform(-3, 3, n // 2)  # half of them near 1
    sign = rng.choice([-1.0, 1.0], n)
    with np.errstate(over="ignore"):
        return (sign * 10.0 ** exponent).astype(dt)


def grid(dtype: str, examples: int, rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([special_values(dtype), random_values(dtype, examples, rng)])


def pairs(a_dtype: str, b_dtype: str, examples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Cross product of the special values, then random pairs."""
    sa, sb = special_values(a_dtype), special_values(b_dtype)
    a = np.repeat(sa, len(sb))
    b = np.tile(sb, len(sa))
    ga, gb = grid(a_dtype, examples, rng), grid(b_dtype, examples, rng)
    n = max(len(ga), len(gb), examples * 4)
    ra = ga[rng.integers(0, len(ga), n)]
    rb = gb[rng.integers(0, len(gb), n)]
    return np.concatenate([a, ra]), np.concatenate([b, rb])


# --------------------------------------------------------------------------- comparison


@dataclass
class Outcome:
    """What one (op, lowering, dtype) did over its grid."""

    op: str
    lowering: str
    dtype: str
    cases: int = 0
    worst: float = 0.0  # rel: max |got - want| / max(scale, smallest normal), finite values
    failures: list[str] = field(default_factory=list)
    status: str = "ok"  # ok, failed, unsupported (declared), refused (by graphkit's selection)
    refused_by: str = ""  # the class of graphkit's error when refused (UnsupportedOpError: no ORT kernel)

    @property
    def key(self) -> tuple[str, str, str]:
        return self.op, self.lowering, self.dtype

    worst_abs: float = 0.0  # max |got - want| over finite values
    worst_ulp: float = 0.0  # max |got - want| / ulp(scale) in want's dtype (1 for integers)
    documented: int = 0          # cases compared with a documented semantics instead of torch
    documented_differs: int = 0  # ... where that semantics really differs from torch

    def note_documented(self, documented: np.ndarray, torch_value: np.ndarray, where: np.ndarray) -> None:
        where = np.broadcast_to(where, torch_value.shape).ravel()
        d = documented.astype(np.float64).ravel()[where]
        w = torch_value.astype(np.float64).ravel()[where]
        self.documented += int(d.size)
        same = ((d == w) & (np.signbit(d) == np.signbit(w))) | (np.isnan(d) & np.isnan(w))
        self.documented_differs += int(np.count_nonzero(~same))

    def fail(self, text: str) -> None:
        self.status = "failed"
        if len(self.failures) < 5:
            self.failures.append(text)


def compare(out: Outcome, got: np.ndarray, want: np.ndarray, tolerance: tuple[float, float],
            scale: np.ndarray | None = None, inputs: Sequence[np.ndarray] = (),
            allowance: np.ndarray | None = None) -> None:
    """Check ``got`` against ``want`` (see the module docstring); record into ``out``.
    ``allowance``: an absolute error allowed on top of the tolerance, per element (a
    lowering's documented precision: grid_sample's position rounding)."""
    out.cases += int(np.size(want))
    if got.dtype != want.dtype:
        out.fail(f"dtype {got.dtype}, torch {want.dtype}")
        return
    if got.shape != want.shape:
        out.fail(f"shape {got.shape}, torch {want.shape}")
        return
    g = got.astype(np.float64).ravel()
    w = want.astype(np.float64).ravel()
    s = np.abs(w) if scale is None else np.maximum(np.abs(w), np.abs(np.broadcast_to(scale, want.shape).astype(np.float64).ravel()))
    rtol, atol = tolerance
    extra = 0.0 if allowance is None else np.broadcast_to(allowance, want.shape).astype(np.float64).ravel()
    nan_w, nan_g = np.isnan(w), np.isnan(g)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(g - w)
        close = (g == w) | (diff <= atol + rtol * s + extra)
        # sign bits: of zeros and infinities (a tiny value of either sign within tolerance is fine)
        signed = (w == 0) | np.isinf(w)
        bad = (nan_w != nan_g) | (~nan_w & ((signed & (np.signbit(g) != np.signbit(w))) | ~close))
        finite = np.isfinite(w) & np.isfinite(g)
        if finite.any():
            floating = want.dtype.kind == "f"
            tiny = float(np.finfo(want.dtype).tiny) if floating else 1.0
            d = diff[finite]
            out.worst = max(out.worst, float((d / np.maximum(s[finite], tiny)).max()))
            out.worst_abs = max(out.worst_abs, float(d.max()))
            if floating:  # in ulps of the scale, in want's dtype
                with np.errstate(over="ignore"):
                    ulp = np.spacing(s[finite].astype(want.dtype)).astype(np.float64)
                ulp = np.where(np.isfinite(ulp), ulp, np.spacing(np.finfo(want.dtype).max).astype(np.float64))
            else:
                ulp = 1.0
            out.worst_ulp = max(out.worst_ulp, float((d / ulp).max()))
    if bad.any():
        for i in np.flatnonzero(bad)[:3]:
            at = ", ".join(f"{np.asarray(x).ravel()[i % max(np.size(x), 1)]!r}" for x in inputs
                           if np.size(x) == np.size(want)) if inputs else ""
            out.fail(f"[{i}] got {got.ravel()[i]!r}, torch {want.ravel()[i]!r}" + (f" at ({at})" if at else ""))


# --------------------------------------------------------------------------- gap fillers

# Where a gap filler departs from torch on purpose (its row's ``semantics`` says why):
# filler name -> ((inputs, torch's result) -> (where the semantics applies, the documented
# result there), why). Those cases are compared with the documented result, not torch's;
# tests/test_edges.py checks that it differs from torch's on some of them.
def _copysign_nan(inputs, want):
    x = np.broadcast_to(inputs[0], want.shape).astype(np.float64)
    y = np.broadcast_to(inputs[1], want.shape).astype(np.float64)
    return np.isnan(y), np.abs(x).astype(want.dtype)


def _logaddexp2_equal(inputs, want):
    x, y = (np.broadcast_to(a, want.shape).astype(np.float64) for a in inputs[:2])
    with np.errstate(over="ignore"):
        return (x == y) & np.isfinite(x), (x + 1.0).astype(want.dtype)


def _gelu_single_overflow(inputs, want):
    """float32 gelu is torch's graph: inf at x > max / 2 (ONNX Runtime's Mul overflows) and +inf.
    At +inf every dtype gives gelu's limit, inf: torch's vectorized CPU kernel gives NaN there
    for a tensor of two or more elements (its one-element path gives inf)."""
    x = np.broadcast_to(inputs[0], want.shape)
    if want.dtype != np.float32:
        return x == np.inf, np.full(want.shape, np.inf, want.dtype)
    return x > np.finfo(np.float32).max / 2, np.full(want.shape, np.inf, np.float32)


DOCUMENTED: dict[str, tuple[Callable[[list[np.ndarray], np.ndarray], tuple[np.ndarray, np.ndarray]], str]] = {
    "copysign": (_copysign_nan, "copysign(x, +-nan) is |x|: a NaN's sign bit is invisible to ONNX ops "
                 "before opset 26 (BitCast); torch gives -|x| for -nan"),
    "gelu": (_gelu_single_overflow, "float32 gelu is torch's graph: inf for x > max / 2 and at inf; every "
             "dtype gives inf at +inf (torch's vectorized kernel gives NaN there)"),
    "logaddexp2": (_logaddexp2_equal, "logaddexp2(x, x) = x + 1 exactly; torch rounds m + log1p(1) / ln 2"),
}


class _Call:
    @staticmethod
    def module(fn):
        import torch

        class Call(torch.nn.Module):
            def forward(self, *args):
                return fn(*args)

        return Call()


def _slots(args) -> list[tuple[int, str]]:
    """(argument index, dtype name) of the tensor arguments that carry values."""
    out = []
    for i, a in enumerate(args):
        name = str(a.dtype).replace("torch.", "")
        if a.dtype.is_floating_point or name in INT_DTYPES:
            out.append((i, name))
    return out


def _variants(slots: list[tuple[int, str]]) -> Iterator[tuple[str, dict[int, str]]]:
    """(label, argument index -> dtype): each float dtype, each integer dtype for the float
    arguments, and float32 with float64 for two float arguments."""
    floats = [i for i, d in slots if d in FLOAT_DTYPES or d == "bfloat16"]
    fixed = {i: d for i, d in slots if i not in floats}
    if not floats:
        yield (slots[0][1] if slots else "none"), dict(fixed)
        return
    for d in FLOAT_DTYPES:
        yield d, {**fixed, **{i: d for i in floats}}
    for d in (INT_DTYPES if thorough() else INT_DTYPES[:1]):
        yield d, {**fixed, **{i: d for i in floats}}
    if len(floats) >= 2:
        yield "float32+float64", {**fixed, floats[0]: "float32", floats[1]: "float64"}


def _streams(kinds: dict[int, str], examples: int, rng) -> dict[int, np.ndarray]:
    idx = sorted(kinds)
    if len(idx) == 1:
        return {idx[0]: grid(kinds[idx[0]], examples, rng)}
    a, b = pairs(kinds[idx[0]], kinds[idx[1]], examples, rng)
    out = {idx[0]: a, idx[1]: b}
    for i in idx[2:]:
        g = grid(kinds[i], examples, rng)
        out[i] = g[rng.integers(0, len(g), len(a))]
    return out


def _batchable(template, kinds: dict[int, str], example) -> bool:
    """Whether the value arguments share one shape (rank >= 1) that the output keeps: then
    the model is exported with a dynamic first dimension and fed the whole grid at once."""
    import torch

    shapes = {tuple(template[i].shape) for i in kinds}
    if len(shapes) != 1 or not next(iter(shapes)):
        return False
    shape = next(iter(shapes))
    grown = list(template)
    for i in kinds:  # the function must take a longer first dimension too
        grown[i] = torch.zeros((shape[0] + 3, *shape[1:]), dtype=template[i].dtype)
    try:
        with torch.no_grad():
            y, z = example.fn(*template), example.fn(*grown)
    except Exception:  # noqa: BLE001
        return False
    return (isinstance(y, torch.Tensor) and tuple(y.shape) == shape
            and isinstance(z, torch.Tensor) and tuple(z.shape) == tuple(grown[next(iter(kinds))].shape))


def _runs(template, kinds: dict[int, str], streams: dict[int, np.ndarray], batch: bool = False) -> Iterator[list]:
    """The template arguments refilled with the streams, chunk by chunk (``batch``: in one
    run, the first dimension grown to hold every value)."""
    import torch

    length = max(len(s) for s in streams.values())
    if batch:
        shape = tuple(template[next(iter(kinds))].shape)
        inner = int(np.prod(shape[1:], dtype=np.int64))
        rows = -(-length // inner)
        template = list(template)
        for i in kinds:
            template[i] = torch.empty((rows, *shape[1:]), dtype=template[i].dtype)
    sizes = {i: max(template[i].numel(), 1) for i in kinds}
    step = max(sizes.values())
    for start in range(0, length, step):
        args = list(template)
        for i, dtype in kinds.items():
            n, s = sizes[i], streams[i]
            values = s[(start + np.arange(n)) % len(s)]
            args[i] = torch.from_numpy(values.reshape(tuple(template[i].shape)).copy())
        yield args


def _elementwise(example, args) -> bool:
    import torch

    try:
        with torch.no_grad():
            y = example.fn(*args)
    except Exception:  # noqa: BLE001
        return False
    return isinstance(y, torch.Tensor) and any(a.shape == y.shape for a in args)


def _examples(filler) -> list:
    import torch

    if thorough():
        return list(filler.examples)
    # the suite: the first example that maps values elementwise, one with a float argument
    # first (its dtype varies), else the first example
    shaped = [ex for i, ex in enumerate(filler.examples)
              if _elementwise(ex, ex.inputs(torch.Generator().manual_seed(i)))]
    floats = [ex for ex in shaped if any(a.dtype.is_floating_point for a in ex.inputs(torch.Generator().manual_seed(0)))]
    return (floats or shaped or list(filler.examples))[:1]


def _export(fn, args, opset: int, table, dynamic: Iterable[int] = ()) -> bytes:
    import torch

    from graphkit.export._loading import silenced_output
    from graphkit.export.aten import scoped_gap_fillers

    buf = io.BytesIO()
    with silenced_output(), scoped_gap_fillers(table, opset):
        torch.onnx.export(_Call.module(fn), tuple(args), buf, dynamo=False, opset_version=opset,
                          input_names=[f"in{i}" for i in range(len(args))],
                          dynamic_axes={f"in{i}": {0: "n"} for i in dynamic} or None)
    return buf.getvalue()


def check_gap_filler(filler, table=None, examples: int | None = None) -> list[Outcome]:
    """Every (opset, dtype variant) of ``filler`` on the edge grid; one Outcome each
    (lowering ``filler@<opset>``), plus the opsets tried at the end of the label."""
    import onnxruntime as ort
    import torch

    from graphkit.export import GAP_FILLERS
    from graphkit.ops._opdef import tolerance_for

    table = GAP_FILLERS if table is None else table
    examples = budget() if examples is None else examples
    outcomes: dict[tuple[str, str], Outcome] = {}
    for k, ex in enumerate(_examples(filler)):
        template = list(ex.inputs(torch.Generator().manual_seed(k)))
        slots = _slots(template)
        for label, kinds in _variants(slots):
            rng = np.random.default_rng(_seed(filler.aten, label, k))
            args0 = list(template)
            for i, d in kinds.items():
                args0[i] = template[i].to(getattr(torch, d))
            try:
                with torch.no_grad():
                    ex.fn(*args0)
            except Exception:  # noqa: BLE001 - torch does not take this dtype: not a case
                continue
            opsets = (range(filler.min_opset, 21) if thorough() else
                      sorted({filler.min_opset, 17}) if label == "float32" else [17])
            streams = _streams(kinds, examples, rng)
            batch = _batchable(args0, kinds, ex)
            for opset in opsets:
                out = outcomes.setdefault((f"filler@{opset}", label), Outcome(filler.name, f"filler@{opset}", label))
                unsupported = next((why for d, why in filler.unsupported.items() if d in kinds.values()), None)
                try:
                    model = _export(ex.fn, args0, opset, table, kinds if batch else ())
                    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
                except Exception as exc:  # noqa: BLE001
                    if unsupported is not None:
                        out.status = "unsupported"
                    else:
                        out.fail(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                    continue
                if unsupported is not None:
                    out.fail(f"declared unsupported ({unsupported}) but ONNX Runtime runs it: update the row")
                    continue
                names = {i.name for i in sess.get_inputs()}
                for args in _runs(args0, kinds, streams, batch):
                    try:
                        with torch.no_grad():
                            want = ex.fn(*args)
                    except Exception:  # noqa: BLE001 - torch refuses these values: not a case
                        continue
                    feeds = {f"in{i}": a.numpy() for i, a in enumerate(args) if f"in{i}" in names}
                    got = sess.run(None, feeds)[0]
                    w = want.numpy()
                    inputs = [a.numpy() for a in args]
                    if filler.name in DOCUMENTED:
                        where, value = DOCUMENTED[filler.name][0](inputs, w)
                        out.note_documented(value, w, where)
                        w = np.where(where, value, w).astype(w.dtype)
                    scale = None
                    if filler.tolerance_scale == "inputs":
                        scale = np.maximum.reduce([np.abs(np.broadcast_to(a, w.shape).astype(np.float64))
                                                   for a in inputs if a.dtype.kind == "f"])
                    compare(out, got, w, tolerance_for(filler.tolerance, str(w.dtype)), scale=scale,
                            inputs=inputs)
    return list(outcomes.values())


# --------------------------------------------------------------------------- graphkit's ops


@dataclass
class OpCase:
    """Inputs for one run of a graphkit op: arrays by input name (None: absent)."""

    feeds: dict[str, np.ndarray | None]
    attrs: dict[str, Any]
    label: str = "grid"


def _elementwise_cases(op, dtype: str, examples: int, rng) -> list[OpCase]:
    names = [p.name for p in op.inputs]
    if len(names) == 1:
        return [OpCase({names[0]: grid(dtype, examples, rng)}, {})]
    a, b = pairs(dtype, dtype, examples, rng)
    return [OpCase({names[0]: a, names[1]: b}, {})]


def _deform_cases(op, dtype: str, examples: int, rng) -> list[OpCase]:
    """Modest shapes; edge values in the input, the offsets (far, inf, NaN, subnormal,
    integer and half-integer positions) and the mask, the other inputs random."""
    dt = np.dtype(dtype)
    n, c, h, w, m, k = 1, 2, 5, 5, 3, 3
    shapes = {"input": (n, c, h, w), "weight": (m, c, k, k), "offset": (n, 2 * k * k, 3, 3),
              "bias": (m,), "mask": (n, k * k, 3, 3)}

    def normal(name):
        return rng.standard_normal(shapes[name]).astype(dt)

    def base():
        return {"input": normal("input"), "weight": normal("weight"),
                "offset": (rng.standard_normal(shapes["offset"]) * 1.5).astype(dt),
                "bias": normal("bias"), "mask": rng.uniform(0, 1, shapes["mask"]).astype(dt)}

    def filled(name, values):
        size = int(np.prod(shapes[name]))
        out = []
        for start in range(0, len(values), size):
            chunk = values[(start + np.arange(size)) % len(values)]
            rng.shuffle(chunk)
            out.append(chunk.reshape(shapes[name]).astype(dt))
        return out

    offsets = np.array([0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.5, -1.5, 4.0, -4.0, 1e-3, 0.999, -0.999, 5.0, -5.0,
                        1e4, -1e4, 1e30, -1e30, np.inf, -np.inf, np.nan, float(np.finfo(dt).smallest_subnormal)])
    masks = np.array([0.0, -0.0, 1.0, 0.5, -1.0, 2.0, 1e-30, 1e30, np.inf, -np.inf, np.nan])
    cases = []
    # finite image values small enough that 18-term sums of products do not overflow in
    # one summation order and not another
    image = grid(dtype, examples, rng)
    limit = math.sqrt(float(np.finfo(dt).max)) / 1e3
    image = image[~np.isfinite(image) | (np.abs(image) < limit)]
    weights = special_values(dtype)
    weights = weights[~np.isfinite(weights) | (np.abs(weights) < limit)]
    for name, values in (("input", image), ("offset", offsets), ("mask", masks), ("weight", weights)):
        for chunk in filled(name, np.asarray(values, np.float64)):
            feeds = base()
            feeds[name] = chunk
            cases.append(OpCase(feeds, {}, f"edge values in {name}"))
    return cases


def op_cases(op, dtype: str, examples: int, rng) -> list[OpCase]:
    if op.name == "deform_conv2d":
        return _deform_cases(op, dtype, examples, rng)
    return _elementwise_cases(op, dtype, examples, rng)


def _model(op, case: OpCase, dtype: str, opset: int):
    import onnx
    from onnx import helper

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = [p.name if case.feeds.get(p.name) is not None else "" for p in op.inputs]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op.name, names, [p.name + "_out" for p in op.outputs], domain=op.domain,
                            name="n0", **case.attrs)
    shapes = {k: list(v.shape) for k, v in case.feeds.items() if v is not None}
    inputs = [helper.make_tensor_value_info(n, elem, shapes[n]) for n in names if n]
    outputs = [helper.make_tensor_value_info(p.name + "_out", elem, None) for p in op.outputs]
    graph = helper.make_graph([node], "edges", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(op.domain, 1)],
                             ir_version=8 if opset < 21 else 10)


def _torch_reference(op, case: OpCase, magnitudes: bool = False) -> list[np.ndarray]:
    import torch

    args = []
    for p in op.inputs:
        v = case.feeds.get(p.name)
        if v is not None and magnitudes and p.name != "offset":  # offsets are positions
            v = np.abs(v)
        args.append(None if v is None else torch.from_numpy(np.ascontiguousarray(v)))
    while args and args[-1] is None:
        args.pop()
    with torch.no_grad():
        out = op.reference(*args, **case.attrs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o.numpy() for o in outs]


def _deform_points(case: OpCase) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """deform_conv2d's sampling points (y, x), each (N, offset_groups, kh * kw, Ho, Wo), in
    the case's dtype and order of additions (integral base, then the offset)."""
    attrs = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1, "offset_groups": 1,
             **case.attrs}
    x, weight, offset = case.feeds["input"], case.feeds["weight"], case.feeds["offset"]
    kh, kw = weight.shape[2:]
    n, _, ho, wo = offset.shape
    og, kk = attrs["offset_groups"], kh * kw
    (sh, sw), (ph, pw), (dh, dw) = attrs["stride"], attrs["padding"], attrs["dilation"]
    off = offset.reshape(n, og, kk, 2, ho, wo)
    base_y = (np.repeat(np.arange(kh) * dh, kw)[:, None, None] + np.arange(ho)[None, :, None] * sh - ph)
    base_x = (np.tile(np.arange(kw) * dw, kh)[:, None, None] + np.arange(wo)[None, None, :] * sw - pw)
    with np.errstate(invalid="ignore", over="ignore"):
        return base_y.astype(x.dtype) + off[:, :, :, 0], base_x.astype(x.dtype) + off[:, :, :, 1], attrs


def _ort_deform_conv(op, case: OpCase, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Runtime's DeformConv (deform_conv2d's docstring): a sampling point with a corner
    outside the image (not 0 <= y < H - 1 and 0 <= x < W - 1: points outside or NaN, the
    border strip, and the last row and column, whose far corners have weight 0) reads pixel
    (0, 0) of its channel with weight 0, so a NaN or infinite pixel (0, 0) gives NaN at every
    output of that position and weight group."""
    y, x, attrs = _deform_points(case)
    image, weight = case.feeds["input"], case.feeds["weight"]
    n, c, h, w = image.shape
    og = y.shape[1]
    with np.errstate(invalid="ignore"):
        strays = ~((y >= 0) & (y < h - 1) & (x >= 0) & (x < w - 1))  # NaN points included
    documented, where = want.copy(), np.zeros(want.shape, bool)
    per_group = weight.shape[0] // attrs["groups"]
    for b, ch in zip(*np.nonzero(~np.isfinite(image[:, :, 0, 0]))):
        hit = strays[b, ch // (c // og)].any(axis=0)  # (Ho, Wo)
        group = ch // weight.shape[1]
        rows = slice(group * per_group, (group + 1) * per_group)
        documented[b, rows][:, hit] = np.nan
        where[b, rows] |= hit
    return where, documented


def _grid_sample_position(op, case: OpCase, want: np.ndarray) -> np.ndarray:
    """The absolute error grid_sample's position rounding allows (its docstring: the grid is
    normalized to [-1, 1] in the model's type, about size * 2^-24 pixel in float32): a
    position error d moves a sample by at most d times the sum of its four corners'
    magnitudes, so d * sum over outputs of |weight| |mask| (|p00| + |p01| + |p10| + |p11|)."""
    feeds = {k: (None if v is None else np.abs(v)) for k, v in case.feeds.items()}
    feeds["bias"] = None
    offset = np.floor(case.feeds["offset"].astype(np.float64))
    n, two_kk, ho, wo = offset.shape
    total = np.zeros(want.shape, np.float64)
    for dy in (0, 1):
        for dx in (0, 1):
            corner = offset.reshape(n, -1, 2, ho, wo) + np.array([dy, dx]).reshape(1, 1, 2, 1, 1)
            feeds["offset"] = corner.reshape(offset.shape).astype(want.dtype)
            with np.errstate(invalid="ignore", over="ignore"):
                total += np.abs(_torch_reference(op, OpCase(feeds, case.attrs))[0]).astype(np.float64)
    size = max(case.feeds["input"].shape[2:])
    position = GRID_SAMPLE_POSITION_ULPS * size * float(np.finfo(want.dtype).eps) / 2
    return np.where(np.isfinite(total), total * position, 0.0)


# grid_sample's position error, in units of size * eps / 2 pixel (measured worst: see
# tests/test_edges.py::test_grid_sample_position_error_is_what_its_docstring_says)
GRID_SAMPLE_POSITION_ULPS = 1.0

# (op, lowering) -> the lowering's documented departure from torch: (op, case, torch's first
# output) -> (where it applies, the documented output); checked like DOCUMENTED.
OP_DOCUMENTED: dict[tuple[str, str], Callable[[Any, OpCase, np.ndarray], tuple[np.ndarray, np.ndarray]]] = {
    ("deform_conv2d", "onnx_deform_conv"): _ort_deform_conv,
}
# (op, lowering) -> its documented precision beyond the op's tolerance: (op, case, torch's
# first output) -> an absolute error allowed per element.
OP_PRECISION: dict[tuple[str, str], Callable[[Any, OpCase, np.ndarray], np.ndarray]] = {
    ("deform_conv2d", "grid_sample"): _grid_sample_position,
}


def lowerings(op) -> list[tuple[str, Any, int, Any]]:
    """(label, Lowering, opset, registry): each decomposition alone at every opset it
    supports (up to LATEST_OPSET), the native kernel, the Python kernel."""
    from graphkit.ops import OpRegistry, discover
    from graphkit.rewrite import Lowering

    out = []
    for dec in op.decompositions:
        only = OpRegistry([dataclasses.replace(op, decompositions=(dec,))])
        top = min(dec.max_opset or LATEST_OPSET, LATEST_OPSET)
        opsets = (range(dec.min_opset, top + 1) if thorough() else
                  sorted({dec.min_opset, max(dec.min_opset, min(17, top)), top}))
        for opset in opsets:
            out.append((f"{dec.name}@{opset}", Lowering.DECOMPOSE, opset, only))
    kernels = discover(entry_points=False, environment=False)
    if op.native:
        out.append(("native", Lowering.NATIVE, 17, kernels))
    if op.python_kernel is not None:
        out.append(("python", Lowering.PYTHON, 17, kernels))
    return out


def check_op(op, examples: int | None = None) -> list[Outcome]:
    """Every lowering of graphkit op ``op`` in every float dtype it declares, on the grid."""
    import graphkit
    from graphkit.errors import GraphkitError
    from graphkit.ops._opdef import tolerance_for
    from graphkit.rewrite import rewrite_model

    from graphkit.ops import discover

    examples = budget() if examples is None else examples
    kernels = discover(entry_points=False, environment=False)
    dtypes = sorted({_np_name(t) for ts in op.type_constraints.values() for t in ts})
    results = []
    for dtype in dtypes:
        rng = np.random.default_rng(_seed(op.name, dtype))
        cases = op_cases(op, dtype, examples, rng)
        wants = [(_torch_reference(op, c), _torch_reference(op, c, magnitudes=True)) for c in cases]
        tol = tolerance_for(op.tolerance, dtype)
        for label, lowering, opset, registry in lowerings(op):
            out = Outcome(op.name, label, dtype)
            results.append(out)
            try:
                lowered, _ = rewrite_model(_model(op, cases[0], dtype, opset), registry=registry, lowering=lowering)
                sess = graphkit.open_session(lowered, registry=kernels)
            except GraphkitError as exc:  # graphkit's selection: nothing executable for this dtype
                out.status = "refused"
                out.refused_by = type(exc).__name__
                out.failures.append(str(exc).splitlines()[0][:200])
                continue
            kind = (op.name, label.partition("@")[0])
            for case, (want, scale) in zip(cases, wants):
                feeds = {k: v for k, v in case.feeds.items() if v is not None}
                try:
                    got = sess.run(feeds)
                except GraphkitError as exc:
                    out.fail(f"run: {str(exc).splitlines()[0][:200]}")
                    break
                want = list(want)
                if kind in OP_DOCUMENTED:
                    where, documented = OP_DOCUMENTED[kind](op, case, want[0])
                    out.note_documented(documented, want[0], where)
                    want[0] = documented
                allowance = OP_PRECISION[kind](op, case, want[0]) if kind in OP_PRECISION else None
                for k, (p, w, s) in enumerate(zip(op.outputs, want, scale)):
                    before = len(out.failures)
                    compare(out, got[p.name + "_out"], w, tol, scale=s, inputs=list(feeds.values()),
                            allowance=allowance if k == 0 else None)
                    out.failures[before:] = [f"{case.label}: {f}" for f in out.failures[before:]]
    return results


def _np_name(type_str: str) -> str:
    from onnx import TensorProto, helper

    elem = getattr(TensorProto, type_str[len("tensor("):-1].upper())
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name


# --------------------------------------------------------------------------- report


def format_table(outcomes: Iterable[Outcome]) -> str:
    """Markdown: per (op, lowering, dtype) the cases checked and the worst error over the
    finite values (abs: |got - torch|; rel: that over the scale the tolerance is relative
    to, |torch| or the op's larger scale; ulp: in units in the last place of that scale in
    the result's dtype, 1 for integers); then the cases checked per op."""
    outcomes = list(outcomes)
    per_op: dict[str, int] = {}
    for o in outcomes:
        per_op[o.op] = per_op.get(o.op, 0) + o.cases
    lines = ["| op | lowering | dtype | cases | worst abs | worst rel | worst ulp | status |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for o in sorted(outcomes, key=lambda o: (o.op, o.lowering, o.dtype)):
        cells = [f"{v:.3g}" if o.cases else "-" for v in (o.worst_abs, o.worst, o.worst_ulp)]
        status = o.status + (f" ({o.documented} documented)" if o.documented else "")
        lines.append(f"| {o.op} | {o.lowering} | {o.dtype} | {o.cases} | {' | '.join(cells)} | {status} |")
    lines += ["", "| op / gap filler | cases checked |", "|---|---:|"]
    lines += [f"| {op} | {n} |" for op, n in sorted(per_op.items())]
    lines.append(f"| total | {sum(per_op.values())} |")
    return "\n".join(lines)


def collapse(outcomes: Iterable[Outcome]) -> list[Outcome]:
    """One row per (op, lowering kind, dtype): opsets folded (``log_sqrt@7-21``)."""
    groups: dict[tuple[str, str, str], list[Outcome]] = {}
    for o in outcomes:
        base, _, opset = o.lowering.partition("@")
        groups.setdefault((o.op, base, o.dtype), []).append(o)
    rows = []
    for (op, base, dtype), group in groups.items():
        opsets = sorted(int(o.lowering.partition("@")[2]) for o in group if "@" in o.lowering)
        label = base + (f"@{opsets[0]}-{opsets[-1]}" if len(opsets) > 1 else f"@{opsets[0]}" if opsets else "")
        statuses = sorted({o.status for o in group})
        row = Outcome(op, label, dtype, sum(o.cases for o in group), max(o.worst for o in group),
                      [f for o in group for f in o.failures][:5], "/".join(statuses),
                      worst_abs=max(o.worst_abs for o in group), worst_ulp=max(o.worst_ulp for o in group),
                      documented=sum(o.documented for o in group),
                      documented_differs=sum(o.documented_differs for o in group))
        rows.append(row)
    return rows


def run_all(examples: int | None = None, fillers: Callable[[Any], bool] = lambda f: True) -> list[Outcome]:
    from graphkit.export import GAP_FILLERS
    from graphkit.ops import discover

    out = []
    for op in discover(entry_points=False, environment=False):
        out += check_op(op, examples)
    for f in GAP_FILLERS:
        if fillers(f):
            out += check_gap_filler(f, examples=examples)
    return out
