"""The lowering options (--bind, --prefer) shared by `graphkit rewrite` and `graphkit run`."""

from __future__ import annotations

import argparse

__all__ = ["LOWERINGS", "add_lowering_arguments", "parse_prefer"]

LOWERINGS = ("decompose", "native", "python")


def add_lowering_arguments(p: argparse.ArgumentParser, *, in_memory: bool) -> argparse._MutuallyExclusiveGroup:
    """--bind and --prefer in one mutually exclusive group (returned, for more choices).

    ``in_memory``: the command lowers a copy before running it (`run`), not a file it writes.
    """
    how = p.add_mutually_exclusive_group()
    where = " in memory before running (the file is not changed)" if in_memory else ""
    how.add_argument("--bind", choices=("native", "python"),
                     help="bind every custom op node to its package's C++ (native) or Python kernel"
                          f"{where or ' instead of decomposing it into standard ops'}")
    how.add_argument("--prefer", metavar="LIST",
                     help=f"per node, the first lowering that fits{where}, in this order; comma-separated "
                          "from decompose, native, python. "
                          + ("" if in_memory else "Default: decompose,native,python (the most portable "
                                                  "the target opset supports). ")
                          + "For example --prefer native,decompose")
    return how


def parse_prefer(text: str):
    """--prefer's comma-separated list of distinct lowerings, as Lowering values."""
    from graphkit.errors import UsageError
    from graphkit.rewrite import Lowering

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in LOWERINGS]
    if bad or not names or len(set(names)) != len(names):
        raise UsageError(f"--prefer {text!r} is not a list of distinct {', '.join(LOWERINGS)}",
                         hint="for example --prefer native,decompose")
    return [Lowering(n) for n in names]
