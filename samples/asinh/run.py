"""The tutorial's asinh (an ATen op without an export rule) with graphkit: both ways out.

    python samples/asinh/run.py [OUT_DIR]

1. ``torch.asinh`` exports as the standard ``Asinh`` node: graphkit's export registers the
   symbolic for ``aten::asinh`` for the call only (a row of GAP_FILLERS).
2. The same model exported with ``placeholders=["asinh"]`` (or a model calling graphkit's
   op, dynamo row) holds ``custom::asinh``; ``graphkit rewrite`` then lowers it per target:
   ``Asinh``, ``log_sqrt`` for runtimes without Asinh (rules graphkit_ops.asinh.no_asinh),
   or the numpy kernel.
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
from graphkit.rewrite.rules.loader import load_rules


class Model(torch.nn.Module):
    """The tutorial's model: nothing graphkit-specific in it."""

    def forward(self, x):
        return torch.asinh(x)


class LibraryModel(torch.nn.Module):
    """Calls graphkit's op: custom::asinh with either exporter."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = TorchOps()

    def forward(self, x):
        return self.ops.asinh(x)


def _run(path: Path, feeds: dict) -> np.ndarray:
    (got,) = graphkit.open_session(path).run(feeds).values()
    return got


def _lower(exported: Path, out: Path, lowering: Lowering, rules=None) -> Path:
    lowered, _ = graphkit.rewrite_model(graphkit.load_model(exported), lowering=lowering, rules=rules)
    graphkit.save_model(lowered, out, input_path=exported)
    return out


def main(out_dir: Path) -> list[tuple[str, str, float]]:
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(2, 3, 10, 10, generator=gen) - 0.5) * 100  # [-50, 50]: log_sqrt must not cancel
    feeds = {"x": x.numpy()}
    expected = torch.asinh(x).numpy()
    no_asinh = load_rules("graphkit_ops.asinh.no_asinh")
    rows = []

    direct = out_dir / "asinh.torchscript.onnx"
    export(Model(), (x,), direct, dynamo=False, opset=17)  # aten::asinh -> Asinh
    rows.append(("torchscript", "Asinh", float(np.abs(_run(direct, feeds) - expected).max())))

    for exporter, model, kwargs in [
            ("torchscript", Model(), {"dynamo": False, "opset": 17, "placeholders": ["asinh"]}),
            ("dynamo", LibraryModel(), {"dynamo": True, "opset": 18})]:
        placeholder = out_dir / f"asinh.{exporter}.custom.onnx"
        report = export(model, (x,), placeholder, **kwargs)
        assert report.count("asinh") == 1, report.details()
        for name, lowering, rules in [("decompose", Lowering.DECOMPOSE, None),
                                      ("log_sqrt", Lowering.DECOMPOSE, no_asinh),
                                      ("python", Lowering.PYTHON, None)]:
            if exporter == "dynamo" and name == "log_sqrt":
                continue
            path = _lower(placeholder, out_dir / f"asinh.{exporter}.{name}.onnx", lowering, rules)
            rows.append((exporter, name, float(np.abs(_run(path, feeds) - expected).max())))
    return rows


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="graphkit-asinh-"))
    out.mkdir(parents=True, exist_ok=True)
    for exporter, lowering, err in main(out):
        print(f"{exporter:<12} {lowering:<10} max abs err {err:.3g}")
