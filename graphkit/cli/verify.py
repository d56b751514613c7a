"""graphkit verify MODULE:FACTORY MODEL.onnx: torch and ONNX Runtime on the same inputs."""

from __future__ import annotations

import argparse
import json


def add_comparison_arguments(p: argparse.ArgumentParser) -> None:
    """Inputs and tolerances, shared by verify, compare and export --verify."""
    g = p.add_argument_group("inputs and tolerances")
    g.add_argument("--inputs", metavar="X.npz",
                   help="input arrays by ONNX input name (numpy .npz); random inputs with --seed if omitted")
    g.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    g.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic input dimension for random inputs; for example "
                        "--dim batch=4 (default 1)")
    g.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (default 1e-5)")
    g.add_argument("--rtol", type=float, default=1e-5,
                   help="relative tolerance (default 1e-5): an element passes when "
                        "|actual - expected| <= atol + rtol * |expected|")
    g.add_argument("--bind", choices=("native", "python"),
                   help="bind custom:: placeholders to graphkit's native or Python kernels in memory "
                        "before running (for ops without a native kernel; the file is not changed)")
    g.add_argument("--json", action="store_true", help="print the report as JSON")


def comparison_options(args: argparse.Namespace) -> dict:
    from graphkit.cli.run import _parse_dims, load_npz
    from graphkit.errors import UsageError

    for name in ("atol", "rtol"):
        value = getattr(args, name)
        if not value >= 0:  # also rejects NaN
            raise UsageError(f"--{name} {value} must be a non-negative number", hint=f"for example --{name} 1e-4")
    return {"inputs": load_npz(args.inputs) if args.inputs else None, "seed": args.seed,
            "dims": _parse_dims(args.dim), "atol": args.atol, "rtol": args.rtol, "bind": args.bind}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="function (or class) building the torch model: a module path or a .py file, "
                        "for example mypkg.models:build or model.py:build")
    p.add_argument("model", help="the exported ONNX model")
    add_comparison_arguments(p)
    p.epilog = ("The ONNX model's inputs, in order, are passed to the torch model positionally. "
                "Exit code 12 when an output differs beyond tolerance.\n\n" + (p.epilog or ""))


def run(args: argparse.Namespace) -> int:
    from graphkit.export._loading import load_model_factory
    from graphkit.verify import verify_export

    from graphkit.cli.export import _registry

    options = comparison_options(args)
    model = load_model_factory(args.factory)
    # After the factory ran (it may import its op packages); verify_export adds the ops the
    # model holds.
    options["registry"] = _registry(args)
    report = verify_export(model, args.model, **options)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format())
    report.raise_for_mismatch()
    return 0
