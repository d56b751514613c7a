"""Benchmark: deform_conv2d's native kernel vs ONNX Runtime's DeformConv-19, the decomposed
graphs and the torch reference, on realistic layers (N=1, 3x3, stride 1, padding 1).

Run:  python bench/deform_conv.py [--seconds 2] [--threads 1,2] [--layers 64x56,128x28] [--no-mask] [--warm]

Every ONNX contender is the same ``custom::deform_conv2d`` model lowered by
``graphkit.rewrite_model``: ``--bind native``, the ``onnx_deform_conv`` decomposition
(opset 19: ORT's own DeformConv kernel) and the sampling decompositions ``grid_sample``
(opset 16) and ``gather`` (opset 13). Each session gets ``intra_op_num_threads`` = the
thread count; the torch reference runs with ``torch.set_num_threads`` likewise. ONNX
Runtime runs are interleaved in rounds so that drift (the machine is shared) hits every
contender alike (the torch reference, whose temporaries flush the caches, runs after them),
with ORT's spin-waiting worker threads off (``session.intra_op.allow_spinning=0``) and
OpenMP threads passive, so an idle session's threads never steal the cores of the one
running; the table shows median milliseconds and each contender's time / native's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads its OpenMP runtime

import graphkit  # noqa: E402
from graphkit.rewrite import Lowering  # noqa: E402
from graphkit.runtime import native  # noqa: E402

CONTENDERS = ("native", "DeformConv-19", "grid_sample", "gather", "torch ref")


def placeholder(channels: int, size: int, mask: bool, opset: int, seed: int = 0) -> tuple[onnx.ModelProto, dict]:
    """custom::deform_conv2d(input, weight, offset, bias, [mask]), 3x3, padding 1; weight and
    bias are initializers."""
    rng = np.random.default_rng(seed)
    c = channels
    feeds = {"input": rng.standard_normal((1, c, size, size)).astype(np.float32),
             "offset": (rng.standard_normal((1, 18, size, size)) * 2).astype(np.float32)}
    if mask:
        feeds["mask"] = rng.random((1, 9, size, size)).astype(np.float32)
    weight = (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    names = ["input", "weight", "offset", "bias"] + (["mask"] if mask else [])
    node = helper.make_node("deform_conv2d", names, ["output"], domain="custom", name="dcn", padding=[1, 1])
    inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in feeds.items()]
    graph = helper.make_graph([node], "dcn", inputs, [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(weight, "weight"),
                                           numpy_helper.from_array(bias, "bias")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", opset),
                                                                   helper.make_opsetid("custom", 1)])
    return model, {**feeds, "weight": weight, "bias": bias}


def ort_runner(model: onnx.ModelProto, feeds: dict, threads: int, lowering: Lowering) -> Callable[[], np.ndarray]:
    lowered, _ = graphkit.rewrite_model(model, lowering=lowering)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if lowering is Lowering.NATIVE:
        so.register_custom_ops_library(str(native.library_path()))
    sess = ort.InferenceSession(lowered.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    bound = {k: v for k, v in feeds.items() if k in names}
    return lambda: sess.run(None, bound)[0]


def torch_runner(feeds: dict, threads: int) -> Callable[[], np.ndarray]:
    import torch

    from graphkit_ops.deform_conv2d import reference

    args = [torch.from_numpy(feeds[k]) if k in feeds else None for k in ("input", "weight", "offset", "bias", "mask")]

    def run() -> np.ndarray:
        torch.set_num_threads(threads)
        with torch.no_grad():
            return reference(*args, padding=[1, 1]).numpy()

    return run


def bench_layer(channels: int, size: int, mask: bool, threads: int, seconds: float,
                warm: bool = False) -> dict[str, float]:
    runners = {}
    for label, opset, lowering in (("native", 17, Lowering.NATIVE), ("DeformConv-19", 19, Lowering.DECOMPOSE),
                                   ("grid_sample", 16, Lowering.DECOMPOSE), ("gather", 13, Lowering.DECOMPOSE)):
        model, feeds = placeholder(channels, size, mask, opset)
        runners[label] = ort_runner(model, feeds, threads, lowering)
    runners["torch ref"] = torch_runner(feeds, threads)
    expected = runners["torch ref"]()
    for label, run in runners.items():  # warm up and check agreement first
        err = float(np.abs(run() - expected).max())
        if err > 1e-4:
            raise SystemExit(f"{label} disagrees with the torch reference: max abs err {err:.3g}")
    # ONNX Runtime contenders interleaved; the torch reference (whose temporaries flush the
    # caches) in a block of its own afterwards.
    times: dict[str, list[float]] = {k: [] for k in runners}
    ort_labels = [k for k in runners if k != "torch ref"]
    if warm:  # each contender in a block of its own: caches stay warm between its runs
        rounds = [[k] for k in ort_labels] + [["torch ref"]]
        budgets = [seconds * 0.8 / len(ort_labels)] * len(ort_labels) + [seconds * 0.2]
    else:
        rounds, budgets = [ort_labels, ["torch ref"]], [seconds * 0.8, seconds * 0.2]
    for labels, budget in zip(rounds, budgets):
        deadline = time.perf_counter() + budget
        while time.perf_counter() < deadline or min(len(times[k]) for k in labels) < 5:
            for label in labels:  # one round: every contender once
                t0 = time.perf_counter()
                runners[label]()
                times[label].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time budget per layer and thread count")
    parser.add_argument("--threads", default="1,2", help="comma-separated intra-op thread counts, e.g. 1,2")
    parser.add_argument("--layers", default="64x56,128x28",
                        help="CHANNELSxSIZE list: channels in = out, square input; e.g. 64x56,128x28")
    parser.add_argument("--no-mask", action="store_true", help="only DCNv1 (no mask) layers")
    parser.add_argument("--mask-only", action="store_true", help="only DCNv2 (masked) layers")
    parser.add_argument("--warm", action="store_true",
                        help="time each contender in its own block (caches warm) instead of interleaved "
                             "rounds (each run starts with what the others left in the caches)")
    args = parser.parse_args(argv)
    layers = [tuple(int(v) for v in item.split("x")) for item in args.layers.split(",")]
    masks = [False] if args.no_mask else [True] if args.mask_only else [False, True]
    threads = [int(t) for t in args.threads.split(",")]
    header = (f"{'layer':<22} {'thr':>3} " + " ".join(f"{c:>13}" for c in CONTENDERS)
              + "   " + " ".join(f"{c + '/nat':>17}" for c in CONTENDERS[1:]))
    print(f"median ms per run ({'warm: one contender at a time' if args.warm else 'interleaved rounds'}); "
          "x/nat = contender time / native time (higher: native faster)")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (more threads than idle cores "
          "measure the other processes)")
    print(header)
    for channels, size in layers:
        for mask in masks:
            for t in threads:
                ms = bench_layer(channels, size, mask, t, args.seconds, warm=args.warm)
                name = f"{channels}->{channels} {size}x{size}{' +mask' if mask else ''}"
                print(f"{name:<22} {t:>3} " + " ".join(f"{ms[c]:>13.3f}" for c in CONTENDERS)
                      + "   " + " ".join(f"{ms[c] / ms['native']:>16.2f}x" for c in CONTENDERS[1:]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
