"""Find the ATen ops torch's TorchScript exporter cannot export, by trying small models.

    python -m graphkit.export.gaps [--opsets 17-20] [--namespace torch.special ...] [--json]

Nothing is listed by hand. The candidates are the public functions of torch's ATen-bound
namespaces (``torch`` builtins and ``torch.functional``, ``torch.special``,
``torch.nn.functional``, ``torch.linalg``, ``torch.fft``) that run eagerly on one or two
small float tensors and return a float tensor, plus the examples of graphkit's gap-filler
table. Each is wrapped in a one-line module and exported with ``dynamo=False`` at every
opset asked, without graphkit's symbolics; an ``UnsupportedOperatorError`` names the ATen
op that has no symbolic. Then each gap graphkit fills is exported again with
:data:`~graphkit.export.GAP_FILLERS` and run in ONNX Runtime against torch.

Ops that need arguments the probe does not pass (dims, integer tensors, lists) are not
reached; failures other than a missing symbolic are listed separately. Exit status 1 when a
filler does not match torch or a table row is no longer a gap (torch exports it itself).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from graphkit.export._loading import silenced_output
from graphkit.export.aten import GapFillerTable
from graphkit.export.gap_fillers import GAP_FILLERS

__all__ = ["Gap", "GapScan", "scan", "main", "NAMESPACES", "DEFAULT_OPSETS"]

NAMESPACES = ("torch", "torch.special", "torch.nn.functional", "torch.linalg", "torch.fft")
DEFAULT_OPSETS = (17, 18, 19, 20)
_UNSUPPORTED = re.compile(r"operator '(aten::[A-Za-z0-9_.]+)'")


@dataclass
class Gap:
    """An ATen op without a TorchScript symbolic."""

    aten: str
    opsets: list[int] = field(default_factory=list)  # where the export failed
    reached_from: list[str] = field(default_factory=list)  # torch callables that hit it
    filler: str | None = None  # what graphkit writes, "Asinh (opset >= 9)"
    max_abs_err: float | None = None  # with graphkit's filler, over its examples and opsets
    filled_ok: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"aten": self.aten, "opsets": self.opsets, "reached_from": self.reached_from,
                "filler": self.filler, "max_abs_err": self.max_abs_err, "filled_ok": self.filled_ok}


@dataclass
class GapScan:
    opsets: tuple[int, ...]
    candidates: int = 0
    gaps: dict[str, Gap] = field(default_factory=dict)
    other_failures: dict[str, str] = field(default_factory=dict)  # callable -> first error line
    not_gaps: list[str] = field(default_factory=list)  # filler table rows torch now exports

    @property
    def covered(self) -> list[Gap]:
        return [g for g in self.gaps.values() if g.filler is not None]

    def to_dict(self) -> dict[str, Any]:
        return {"opsets": list(self.opsets), "candidates": self.candidates,
                "gaps": [g.to_dict() for g in sorted(self.gaps.values(), key=lambda g: g.aten)],
                "covered": len(self.covered), "other_failures": self.other_failures,
                "not_gaps": self.not_gaps}


class _Call(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _export_error(fn, args, opset: int) -> BaseException | None:
    try:
        torch.onnx.export(_Call(fn), args, io.BytesIO(), dynamo=False, opset_version=opset)
    except Exception as exc:  # noqa: BLE001 - the point is to collect them
        return exc
    return None


def _first_line(exc: BaseException) -> str:
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {text}"[:160]


def _candidates(namespaces: Sequence[str]) -> Iterator[tuple[str, Any]]:
    import importlib

    for ns in namespaces:
        module = importlib.import_module(ns)
        for name in sorted(dir(module)):
            if name.startswith("_") or name.endswith("_"):
                continue
            fn = getattr(module, name, None)
            if isinstance(fn, type) or not callable(fn):
                continue
            if ns == "torch":
                # ATen bindings (builtins) and torch.functional's Python ops; torch's other
                # functions configure the process (set_*, manual_seed, save, ...).
                if not (isinstance(fn, types.BuiltinFunctionType)
                        or getattr(fn, "__module__", None) == "torch.functional"):
                    continue
            elif isinstance(fn, types.ModuleType):
                continue
            yield f"{ns}.{name}", fn


def _probe_args(fn, x, y) -> tuple | None:
    """The arguments ``fn`` runs on eagerly and returns a real float tensor for, or None."""
    for args in ((x,), (x, y)):
        try:
            with torch.no_grad():
                out = fn(*args)
        except Exception:  # noqa: BLE001 - not callable like this
            continue
        if isinstance(out, torch.Tensor) and out.is_floating_point() and not out.is_complex():
            return args
        return None
    return None


@contextlib.contextmanager
def _torch_state() -> Iterator[None]:
    """Whatever a probed function changes in torch's global state is put back."""
    dtype, grad, threads = torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads()
    rng = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)


def _record(scan: GapScan, label: str | None, fn, args) -> None:
    for opset in scan.opsets:
        exc = _export_error(fn, args, opset)
        if exc is None:
            continue
        match = _UNSUPPORTED.search(str(exc))
        if match is None:
            scan.other_failures.setdefault(label or "graphkit table example", f"opset {opset}: {_first_line(exc)}")
            continue
        gap = scan.gaps.setdefault(match.group(1), Gap(match.group(1)))
        if opset not in gap.opsets:
            gap.opsets.append(opset)
        if label is not None and label not in gap.reached_from:
            gap.reached_from.append(label)


def _diff(got: np.ndarray, want: np.ndarray):
    from graphkit.verify import compare_arrays

    return compare_arrays("y", want, got, atol=1e-5, rtol=1e-5)


