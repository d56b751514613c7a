"""The lowering group (--bind, --prefer): how custom op nodes are lowered. `rewrite` lowers the
file it writes; `run` lowers in memory before running; verify, compare and export --verify
bind in memory (--bind only: graphkit.verify takes one kernel kind)."""

from __future__ import annotations

import argparse

from graphkit.cli._args import declare

__all__ = ["LOWERINGS", "add_lowering_arguments", "parse_prefer"]

LOWERINGS = ("decompose", "native", "python")


def add_lowering_arguments(p: argparse.ArgumentParser, *, in_memory: bool, prefer: bool = True,
                           when: str = "") -> argparse._MutuallyExclusiveGroup:
    """--bind and (with ``prefer``) --prefer in one mutually exclusive group (returned, for
    more choices).

    ``in_memory``: the command lowers a copy before running it, not a file it writes.
    ``when``: a condition to say first, such as "with --verify: ".
    """
    how = p.add_mutually_exclusive_group()
    where = " in memory before running (the file is not changed)" if in_memory else ""
    declare(how, "lowering", "--bind", choices=("native", "python"),
            help=f"{when}bind every custom op node to its package's C++ (native) or Python kernel"
                 f"{where or ' instead of decomposing it into standard ops'}. For example --bind python")
    if prefer:
        declare(how, "lowering", "--prefer", metavar="LIST",
                help=f"{when}per node, the first lowering that fits{where}, in this order; comma-separated "
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
