"""How graphkit.rewrite.graph.walk's walk() scales, against the least a walk can do.

    python bench/walk.py                      # 10k and 100k nodes, every shape
    python bench/walk.py --sizes 100000 1000000 --shapes if_bodies deep

For each shape and size, in the same run (CPU seconds, best of --repeat):
- the floor: one pass with a plain stack of graphs, reading each node's attributes to find
  the graphs it holds (what any walk must read), yielding nothing;
- walk(model): every graph as (ENTER, Visit), the Visit made for each;
- walk(model, exits=True, nodes=True): an event per node too (what runtime/session.py uses);
- ModelIndex(model): the index the rewrite builds (op counts, names), through walk().
It prints each one's ratio to the floor and its growth from one size to the next, time over nodes (1.0 = linear).
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the shapes tests/test_scaling.py grows

import scaling_models as shapes  # noqa: E402

from graphkit.rewrite.graph.walk import ModelIndex, walk  # noqa: E402


def _deep(n: int) -> onnx.ModelProto:
    """Loop bodies nested n // 4 levels deep, each with three Add nodes and the next Loop."""
    model = onnx.helper.make_model(onnx.helper.make_graph([], "main", [], []), ir_version=9,
                                   opset_imports=[onnx.helper.make_opsetid("", 17)])
    g = model.graph
    for level in range(max(n // 4, 1)):
        for k in range(3):
            g.node.append(onnx.helper.make_node("Add", ["x", "x"], [f"a{level}_{k}"]))
        loop = g.node.add(op_type="Loop", input=["", "c"], output=[f"l{level}"])
        attr = loop.attribute.add(name="body", type=onnx.AttributeProto.GRAPH)
        g = attr.g
    return model


SHAPES = {
    "chain": lambda n: shapes.chain(n // 2),
    "if_bodies": lambda n: shapes.if_bodies(n // 3),
    "loop_bodies": lambda n: shapes.loop_bodies(n // 3),
    "functions": lambda n: shapes.functions(n, 100),
    "deep": _deep,
}
_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def floor(model: onnx.ModelProto) -> None:
    stack = [model.graph.node, *(fn.node for fn in model.functions)]
    while stack:
        for node in stack.pop():
            if node.attribute:
                for attr in node.attribute:
                    if attr.type == _GRAPH:
                        stack.append(attr.g.node)
                    elif attr.type == _GRAPHS:
                        stack.extend(g.node for g in attr.graphs)


_drain = collections.deque(maxlen=0).extend
CONTENDERS = {
    "floor": floor,
    "walk": lambda m: _drain(walk(m)),
    "walk+nodes": lambda m: _drain(walk(m, exits=True, nodes=True)),
    "ModelIndex": ModelIndex,
}


def best(fn, model: onnx.ModelProto, repeat: int) -> float:
    out = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        fn(model)
        out = min(out, time.process_time() - start)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    names = [c for c in CONTENDERS if c != "floor"]
    print(f"{'shape':12} {'nodes':>8} {'floor ms':>9} " + " ".join(f"{n + '/floor':>17}" for n in names)
          + " " + " ".join(f"{n + ' growth':>17}" for n in names))
    for shape in args.shapes:
        before: dict[str, float] = {}
        prev = 0
        for size in sorted(args.sizes):
            model = SHAPES[shape](size)
            timed = {name: best(fn, model, args.repeat) for name, fn in CONTENDERS.items()}
            ratios = " ".join(f"{timed[n] / timed['floor']:>17.2f}" for n in names)
            growth = " ".join(f"{timed[n] / before[n] / (size / prev):>17.2f}" for n in names) if before else ""
            print(f"{shape:12} {size:>8} {timed['floor'] * 1e3:>9.1f} {ratios} {growth}", flush=True)
            before, prev = timed, size


if __name__ == "__main__":
    main()
