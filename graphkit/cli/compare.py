"""graphkit compare A.onnx B.onnx: two models on the same inputs (and --bisect)."""

from __future__ import annotations

import argparse
import json

from graphkit.cli._args import add_feed_arguments, add_json_argument, add_tolerance_arguments, comparison_options
from graphkit.cli._lowering import add_lowering_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("reference", metavar="A.onnx", help="the reference model (say, before a rewrite)")
    p.add_argument("candidate", metavar="B.onnx", help="the model checked against it (say, after)")
    add_feed_arguments(p)
    add_tolerance_arguments(p)
    add_lowering_arguments(p, in_memory=True, prefer=False)
    add_json_argument(p)
    p.add_argument("--bisect", action="store_true",
                   help="also find the first tensor, in A's node order, that differs between the "
                        "models (tensors both compute under the same name)")
    p.add_argument("--chunk", type=int, default=64, metavar="N",
                   help="with --bisect: intermediate tensors exposed per run (default 64); memory "
                        "holds at most N of them per model at a time")
    p.epilog = ("Custom ops run on the kernels of their op packages (native or Python). Exit code 12 "
                "when an output (or, with --bisect, a shared tensor) differs beyond tolerance.\n\n"
                + (p.epilog or ""))


def run(args: argparse.Namespace) -> int:
    from graphkit.cli._args import op_registry
    from graphkit.errors import UsageError
    from graphkit.verify import bisect_models, compare_models

    options = comparison_options(args)
    options["registry"] = op_registry(args)
    if args.chunk < 1:
        raise UsageError(f"--chunk {args.chunk} must be a positive number", hint="for example --chunk 64")
    report = compare_models(args.reference, args.candidate, **options)
    bisect = bisect_models(args.reference, args.candidate, chunk=args.chunk, **options) if args.bisect else None
    if args.json:
        out = report.to_dict()
        if bisect is not None:
            out["bisect"] = bisect.to_dict()
        print(json.dumps(out, indent=2))
    else:
        print(report.format())
        if bisect is not None:
            print(bisect.format())
    report.raise_for_mismatch()
    if bisect is not None:
        bisect.raise_for_mismatch()
    return 0
