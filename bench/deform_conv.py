"""Benchmark: deform_conv2d's native kernel vs ONNX Runtime's DeformConv-19 on the layers of
a DCN ResNet-50, and the whole model per lowering.

Run:  python bench/deform_conv.py [--seconds 1.5] [--batches 1,8] [--stages 64x56,128x28s2]
      python bench/deform_conv.py --model [--spin] [--size 224] [--seconds 10]

Layer table (default): every 3x3 deformable convolution shape of a ResNet-50's stages
(C_in = C_out = 64@56, 128@28, 256@14, 512@7; ``s2``: the first block of a stage, stride 2
from twice the size), batch 1 and 8, with and without mask, offset_groups 1 and 4. Each
row builds one ``custom::deform_conv2d`` model and lowers it twice with
``graphkit.rewrite_model``: ``--bind native`` and the ``onnx_deform_conv`` decomposition
(opset 19: ORT's own DeformConv kernel); each runs in a session with 1 and one with 2
intra-op threads. The four sessions run interleaved in rounds in one process (the machine
is shared: drift hits every contender alike), with ORT's spin-waiting off
(``session.intra_op.allow_spinning=0``) so an idle session never steals a core. Printed:
median ms, native / DeformConv-19 (<= 1: native at least as fast) and the 2-thread speedup
(1-thread ms / 2-thread ms); at the end, the rows (and thread counts) where native was slower
than DeformConv-19 and the rows where 2 threads were not faster than 1 for native.

``--model``: the DCN ResNet-50 of ``samples/dcn_resnet.py`` (DCNv2 in the last two stages,
random weights), exported once and lowered every way (native, python, DeformConv-19,
grid_sample, gather); per thread count (1, 2) the five sessions run interleaved; median ms,
the 2-thread speedup and each lowering's time / native's.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads its OpenMP runtime

import graphkit  # noqa: E402
from graphkit.rewrite import Lowering  # noqa: E402
from graphkit.runtime import native  # noqa: E402

STAGES = "64x56,128x28,128x28s2,256x14,256x14s2,512x7,512x7s2"


def placeholder(channels: int, size: int, stride: int, batch: int, mask: bool, offset_groups: int,
                opset: int, seed: int = 0) -> tuple[onnx.ModelProto, dict]:
    """custom::deform_conv2d(input, weight, offset, bias, [mask]), 3x3, padding 1, output
    ``size`` x ``size`` (input ``size * stride``); weight and bias are initializers."""
    rng = np.random.default_rng(seed)
    c, og, h = channels, offset_groups, size * stride
    feeds = {"input": rng.standard_normal((batch, c, h, h)).astype(np.float32),
             "offset": (rng.standard_normal((batch, 2 * og * 9, size, size)) * 2).astype(np.float32)}
    if mask:
        feeds["mask"] = rng.random((batch, og * 9, size, size)).astype(np.float32)
    weight = (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    names = ["input", "weight", "offset", "bias"] + (["mask"] if mask else [])
    node = helper.make_node("deform_conv2d", names, ["output"], domain="custom", name="dcn", padding=[1, 1],
                            stride=[stride, stride], offset_groups=og)
    inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in feeds.items()]
    graph = helper.make_graph([node], "dcn", inputs, [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(weight, "weight"),
                                           numpy_helper.from_array(bias, "bias")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", opset),
                                                                   helper.make_opsetid("custom", 1)])
    return model, feeds


def session(model: onnx.ModelProto, threads: int, lowering: Lowering, **rewrite) -> ort.InferenceSession:
    lowered, _ = graphkit.rewrite_model(model, lowering=lowering, **rewrite)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if lowering is Lowering.NATIVE:
        so.register_custom_ops_library(str(native.library_path()))
    return ort.InferenceSession(lowered.SerializeToString(), so, providers=["CPUExecutionProvider"])


def runner(sess: ort.InferenceSession, feeds: dict) -> Callable[[], np.ndarray]:
    names = {i.name for i in sess.get_inputs()}
    bound = {k: v for k, v in feeds.items() if k in names}
    return lambda: sess.run(None, bound)[0]


def interleaved(runners: dict[str, Callable[[], object]], seconds: float, min_rounds: int = 5,
                cpu: dict[str, float] | None = None, settle: bool = False) -> dict[str, float]:
    """Median ms of each runner, run once per round in turn until ``seconds`` have passed.
    ``cpu``, when given, receives each runner's median CPU time of this thread (ms): all of
    a 1-thread session's work, and unlike wall time not stretched by other processes.
    ``settle``: an untimed run before each timed one, so the previous session's spinning
    worker threads have gone to sleep before the clock starts."""
    times: dict[str, list[float]] = {k: [] for k in runners}
    cpu_times: dict[str, list[float]] = {k: [] for k in runners}
    deadline = time.perf_counter() + seconds
    rounds = 0
    while time.perf_counter() < deadline or rounds < min_rounds:
        for label, run in runners.items():
            if settle:
                run()
            c0, t0 = time.thread_time(), time.perf_counter()
            run()
            times[label].append(time.perf_counter() - t0)
            cpu_times[label].append(time.thread_time() - c0)
        rounds += 1
    if cpu is not None:
        cpu.update({k: statistics.median(v) * 1e3 for k, v in cpu_times.items()})
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def parse_stage(item: str) -> tuple[int, int, int]:
    """'128x28s2' -> (128, 28, 2): channels, output size, stride."""
    shape, _, stride = item.partition("s")
    channels, size = (int(v) for v in shape.split("x"))
    return channels, size, int(stride or 1)


def layer_row(channels: int, size: int, stride: int, batch: int, mask: bool, og: int, seconds: float) -> dict:
    runners = {}
    expected = None
    for label, opset, lowering in (("native", 17, Lowering.NATIVE), ("ort", 19, Lowering.DECOMPOSE)):
        model, feeds = placeholder(channels, size, stride, batch, mask, og, opset)
        for threads in (1, 2):
            run = runner(session(model, threads, lowering), feeds)
            got = run()  # warm-up, and the contenders must agree
            if expected is None:
                expected = got
            err = float(np.abs(got - expected).max())
            if err > 1e-3:
                raise SystemExit(f"{label} ({threads} threads) disagrees with native: max abs err {err:.3g}")
            runners[f"{label}{threads}"] = run
    cpu: dict[str, float] = {}
    ms = interleaved(runners, seconds, cpu=cpu)
    ms["cpu_ratio"] = cpu["native1"] / cpu["ort1"]
    return ms


def layer_table(args: argparse.Namespace) -> int:
    stages = [parse_stage(s) for s in args.stages.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    masks = {"both": (False, True), "yes": (True,), "no": (False,)}[args.mask]
    ogs = [int(v) for v in args.offset_groups.split(",")]
    print("median ms per run, interleaved rounds; nat/ORT = native ms / DeformConv-19 ms (<= 1: native at "
          "least as fast); 2t/1t = 1-thread ms / 2-thread ms; cpu 1t = the same ratio of 1-thread CPU time "
          "(immune to other processes taking the cores)")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("| N | C | out | stride | mask | og | native 1t | ORT 1t | nat/ORT 1t | cpu 1t | native 2t | ORT 2t "
          "| nat/ORT 2t | native 2t/1t | ORT 2t/1t |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    slower: list[str] = []  # rows where native took longer than DeformConv-19
    no_gain: list[str] = []  # rows where 2 threads were not faster than 1 (native)
    for batch in batches:
        for channels, size, stride in stages:
            for mask in masks:
                for og in ogs:
                    ms = layer_row(channels, size, stride, batch, mask, og, args.seconds)
                    r1, r2 = ms["native1"] / ms["ort1"], ms["native2"] / ms["ort2"]
                    worst = max(worst, r1, r2)
                    row = f"N={batch} {channels}@{size} s{stride} mask={'yes' if mask else 'no'} og={og}"
                    slower += [f"{row} {t}t {r:.2f}" for t, r in ((1, r1), (2, r2)) if r > 1.0]
                    if ms["native2"] >= ms["native1"]:
                        no_gain.append(f"{row} {ms['native1'] / ms['native2']:.2f}")
                    print(f"| {batch} | {channels} | {size}x{size} | {stride} | {'yes' if mask else 'no'} | {og} "
                          f"| {ms['native1']:.2f} | {ms['ort1']:.2f} | {r1:.2f} | {ms['cpu_ratio']:.2f} "
                          f"| {ms['native2']:.2f} "
                          f"| {ms['ort2']:.2f} | {r2:.2f} | {ms['native1'] / ms['native2']:.2f} "
                          f"| {ms['ort1'] / ms['ort2']:.2f} |", flush=True)
    print(f"worst native/DeformConv-19: {worst:.2f}")
    print(f"rows where native > DeformConv-19 (wall clock, 1 or 2 threads): {len(slower)}"
          + (": " + "; ".join(slower) if slower else ""))
    print(f"rows where 2 threads is not faster than 1 (native): {len(no_gain)}"
          + (": " + "; ".join(no_gain) if no_gain else ""))
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


def model_table(args: argparse.Namespace) -> int:
    import tempfile

    import torch

    sys.path.insert(0, str(ROOT / "samples"))
    from dcn_resnet import dcn_resnet50, lower_all

    torch.manual_seed(0)
    net = dcn_resnet50(width=args.width).eval()
    x = torch.rand(1, 3, args.size, args.size)
    with torch.no_grad():
        want = net(x).numpy()
    feeds = {"image": x.numpy()}
    paths = lower_all(net, x, Path(tempfile.mkdtemp(prefix="graphkit-bench-dcn-")))
    print(f"DCN ResNet-50 (width {args.width}), 1x3x{args.size}x{args.size}, median ms, lowerings interleaved; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; spinning {'on' if args.spin else 'off'}")
    results: dict[int, dict[str, float]] = {}
    cpu: dict[str, float] = {}
    for threads in (1, 2):
        runners = {}
        for label, path in paths.items():
            so = ort.SessionOptions()
            if not args.spin:
                so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            sess = graphkit.open_session(path, threads=threads, options=so)
            run = (lambda s: lambda: next(iter(s.run(feeds).values())))(sess)
            err = float(np.abs(run() - want).max())
            if err > 1e-4 * max(1.0, float(np.abs(want).max())):
                raise SystemExit(f"{label} disagrees with torch eager: max abs err {err:.3g}")
            runners[label] = run
        results[threads] = interleaved(runners, args.seconds, min_rounds=3, cpu=cpu if threads == 1 else None,
                                       settle=args.spin)
    print("| lowering | 1 thread ms | 2 threads ms | 2t/1t speedup | / native (1t) | / native (1t, cpu) "
          "| / native (2t) |")
    print("|---|---|---|---|---|---|---|")
    for label in paths:
        a, b = results[1][label], results[2][label]
        print(f"| {label} | {a:.1f} | {b:.1f} | {a / b:.2f} | {a / results[1]['native']:.2f} "
              f"| {cpu[label] / cpu['native']:.2f} | {b / results[2]['native']:.2f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=None,
                        help="time budget per row (default 1.5) or per thread count with --model (default 10)")
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--stages", default=STAGES,
                        help=f"CHANNELSxSIZE[sSTRIDE] list (output size; input size * stride); default {STAGES}")
    parser.add_argument("--mask", choices=("both", "yes", "no"), default="both", help="DCNv2 (mask), DCNv1 or both")
    parser.add_argument("--offset-groups", default="1,4", help="comma-separated offset_groups values")
    parser.add_argument("--model", action="store_true", help="whole DCN ResNet-50 latency per lowering instead")
    parser.add_argument("--spin", action="store_true",
                        help="--model: keep ONNX Runtime's default thread spinning (what a deployment runs with; "
                             "off by default so interleaved idle sessions do not steal a core on a shared machine, "
                             "which also hides most of the second thread's gain); each timed run follows an untimed one")
    parser.add_argument("--size", type=int, default=224, help="--model: input height and width")
    parser.add_argument("--width", type=int, default=64, help="--model: width of the first stage (64: ResNet-50)")
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = 10.0 if args.model else 1.5
    return model_table(args) if args.model else layer_table(args)


if __name__ == "__main__":
    sys.exit(main())
