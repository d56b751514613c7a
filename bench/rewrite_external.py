"""Rewriting a model whose weights live in external data, without loading them.

Generates a model with --layers MatMul + custom::my_add blocks whose weights total
--gib GiB in one external file (a sparse file: nothing is written to disk), rewrites it
with `graphkit rewrite` into another directory, and prints wall time and peak RSS of that
process against a process that only imports graphkit's dependencies (the baseline).

    python bench/rewrite_external.py [--gib 2.5] [--layers 40]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
from onnx import TensorProto, helper


def make_model(directory: Path, gib: float, layers: int) -> Path:
    """x -> [MatMul(W_i) -> my_add(., x)] * layers; W_i external, square, float32."""
    n = max(1, int((gib * 2**30 / layers / 4) ** 0.5))
    weights = directory / "weights.bin"
    tensor_bytes = n * n * 4
    with open(weights, "wb") as fh:
        fh.truncate(tensor_bytes * layers)  # sparse: reads as zeros, costs no disk
    inits, nodes, prev = [], [], "x"
    for i in range(layers):
        w = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[n, n], data_location=TensorProto.EXTERNAL)
        for key, value in (("location", "weights.bin"), ("offset", str(i * tensor_bytes)),
                           ("length", str(tensor_bytes))):
            w.external_data.add(key=key, value=value)
        inits.append(w)
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"matmul{i}"))
        nodes.append(helper.make_node("my_add", [f"m{i}", "x"], [f"y{i}"], domain="custom", name=f"add{i}"))
        prev = f"y{i}"
    graph = helper.make_graph(nodes, "external", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, n])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    path = directory / "model.onnx"
    onnx.save(model, path)
    return path


def run_measured(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child process (its own rusage, via wait4)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{argv} failed:\n{proc.stderr.read().decode()[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.5)
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--max-seconds", type=float, help="exit 1 if the rewrite takes longer")
    parser.add_argument("--max-rss-mib", type=float, help="exit 1 if the rewrite's peak RSS is higher")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="graphkit-ext-") as tmp:
        src_dir, out_dir = Path(tmp, "in"), Path(tmp, "out")
        src_dir.mkdir()
        out_dir.mkdir()
        src = make_model(src_dir, args.gib, args.layers)
        size = (src_dir / "weights.bin").stat().st_size
        base_t, base_rss = run_measured([sys.executable, "-c", "import onnx, numpy, graphkit.rewrite"])
        t, rss = run_measured([sys.executable, "-m", "graphkit", "rewrite", str(src), str(out_dir / "model.onnx")])
        linked = os.path.samefile(out_dir / "weights.bin", src_dir / "weights.bin")
    print(f"{args.layers} custom nodes, {size / 2**30:.2f} GiB external weights")
    print(f"{'process':<30} {'seconds':>8} {'peak RSS MiB':>13}")
    print(f"{'imports only (baseline)':<30} {base_t:>8.2f} {base_rss:>13.0f}")
    print(f"{'graphkit rewrite':<30} {t:>8.2f} {rss:>13.0f}")
    print(f"ratio to baseline: time {t / base_t:.2f}x, RSS {rss / base_rss:.2f}x; weights hard-linked: {linked}")
    too_slow = args.max_seconds is not None and t > args.max_seconds
    too_big = args.max_rss_mib is not None and rss > args.max_rss_mib
    return 1 if too_slow or too_big else 0


if __name__ == "__main__":
    sys.exit(main())
