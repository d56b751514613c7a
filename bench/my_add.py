"""Benchmark: native my_add (one pass) vs ONNX Runtime's own Mul(a, 2) + Add(., b).

Run:  python bench/my_add.py [--seconds 1.5] [--shapes 1x16x128x128,1x64x256x256] [--threads 1,2]

Each case runs on a float32 model with static shapes, inputs bound once and the output
written into a preallocated buffer (IOBinding), so the numbers are the session's run
latency without numpy conversions. Runs are interleaved in rounds so that drift hits
every case alike; the table shows medians in microseconds and native / Mul+Add.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphkit.runtime import native  # noqa: E402

OPSET = 17
IR_VERSION = 10


@dataclass
class Case:
    """One way to compute y = 2a + b: a model (inputs a, b; output y) and session setup."""

    label: str
    build: Callable[[tuple[int, ...]], onnx.ModelProto]
    configure: Callable[[ort.SessionOptions], None] = field(default=lambda so: None)
    runner: Any = None  # a Runner-like class; None: the raw io-bound Runner


def _io(shape: tuple[int, ...]) -> tuple[list, list]:
    dims = list(shape)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in ("a", "b")]
    return inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)]


def native_model(shape: tuple[int, ...]) -> onnx.ModelProto:
    inputs, outputs = _io(shape)
    node = helper.make_node("my_add", ["a", "b"], ["y"], domain="graphkit.native", name="my_add0")
    graph = helper.make_graph([node], "native_my_add", inputs, outputs)
    return helper.make_model(graph, ir_version=IR_VERSION,
                             opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("graphkit.native", 1)])


def mul_add_model(shape: tuple[int, ...]) -> onnx.ModelProto:
    inputs, outputs = _io(shape)
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    nodes = [helper.make_node("Mul", ["a", "two"], ["a2"], name="mul0"),
             helper.make_node("Add", ["a2", "b"], ["y"], name="add0")]
    graph = helper.make_graph(nodes, "mul_add", inputs, outputs, initializer=[two])
    return helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", OPSET)])


def _register_native(so: ort.SessionOptions) -> None:
    so.register_custom_ops_library(str(native.library_path()))


BASELINE = Case("Mul+Add", mul_add_model)
NATIVE = Case("native", native_model, _register_native)


def python_model(shape: tuple[int, ...]) -> onnx.ModelProto:
    model = native_model(shape)
    model.graph.node[0].domain = "graphkit.python"
    model.opset_import[1].domain = "graphkit.python"
    return model


class GraphkitRunner:
    """A graphkit Session (Python kernels registered by graphkit); call() runs it once.

    Goes through Session.run (feeds dict, fresh outputs), a few microseconds more per
    call than the io-bound raw sessions of the other cases.
    """

    def __init__(self, case: "Case", shape: tuple[int, ...], threads: int, workdir: Path,
                 a: np.ndarray, b: np.ndarray) -> None:
        from graphkit.runtime import open_session

        path = workdir / f"python_{'x'.join(map(str, shape))}.onnx"
        onnx.save(case.build(shape), path)
        self.session = open_session(path, threads=threads)
        self.feeds = {"a": a, "b": b}
        self.y = np.empty(shape, np.float32)

    def __call__(self) -> None:
        self.y = self.session.run(self.feeds)["y"]


def extra_cases() -> list[Case]:
    """More paths, each timed and compared with Mul+Add like the native case."""
    return [Case("python", python_model, runner=GraphkitRunner)]


class Runner:
    """A session with inputs and output bound once; call() runs it once."""

    def __init__(self, case: Case, shape: tuple[int, ...], threads: int, workdir: Path,
                 a: np.ndarray, b: np.ndarray) -> None:
        path = workdir / f"{case.label.replace('+', '_').replace(' ', '_')}_{'x'.join(map(str, shape))}.onnx"
        onnx.save(case.build(shape), path)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        case.configure(so)
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.y = np.empty(shape, np.float32)
        self.binding = self.session.io_binding()
        self.binding.bind_cpu_input("a", a)
        self.binding.bind_cpu_input("b", b)
        self.binding.bind_output("y", "cpu", 0, np.float32, list(shape), self.y.ctypes.data)

    def __call__(self) -> None:
        self.session.run_with_iobinding(self.binding)


def measure(runners: dict[str, Runner], seconds: float) -> dict[str, float]:
    """Median latency (us) per runner, interleaving runners in rounds."""
    for r in runners.values():  # warm-up (thread pool, arena, caches)
        for _ in range(20):
            r()
    t0 = time.perf_counter()
    for r in runners.values():
        r()
    once = max((time.perf_counter() - t0) / len(runners), 1e-6)
    rounds = 20
    per_round = max(5, int(seconds / len(runners) / rounds / once))
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(rounds):
        for k, r in runners.items():
            for _ in range(per_round):
                t = time.perf_counter_ns()
                r()
                times[k].append((time.perf_counter_ns() - t) / 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x16x128x128,1x64x256x256")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--seconds", type=float, default=1.5, help="time budget per shape and thread count")
    args = ap.parse_args(argv)
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    cases = [NATIVE, *extra_cases()]

    load = ", load average %.2f %.2f %.2f" % os.getloadavg() if hasattr(os, "getloadavg") else ""
    print(f"onnxruntime {ort.__version__}, {os.cpu_count()} CPUs{load}, library {native.library_path()}")
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="graphkit-bench-") as tmp:
        for shape in shapes:
            a = rng.standard_normal(shape, dtype=np.float32)
            b = rng.standard_normal(shape, dtype=np.float32)
            for t in threads:
                runners = {c.label: (c.runner or Runner)(c, shape, t, Path(tmp), a, b) for c in (BASELINE, *cases)}
                expected = 2 * a + b
                for label, r in runners.items():  # every path must compute the same thing
                    r()
                    np.testing.assert_allclose(r.y, expected, rtol=1e-6, atol=1e-6, err_msg=label)
                med = measure(runners, args.seconds)
                rows.append((shape, t, med))

    labels = [c.label for c in cases]
    head = f"{'shape':>14} {'threads':>7} {BASELINE.label + ' us':>12}"
    for label in labels:
        head += f" {label + ' us':>12} {label + '/Mul+Add':>16}"
    print(head)
    print("-" * len(head))
    for shape, t, med in rows:
        base = med[BASELINE.label]
        line = f"{'x'.join(map(str, shape)):>14} {t:>7} {base:>12.1f}"
        for label in labels:
            line += f" {med[label]:>12.1f} {med[label] / base:>16.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
