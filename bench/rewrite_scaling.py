"""How `graphkit rewrite` scales with the graph, on the shapes users have.

    python bench/rewrite_scaling.py                     # 10k and 100k nodes, every shape
    python bench/rewrite_scaling.py --sizes 10000 100000 1000000 --shapes unnamed fanout

For each shape and size it writes a model, then times, in the same run:
- the floor: a Python process that only does onnx.load + onnx.save of that file;
- `graphkit rewrite` (load, rewrite, check, save) as a whole process, with its peak RSS;
- in this process, `rewrite_bytes` with each writer: "objects" (parse, rewrite_model's
  passes, serialize) and "bytes" (the wire-level writer where its preconditions hold,
  else the objects writer: the CLI's choice).
Processes are timed by CPU seconds (user + system, from wait4) as well as wall seconds:
on a shared machine the CPU time is what the work costs; the ratios use it. It prints
CPU microseconds per node, the growth factor per 10x nodes (1.0 = linear), and the CLI's
ratio to the floor (CPU, wall, peak memory). Goal: growth <= 1.1 everywhere; CLI within
3x of the floor at 100k and 1M nodes. `nodes` counts every node, subgraphs and functions
included.
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

OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)]


def _vi(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])


def _model(nodes, outputs, functions=()) -> onnx.ModelProto:
    return helper.make_model(helper.make_graph(nodes, "g", [_vi("x")], [_vi(o) for o in outputs]),
                             opset_imports=[*OPSETS, helper.make_opsetid("local", 1)], ir_version=10,
                             functions=list(functions))


def chain(nodes_total: int, named: bool) -> onnx.ModelProto:
    nodes, prev = [], "x"
    for i in range(nodes_total // 2):
        nodes += [helper.make_node("my_add", [prev, prev], [f"a{i}"], domain="custom", name=f"m{i}" if named else ""),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"r{i}" if named else "")]
        prev = f"r{i}"
    return _model(nodes, [prev])


def fanout(nodes_total: int) -> onnx.ModelProto:
    n = nodes_total - 1
    nodes = [helper.make_node("my_add", ["x", "x"], [f"y{i}"], domain="custom") for i in range(n)]
    nodes.append(helper.make_node("Sum", [f"y{i}" for i in range(n)], ["s"]))
    return _model(nodes, ["s"])


def multi_output(nodes_total: int) -> onnx.ModelProto:
    """my_add -> Split (2 outputs) -> Concat, repeated."""
    nodes, prev = [], "x"
    for i in range(nodes_total // 3):
        nodes += [helper.make_node("my_add", [prev, prev], [f"a{i}"], domain="custom"),
                  helper.make_node("Split", [f"a{i}"], [f"s{i}a", f"s{i}b"], axis=1, num_outputs=2),
                  helper.make_node("Concat", [f"s{i}b", f"s{i}a"], [f"c{i}"], axis=1)]
        prev = f"c{i}"
    model = _model(nodes, [prev])
    model.opset_import[0].version = 18  # Split's num_outputs
    return model


def if_bodies(nodes_total: int) -> onnx.ModelProto:
    """Chained If nodes, each branch one my_add (3 nodes per If)."""
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))
    nodes, prev = [cond], "x"
    for i in range(nodes_total // 3):
        def body(tag: str) -> onnx.GraphProto:
            return helper.make_graph([helper.make_node("my_add", [prev, prev], [f"{tag}{i}"], domain="custom")],
                                     f"{tag}{i}", [], [_vi(f"{tag}{i}")])
        nodes.append(helper.make_node("If", ["c"], [f"o{i}"], then_branch=body("t"), else_branch=body("e")))
        prev = f"o{i}"
    return _model(nodes, [prev])


def functions(nodes_total: int) -> onnx.ModelProto:
    """Up to 5000 local functions (each a my_add), called in a chain by the rest."""
    count = max(1, min(5000, nodes_total // 20))
    fns = [helper.make_function("local", f"f{k}", ["a"], ["b"],
                                [helper.make_node("my_add", ["a", "a"], ["b"], domain="custom")], OPSETS)
           for k in range(count)]
    nodes, prev = [], "x"
    for i in range(nodes_total - count):
        nodes.append(helper.make_node(f"f{i % count}", [prev], [f"o{i}"], domain="local"))
        prev = f"o{i}"
    return _model(nodes, [prev], fns)


SHAPES = {
    "named": lambda n: chain(n, True),
    "unnamed": lambda n: chain(n, False),
    "fanout": fanout,
    "multi_output": multi_output,
    "if_bodies": if_bodies,
    "functions": functions,
}
FLOOR = "import onnx, sys; onnx.save(onnx.load(sys.argv[1]), sys.argv[2])"


def _process(argv: list[str]) -> tuple[float, float, int]:
    """CPU seconds, wall seconds and peak RSS (KiB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(argv)}: {proc.stderr.read().decode()[-500:]}")
    return usage.ru_utime + usage.ru_stime, seconds, usage.ru_maxrss


