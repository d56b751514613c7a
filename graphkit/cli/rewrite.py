"""graphkit rewrite IN OUT: lower custom:: nodes (decompose by default, or bind kernels)."""

from __future__ import annotations

import argparse
import json

from graphkit.cli._args import (add_fuse_argument, add_model_output_arguments, add_output_model_argument,
                                add_target_opset_argument)
from graphkit.cli._lowering import add_lowering_arguments, parse_prefer
from graphkit.cli._simplify_args import add_simplify_arguments, simplify_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN.onnx", help="ONNX model to read (never modified)")
    add_output_model_argument(p, help="where to write the rewritten model (written atomically)")
    how = add_lowering_arguments(p, in_memory=False)
    how.add_argument("--keep-custom", action="store_true",
                     help="leave custom:: nodes as placeholders (apply --rules only)")
    how.add_argument("--as-functions", action="store_true",
                     help="keep custom:: nodes and attach their decompositions as model-local functions: "
                          "ONNX Runtime runs a registered kernel where there is one, the function elsewhere")
    add_target_opset_argument(p, help="convert the model's standard ops to ai.onnx opset N and pick "
                                      "decompositions valid there")
    p.add_argument("--rules", action="append", default=[], metavar="FILE.py|MODULE",
                   help="apply the rules defined as `rules = RuleSet([...])` in a Python file or "
                        "module before lowering; repeatable. For example --rules my_rules.py")
    add_fuse_argument(p)
    p.add_argument("--simplify", action="store_true",
                   help="after lowering, simplify as `graphkit simplify` does (its options apply)")
    add_simplify_arguments(p)
    add_model_output_arguments(
        p, changed="rewritten",
        explain="print, per rule, how often it matched and applied and its top reasons for not matching "
                "with counts; --explain=all lists every node that did not match")


def _preference(args: argparse.Namespace):
    from graphkit.rewrite import Lowering
    from graphkit.rewrite.engine import DEFAULT_PREFERENCE

    if args.keep_custom:
        return Lowering.KEEP
    if args.bind:
        return Lowering(args.bind)
    if not args.prefer:
        return DEFAULT_PREFERENCE
    return parse_prefer(args.prefer)


def run(args: argparse.Namespace, *, fuse_first: bool = True) -> int:
    """``fuse_first``: --fuse's fusions run as rules before lowering (``graphkit simplify``
    passes False: they run in its fuse pass only)."""
    import sys
    import time

    start = time.perf_counter()

    from graphkit.cli._args import chosen_fusions, op_registry
    from graphkit.rewrite import RuleSet, rewrite_file
    from graphkit.rewrite.rules.loader import load_rules

    lowering = _preference(args)
    if args.target_opset is not None:  # a usage error before any model work
        from graphkit.rewrite.lowering.selection import check_target_opset

        check_target_opset(args.target_opset)
    registry = op_registry(args)  # a broken --ops package fails before any model work
    if args.diff:
        from graphkit.cli.show import check_target

        check_target(args.diff)
    chosen = chosen_fusions(args) or []  # an unknown name fails before any model work
    fused = [rule for fusion in chosen for rule in fusion.rules] if fuse_first else []
    rules = RuleSet([*fused, *(r for source in args.rules for r in load_rules(source))])
    simplify = simplify_options(args) if getattr(args, "simplify", False) else None
    show = args.progress if args.progress is not None else sys.stderr.isatty()

    def before_write(report, sizes: dict) -> None:
        _report_text(args, report, sizes, start)  # a report that cannot be made fails before writing

    result = rewrite_file(args.input, None if args.dry_run else args.output, registry=registry,
                          lowering=lowering, rules=rules, target_opset=args.target_opset,
                          as_functions=args.as_functions, check=not args.no_check,
                          full_check=args.full_check, external_data=args.external_data,
                          progress=_progress_bar if show else None, before_write=before_write, simplify=simplify)
    text = _report_text(args, result.report, result.sizes, start)
    if args.diff:
        from graphkit.cli.show import draw_rewrite

        text = draw_rewrite(args.diff, args.input, result.output, result.report, text, as_json=args.json)
    print(text)
    return 0


