"""The corpus of `graphkit simplify` (issue 26): real models exported by graphkit's export.

Used by ``tests/test_simplify_bench.py`` (``small=True``: tiny configs, images 32x32) and
``bench/simplify.py`` (``small=False``: 4 layers of hidden 256, sequence 128, images
224x224). Every model has random weights from fixed seeds; nothing is downloaded.

- ``bert``, ``gpt2``, ``vit``, ``llama`` (RMSNorm, rotary embeddings, grouped KV heads):
  transformers' model classes built from their config classes, as ``bench/zoo.py`` does;
- ``resnet50``: a torchvision-style ResNet-50 (Bottleneck [3, 4, 6, 3]) written here;
- ``dcn_resnet``: ``samples/dcn_resnet.py``'s ResNet-50 with DCNv2 (graphkit's
  ``custom::deform_conv2d``) in its last two stages;
- ``my_add_resnet``: a ResNet-18 layout (BasicBlock [2, 2, 2, 2]) whose residual adds are
  graphkit's ``my_add`` (2a + b, ``custom::my_add``).

:func:`build_corpus` exports each model with each exporter (TorchScript ``dynamo=False``,
``dynamo=True``), with static shapes (batch 1) and with a dynamic batch (and sequence, for
the text models) dimension. An entry holds the ONNX path, input feeds (one shape for a
static export; two for a dynamic one: batch 1 at the full length, then batch 2 at another
length) and torch eager's outputs on them. A combination that fails to export is an entry
whose ``error`` is the first line of the failure; nothing raises.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]

EXPORTERS = ("torchscript", "dynamo")
SHAPES = ("static", "dynamic")
OPSET = 18


# --------------------------------------------------------------------------- models


@dataclass
class Model:
    """A torch model and how to feed it: ``inputs(batch, length)`` builds the forward's
    arguments (``length`` is ignored by image models); the export example is
    (``batch``, ``length``) of :attr:`export_shape`, the feeds are :attr:`feed_shapes`."""

    name: str
    module: nn.Module
    input_names: tuple[str, ...]
    inputs: Callable[[int, int], tuple[torch.Tensor, ...]]
    length: int  # the realistic sequence length (or image side)
    other_length: int  # the second dynamic feed's
    sequence: bool  # whether the second dimension of the inputs is dynamic too
    atol: float = 1e-4
    rtol: float = 1e-3

    def dynamic_dims(self) -> dict[str, dict[int, str]]:
        dims = {0: "batch", 1: "sequence"} if self.sequence else {0: "batch"}
        return {n: dict(dims) for n in self.input_names}

    def export_shape(self, dynamic: bool) -> tuple[int, int]:
        # torch.export specializes a dimension whose example size is 1: dynamic exports
        # trace batch 2 (and a length unlike any other dimension of the model).
        return (2, self.length) if dynamic else (1, self.length)

    def feed_shapes(self, dynamic: bool) -> list[tuple[int, int]]:
        return [(1, self.length), (2, self.other_length)] if dynamic else [(1, self.length)]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _transformers():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import transformers
    transformers.logging.set_verbosity_error()
    return transformers


class _FirstOutput(nn.Module):
    """A transformers model called with keyword inputs, its first output returned, so both
    exporters see named tensors in (torch.export's dynamic shapes go by parameter name)
    and one tensor out."""

    def __init__(self, model: nn.Module, **fixed) -> None:
        super().__init__()
        self.model = model
        self.fixed = fixed

    def call(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**inputs, **self.fixed, return_dict=False)[0]


class _Ids(_FirstOutput):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.call(input_ids=input_ids)


class _IdsMask(_FirstOutput):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.call(input_ids=input_ids, attention_mask=attention_mask)


class _Pixels(_FirstOutput):
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.call(pixel_values=pixel_values)


def _token_inputs(vocab: int, mask: bool) -> Callable[[int, int], tuple[torch.Tensor, ...]]:
    def inputs(batch: int, length: int) -> tuple[torch.Tensor, ...]:
        ids = torch.randint(0, vocab, (batch, length), generator=_gen(batch * 1000 + length))
        if not mask:
            return (ids,)
        attention = torch.ones(batch, length, dtype=torch.int64)
        attention[1:, length - length // 4:] = 0  # the second sequence on is padded at its end
        return ids, attention

    return inputs


def _image_inputs(side: int) -> Callable[[int, int], tuple[torch.Tensor, ...]]:
    def inputs(batch: int, length: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn(batch, 3, side, side, generator=_gen(batch)),)

    return inputs


def bert(small: bool) -> Model:
    t = _transformers()
    torch.manual_seed(0)
    cfg = (t.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64) if small else
           t.BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=1024, max_position_embeddings=512))
    names = ("input_ids", "attention_mask")
    return Model("bert", _IdsMask(t.BertModel(cfg)), names, _token_inputs(cfg.vocab_size, True),
                 *((16, 9) if small else (128, 64)), sequence=True)


def gpt2(small: bool) -> Model:
    t = _transformers()
    torch.manual_seed(0)
    cfg = (t.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64) if small else
           t.GPT2Config(vocab_size=50257, n_embd=256, n_layer=4, n_head=4, n_positions=1024))
    cfg.bos_token_id = cfg.eos_token_id = 0
    names = ("input_ids",)
    return Model("gpt2", _Ids(t.GPT2Model(cfg), use_cache=False), names,
                 _token_inputs(cfg.vocab_size, False), *((16, 9) if small else (128, 64)), sequence=True)


def llama(small: bool) -> Model:
    t = _transformers()
    torch.manual_seed(0)
    common = dict(num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    cfg = (t.LlamaConfig(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                         max_position_embeddings=64, **common) if small else
           t.LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         max_position_embeddings=2048, **common))
    names = ("input_ids",)
    return Model("llama", _Ids(t.LlamaModel(cfg), use_cache=False), names,
                 _token_inputs(cfg.vocab_size, False), *((16, 9) if small else (128, 64)), sequence=True)


def vit(small: bool) -> Model:
    t = _transformers()
    torch.manual_seed(0)
    cfg = (t.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=37) if small else
           t.ViTConfig(image_size=224, patch_size=16, hidden_size=256, num_hidden_layers=4,
                       num_attention_heads=4, intermediate_size=1024))
    names = ("pixel_values",)
    side = cfg.image_size
    return Model("vit", _Pixels(t.ViTModel(cfg)), names, _image_inputs(side), side, side,
                 sequence=False)


class BasicBlock(nn.Module):
    """torchvision's BasicBlock; ``add(out, identity)`` joins the residual."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, add: Callable | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.add = add or torch.add
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.add(self.bn2(self.conv2(out)), identity))


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (1x1, 3x3 with the stride, 1x1 x4; 1x1 + BN projection)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, add: Callable | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.add = add or torch.add
        self.downsample = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes * 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.add(self.bn3(self.conv3(out)), identity))