def _check_fillers(scan: GapScan, table: GapFillerTable) -> None:
    import onnxruntime as ort

    from graphkit.export.aten import scoped_gap_fillers

    for gap in scan.gaps.values():
        filler = table.get(gap.aten)
        if filler is None:
            continue
        worst, ok = 0.0, True
        for i, ex in enumerate(filler.examples):
            args = ex.inputs(torch.Generator().manual_seed(i))
            with torch.no_grad():
                want = ex.fn(*args).numpy()
            for opset in (o for o in scan.opsets if o >= filler.min_opset):
                buf = io.BytesIO()
                with scoped_gap_fillers(table, opset):
                    exc = None
                    try:
                        torch.onnx.export(_Call(ex.fn), args, buf, dynamo=False, opset_version=opset)
                    except Exception as e:  # noqa: BLE001
                        exc = e
                if exc is not None:
                    ok, worst = False, float("inf")
                    continue
                sess = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
                feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
                diff = _diff(sess.run(None, feeds)[0], want)
                ok = ok and diff.passed
                worst = max(worst, diff.max_abs)
        gap.max_abs_err, gap.filled_ok = worst, ok


def scan(opsets: Sequence[int] = DEFAULT_OPSETS, namespaces: Sequence[str] = NAMESPACES,
         table: GapFillerTable = GAP_FILLERS, *, check_fillers: bool = True) -> GapScan:
    """Export one small model per candidate at each of ``opsets`` (no graphkit symbolics
    registered) and collect the ATen ops without a symbolic; then check ``table``'s fillers
    for them in ONNX Runtime."""
    result = GapScan(tuple(opsets))
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 4, generator=gen) * 0.6 + 0.2
    y = torch.rand(2, 3, 4, generator=gen) * 0.6 + 0.2
    with silenced_output(), _torch_state():
        for label, fn in _candidates(namespaces):
            args = _probe_args(fn, x, y)
            if args is None:
                continue
            result.candidates += 1
            _record(result, label, fn, args)
        for filler in table:  # the table's own examples: is each row still a gap?
            for i, ex in enumerate(filler.examples):
                args = ex.inputs(torch.Generator().manual_seed(i))
                _record(result, None, ex.fn, args)
            gap = result.gaps.get(filler.aten)
            if filler.replaces:  # torch exports it: the row corrects what torch writes
                continue
            if gap is None or len(gap.opsets) < len(result.opsets):
                result.not_gaps.append(filler.aten)
        for gap in result.gaps.values():
            filler = table.get(gap.aten)
            if filler is not None:
                gap.filler = f"{filler.onnx} (opset >= {filler.min_opset})"
        if check_fillers:
            _check_fillers(result, table)
    for gap in result.gaps.values():
        gap.opsets.sort()
    return result


def _opsets(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            values = range(int(lo), int(hi) + 1) if sep else [int(lo)]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a list of opsets like 17-20 or 17,20") from None
        out += values
    bad = [o for o in out if not 7 <= o <= 20]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"opsets {bad or text} are outside the TorchScript exporter's 7-20")
    return tuple(sorted(set(out)))


def _span(opsets: Sequence[int]) -> str:
    if opsets and list(opsets) == list(range(opsets[0], opsets[-1] + 1)) and len(opsets) > 1:
        return f"{opsets[0]}-{opsets[-1]}"
    return ",".join(map(str, opsets))


def format_scan(result: GapScan) -> str:
    covered = sorted(result.covered, key=lambda g: g.aten)
    others = sorted((g for g in result.gaps.values() if g.filler is None), key=lambda g: g.aten)
    lines = [f"torch {torch.__version__}, TorchScript exporter (dynamo=False), opsets "
             f"{_span(result.opsets)}: {result.candidates} callables probed, {len(result.gaps)} "
             f"ATen ops without a symbolic, {len(covered)} filled by graphkit",
             "",
             f"filled by graphkit ({len(covered)}), checked against torch in ONNX Runtime:",
             f"  {'aten op':<26} {'fails at':<9} {'graphkit writes':<52} {'max abs err':>11}  reached from"]
    for g in covered:
        err = "-" if g.max_abs_err is None else f"{g.max_abs_err:.3g}" + ("" if g.filled_ok else " FAIL")
        lines.append(f"  {g.aten:<26} {_span(g.opsets):<9} {g.filler:<52} {err:>11}  "
                     f"{', '.join(g.reached_from) or 'table examples'}")
    lines += ["", f"not filled ({len(others)}):"]
    for g in others:
        lines.append(f"  {g.aten:<42} {_span(g.opsets):<9} {', '.join(g.reached_from)}")
    if result.other_failures:
        lines += ["", f"other export failures ({len(result.other_failures)}, not a missing symbolic):"]
        lines += [f"  {k}: {v}" for k, v in sorted(result.other_failures.items())]
    if result.not_gaps:
        lines += ["", "gap-filler rows torch exports itself at some of these opsets: "
                  + ", ".join(result.not_gaps)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphkit.export.gaps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--opsets", type=_opsets, default=DEFAULT_OPSETS,
                        help="opsets to try: a range or a list, for example 17-20 (default) or 9,17")
    parser.add_argument("--namespace", action="append", choices=NAMESPACES,
                        help="probe only these namespaces (repeatable; default all)")
    parser.add_argument("--no-check", action="store_true",
                        help="do not run graphkit's fillers in ONNX Runtime")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = scan(args.opsets, args.namespace or NAMESPACES, check_fillers=not args.no_check)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_scan(result))
    failed = [g.aten for g in result.covered if g.filled_ok is False]
    return 1 if failed or result.not_gaps else 0


if __name__ == "__main__":
    sys.exit(main())