def _best(fn, repeat: int):
    results = [fn() for _ in range(repeat)]
    return min(results, key=lambda r: r[0] if isinstance(r, tuple) else r)


def _all_nodes(model: onnx.ModelProto) -> int:
    from graphkit.rewrite._walk import count_ops

    return sum(count_ops(model).values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    ap.add_argument("--flags", default="", help="extra `graphkit rewrite` flags, e.g. '--bind native'")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--writers", nargs="*", choices=("objects", "bytes"), default=["objects", "bytes"],
                    help="in-process writers to time (none: the processes only)")
    args = ap.parse_args()
    from graphkit.ops import default_registry
    from graphkit.rewrite import Lowering, rewrite_bytes

    lowering = {"--bind native": Lowering.NATIVE, "--bind python": Lowering.PYTHON}.get(args.flags.strip(),
                                                                                      Lowering.DECOMPOSE)
    registry = default_registry()
    print(f"{'shape':13} {'nodes':>8} {'floor cpu':>9} {'cli cpu':>8} {'cli/floor':>9} {'wall ratio':>10} "
          f"{'rss/floor':>9} {'cli us/node':>11} {'growth':>6} {'objects s':>9} {'bytes s':>8} {'writer':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            previous = None
            for size in args.sizes:
                src, out = Path(tmp) / f"{shape}{size}.onnx", Path(tmp) / "out.onnx"
                model = SHAPES[shape](size)
                onnx.save(model, src)
                nodes = _all_nodes(model)
                del model
                floor, floor_wall, floor_rss = _best(
                    lambda: _process([sys.executable, "-c", FLOOR, str(src), str(out)]), args.repeat)
                cli, cli_wall, cli_rss = _best(lambda: _process([sys.executable, "-m", "graphkit", "rewrite", str(src),
                                                                 str(out), *args.flags.split()]), args.repeat)
                data = src.read_bytes()
                timed = {}
                writer = ""
                for name in args.writers:
                    def api() -> float:
                        nonlocal writer
                        start = time.process_time()
                        _, report = rewrite_bytes(data, registry=registry, lowering=lowering, fast=name == "bytes")
                        writer = report.writer if name == "bytes" else writer
                        return time.process_time() - start

                    timed[name] = _best(api, args.repeat)
                growth = ""
                if previous is not None:
                    growth = f"{(cli / previous[1]) / (nodes / previous[0]):.2f}"
                print(f"{shape:13} {nodes:>8} {floor:>9.2f} {cli:>8.2f} {cli / floor:>9.2f} "
                      f"{cli_wall / floor_wall:>10.2f} {cli_rss / floor_rss:>9.2f} {cli / nodes * 1e6:>11.2f} "
                      f"{growth:>6} {timed.get('objects', float('nan')):>9.2f} {timed.get('bytes', float('nan')):>8.2f} "
                      f"{writer:>7}", flush=True)
                previous = (nodes, cli)


if __name__ == "__main__":
    main()
