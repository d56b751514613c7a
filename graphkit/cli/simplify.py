"""graphkit simplify IN OUT: fold constants and shapes, remove what computes nothing; custom
ops are kept and seen through (their shapes, kernels and ChannelLinear declarations)."""

from __future__ import annotations

import argparse

from graphkit.cli._args import add_json_argument
from graphkit.cli._simplify_args import add_simplify_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="ONNX model to read (never modified)")
    p.add_argument("output", help="where to write the simplified model (written atomically)")
    add_simplify_arguments(p)
    p.add_argument("--explain", nargs="?", const="summary", choices=("summary", "all"), default=None,
                   help="print what each pass did and why nodes with constant inputs were kept "
                        "(--explain=all lists every one)")
    p.add_argument("--no-check", action="store_true", help="skip the ONNX checker and shape inference on the result")
    p.add_argument("--full-check", action="store_true",
                   help="run strict shape inference over the whole result even when it is big")
    p.add_argument("--external-data", choices=("auto", "link", "copy"), default="auto",
                   help="when writing into another directory, make external weights valid there by hard "
                        "link (link), copy (copy) or link falling back to copy (auto, the default)")
    p.add_argument("--dry-run", action="store_true", help="do everything but write the output")
    p.add_argument("--diff", metavar="DIR",
                   help="also draw what changed: DIR/index.html and a before/after page per changed region "
                        "(needs graphviz's dot)")
    add_json_argument(p)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show progress on stderr (default: on a terminal, for models over 10k nodes)")


def run(args: argparse.Namespace) -> int:
    from graphkit.cli import rewrite

    # `graphkit rewrite --keep-custom --simplify` with no rules: one engine, one report.
    for name, value in (("keep_custom", True), ("bind", None), ("prefer", None), ("as_functions", False),
                        ("target_opset", None), ("rules", []), ("fuse", None), ("simplify", True)):
        setattr(args, name, value)
    return rewrite.run(args)
