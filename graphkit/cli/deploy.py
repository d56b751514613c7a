"""graphkit deploy [MODEL.onnx] -o DIR: what to ship so that plain ONNX Runtime runs a model
(graphkit.deploy)."""

from __future__ import annotations

import argparse

from graphkit.cli._args import add_json_argument, add_output_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", metavar="MODEL.onnx",
                   help="the model to deploy (usually rewritten with --bind native); its nodes decide which "
                        "kernels are shipped. Without it, --package names what to ship")
    add_output_argument(p, metavar="DIR", required=True,
                        help="the deployment folder: created, or replaced if graphkit wrote it before (written "
                             "whole or not at all). Relocatable: copy it anywhere. For example -o deploy/")
    p.add_argument("--package", action="append", default=[], metavar="NAME",
                   help="ship the native kernels of this op package (every native op it has) besides the "
                        "model's; repeatable. For example --package graphkit_ops")
    p.add_argument("--copy-model", action="store_true",
                   help="copy the model (and its external weights) into the folder too")
    p.add_argument("--march", metavar="CPU",
                   help="compile the kernels for this CPU (gcc's -march, e.g. x86-64-v2) instead of this "
                        "machine's (native): for servers whose CPU lacks this one's instructions")
    add_json_argument(p, what="the manifest")


def run(args: argparse.Namespace) -> int:
    import json

    from graphkit.cli._args import op_registry
    from graphkit.deploy import deploy

    report = deploy(args.output, args.model, packages=args.package, registry=op_registry(args),
                    copy_model=args.copy_model, march=args.march)
    print(json.dumps(report.manifest, indent=2) if args.json else report.format())
    return 0
