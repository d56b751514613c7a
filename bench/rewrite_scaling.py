"""How `graphkit rewrite` scales with the graph, on the shapes users have.

    python bench/rewrite_scaling.py                     # 10k and 100k nodes, every shape
    python bench/rewrite_scaling.py --sizes 10000 100000 1000000 --shapes unnamed fanout
    python bench/rewrite_scaling.py --shapes unnamed if_bodies --flags=--as-functions
    python bench/rewrite_scaling.py --shapes unnamed if_bodies --rule   # a user rule, then lowering

For each shape and size it writes a model, then times, in the same run:
- the floor: a Python process that only does onnx.load + onnx.save of that file;
- `graphkit rewrite` (load, rewrite, check, save) as a whole process, with its peak RSS;
- in this process, `rewrite_bytes` with each writer: "objects" (parse, rewrite_model's
  passes, serialize) and "bytes" (the wire-level writer where its preconditions hold,
  else the objects writer: the CLI's choice).
Processes run with Python's bytecode cache on, in a directory of this run's own
(PYTHONPYCACHEPREFIX, warmed by one run of each command first), as an installed package
has it: where PYTHONDONTWRITEBYTECODE is set, every `graphkit rewrite` process would
otherwise compile graphkit's sources again (about 0.1 s).
Processes are timed by CPU seconds (user + system, from wait4) as well as wall seconds:
on a shared machine the CPU time is what the work costs; the ratios use it. It prints
CPU microseconds per node, the growth factor per 10x nodes (1.0 = linear), and the CLI's
ratio to the floor (CPU, wall, peak memory). Goal: growth <= 1.1 everywhere; CLI within
3x of the floor at 100k and 1M nodes. `nodes` counts every node, subgraphs and functions
included. `--flags` are passed to `graphkit rewrite` and to the in-process writers (the
lowering, --target-opset, --as-functions); `--rule` adds a user rule (every my_add becomes
an Add) given to both as `--rules FILE` / ``rules=``, which the objects writer applies.
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


def loop_bodies(nodes_total: int) -> onnx.ModelProto:
    """Chained Loop nodes (one trip), each body an Identity of the condition and a my_add (3 nodes per Loop)."""
    nodes = [helper.make_node("Constant", [], ["m"], value=helper.make_tensor("m", TensorProto.INT64, [], [1])),
             helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))]
    prev = "x"
    for i in range(nodes_total // 3):
        body = helper.make_graph(
            [helper.make_node("Identity", [f"ci{i}"], [f"co{i}"]),
             helper.make_node("my_add", [f"v{i}", f"v{i}"], [f"vo{i}"], domain="custom")], f"b{i}",
            [helper.make_tensor_value_info(f"it{i}", TensorProto.INT64, []),
             helper.make_tensor_value_info(f"ci{i}", TensorProto.BOOL, []), _vi(f"v{i}")],
            [helper.make_tensor_value_info(f"co{i}", TensorProto.BOOL, []), _vi(f"vo{i}")])
        nodes.append(helper.make_node("Loop", ["m", "c", prev], [f"o{i}"], body=body))
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
    "loop_bodies": loop_bodies,
    "functions": functions,
}
FLOOR = "import onnx, sys; onnx.save(onnx.load(sys.argv[1]), sys.argv[2])"
# The user rule of --rule: a rules file as `graphkit rewrite --rules` reads it.
RULE_FILE = """from graphkit.rewrite import Rule, RuleSet

rules = RuleSet([Rule.node("my_add_as_add", "my_add", lambda op, x0, x1: op.Add(x0, x1), domain="custom",
                           inputs=2)])
"""


def _options(flags: str) -> dict:
    """rewrite_bytes keywords for the `graphkit rewrite` flags the benchmark is given."""
    from graphkit.rewrite import Lowering

    argv = flags.split()
    options: dict = {}
    if "--bind" in argv:
        options["lowering"] = Lowering(argv[argv.index("--bind") + 1])
    if "--target-opset" in argv:
        options["target_opset"] = int(argv[argv.index("--target-opset") + 1])
    if "--as-functions" in argv:
        options["as_functions"] = True
    return options


# Runs argv[1:] and prints its CPU seconds, wall seconds and peak RSS. A process's peak RSS
# counts the memory of the process it was forked from (ru_maxrss survives exec): measured
# from this small launcher, not from the benchmark, which holds the models it made.
LAUNCHER = """import os, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(usage.ru_utime + usage.ru_stime, time.perf_counter() - start, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


ENV = dict(os.environ)


def _process(argv: list[str]) -> tuple[float, float, int]:
    """CPU seconds, wall seconds and peak RSS (KiB) of one child process."""
    done = subprocess.run([sys.executable, "-c", LAUNCHER, *argv], capture_output=True, text=True, env=ENV)
    *lines, last = done.stdout.strip().splitlines() or ["0 0 0 1"]
    cpu, wall, rss, code = last.split()
    if done.returncode != 0 or code != "0":
        raise SystemExit(f"failed: {' '.join(argv)}: {done.stderr[-500:]}")
    return float(cpu), float(wall), int(rss)


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
    ap.add_argument("--rule", action="store_true", help="apply a user rule (my_add -> Add) before lowering")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--writers", nargs="*", choices=("objects", "bytes"), default=["objects", "bytes"],
                    help="in-process writers to time (none: the processes only)")
    args = ap.parse_args()
    from graphkit.ops import default_registry
    from graphkit.rewrite import Lowering, rewrite_bytes
    from graphkit.rewrite.loader import load_rules

    options = {"lowering": Lowering.DECOMPOSE, **_options(args.flags)}
    flags = args.flags.split()
    registry = default_registry()
    print(f"{'shape':13} {'nodes':>8} {'floor cpu':>9} {'cli cpu':>8} {'cli/floor':>9} {'wall ratio':>10} "
          f"{'rss/floor':>9} {'cli us/node':>11} {'growth':>6} {'objects s':>9} {'bytes s':>8} {'writer':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.rule:
            rule_file = Path(tmp) / "scaling_rule.py"
            rule_file.write_text(RULE_FILE)
            flags += ["--rules", str(rule_file)]
            options["rules"] = load_rules(str(rule_file))
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        ENV["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        warm, warm_out = Path(tmp) / "warm.onnx", Path(tmp) / "warm_out.onnx"
        onnx.save(SHAPES["named"](2), warm)
        _process([sys.executable, "-c", FLOOR, str(warm), str(warm_out)])
        _process([sys.executable, "-m", "graphkit", "rewrite", str(warm), str(warm_out), *flags])
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
                                                                 str(out), *flags]), args.repeat)
                data = src.read_bytes()
                timed = {}
                writer = ""
                for name in args.writers:
                    def api() -> float:
                        nonlocal writer
                        start = time.process_time()
                        _, report = rewrite_bytes(data, registry=registry, fast=name == "bytes", **options)
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
