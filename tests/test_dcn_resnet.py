"""A whole DCN ResNet-50 (samples/dcn_resnet.py: torchvision's ResNet-50 layout, DCNv2 in
layer3 and layer4, random weights) exported by graphkit, lowered every way, run in ONNX
Runtime and compared with torch eager. Small here (width 8, 64x64); bench/deform_conv.py
--model times the full-size one."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import graphkit

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "samples"))
from dcn_resnet import LOWERINGS, dcn_resnet50, lower_all  # noqa: E402

DCN_LAYERS = 6 + 3  # every block of layer3 and layer4


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    torch.manual_seed(0)
    net = dcn_resnet50(width=8, num_classes=10).eval()
    image = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        want = net(image).numpy()
    return net, image, want, lower_all(net, image, tmp_path_factory.mktemp("dcn_resnet"))


def _ops(path: Path) -> collections.Counter:
    return collections.Counter((n.domain, n.op_type) for n in onnx.load(path).graph.node)


def test_architecture_is_resnet50_with_dcnv2_in_the_last_two_stages():
    net = dcn_resnet50(width=8)
    assert [len(s) for s in (net.layer1, net.layer2, net.layer3, net.layer4)] == [3, 4, 6, 3]
    kinds = [type(b.conv2).__name__ for s in (net.layer1, net.layer2, net.layer3, net.layer4) for b in s]
    assert kinds == ["Conv2d"] * 7 + ["DCNv2"] * DCN_LAYERS
    assert [b.conv2.conv.stride for b in net.layer3[:1] + net.layer4[:1]] == [(2, 2), (2, 2)]
    assert net.fc.in_features == 8 * 8 * 4


@pytest.mark.parametrize("label", list(LOWERINGS))
def test_every_lowering_matches_torch_eager(lowered, label):
    _, image, want, paths = lowered
    ops = _ops(paths[label])
    kernel_domain = {"native": "graphkit.native", "python": "graphkit.python"}.get(label)
    if kernel_domain is not None:
        assert ops[(kernel_domain, "deform_conv2d")] == DCN_LAYERS
    elif label == "DeformConv-19":
        assert ops[("", "DeformConv")] == DCN_LAYERS
    else:  # sampled with standard ops
        assert not any(domain for domain, _ in ops)
        assert ops[("", "GridSample" if label == "grid_sample" else "GatherElements")] >= DCN_LAYERS
    for threads in (1, 2):
        (got,) = graphkit.open_session(paths[label], threads=threads).run({"image": image.numpy()}).values()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
