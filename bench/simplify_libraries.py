"""Why simplify's clean-up passes are graphkit's own and not onnx_ir's (docs/simplify.md,
"Where the passes come from"): speed, measured in one run.

    python bench/simplify_libraries.py               # 100 and 400 blocks
    python bench/simplify_libraries.py --n 50 200 800 --runs 5

onnx_ir's LiftConstantsToInitializersPass, CommonSubexpressionEliminationPass,
RemoveUnusedNodesPass and DeduplicateInitializersPass against graphkit's lift-constants,
eliminate-common, eliminate-dead and merge-constants (``simplify_model`` with every other
pass skipped, no check), on bench/simplify_growth.py's ``exported`` shape (the blocks a
TorchScript export writes). onnx_ir's time includes converting the ModelProto to onnx_ir
and back, as a pass of graphkit's engine would have to. Least CPU time of ``--runs``;
imports are timed as fresh processes (CPU seconds of ``python -c "import ..."``, less
``import onnx``'s).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simplify_growth import exported  # noqa: E402

from graphkit.rewrite.simplify import PASS_NAMES, simplify_model, simplify_options  # noqa: E402

OWN = {"lift-constants", "eliminate-common", "eliminate-dead", "merge-constants"}


def with_onnx_ir(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx_ir as ir
    from onnx_ir.passes import common

    m = ir.serde.deserialize_model(model)
    for p in (common.LiftConstantsToInitializersPass(), common.CommonSubexpressionEliminationPass(),
              common.RemoveUnusedNodesPass(), common.DeduplicateInitializersPass()):
        m = p(m).model
    return ir.serde.serialize_model(m)


def with_graphkit(model: onnx.ModelProto) -> onnx.ModelProto:
    return simplify_model(model, options=simplify_options(skip=set(PASS_NAMES) - OWN), check=False)[0]


def least_cpu(fn, model: onnx.ModelProto, runs: int) -> tuple[float, onnx.ModelProto]:
    best, out = float("inf"), None
    for _ in range(runs):
        start = time.process_time()
        out = fn(model)
        best = min(best, time.process_time() - start)
    return best, out


def import_cpu(module: str, runs: int) -> float:
    best = float("inf")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}  # (bytecode cached, as installed packages have it)
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, env=env)  # warm the cache
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True, env=env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[100, 400], help="blocks (12 nodes each)")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    base = import_cpu("onnx", args.runs)
    ir_import = import_cpu("onnx_ir.passes.common", args.runs) - base
    gk_import = import_cpu("graphkit.rewrite.simplify, graphkit.rewrite.engine", args.runs) - base
    print(f"import CPU s over `import onnx`: onnx_ir.passes.common {ir_import:.3f}, "
          f"graphkit.rewrite.simplify and .engine {gk_import:.3f}")
    print("| blocks | nodes | nodes after: onnx_ir / graphkit | CPU s: onnx_ir / graphkit | graphkit / onnx_ir |")
    print("|--:|--:|---|---|--:|")
    for n in args.n:
        model = exported(n)
        t_ir, out_ir = least_cpu(with_onnx_ir, model, args.runs)
        t_gk, out_gk = least_cpu(with_graphkit, model, args.runs)
        print(f"| {n} | {len(model.graph.node)} | {len(out_ir.graph.node)} / {len(out_gk.graph.node)} | "
              f"{t_ir:.3f} / {t_gk:.3f} | {t_gk / t_ir:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
