"""Rewrite speed: 100k nodes (50k custom::my_add interleaved with Relu) decomposed end to end.

Prints each contender's wall time (median of --repeat runs, each a fresh process) and its
ratio to the floor, a process that only does onnx.load + onnx.save of the same file.
"graphkit, objects writer only" is the rewrite with the byte writer turned off: what the
wire-level writer (graphkit/rewrite/bytes/main_graph.py) saves.

    python bench/rewrite_100k.py [--pairs 50000] [--repeat 3] [--skip-slow]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
from onnx import TensorProto, helper

CONTENDERS = Path(__file__).resolve().parent / "contenders"


def make_model(path: Path, pairs: int) -> None:
    nodes, prev = [], "x"
    for i in range(pairs):
        nodes.append(helper.make_node("my_add", [prev, "x"], [f"a{i}"], domain="custom", name=f"add{i}"))
        nodes.append(helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    onnx.save(model, path)


def timed(argv: list[str], repeat: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds (user + system, from wait4) of ``repeat`` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        walls.append(time.perf_counter() - start)
        cpus.append(usage.ru_utime + usage.ru_stime)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{argv[:3]} failed:\n{proc.stderr.read().decode()[-2000:]}")
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-slow", action="store_true", help="skip graphsurgeon and onnxscript")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "chain.onnx"
        make_model(src, args.pairs)
        py = sys.executable
        contenders = {
            "floor (onnx.load + onnx.save)": [py, str(CONTENDERS / "floor.py"), str(src), f"{tmp}/floor.onnx"],
            "graphkit rewrite": [py, "-m", "graphkit", "rewrite", str(src), f"{tmp}/gk.onnx"],
            "graphkit rewrite --no-check": [py, "-m", "graphkit", "rewrite", str(src), f"{tmp}/gk2.onnx",
                                            "--no-check"],
            "graphkit, objects writer only": [py, str(CONTENDERS / "objects_writer.py"), str(src), f"{tmp}/gk3.onnx"],
        }
        if not args.skip_slow:
            contenders["onnx-graphsurgeon loop"] = [py, str(CONTENDERS / "graphsurgeon_loop.py"), str(src),
                                                    f"{tmp}/gs.onnx"]
            contenders["onnxscript pattern rewriter"] = [py, str(CONTENDERS / "onnxscript_rewriter.py"), str(src),
                                                         f"{tmp}/os.onnx"]
        slow = ("onnx-graphsurgeon loop", "onnxscript pattern rewriter")
        results = {name: timed(argv, 1 if name in slow else args.repeat) for name, argv in contenders.items()}
        floor = results["floor (onnx.load + onnx.save)"]
        gk = results["graphkit rewrite"]
        print(f"{2 * args.pairs} nodes ({args.pairs} custom::my_add), {src.stat().st_size / 1e6:.1f} MB; "
              "ratios of CPU seconds (user + system; a shared machine's wall time is mostly waiting)")
        print(f"{'contender':<32} {'wall s':>7} {'cpu s':>7} {'x floor':>8} {'graphkit faster by':>19}")
        for name, (wall, cpu) in results.items():
            print(f"{name:<32} {wall:>7.2f} {cpu:>7.2f} {cpu / floor[1]:>8.2f} {cpu / gk[1]:>18.1f}x")


if __name__ == "__main__":
    main()