class ResNet(nn.Module):
    """torchvision's ResNet: 7x7 stem, max pool, four stages, average pool, Linear."""

    def __init__(self, block: type[nn.Module], layers: Sequence[int], width: int = 64, num_classes: int = 1000,
                 add: Callable | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes, stages = width, []
        for i, blocks in enumerate(layers):
            planes = width * 2 ** i
            stage = []
            for b in range(blocks):
                stage.append(block(inplanes, planes, 2 if (i > 0 and b == 0) else 1, add))
                inplanes = planes * block.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)
        _init_cnn(self, residual_bn=[m.bn3 if isinstance(m, Bottleneck) else m.bn2 for m in self.modules()
                                     if isinstance(m, (BasicBlock, Bottleneck))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _init_cnn(model: nn.Module, residual_bn: Iterable[nn.BatchNorm2d]) -> None:
    """Kaiming convs and random BatchNorm statistics (eval-mode BatchNorm is no identity, as
    after training); the last BatchNorm of each block scaled down so outputs stay O(1)."""
    gen = _gen(1)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.0, generator=gen)
                m.bias.uniform_(-0.1, 0.1, generator=gen)
                m.running_mean.uniform_(-0.1, 0.1, generator=gen)
                m.running_var.uniform_(1.0, 2.0, generator=gen)
    with torch.no_grad():
        for bn in residual_bn:
            bn.weight.mul_(0.2)


def _cnn(name: str, module: nn.Module, side: int) -> Model:
    return Model(name, module, ("image",), _image_inputs(side), side, side, sequence=False)


def resnet50(small: bool) -> Model:
    torch.manual_seed(0)
    net = (ResNet(Bottleneck, (1, 1, 1, 1), width=8, num_classes=10) if small else ResNet(Bottleneck, (3, 4, 6, 3)))
    return _cnn("resnet50", net, 32 if small else 224)


def dcn_resnet(small: bool) -> Model:
    if str(REPO / "samples") not in sys.path:
        sys.path.insert(0, str(REPO / "samples"))
    from dcn_resnet import DCNResNet, dcn_resnet50

    torch.manual_seed(0)
    net = DCNResNet((1, 1, 1, 1), width=8, num_classes=10) if small else dcn_resnet50(width=64)
    return _cnn("dcn_resnet", net, 32 if small else 224)


def my_add_resnet(small: bool) -> Model:
    from graphkit.export import TorchOps

    torch.manual_seed(0)
    add = TorchOps().my_add  # 2a + b
    net = (ResNet(BasicBlock, (1, 1, 1, 1), width=8, num_classes=10, add=add) if small else
           ResNet(BasicBlock, (2, 2, 2, 2), add=add))
    return _cnn("my_add_resnet", net, 32 if small else 224)


MODELS: dict[str, Callable[[bool], Model]] = {f.__name__: f for f in
                                               (bert, gpt2, vit, llama, resnet50, dcn_resnet, my_add_resnet)}
# Models with graphkit's custom ops (their ONNX needs graphkit's kernels to run).
CUSTOM_OP_MODELS = frozenset({"dcn_resnet", "my_add_resnet"})


# --------------------------------------------------------------------------- the corpus


@dataclass
class Entry:
    """One model exported one way. ``feeds[i]`` are ONNX inputs by name, ``expected[i]``
    torch eager's outputs on them; ``error`` is the export's first error line (then there
    is no file)."""

    model: str
    exporter: str
    dynamic: bool
    path: Path
    feeds: list[dict[str, np.ndarray]] = field(default_factory=list)
    expected: list[list[np.ndarray]] = field(default_factory=list)
    error: str | None = None
    export_seconds: float = 0.0
    atol: float = 1e-4
    rtol: float = 1e-3

    @property
    def shapes(self) -> str:
        return "dynamic" if self.dynamic else "static"

    @property
    def label(self) -> str:
        return f"{self.model}/{self.exporter}/{self.shapes}"


def first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def export_entry(model: Model, exporter: str, dynamic: bool, folder: Path) -> Entry:
    """Export ``model`` one way into ``folder`` and compute torch's outputs on its feeds."""
    from graphkit.export import export
    from graphkit.export._loading import silenced_output

    shapes = "dynamic" if dynamic else "static"
    entry = Entry(model.name, exporter, dynamic, folder / f"{model.name}.{exporter}.{shapes}.onnx",
                  atol=model.atol, rtol=model.rtol)
    module = model.module.eval()
    for shape in model.feed_shapes(dynamic):
        args = model.inputs(*shape)
        with torch.no_grad():
            out = module(*args)
        entry.feeds.append({n: a.numpy() for n, a in zip(model.input_names, args)})
        entry.expected.append([o.numpy() for o in (out if isinstance(out, tuple) else (out,))])
    start = time.perf_counter()
    try:
        with silenced_output(True):
            export(module, model.inputs(*model.export_shape(dynamic)), entry.path, dynamo=exporter == "dynamo",
                   opset=OPSET, input_names=model.input_names, output_names=["output"],
                   dynamic_dims=model.dynamic_dims() if dynamic else None)
    except Exception as exc:  # noqa: BLE001 - a failed export is a result, recorded
        entry.error = first_line(exc)
    entry.export_seconds = time.perf_counter() - start
    return entry


def build_corpus(folder: str | Path, *, small: bool, models: Sequence[str] = tuple(MODELS),
                 exporters: Sequence[str] = EXPORTERS, shapes: Sequence[str] = SHAPES,
                 log: Callable[[str], None] | None = None) -> list[Entry]:
    """Every model x exporter x shape mode asked for, exported into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for name in models:
        model = MODELS[name](small)
        for exporter in exporters:
            for mode in shapes:
                entry = export_entry(model, exporter, mode == "dynamic", folder)
                if log is not None:
                    log(f"exported {entry.label} in {entry.export_seconds:.1f} s"
                        + (f": FAILED {entry.error}" if entry.error else ""))
                entries.append(entry)
    return entries
