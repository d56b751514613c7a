"""The tutorial's my_add (2a + b, C++ forward) with graphkit: export, lower, run, compare.

    python samples/my_add/run.py [OUT_DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import graphkit
from graphkit.export import TorchOps, export
from graphkit.rewrite import Lowering

ops = TorchOps()
MyAddFunction = ops.function("my_add")  # the tutorial's autograd.Function: symbolic -> custom::my_add


class TutorialMyAdd(torch.nn.Module):
    """As in the tutorial: the Function's symbolic drives the TorchScript exporter."""

    def forward(self, a, b):
        return MyAddFunction.apply(a, b)


class LibraryMyAdd(torch.nn.Module):
    """The torch.library op graphkit::my_add: exports with both exporters."""

    def forward(self, a, b):
        return ops.my_add(a, b)


def main(out_dir: Path) -> list[tuple[str, str, float]]:
    torch.manual_seed(0)
    a, b = torch.rand(2, 3, 10, 10), torch.rand(2, 3, 10, 10)
    feeds = {"a": a.numpy(), "b": b.numpy()}
    rows = []
    for exporter, model, dynamo in [("torchscript", TutorialMyAdd(), False),
                                    ("dynamo", LibraryMyAdd(), True)]:
        expected = model(a, b).numpy()
        exported = out_dir / f"my_add.{exporter}.onnx"
        export(model, (a, b), exported, dynamo=dynamo, input_names=["a", "b"], output_names=["y"],
               dynamic_dims={"a": {0: "batch"}, "b": {0: "batch"}})
        for lowering in (Lowering.DECOMPOSE, Lowering.NATIVE, Lowering.PYTHON):
            lowered, _ = graphkit.rewrite_model(graphkit.load_model(exported), lowering=lowering)
            path = out_dir / f"my_add.{exporter}.{lowering.value}.onnx"
            graphkit.save_model(lowered, path, input_path=exported)
            (got,) = graphkit.open_session(path).run(feeds).values()
            rows.append((exporter, lowering.value, float(np.abs(got - expected).max())))
    return rows


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="graphkit-my_add-"))
    out.mkdir(parents=True, exist_ok=True)
    for exporter, lowering, err in main(out):
        print(f"{exporter:<12} {lowering:<10} max abs err {err:.3g}")
