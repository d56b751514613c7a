"""A DCN ResNet-50: torchvision's ResNet-50 with DCNv2 in its last two stages, random weights.

    python samples/dcn_resnet.py [--size 224] [--width 64] [--dynamo] [OUT_DIR]

torchvision's ``resnet50`` layout (Bottleneck blocks [3, 4, 6, 3], stride on the 3x3 conv,
a 1x1 conv + BatchNorm downsample), where every 3x3 conv of ``layer3`` and ``layer4`` is a
modulated deformable conv as in DCNv2 / mmdetection's ``ModulatedDeformConv2dPack``: a 3x3
conv (same stride) predicts 18 offsets and 9 mask logits per position, the mask is their
sigmoid. ``width`` scales every stage (64: the real ResNet-50; the test suite uses 16 on
64x64 images). BatchNorm statistics are random too, so eval mode is no identity.

As a script: export (graphkit's export; TorchScript exporter, or dynamo with --dynamo),
lower every way (gather, grid_sample, DeformConv-19, native, python), run each in ONNX
Runtime and print its largest difference from torch eager. ``bench/deform_conv.py --model`` times the same.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from graphkit_ops.deform_conv2d.nn import DeformConv2d

__all__ = ["LOWERINGS", "Bottleneck", "DCNResNet", "DCNv2", "dcn_resnet50", "lower_all"]


class DCNv2(nn.Module):
    """3x3 modulated deformable conv whose offsets and mask come from a 3x3 conv."""

    def __init__(self, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.offset_mask = nn.Conv2d(channels, 3 * 9, 3, stride=stride, padding=1)
        self.conv = DeformConv2d(channels, channels, 3, stride=stride, padding=1, bias=False)
        with torch.no_grad():  # trained offsets reach a few pixels; mmdet starts them at 0
            self.offset_mask.weight.normal_(0.0, 0.5 / (3 * channels) ** 0.5)
            self.offset_mask.bias.uniform_(-1.0, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        predicted = self.offset_mask(x)
        offset, mask = predicted[:, :18], torch.sigmoid(predicted[:, 18:])
        return self.conv(x, offset, mask)


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (expansion 4, stride on the 3x3), its 3x3 optionally DCNv2."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, deformable: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = DCNv2(planes, stride) if deformable else nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes * 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class DCNResNet(nn.Module):
    """ResNet with Bottleneck blocks; stages in ``deformable`` use DCNv2 for their 3x3 convs."""

    def __init__(self, layers: tuple[int, ...] = (3, 4, 6, 3), width: int = 64, num_classes: int = 1000,
                 deformable: tuple[bool, ...] = (False, False, True, True)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes, stages = width, []
        for i, (blocks, dcn) in enumerate(zip(layers, deformable)):
            planes = width * 2 ** i
            stage = []
            for b in range(blocks):
                stage.append(Bottleneck(inplanes, planes, 2 if (i > 0 and b == 0) else 1, dcn))
                inplanes = planes * 4
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)
        generator = torch.Generator().manual_seed(1)
        offset_convs = {id(m.offset_mask) for m in self.modules() if isinstance(m, DCNv2)}  # keep DCNv2's init
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and id(m) not in offset_convs:
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                with torch.no_grad():  # random statistics: eval-mode BatchNorm does something
                    m.weight.uniform_(0.5, 1.0, generator=generator)
                    m.bias.uniform_(-0.1, 0.1, generator=generator)
                    m.running_mean.uniform_(-0.1, 0.1, generator=generator)
                    m.running_var.uniform_(1.0, 2.0, generator=generator)
        for m in self.modules():  # torchvision's zero_init_residual, softened: outputs stay O(1)
            if isinstance(m, Bottleneck):
                with torch.no_grad():
                    m.bn3.weight.mul_(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def dcn_resnet50(width: int = 64, num_classes: int = 1000) -> DCNResNet:
    """ResNet-50 (Bottleneck [3, 4, 6, 3]) with DCNv2 in layer3 and layer4."""
    return DCNResNet((3, 4, 6, 3), width=width, num_classes=num_classes)


# label -> (lowering, target opset or None: the exported one's)
LOWERINGS = {
    "native": ("NATIVE", None),
    "python": ("PYTHON", None),
    "DeformConv-19": ("DECOMPOSE", 19),
    "grid_sample": ("DECOMPOSE", 16),
    "gather": ("DECOMPOSE", None),
}


def lower_all(net: nn.Module, example: torch.Tensor, out_dir: Path, *, dynamo: bool = False) -> dict[str, Path]:
    """``net`` exported by graphkit's export and lowered every way of LOWERINGS, saved in ``out_dir``.

    The TorchScript exporter writes opset 13, where the gather decomposition applies and
    from which the others convert up; the dynamo exporter (``dynamo=True``, 4x slower on
    this model) writes opset 18, which onnx's converter cannot take down to gather's 11-15
    (BatchNormalization), so that lowering is left out."""
    import graphkit
    from graphkit.export import export
    from graphkit.rewrite import Lowering

    exported = out_dir / f"dcn_resnet.{'dynamo' if dynamo else 'torchscript'}.onnx"
    export(net, (example,), exported, dynamo=dynamo, opset=18 if dynamo else 13, input_names=["image"],
           output_names=["logits"])
    paths = {}
    for label, (lowering, target) in LOWERINGS.items():
        if dynamo and label == "gather":
            continue
        lowered, _ = graphkit.rewrite_model(graphkit.load_model(exported), lowering=Lowering[lowering],
                                            target_opset=target)
        paths[label] = exported.with_suffix(f".{label}.onnx")
        graphkit.save_model(lowered, paths[label], input_path=exported)
    return paths


def main(argv: list[str] | None = None) -> int:
    import argparse

    import numpy as np

    import graphkit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="", help="output folder (default: a temporary one)")
    parser.add_argument("--size", type=int, default=224, help="image height and width")
    parser.add_argument("--width", type=int, default=64, help="first stage's width (64: ResNet-50)")
    parser.add_argument("--dynamo", action="store_true", help="torch's dynamo exporter (opset 18; no gather)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="graphkit-dcn-resnet-"))
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    net = dcn_resnet50(width=args.width).eval()
    image = torch.rand(1, 3, args.size, args.size)
    with torch.no_grad():
        want = net(image).numpy()
    failures = 0
    scale = float(np.abs(want).max())
    for label, path in lower_all(net, image, out, dynamo=args.dynamo).items():
        (got,) = graphkit.open_session(path).run({"image": image.numpy()}).values()
        err = float(np.abs(got - want).max())
        ok = err <= 1e-4 * max(scale, 1.0)  # float32 through ~50 layers
        failures += not ok
        print(f"{label:<14} max abs err vs torch {err:.3g} (outputs up to {scale:.3g})"
              f"  {'ok' if ok else 'MISMATCH'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
