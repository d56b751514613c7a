"""A detection-style model with a DCNv2 block: export, lower every way, run, compare with torch.

    python samples/deform_conv/run.py [OUT_DIR]

The model: a small conv backbone (two stride-2 convs), a DCNv2 block (a 3x3 conv predicts
the offsets and the mask of a 3x3 deformable conv, as in mmdetection's DCNv2) and a 1x1
head (3 class scores + 4 box values per cell). It is exported with both exporters (the
TorchScript one at opset 13, the dynamo one at opset 18), each export holding one
``custom::deform_conv2d`` node, and lowered into:

- ``gather``      the opset 11-15 decomposition (GatherElements bilinear sampling + Conv)
- ``gridsample``  the opset 16+ decomposition (GridSample + Conv)
- ``deformconv``  ONNX's standard DeformConv (opset 19, ``--target-opset 19``)
- ``native``      graphkit's C++ kernel (``--bind native``)
- ``python``      graphkit's numpy kernel (``--bind python``)

Each lowered model runs in ONNX Runtime on a batch the export did not see and is compared
with the torch model's output; as a script it also prints the median latency.
"""

from __future__ import annotations

import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import graphkit
from graphkit_ops.deform_conv2d.nn import DeformConv2d
from graphkit.export import export
from graphkit.rewrite import Lowering

EXPORTS = (("torchscript", False, 13), ("dynamo", True, 18))
# lowering label -> (lowering, target opset or None for the exported one)
LOWERINGS = {
    "gather": (Lowering.DECOMPOSE, 13),
    "gridsample": (Lowering.DECOMPOSE, 18),
    "deformconv": (Lowering.DECOMPOSE, 19),
    "native": (Lowering.NATIVE, None),
    "python": (Lowering.PYTHON, None),
}


class DetectionNet(torch.nn.Module):
    """backbone -> DCNv2 block -> head (3 class scores + 4 box values per cell)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.backbone = torch.nn.Sequential(
            torch.nn.Conv2d(3, width // 2, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(width // 2, width, 3, stride=2, padding=1), torch.nn.ReLU())
        self.offset_mask = torch.nn.Conv2d(width, 3 * 9, 3, padding=1)  # 18 offsets + 9 mask logits
        self.dcn = DeformConv2d(width, width, 3, padding=1)
        self.head = torch.nn.Conv2d(width, 3 + 4, 1)
        with torch.no_grad():  # trained offsets reach a few pixels: some samples leave the map
            self.offset_mask.weight[:18] *= 8

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = self.backbone(image)
        predicted = self.offset_mask(features)
        offset, mask = predicted[:, :18], torch.sigmoid(predicted[:, 18:])
        return self.head(torch.relu(self.dcn(features, offset, mask)))


# (exporter, lowering, max abs error vs torch, median latency in ms or None)
Result = collections.namedtuple("Result", "exporter lowering max_abs_err ms")


def run(out_dir: Path, *, timing: bool = False) -> list[Result]:
    torch.manual_seed(0)
    model = DetectionNet().eval()
    example = torch.rand(2, 3, 64, 64)
    image = torch.rand(3, 3, 64, 64)  # another batch size than the export saw
    with torch.no_grad():
        expected = model(image).numpy()
    results = []
    for exporter, dynamo, opset in EXPORTS:
        exported = out_dir / f"detector.{exporter}.onnx"
        export(model, (example,), exported, dynamo=dynamo, opset=opset, input_names=["image"],
               output_names=["scores_boxes"], dynamic_dims={"image": {0: "batch"}})
        for label, (lowering, target) in LOWERINGS.items():
            if target is not None and target < opset:
                continue  # the exporter wrote a newer opset than this decomposition's
            lowered, _ = graphkit.rewrite_model(graphkit.load_model(exported), lowering=lowering,
                                                target_opset=target)
            path = out_dir / f"detector.{exporter}.{label}.onnx"
            graphkit.save_model(lowered, path, input_path=exported)
            session = graphkit.open_session(path)
            (got,) = session.run({"image": image.numpy()}).values()
            ms = None
            if timing:
                feeds = {"image": image.numpy()}
                for _ in range(3):
                    session.run(feeds)
                times = []
                for _ in range(30):
                    t0 = time.perf_counter()
                    session.run(feeds)
                    times.append(time.perf_counter() - t0)
                ms = statistics.median(times) * 1e3
            results.append(Result(exporter, label, float(np.abs(got - expected).max()), ms))
    return results


def main(out_dir: Path) -> list[tuple[str, str, float]]:
    """samples/run_all.py's contract: (exporter, lowering, max abs error vs torch) rows."""
    return [(r.exporter, r.lowering, r.max_abs_err) for r in run(out_dir)]


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="graphkit-deform_conv-"))
    out.mkdir(parents=True, exist_ok=True)
    for r in run(out, timing=True):
        print(f"{r.exporter:<12} {r.lowering:<10} max abs err {r.max_abs_err:.3g}  latency {r.ms:.3f} ms")
