"""How `graphkit rewrite` scales with the graph, on the shapes users have.

    python bench/rewrite_scaling.py                     # 10k and 100k nodes, every shape
    python bench/rewrite_scaling.py --sizes 10000 100000 1000000 --shapes unnamed fanout

For each shape and size it writes a model, then times, in the same run:
- the floor: a Python process that only does onnx.load + onnx.save of that file;
- `graphkit rewrite` (load, rewrite, check, save) as a whole process, with its peak RSS;
- `rewrite_model` in this process (the API, parse and serialization excluded).
It prints time per node, the growth factor per 10x nodes (1.0 = linear), and the CLI's
ratio to the floor (time and peak memory). Goal: growth <= 1.1 everywhere; CLI within 3x
of the floor at 100k and 1M nodes.
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


def _process(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(argv)}: {proc.stderr.read().decode()[-500:]}")
    return seconds, usage.ru_maxrss


def _best(fn, repeat: int):
    results = [fn() for _ in range(repeat)]
    return min(results, key=lambda r: r[0] if isinstance(r, tuple) else r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    ap.add_argument("--flags", default="", help="extra `graphkit rewrite` flags, e.g. '--bind native'")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    from graphkit.rewrite import Lowering, rewrite_model

    lowering = {"--bind native": Lowering.NATIVE, "--bind python": Lowering.PYTHON}.get(args.flags.strip(),
                                                                                      Lowering.DECOMPOSE)
    print(f"{'shape':13} {'nodes':>8} {'floor s':>8} {'cli s':>7} {'cli/floor':>9} {'rss/floor':>9} "
          f"{'cli us/node':>11} {'growth':>6} {'api s':>7} {'api growth':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            previous = None
            for size in args.sizes:
                src, out = Path(tmp) / f"{shape}{size}.onnx", Path(tmp) / "out.onnx"
                model = SHAPES[shape](size)
                onnx.save(model, src)
                nodes = sum(1 for _ in model.graph.node)
                floor, floor_rss = _best(lambda: _process([sys.executable, "-c", FLOOR, str(src), str(out)]),
                                         args.repeat)
                cli, cli_rss = _best(lambda: _process([sys.executable, "-m", "graphkit", "rewrite", str(src),
                                                       str(out), *args.flags.split()]), args.repeat)

                def api() -> float:
                    start = time.perf_counter()
                    rewrite_model(model, lowering=lowering)
                    return time.perf_counter() - start

                api_s = _best(api, args.repeat)
                growth = api_growth = ""
                if previous is not None:
                    scale = size / previous[0]
                    growth = f"{(cli / previous[1]) / scale:.2f}"
                    api_growth = f"{(api_s / previous[2]) / scale:.2f}"
                print(f"{shape:13} {nodes:>8} {floor:>8.2f} {cli:>7.2f} {cli / floor:>9.2f} "
                      f"{cli_rss / floor_rss:>9.2f} {cli / size * 1e6:>11.2f} {growth:>6} {api_s:>7.2f} "
                      f"{api_growth:>10}", flush=True)
                previous = (size, cli, api_s)


if __name__ == "__main__":
    main()
