"""The edge-value harness over every op and gap filler, as a markdown table: cases checked
per op and gap filler, and the worst error (abs, rel, ulp) per lowering and dtype
(tests/edge_harness.py says what is compared and how).

    python bench/edges.py                      # the suite's budget (32 random draws per dtype)
    python bench/edges.py --examples 2000      # nightly-style: also every opset and example
    python bench/edges.py --only hypot asinh   # some ops / gap fillers

Exit status 1 when a case disagrees with torch (or, where the op or gap filler documents a
departure, with the documented result).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=None,
                        help="random draws per dtype (default: $GRAPHKIT_EDGE_EXAMPLES or 32)")
    parser.add_argument("--only", nargs="*", default=None, help="op or gap-filler names")
    args = parser.parse_args(argv)
    if args.examples is not None:
        os.environ["GRAPHKIT_EDGE_EXAMPLES"] = str(args.examples)

    import edge_harness as h
    from graphkit.export import GAP_FILLERS
    from graphkit.ops import discover

    start, cpu = time.perf_counter(), time.process_time()
    wanted = set(args.only or ())
    outcomes = []
    for op in discover(entry_points=False, environment=False):
        if not wanted or op.name in wanted:
            outcomes += h.check_op(op)
    for filler in GAP_FILLERS:
        if not wanted or filler.name in wanted:
            outcomes += h.check_gap_filler(filler)
    rows = h.collapse(outcomes)
    print(f"edge-value harness, {h.ENV_EXAMPLES}={h.budget()}: {time.perf_counter() - start:.0f} s wall, "
          f"{time.process_time() - cpu:.0f} s CPU\n")
    print(h.format_table(rows))
    failed = [r for r in rows if "failed" in r.status]
    for r in failed:
        print(f"\n{r.op} {r.lowering} {r.dtype}:\n  " + "\n  ".join(r.failures))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
