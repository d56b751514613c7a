"""graphkit inspect MODEL: what a model holds and how its custom ops can be lowered."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model to inspect (weights are not loaded)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    from graphkit.inspection import inspect_model
    from graphkit.modelio import load_model

    summary = inspect_model(load_model(args.model), path=args.model)
    print(json.dumps(summary, indent=2, default=str) if args.json else format_summary(summary))
    return 0


def format_summary(s: dict) -> str:
    lines = [f"{s['path']}: ir_version {s['ir_version']}, producer {s['producer'] or '-'}, "
             f"{s['nodes']} nodes, {len(s['functions'])} local functions",
             "opsets: " + ", ".join(f"{d or 'ai.onnx'}:{v}" for d, v in s["opsets"].items())]
    if s["custom_ops"]:
        lines.append("custom ops:")
        for op in s["custom_ops"]:
            where = ", ".join(map(str, op["nodes"][:5])) + (f", ... ({len(op['nodes']) - 5} more)"
                                                            if len(op["nodes"]) > 5 else "")
            lines.append(f"  {op['op']} x{op['count']} ({where})")
            lines.append(f"    lowerings: {', '.join(op['lowerings']) or 'none'}")
    else:
        lines.append("custom ops: none")
    ext = s["external_data"]
    lines.append(f"external data: {ext['tensors']} tensors in {len(ext['files'])} file(s), "
                 f"{ext['bytes'] / 2**20:.1f} MiB" if ext["tensors"] else "external data: none")
    return "\n".join(lines)
