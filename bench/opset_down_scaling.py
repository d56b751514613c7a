"""The dynamo exporter's opset-18 model brought down to 17 (graphkit.export._opset_down.convert_down)
on ``n`` chained If nodes, each followed by Relus (tests/scaling_models.if_chain_18): graphkit's
converter (rewrite/convert/opset.py, one pass) against onnx's version converter on the whole model
(convert_down's fallback, what it ran before), both in this process, CPU seconds.

Run:  python bench/opset_down_scaling.py [--ifs 250,2000] [--relus 10] [--no-onnx]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the shapes tests/test_opset_down.py grows

from scaling_models import if_chain_18  # noqa: E402

from graphkit.export._opset_down import _convert_whole_model, convert_down  # noqa: E402


def _seconds(convert, n: int, relus: int) -> float:
    model = if_chain_18(n, relus)
    start = time.process_time()
    out = convert(model, 17)
    spent = time.process_time() - start
    assert [i.version for i in out.opset_import if i.domain == ""] == [17]
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ifs", default="250,2000", help="If node counts, comma-separated")
    parser.add_argument("--relus", type=int, default=10, help="Relus after each If")
    parser.add_argument("--no-onnx", action="store_true", help="skip onnx's whole-model converter (quadratic)")
    args = parser.parse_args()
    counts = [int(c) for c in args.ifs.split(",")]
    print(f"| If nodes (+{args.relus} Relus each) | graphkit CPU s | onnx whole-model CPU s | onnx / graphkit |")
    print("|---|---|---|---|")
    previous = None
    for n in counts:
        ours = min(_seconds(convert_down, n, args.relus) for _ in range(2))
        theirs = None if args.no_onnx else _seconds(_convert_whole_model, n, args.relus)
        growth = f" (x{ours / previous[1]:.1f} for x{n / previous[0]:.0f} Ifs)" if previous else ""
        print(f"| {n} | {ours:.3f}{growth} | {'-' if theirs is None else f'{theirs:.2f}'} | "
              f"{'-' if theirs is None else f'{theirs / ours:.1f}x'} |", flush=True)
        previous = (n, ours)


if __name__ == "__main__":
    main()
