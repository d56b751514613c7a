"""graphkit verify MODULE:FACTORY MODEL.onnx: torch and ONNX Runtime on the same inputs."""

from __future__ import annotations

import argparse
import json

from graphkit.cli._args import add_feed_arguments, add_json_argument, add_tolerance_arguments, comparison_options
from graphkit.cli._lowering import add_lowering_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="function (or class) building the torch model: a module path or a .py file, "
                        "for example mypkg.models:build or model.py:build")
    p.add_argument("model", help="the exported ONNX model")
    add_feed_arguments(p)
    add_tolerance_arguments(p)
    add_lowering_arguments(p, in_memory=True, prefer=False)
    add_json_argument(p)
    p.epilog = ("The ONNX model's inputs, in order, are passed to the torch model positionally. "
                "Exit code 12 when an output differs beyond tolerance.\n\n" + (p.epilog or ""))


def run(args: argparse.Namespace) -> int:
    from graphkit.export._loading import load_model_factory
    from graphkit.verify import verify_export

    from graphkit.cli._args import op_registry

    options = comparison_options(args)
    model = load_model_factory(args.factory)
    # After the factory ran (it may import its op packages); verify_export adds the ops the
    # model holds.
    options["registry"] = op_registry(args)
    report = verify_export(model, args.model, **options)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format())
    report.raise_for_mismatch()
    return 0
