"""graphkit simplify IN OUT: fold constants and shapes, remove what computes nothing; custom
ops are kept and seen through (their shapes, kernels and ChannelLinear declarations)."""

from __future__ import annotations

import argparse

from graphkit.cli._args import add_fuse_argument, add_model_output_arguments, add_output_model_argument
from graphkit.cli._simplify_args import add_simplify_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN.onnx", help="ONNX model to read (never modified)")
    add_output_model_argument(p, help="where to write the simplified model (written atomically)")
    add_simplify_arguments(p)
    add_fuse_argument(p)
    add_model_output_arguments(
        p, explain="print what each pass did and why nodes with constant inputs were kept "
                   "(--explain=all lists every one)")


def run(args: argparse.Namespace) -> int:
    from graphkit.cli import rewrite

    # `graphkit rewrite --keep-custom --simplify` with no rules: one engine, one report; --fuse's
    # fusions run in the fuse pass only (rewrite runs them before lowering too).
    for name, value in (("keep_custom", True), ("bind", None), ("prefer", None), ("as_functions", False),
                        ("target_opset", None), ("rules", []), ("simplify", True)):
        setattr(args, name, value)
    return rewrite.run(args, fuse_first=False)
