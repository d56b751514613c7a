"""How `graphkit rewrite` scales with the graph, on the shapes users have.

    python bench/rewrite_scaling.py                     # 10k and 100k nodes, every shape
    python bench/rewrite_scaling.py --sizes 10000 100000 1000000 --shapes unnamed fanout
    python bench/rewrite_scaling.py --shapes unnamed if_bodies --flags=--as-functions
    python bench/rewrite_scaling.py --shapes unnamed if_bodies --rule   # a user rule, then lowering
    python bench/rewrite_scaling.py --shapes reduce_chain reduce_if_bodies --flags="--target-opset 18"
    python bench/rewrite_scaling.py --shapes reduce18_chain --flags="--target-opset 17"   # converted down

For each shape and size it writes a model, then times, in the same run:
- the floor: a Python process that only does onnx.load + onnx.save of that file;
- `graphkit rewrite` (load, rewrite, check, save) as a whole process, with its peak RSS;
- in this process, `rewrite_bytes` with each writer: "objects" (parse, rewrite_model's
  passes, serialize) and "bytes" (the wire-level writer where its preconditions hold,
  else the objects writer: the CLI's choice); the `writer` column says which ran there
  ("main": the main graph's byte writer, "bodies": the bodies', "objects"), its `saving`
  column the objects writer's CPU seconds over that (graphkit.rewrite.writers: the writers).
Processes run with Python's bytecode cache on, in a directory of this run's own
(PYTHONPYCACHEPREFIX, warmed by one run of each command first), as an installed package
has it: where PYTHONDONTWRITEBYTECODE is set, every `graphkit rewrite` process would
otherwise compile graphkit's sources again (about 0.1 s).
The floor and the CLI take turns (`--repeat` rounds, the least of each kept).
Processes are timed by CPU seconds (user + system, from wait4) as well as wall seconds:
on a shared machine the CPU time is what the work costs; the ratios use it. It prints
CPU microseconds per node, the growth factor per 10x nodes (1.0 = linear), and the CLI's
ratio to the floor (CPU, wall, peak memory; the peaks themselves in MiB). Goal: growth <= 1.1
everywhere; CLI within 3x of the floor at 100k and 1M nodes, its peak memory too. `nodes` counts every node, subgraphs and functions
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

import numpy as np
import onnx
import onnx.numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the shapes tests/test_scaling.py grows

import scaling_models as shapes  # noqa: E402


def _functions(nodes_total: int) -> onnx.ModelProto:
    """Up to 5000 local functions (each a my_add), called in a chain by the rest."""
    count = max(1, min(5000, nodes_total // 20))
    return shapes.functions(nodes_total - count, count)


def _reduce18_chain(nodes_total: int) -> onnx.ModelProto:
    """reduce_chain at opset 18: each ReduceMean reads its axes from one shared initializer
    (--target-opset 17 makes them attributes again and removes it)."""
    model = shapes.chain(nodes_total // 2, reduce=True)
    for node in model.graph.node:
        if node.op_type == "ReduceMean":
            axes = next(a for a in node.attribute if a.name == "axes")
            node.attribute.remove(axes)
            node.input.append("axes")
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([0], np.int64), "axes"))
    next(i for i in model.opset_import if i.domain == "").version = 18
    return model


# Shape name -> model of about that many nodes.
SHAPES = {
    "named": lambda n: shapes.chain(n // 2, named=True),
    "unnamed": lambda n: shapes.chain(n // 2),
    "fanout": lambda n: shapes.fan_out(n - 1),
    "multi_output": lambda n: shapes.multi_output(n // 3),
    "if_bodies": lambda n: shapes.if_bodies(n // 3),
    "loop_bodies": lambda n: shapes.loop_bodies(n // 3),
    "functions": _functions,
    # ReduceMean (axes an input from opset 18) in place of Relu / after each body's my_add:
    # with --flags="--target-opset 18" every one of them is converted
    "reduce_chain": lambda n: shapes.chain(n // 2, reduce=True),
    "reduce_if_bodies": lambda n: shapes.if_bodies(n // 5, reduce=True),
    "reduce18_chain": _reduce18_chain,
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


def _best_in_turns(fns: list, repeat: int) -> list:
    """The least CPU of ``repeat`` runs of each of ``fns``, run in turns (a round runs each
    once), so a slow spell of the machine falls on all of them alike."""
    rounds = [[fn() for fn in fns] for _ in range(repeat)]
    return [min((r[i] for r in rounds), key=lambda x: x[0]) for i in range(len(fns))]


def _writer(report) -> str:
    """Which writer made ``report``'s output: "main" (the main graph's byte writer), "bodies"
    (the bodies') or "objects"."""
    from graphkit.rewrite.bytes import bodies

    if report.writer != "bytes":
        return report.writer
    return "bodies" if report.writer_reason.startswith(bodies.WHY) else "main"


def _all_nodes(model: onnx.ModelProto) -> int:
    from graphkit.rewrite.graph.walk import count_ops

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
    from graphkit.rewrite import Lowering
    from graphkit.rewrite.files import rewrite_bytes
    from graphkit.rewrite.rules.loader import load_rules

    options = {"lowering": Lowering.DECOMPOSE, **_options(args.flags)}
    flags = args.flags.split()
    registry = default_registry()
    print(f"{'shape':13} {'nodes':>8} {'floor cpu':>9} {'cli cpu':>8} {'cli/floor':>9} {'wall ratio':>10} "
          f"{'rss/floor':>9} {'floor MiB':>9} {'cli MiB':>7} {'cli us/node':>11} {'growth':>6} {'objects s':>9} {'bytes s':>8} "
          f"{'writer':>7} {'saving':>6}")
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
                (floor, floor_wall, floor_rss), (cli, cli_wall, cli_rss) = _best_in_turns([
                    lambda: _process([sys.executable, "-c", FLOOR, str(src), str(out)]),
                    lambda: _process([sys.executable, "-m", "graphkit", "rewrite", str(src), str(out), *flags])],
                    args.repeat)
                data = src.read_bytes()
                timed = {}
                writer = ""
                for name in args.writers:
                    def api() -> float:
                        nonlocal writer
                        start = time.process_time()
                        _, report = rewrite_bytes(data, registry=registry, fast=name == "bytes", **options)
                        writer = _writer(report) if name == "bytes" else writer
                        return time.process_time() - start

                    timed[name] = _best(api, args.repeat)
                growth = ""
                if previous is not None:
                    growth = f"{(cli / previous[1]) / (nodes / previous[0]):.2f}"
                print(f"{shape:13} {nodes:>8} {floor:>9.2f} {cli:>8.2f} {cli / floor:>9.2f} "
                      f"{cli_wall / floor_wall:>10.2f} {cli_rss / floor_rss:>9.2f} {floor_rss / 1024:>9.0f} "
                      f"{cli_rss / 1024:>7.0f} {cli / nodes * 1e6:>11.2f} "
                      f"{growth:>6} {timed.get('objects', float('nan')):>9.2f} {timed.get('bytes', float('nan')):>8.2f} "
                      f"{writer:>7} {timed.get('objects', float('nan')) / timed.get('bytes', float('nan')):>6.2f}",
                      flush=True)
                previous = (nodes, cli)


if __name__ == "__main__":
    main()
