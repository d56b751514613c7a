"""graphkit rewrite IN OUT: lower custom:: nodes (decompose by default, or bind kernels)."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="ONNX model to read (never modified)")
    p.add_argument("output", help="where to write the rewritten model (written atomically)")
    p.add_argument("--bind", choices=("native", "python"),
                   help="bind custom:: nodes to graphkit's C++ (native) or Python kernels "
                        "instead of decomposing them into standard ops")
    p.add_argument("--keep-custom", action="store_true",
                   help="leave custom:: nodes as placeholders (apply --rules only)")
    p.add_argument("--rules", action="append", default=[], metavar="FILE.py|MODULE",
                   help="apply the rules defined as `rules = RuleSet([...])` in a Python file or "
                        "module before lowering; repeatable. For example --rules my_rules.py")
    p.add_argument("--explain", action="store_true",
                   help="print, per rule, how often it applied and why it did not match elsewhere")
    p.add_argument("--no-check", action="store_true",
                   help="skip the ONNX checker and shape inference on the result")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from graphkit.modelio import check_output_path, load_model, save_model
    from graphkit.rewrite import Lowering, rewrite_model

    from graphkit.errors import UsageError
    from graphkit.rewrite import RuleSet
    from graphkit.rewrite.loader import load_rules

    if args.bind and args.keep_custom:
        raise UsageError("--bind and --keep-custom exclude each other", hint="pick one")
    check_output_path(args.output, args.input)
    rules = RuleSet([r for source in args.rules for r in load_rules(source)])
    model = load_model(args.input)
    lowering = (Lowering.KEEP if args.keep_custom else
                Lowering(args.bind) if args.bind else Lowering.DECOMPOSE)
    out, report = rewrite_model(model, lowering=lowering, rules=rules, check=not args.no_check,
                                path=args.input)
    save_model(out, args.output, input_path=args.input)
    if args.json:
        print(json.dumps({"input": args.input, "output": args.output, **report.to_dict()}, indent=2))
    else:
        print(format_report(report, args.input, args.output))
        if args.explain:
            print(report.rules.explain() or "no rules given")
    return 0


def format_report(report, src: str, dst: str) -> str:
    def fmt(key):
        domain, op = key
        return f"{domain}::{op}" if domain else op

    keys = sorted(set(report.ops_before) | set(report.ops_after), key=fmt)
    width = max([len(fmt(k)) for k in keys] + [2])
    lines = [f"{src} -> {dst}", f"  {'op':<{width}}  before  after"]
    lines += [f"  {fmt(k):<{width}}  {report.ops_before.get(k, 0):>6}  {report.ops_after.get(k, 0):>5}"
              for k in keys]
    if report.actions or report.rules.applied:
        lines.append("  rules applied:")
        lines += [f"    {op}: {how} x{n}" for (op, how), n in sorted(report.actions.items())]
    for name, n in sorted(report.rules.applied.items()):
        lines.append(f"    rule {name}: x{n}")
    if not report.actions and not report.rules.applied:
        lines.append("  nothing to rewrite: model written unchanged")
    return "\n".join(lines)