def summary(report, sizes: dict, start: float) -> dict:
    """Wall time, node counts and model file sizes (bytes, external data not counted) before
    and after; bytes_after of a dry run is the size the model would have."""
    import time

    return {"seconds": round(time.perf_counter() - start, 3),
            "nodes_before": sum(report.ops_before.values()), "nodes_after": sum(report.ops_after.values()),
            **sizes}


def _report_text(args: argparse.Namespace, report, sizes: dict, start: float) -> str:
    stats = summary(report, sizes, start)
    if args.json:
        return json.dumps({"input": args.input, "output": None if args.dry_run else args.output,
                           **report.to_dict(), **stats}, indent=2, default=str)
    text = format_report(report, args.input, "(dry run: not written)" if args.dry_run else args.output)
    text += (f"\n  nodes {stats['nodes_before']} -> {stats['nodes_after']}, "
             f"size {stats['bytes_before']:,} -> {stats['bytes_after']:,} bytes, {stats['seconds']:.2f} s")
    if args.explain:
        explained = report.rules.explain(all=args.explain == "all")
        if getattr(args, "simplify", False):
            explained = "\n".join(filter(None, [explained, simplify_explain(report, all=args.explain == "all")]))
        text += "\n" + (explained or "no rules given")
    return text


def simplify_explain(report, *, all: bool) -> str:
    """The nodes simplify kept though their inputs were constant, and why."""
    lines = []
    kept = sorted(report.kept.items())
    if kept:
        lines.append(f"kept with constant inputs: {len(kept)} node(s)")
        lines += [f"  {node}: {why}" for node, why in (kept if all else kept[:10])]
        if len(kept) > 10 and not all:
            lines.append(f"  ... {len(kept) - 10} more (--explain=all lists them)")
    return "\n".join(lines)


def _progress_bar(phase: str, done: int, total: int) -> None:
    import sys

    width = 30
    filled = width * done // max(total, 1)
    end = "\n" if done >= total else ""
    sys.stderr.write(f"\r{phase:<10} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}{end}")
    sys.stderr.flush()


def format_report(report, src: str, dst: str) -> str:
    def fmt(key):
        domain, op = key
        return f"{domain}::{op}" if domain else str(op)

    keys = sorted(set(report.ops_before) | set(report.ops_after), key=fmt)
    width = max([len(fmt(k)) for k in keys] + [2])
    lines = [f"{src} -> {dst}", f"  {'op':<{width}}  before  after"]
    lines += [f"  {fmt(k):<{width}}  {report.ops_before.get(k, 0):>6}  {report.ops_after.get(k, 0):>5}"
              for k in keys]
    for before, after, how in report.conversions:
        lines.append(f"  converted: ai.onnx opset {before if before is not None else '(none)'} -> {after} ({how})")
    if report.actions or report.rules.applied:
        lines.append("  rules applied:")
        lines += [f"    {op}: {how} x{n}" for (op, how), n in sorted(report.actions.items())]
    if report.passed_over:
        lines.append("  lowerings passed over:")
        lines += [f"    {op}: {reason}" for op, reasons in sorted(report.passed_over.items()) for reason in reasons]
    for name, n in sorted(report.rules.applied.items()):
        lines.append(f"    rule {name}: x{n}")
    simplified = [(name, what) for name, what in report.passes if name.startswith("simplify:")]
    if simplified:
        lines.append("  simplified:")
        lines += [f"    {name[len('simplify:'):]}: {what}" for name, what in simplified]
    if not report.actions and not report.rules.applied and not report.conversions and not simplified:
        lines.append("  nothing to rewrite: model written unchanged")
    return "\n".join(lines)
