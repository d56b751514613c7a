"""How `graphkit simplify`'s cost grows with the graph (issue 26: "grows linearly, measured
at n and 8n nodes on the growth-test shapes").

    python bench/simplify_growth.py                 # n = 1000 blocks, every shape
    python bench/simplify_growth.py --n 2000 --shapes exported if_bodies

The shapes are the rewrite's growth-test shapes (tests/scaling_models.py: an unnamed
my_add/Relu chain, one value read by n nodes, n If and Loop bodies, local functions) and
``exported``: n blocks of what a TorchScript export writes and simplify removes (a
Shape -> Gather -> Unsqueeze -> Concat -> Reshape chain with Constant nodes, an Identity,
a duplicate Relu). Each model is simplified in this process (``simplify_model``, no check)
at n and at 8n, the least CPU time of ``--runs`` runs each; ``growth`` is
t(8n) / (8 t(n)): 1.0 is linear, 8.0 quadratic.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the shapes tests/test_scaling.py grows

import scaling_models as sm  # noqa: E402

from graphkit.rewrite.simplify import simplify_model  # noqa: E402


def exported(n: int) -> onnx.ModelProto:
    """n unnamed blocks: Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [4])), an Identity,
    two equal Relus summed; every constant a Constant node."""
    def const(name: str, value: np.ndarray) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))

    nodes, prev = [], "x"
    for i in range(n):
        nodes += [helper.make_node("Shape", [prev], [f"s{i}"]), const(f"z{i}", np.array(0, np.int64)),
                  helper.make_node("Gather", [f"s{i}", f"z{i}"], [f"b{i}"]), const(f"a{i}", np.array([0], np.int64)),
                  helper.make_node("Unsqueeze", [f"b{i}", f"a{i}"], [f"u{i}"]), const(f"r{i}", np.array([4], np.int64)),
                  helper.make_node("Concat", [f"u{i}", f"r{i}"], [f"c{i}"], axis=0),
                  helper.make_node("Reshape", [prev, f"c{i}"], [f"h{i}"]),
                  helper.make_node("Identity", [f"h{i}"], [f"i{i}"]), helper.make_node("Relu", [f"i{i}"], [f"p{i}"]),
                  helper.make_node("Relu", [f"i{i}"], [f"q{i}"]), helper.make_node("Add", [f"p{i}", f"q{i}"], [f"o{i}"])]
        prev = f"o{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info(prev, onnx.TensorProto.FLOAT, ["b", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


SHAPES = {
    "exported": exported,
    "chain": lambda n: sm.chain(n),
    "fan_out": lambda n: sm.fan_out(n),
    "if_bodies": lambda n: sm.if_bodies(n),
    "loop_bodies": lambda n: sm.loop_bodies(n),
    "functions": lambda n: sm.functions(n, max(n // 20, 1)),
}


def count_nodes(model: onnx.ModelProto) -> int:
    def graph_nodes(g: onnx.GraphProto) -> int:
        return sum(1 + sum(graph_nodes(a.g) for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
                   for node in g.node)
    return graph_nodes(model.graph) + sum(len(f.node) for f in model.functions)


def least_cpu(model: onnx.ModelProto, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.process_time()
        simplify_model(model, check=False)
        best = min(best, time.process_time() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1000, help="blocks at the small size (the large one is 8n)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    args = p.parse_args(argv)
    print("| shape | nodes n | nodes 8n | CPU s n | CPU s 8n | growth t(8n)/(8 t(n)) |")
    print("|---|--:|--:|--:|--:|--:|")
    for shape in args.shapes:
        small, large = SHAPES[shape](args.n), SHAPES[shape](8 * args.n)
        ts, tl = least_cpu(small, args.runs), least_cpu(large, args.runs)
        print(f"| {shape} | {count_nodes(small)} | {count_nodes(large)} | {ts:.3f} | {tl:.3f} | {tl / (8 * ts):.2f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
