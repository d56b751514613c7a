"""How pattern-rule matching scales with the graph.

    python bench/rule_matching.py                       # 1k, 10k and 100k nodes
    python bench/rule_matching.py --layers 24 240

Each model is a chain of layers: MatMul + Add + Relu + residual Add, a LayerNorm written with
elementary ops (the DAG pattern of docs/rules.md's "Rule patterns": a shared Sub, const(eps), the
axes captured), then 30 Add/Mul nodes that every Add candidate of the pattern has to reject.
It times, in the same run, rewrite_model with the LayerNorm rule (which rewrites every
layer) and with a rule of the same root op that never matches (only rejections), and a
baseline: one GraphView over the same nodes with its producers and consumers (the index
these rules' rounds build). It prints the
CPU time per node, the growth per 10x nodes (1.0 = linear) and the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphkit.ops import default_registry
from graphkit.rewrite import Lowering, MatchResult, Rule, const, rewrite_model
from graphkit.rewrite.graph.view import GraphView

F = TensorProto.FLOAT


def encoder_like(layers: int) -> onnx.ModelProto:
    nodes: list[onnx.NodeProto] = []
    inits = [numpy_helper.from_array(np.float32(2), "two"), numpy_helper.from_array(np.float32(1e-5), "eps")]

    def n(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    cur = "x"
    for i in range(layers):
        p = f"l{i}_"
        inits += [numpy_helper.from_array(np.ones(8, np.float32), p + "g"),
                  numpy_helper.from_array(np.zeros(8, np.float32), p + "b"),
                  numpy_helper.from_array(np.eye(8, dtype=np.float32), p + "w")]
        h = n("Relu", [n("Add", [n("MatMul", [cur, p + "w"], p + "mm"), p + "b"], p + "ba")], p + "r")
        h = n("Add", [h, cur], p + "res")
        d = n("Sub", [h, n("ReduceMean", [h], p + "m", axes=[-1])], p + "d")
        v = n("ReduceMean", [n("Pow", [d, "two"], p + "p")], p + "v", axes=[-1])
        s = n("Sqrt", [n("Add", [v, "eps"], p + "ve")], p + "s")
        cur = n("Add", [n("Mul", [n("Div", [d, s], p + "n"), p + "g"], p + "ng"), p + "b"], p + "y")
        for k in range(30):
            cur = n("Mul" if k % 2 else "Add", [cur, "two" if k % 2 else "eps"], p + f"pad{k}")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 8])],
                              [helper.make_tensor_value_info(cur, F, [2, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def layernorm_pattern(op, x, eps, g, b, axes):
    d = op.Sub(x, op.ReduceMean(x, axes=axes))
    var = op.ReduceMean(op.Pow(d, 2.0), axes=axes)
    return op.Add(op.Mul(op.Div(d, op.Sqrt(op.Add(var, const(eps)))), g), b)


def last_axis(ctx, x, eps, g, b, axes):
    return MatchResult() if list(axes) == [-1] else MatchResult().fail(f"axes {axes}")


RULES = {
    "layernorm (rewrites)": Rule("layernorm", layernorm_pattern,
                                 lambda op, x, eps, g, b, axes: op.LayerNormalization(x, g, b, epsilon=float(eps)),
                                 check=last_axis, commute=True),
    "no match (rejects)": Rule("never", lambda op, x, y: op.Add(op.Mul(op.Erf(x), 3.0), y),
                               lambda op, x, y: op.Sub(x, y), commute=True),
}


def cpu(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[24, 240, 2400])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    registry = default_registry()
    rows: dict[str, list[tuple[int, float]]] = {name: [] for name in RULES}
    print(f"{'rule':<22} {'nodes':>7} {'CPU ms':>9} {'us/node':>8} {'x index':>8} {'growth/10x':>10}")
    for layers in args.layers:
        model = encoder_like(layers)
        count = len(model.graph.node)
        index = cpu(lambda: GraphView(model.graph.node).consumers, args.repeat)  # fields, producers, consumers
        for name, rule in RULES.items():
            out, report = rewrite_model(model, rules=[rule], lowering=Lowering.KEEP, check=False, registry=registry)
            if name.startswith("layernorm"):
                assert report.rules.applied == {"layernorm": layers}, report.rules.applied
            t = cpu(lambda: rewrite_model(model, rules=[rule], lowering=Lowering.KEEP, check=False,
                                          registry=registry), args.repeat)
            growth = ""
            if rows[name]:
                n0, t0 = rows[name][-1]
                growth = f"{(t / t0) ** (1 / np.log10(count / n0)) / 10:.2f}"  # 1.0: linear
            rows[name].append((count, t))
            print(f"{name:<22} {count:>7} {t * 1e3:>9.1f} {t / count * 1e6:>8.1f} {t / index:>8.1f} {growth:>10}")


if __name__ == "__main__":
    main()
