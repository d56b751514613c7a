"""graphkit inspect MODEL: what a model holds and how its custom ops can be lowered."""

from __future__ import annotations

import argparse
import json

from graphkit.cli._args import add_json_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model to inspect (weights are not loaded)")
    add_json_argument(p, what="the summary")
    p.epilog = ("Every node outside the ONNX and ONNX Runtime domains that calls no model-local "
                "function is a custom op; one that no op package defines is marked UNKNOWN (the "
                "exit code stays 0).\n\n" + (p.epilog or ""))


def run(args: argparse.Namespace) -> int:
    from graphkit.cli._args import op_registry
    from graphkit.inspection import inspect_model
    from graphkit.modelio import load_model

    registry = op_registry(args)
    summary = inspect_model(load_model(args.model), path=args.model, registry=registry)
    print(json.dumps(summary, indent=2, default=str) if args.json else format_summary(summary))
    return 0


def _package(op: dict) -> str:
    package = op.get("package")
    if not package:
        return "a loose OpDef (no package)"
    version = f" {package['version']}" if package.get("version") else ""
    origin = f" ({package['origin']})" if package.get("origin") else ""
    return f"{package['name']}{version}{origin}"


def format_summary(s: dict) -> str:
    lines = [f"{s['path']}: ir_version {s['ir_version']}, producer {s['producer'] or '-'}, "
             f"{s['nodes']} nodes, {len(s['functions'])} local functions",
             "opsets: " + ", ".join(f"{d or 'ai.onnx'}:{v}" for d, v in s["opsets"].items())]
    if s["custom_ops"]:
        lines.append("custom ops:")
        for op in s["custom_ops"]:
            where = ", ".join(map(str, op["nodes"][:5])) + (f", ... ({len(op['nodes']) - 5} more)"
                                                            if len(op["nodes"]) > 5 else "")
            if not op["known"]:
                lines.append(f"  {op['op']}  x{op['count']}  UNKNOWN: no op package defines it "
                             "(pass --ops PACKAGE, set $GRAPHKIT_OPS, or install the package that "
                             "defines it)")
                lines.append(f"    nodes: {where}")
                continue
            lines.append(f"  {op['op']} x{op['count']} ({where})")
            defined = op.get("definition", op["op"])
            lines.append(f"    package: {_package(op)}"
                         + (f", defines {defined}" if defined != op["op"] else ""))
            if op.get("bound"):
                lines.append(f"    bound to its {op['bound']} kernel")
            else:
                lines.append(f"    lowerings: {', '.join(op['lowerings']) or 'none at this opset'}")
            if op.get("function"):
                lines.append("    the model also holds a local function for it")
        unknown = sum(not op["known"] for op in s["custom_ops"])
        if unknown:
            lines.append(f"{unknown} unknown op(s): `graphkit ops` lists the known ones")
    else:
        lines.append("custom ops: none")
    for std in s.get("standard_ops_of_graphkit_ops", ()):
        where = ", ".join(map(str, std["nodes"][:5])) + (f", ... ({len(std['nodes']) - 5} more)"
                                                         if len(std["nodes"]) > 5 else "")
        state = ("valid here" if std["valid"] else
                 f"INVALID at this opset (needs {std['since_opset']}): `graphkit rewrite` lowers it")
        lines.append(f"{std['op']} x{std['count']} ({where}) is {std['as']}: {state}")
        lines.append(f"    lowerings: {', '.join(std['lowerings']) or 'none at this opset'}")
    ext = s["external_data"]
    lines.append(f"external data: {ext['tensors']} tensors in {len(ext['files'])} file(s), "
                 f"{ext['bytes'] / 2**20:.1f} MiB" if ext["tensors"] else "external data: none")
    return "\n".join(lines)
