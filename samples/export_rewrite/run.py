"""An ``is_in_onnx_export()`` patch replaced by a clean model and an export-time rewrite.

    python samples/export_rewrite/run.py [OUT_DIR]

Before (seed 004, section 3): the model itself branches on the exporter, so every reader
of the training code meets deployment logic, and every export gets the branch whether the
target needs it or not::

    class PointwiseMix(nn.Module):
        def forward(self, x):
            if torch.onnx.is_in_onnx_export():          # Einsum is new in opset 12
                return F.conv2d(x, self.weight[:, :, None, None])
            return torch.einsum("bchw,oc->bohw", x, self.weight)

After: the model says what it computes; the export-friendly path is a rewrite of
``PointwiseMix.forward``, selected only where it is needed (opsets before 12) and active
only while exporting.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import graphkit
from graphkit.export import Opset, RewriteRegistry, export


class PointwiseMix(torch.nn.Module):
    """Mixes channels at every pixel: y[b, o, h, w] = sum_c w[o, c] x[b, c, h, w]."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(c_out, c_in) / c_in ** 0.5)

    def forward(self, x):
        return torch.einsum("bchw,oc->bohw", x, self.weight)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.mix = PointwiseMix(8, 4)

    def forward(self, x):
        return self.mix(torch.relu(self.conv(x)))


REWRITES = RewriteRegistry("export_rewrite sample")


@REWRITES.forward(PointwiseMix, when=Opset(max=11))
def pointwise_mix_as_conv(ctx, self, x):
    """Opsets before 12 have no Einsum: the same product as a 1x1 convolution."""
    return F.conv2d(x, self.weight[:, :, None, None])


def main(out_dir: Path) -> list[tuple[str, str, float]]:
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = model(x).numpy()
    rows = []
    for exporter, opset, dynamo in [("torchscript", 11, False), ("torchscript", 17, False),
                                    ("dynamo", 18, True)]:
        path = out_dir / f"net.{exporter}.opset{opset}.onnx"
        report = export(model, (x,), path, dynamo=dynamo, opset=opset, rewrites=REWRITES)
        ops = {n.op_type for n in graphkit.load_model(path).graph.node}
        rewritten = report.rewrites.get("export_rewrite sample/pointwise_mix_as_conv", 0) > 0
        assert rewritten == (opset < 12) and ("Einsum" in ops) == (not rewritten), (opset, ops)
        assert not hasattr(PointwiseMix.forward, "__graphkit_rewrite__")  # restored after export
        (got,) = graphkit.open_session(path).run({"x": x.numpy()}).values()
        rows.append((exporter, f"opset{opset}:{'conv' if rewritten else 'einsum'}",
                     float(np.abs(got - expected).max())))
    return rows


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="graphkit-rewrite-"))
    out.mkdir(parents=True, exist_ok=True)
    for exporter, lowering, err in main(out):
        print(f"{exporter:<12} {lowering:<16} max abs err {err:.3g}")
