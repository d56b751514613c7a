"""The simplify options, declared once for `graphkit simplify` and `graphkit rewrite --simplify`."""

from __future__ import annotations

import argparse
import re

from graphkit.errors import UsageError

# Spelled out here rather than imported from graphkit.rewrite.simplify (which imports onnx):
# `--help` stays fast. tests/test_simplify.py checks they agree with PASS_NAMES.
PASSES = ("lift-constants", "fold-constants", "fold-shapes", "remove-no-ops", "cancel-reshapes", "absorb-into-custom-ops",
          "merge-constants", "eliminate-common", "eliminate-dead", "fuse")
_UNITS = {"": 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000 ** 2, "mib": 1024 ** 2, "gb": 1000 ** 3, "gib": 1024 ** 3}


def parse_size(text: str) -> int:
    """"1048576", "512KiB", "4MB" -> bytes; UsageError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m and m.group(2).lower()
    if not m or unit not in _UNITS:
        raise UsageError(f"--size-limit {text!r} is not a size", hint="for example --size-limit 4MiB or 1048576")
    return int(float(m.group(1)) * _UNITS[unit])


def add_simplify_arguments(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    g = p.add_argument_group("simplify", "How `graphkit simplify` (and `rewrite --simplify`) folds and cleans up.")
    g.add_argument("--size-limit", default="1MiB", metavar="BYTES",
                   help="keep a node with constant inputs whose outputs would hold more than this many bytes "
                        "(and more than twice its constant inputs); default 1MiB. For example --size-limit 16MiB")
    g.add_argument("--skip", default="", metavar="PASS,...",
                   help=f"passes not to run, comma-separated: {', '.join(PASSES)}. For example --skip fuse")
    return g


def simplify_options(args: argparse.Namespace):
    """SimplifyOptions from the parsed arguments (a bad size or pass name is a UsageError)."""
    from graphkit.rewrite.simplify import simplify_options as make

    from graphkit.cli._args import chosen_fusions

    skip = frozenset(s.strip() for s in args.skip.split(",") if s.strip())
    chosen = chosen_fusions(args)  # --fuse: the fuse pass's fusions (else simplify's default set)
    options = {} if chosen is None else {"fusions": tuple(chosen)}
    return make(size_limit=parse_size(args.size_limit), skip=skip, **options)
