"""The architecture zoo: real models exported with both torch exporters at the opsets users pick.

Run:  python bench/zoo.py [--models bert,gpt2] [--exporters dynamo,torchscript] [--opsets 17,18,20]

Each model is built from a transformers config class (tiny dims, random weights, fixed seed;
nothing is downloaded) or written here in the torchvision style (ResNet backbone with an
FCN head, DeepLab's ASPP head, a RetinaNet-like detector with an FPN, anchor decoding and
a fixed top-k, without data-dependent postprocessing). Each cell of the grid
architectures x exporters x opsets goes through :func:`graphkit.export.export` (which loads
the written model in ONNX Runtime), then runs in ONNX Runtime through
:func:`graphkit.runtime.open_session` and is compared with torch eager on the same inputs
at the model's tolerance. The markdown table it prints says, per cell, whether the model
exported, ran and matched torch (max abs error), with the first line of the reason for
each failure.

``tests/test_zoo.py`` runs a bounded part of the grid (``GRAPHKIT_ZOO=1``: all of it).
Exit status 0 when every cell matches torch or fails as :data:`KNOWN_FAILURES` says.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

EXPORTERS = ("torchscript", "dynamo")
OPSETS = (17, 18, 20)


@dataclass(frozen=True)
class ZooModel:
    """A model of the zoo: ``build()`` returns (module, example args); outputs are compared
    with ``atol``/``rtol``. ``real(args)`` marks the (batch, position) entries that are real
    tokens, for models fed padding: a mismatch confined to padding positions is named so."""

    name: str
    build: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]
    atol: float = 1e-4
    rtol: float = 1e-4
    real: Callable[[tuple[torch.Tensor, ...]], torch.Tensor] | None = None


class _Outputs(nn.Module):
    """Calls a transformers model with keyword inputs and returns its first output
    (a tensor), so both exporters see positional tensors in and one tensor out."""

    def __init__(self, model: nn.Module, names: Sequence[str], **fixed) -> None:
        super().__init__()
        self.model = model
        self.names = tuple(names)
        self.fixed = fixed

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.names, inputs)), **self.fixed, return_dict=False)
        return out[0]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ids(batch: int, length: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=_gen(seed))


def _transformers():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import transformers
    transformers.logging.set_verbosity_error()
    return transformers


# --------------------------------------------------------------------------- transformers


def bert():
    t = _transformers()
    torch.manual_seed(0)
    cfg = t.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=37, max_position_embeddings=64)
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[1, 5:] = 0  # a padded sequence
    return _Outputs(t.BertModel(cfg), ["input_ids", "attention_mask"]), (_ids(2, 7, 99), mask)


def gpt2():
    t = _transformers()
    torch.manual_seed(0)
    cfg = t.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                       bos_token_id=0, eos_token_id=0)
    # input_ids only, as generation's first step calls it: the masking code then looks for
    # packed sequences in the position ids (torch.diff, a bool cumsum).
    return _Outputs(t.GPT2Model(cfg), ["input_ids"], use_cache=False), (_ids(2, 7, 99),)


def _left_padded_mask() -> torch.Tensor:
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[1, :3] = 0  # batched generation pads on the left
    return mask


def gpt2_padded():
    model, (ids,) = gpt2()
    model.names = ("input_ids", "attention_mask")
    return model, (ids, _left_padded_mask())


def llama_padded():
    model, (ids,) = llama()
    model.names = ("input_ids", "attention_mask")
    return model, (ids, _left_padded_mask())


def _mask_input(args: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return args[1].bool()


def t5():
    t = _transformers()
    torch.manual_seed(0)
    cfg = t.T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=2,
                     num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                     decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return (_Outputs(t.T5Model(cfg), ["input_ids", "decoder_input_ids"], use_cache=False),
            (_ids(2, 9, 99), _ids(2, 5, 99, seed=2)))


def vit():
    t = _transformers()
    torch.manual_seed(0)
    cfg = t.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=37)
    return _Outputs(t.ViTModel(cfg), ["pixel_values"]), (torch.randn(2, 3, 32, 32, generator=_gen(1)),)


def whisper():
    t = _transformers()
    torch.manual_seed(0)
    cfg = t.WhisperConfig(vocab_size=99, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
                          decoder_ffn_dim=37, max_source_positions=16, max_target_positions=16,
                          pad_token_id=0, bos_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    features = torch.randn(1, 16, 32, generator=_gen(1))  # 2 * max_source_positions frames
    return (_Outputs(t.WhisperModel(cfg), ["input_features", "decoder_input_ids"], use_cache=False),
            (features, _ids(1, 5, 99, seed=2)))


def llama():
    t = _transformers()
    torch.manual_seed(0)
    cfg = t.LlamaConfig(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        bos_token_id=0, eos_token_id=1, pad_token_id=0)
    return _Outputs(t.LlamaModel(cfg), ["input_ids"], use_cache=False), (_ids(2, 7, 99),)


# --------------------------------------------------------------------------- torchvision style


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock (3x3, 3x3, identity or 1x1 projection)."""

    def __init__(self, cin: int, cout: int, stride: int = 1, dilation: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, padding=dilation, dilation=dilation, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, padding=dilation, dilation=dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """A small ResNet returning its stride-8, 16 and 32 feature maps (the last stage dilated
    instead of strided when ``dilate_last``, as segmentation backbones do)."""

    def __init__(self, widths=(8, 16, 24, 32), dilate_last: bool = False) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.layer1 = BasicBlock(widths[0], widths[0])
        self.layer2 = BasicBlock(widths[0], widths[1], stride=2)
        self.layer3 = BasicBlock(widths[1], widths[2], stride=2)
        self.layer4 = (BasicBlock(widths[2], widths[3], dilation=2) if dilate_last
                       else BasicBlock(widths[2], widths[3], stride=2))
        self.channels = widths[1:]

    def forward(self, x):
        c2 = self.layer2(self.layer1(self.stem(x)))
        c3 = self.layer3(c2)
        return c2, c3, self.layer4(c3)


def _randomize_bn(model: nn.Module) -> nn.Module:
    """Batch-norm statistics that are not the identity (as after training)."""
    gen = _gen(3)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    return model


class FCN(nn.Module):
    """torchvision's FCN: backbone, 3x3 conv head, 1x1 classifier, bilinear upsampling."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.backbone = ResNet(dilate_last=True)
        c = self.backbone.channels[-1]
        self.head = nn.Sequential(nn.Conv2d(c, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Dropout(0.1), nn.Conv2d(16, classes, 1))

    def forward(self, x):
        feat = self.backbone(x)[-1]
        return F.interpolate(self.head(feat), size=x.shape[-2:], mode="bilinear", align_corners=False)


class ASPP(nn.Module):
    """DeepLabV3's atrous spatial pyramid pooling: 1x1, three dilated 3x3 and an image-pooling
    branch, concatenated and projected."""

    def __init__(self, cin: int, cout: int = 16, rates=(2, 4, 6)) -> None:
        super().__init__()

        def cbr(k, d=1):
            return nn.Sequential(nn.Conv2d(cin, cout, k, padding=0 if k == 1 else d, dilation=d, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU())

        self.branches = nn.ModuleList([cbr(1), *[cbr(3, r) for r in rates]])
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, cout, 1, bias=False), nn.ReLU())
        self.project = nn.Sequential(nn.Conv2d(cout * (len(rates) + 2), cout, 1, bias=False),
                                     nn.BatchNorm2d(cout), nn.ReLU())

    def forward(self, x):
        pooled = F.interpolate(self.pool(x), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.project(torch.cat([b(x) for b in self.branches] + [pooled], dim=1))


class DeepLabV3(nn.Module):
    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.backbone = ResNet(dilate_last=True)
        self.aspp = ASPP(self.backbone.channels[-1])
        self.classifier = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                                        nn.ReLU(), nn.Conv2d(16, classes, 1))

    def forward(self, x):
        y = self.classifier(self.aspp(self.backbone(x)[-1]))
        return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)


class RetinaNetLike(nn.Module):
    """A RetinaNet-style detector without data-dependent postprocessing: FPN (lateral 1x1,
    nearest upsampling, 3x3 smoothing), shared class and box heads over three levels,
    anchors decoded with torchvision's BoxCoder arithmetic (clamped exp), a fixed top-k."""

    def __init__(self, classes: int = 4, anchors: int = 3, width: int = 16, topk: int = 20) -> None:
        super().__init__()
        self.backbone = ResNet()
        self.lateral = nn.ModuleList(nn.Conv2d(c, width, 1) for c in self.backbone.channels)
        self.smooth = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1) for _ in self.backbone.channels)
        self.cls_head = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, anchors * classes, 3, padding=1))
        self.box_head = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, anchors * 4, 3, padding=1))
        self.classes, self.anchors, self.topk = classes, anchors, topk
        self.sizes = (8.0, 16.0, 32.0)
        self.ratios = torch.tensor([0.5, 1.0, 2.0])

    def _anchors(self, feat: torch.Tensor, stride: int, size: float) -> torch.Tensor:
        """(H * W * A, 4) anchors (x1, y1, x2, y2) centred on each cell, as torchvision's
        AnchorGenerator lays them out."""
        h, w = feat.shape[-2:]
        ys = (torch.arange(h, dtype=torch.float32) + 0.5) * stride
        xs = (torch.arange(w, dtype=torch.float32) + 0.5) * stride
        cy, cx = torch.meshgrid(ys, xs, indexing="ij")
        hr = torch.sqrt(self.ratios)
        aw, ah = size / hr, size * hr
        centers = torch.stack([cx, cy, cx, cy], dim=-1).reshape(-1, 1, 4)
        half = torch.stack([-aw, -ah, aw, ah], dim=-1) / 2
        return (centers + half).reshape(-1, 4)

    def _flat(self, y: torch.Tensor, k: int) -> torch.Tensor:
        n, _, h, w = y.shape
        return y.view(n, self.anchors, k, h, w).permute(0, 3, 4, 1, 2).reshape(n, -1, k)

    def forward(self, x):
        feats = [lat(c) for lat, c in zip(self.lateral, self.backbone(x))]
        for i in range(len(feats) - 2, -1, -1):
            feats[i] = feats[i] + F.interpolate(feats[i + 1], size=feats[i].shape[-2:], mode="nearest")
        feats = [s(f) for s, f in zip(self.smooth, feats)]
        logits = torch.cat([self._flat(self.cls_head(f), self.classes) for f in feats], dim=1)
        deltas = torch.cat([self._flat(self.box_head(f), 4) for f in feats], dim=1)
        anchors = torch.cat([self._anchors(f, x.shape[-1] // f.shape[-1], s)
                             for f, s in zip(feats, self.sizes)], dim=0)
        widths, heights = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
        cx, cy = anchors[:, 0] + 0.5 * widths, anchors[:, 1] + 0.5 * heights
        dw = deltas[..., 2].clamp(max=math.log(1000.0 / 16))
        dh = deltas[..., 3].clamp(max=math.log(1000.0 / 16))
        pcx, pcy = deltas[..., 0] * widths + cx, deltas[..., 1] * heights + cy
        pw, ph = torch.exp(dw) * widths, torch.exp(dh) * heights
        boxes = torch.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw, pcy + 0.5 * ph], dim=-1)
        # An int and a float bound: torch 2.13's dynamo exporter fails on it by itself ("Unable to
        # cast 64.0 to Tensor"); graphkit.export._trace_fixes makes the int bound a float.
        boxes = boxes.clamp(min=0, max=float(x.shape[-1]))
        scores, labels = torch.sigmoid(logits).max(dim=-1)
        top, index = scores.topk(self.topk, dim=1)
        picked = torch.gather(boxes, 1, index.unsqueeze(-1).expand(-1, -1, 4))
        return picked, top, torch.gather(labels, 1, index)


def _vision(cls) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    def build():
        torch.manual_seed(0)
        return _randomize_bn(cls()), (torch.randn(1, 3, 64, 64, generator=_gen(1)),)

    build.__name__ = cls.__name__.lower()
    return build


ZOO: dict[str, ZooModel] = {m.name: m for m in [
    ZooModel("bert", bert),
    ZooModel("gpt2", gpt2),
    ZooModel("t5", t5),
    ZooModel("vit", vit),
    ZooModel("whisper", whisper),
    ZooModel("llama", llama),
    ZooModel("gpt2_padded", gpt2_padded, real=_mask_input),
    ZooModel("llama_padded", llama_padded, real=_mask_input),
    ZooModel("fcn_resnet", _vision(FCN)),
    ZooModel("deeplabv3_resnet", _vision(DeepLabV3)),
    ZooModel("retinanet_like", _vision(RetinaNetLike)),
]}


# Cells that fail for reasons graphkit does not fix (yet): (model or "*", exporter, opset or
# None for all) -> words of the failure reason, and why.
KNOWN_FAILURES: dict[tuple[str, str, int | None], tuple[str, str]] = {}


def known_failure(model: str, exporter: str, opset: int) -> str | None:
    """The words a known failure's reason holds, None for a cell expected to match torch."""
    for key in ((model, exporter, opset), (model, exporter, None), ("*", exporter, opset), ("*", exporter, None)):
        if key in KNOWN_FAILURES:
            return KNOWN_FAILURES[key][0]
    return None


# --------------------------------------------------------------------------- the grid


@dataclass
class Cell:
    """One model x exporter x opset."""

    model: str
    exporter: str
    opset: int
    exported: bool = False
    ran: bool = False
    matched: bool = False
    max_abs: float | None = None
    seconds: float = 0.0  # the export's, ONNX Runtime load check included
    check_seconds: float = 0.0  # the load check's alone (measured again on the written model)
    gap_fillers: tuple[str, ...] = ()
    reason: str = ""

    @property
    def status(self) -> str:
        if self.matched:
            return f"ok {self.max_abs:.1e}"
        if self.ran:
            return f"MISMATCH {self.max_abs:.1e}"
        return "RUN FAILED" if self.exported else "EXPORT FAILED"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


def run_cell(zoo: ZooModel, exporter: str, opset: int, folder: Path, **export_kwargs) -> Cell:
    """Export ``zoo`` with graphkit, run it in ONNX Runtime and compare with torch eager."""
    import onnx

    from graphkit.errors import GraphkitError
    from graphkit.export import export
    from graphkit.export._loading import silenced_output
    from graphkit.export._runtime_check import check_loads
    from graphkit.runtime import open_session
    from graphkit.verify import compare_arrays

    cell = Cell(zoo.name, exporter, opset)
    model, args = zoo.build()
    model.eval()
    with torch.no_grad():
        want = model(*args)
    want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
    path = folder / f"{zoo.name}_{exporter}_{opset}.onnx"
    start = time.perf_counter()
    try:
        with silenced_output(True), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = export(model, args, path, dynamo=exporter == "dynamo", opset=opset, **export_kwargs)
    except GraphkitError as exc:
        cell.reason = _first_line(exc)
        return cell
    finally:
        cell.seconds = time.perf_counter() - start
    cell.exported = True
    cell.gap_fillers = report.gap_fillers
    written = onnx.load(path)
    start = time.perf_counter()
    check_loads(written, report.registry, model_name=zoo.name, exporter=exporter, path=str(path))
    cell.check_seconds = time.perf_counter() - start
    try:
        session = open_session(path)
        got = session.run({i.name: a.numpy() for i, a in zip(session.inputs, args)})
    except GraphkitError as exc:
        cell.reason = _first_line(exc)
        return cell
    cell.ran = True
    diffs = [compare_arrays(name, w, g, atol=zoo.atol, rtol=zoo.rtol) for (name, g), w in zip(got.items(), want)]
    cell.max_abs = max(d.max_abs for d in diffs)
    cell.matched = len(got) == len(want) and all(d.passed for d in diffs)
    if not cell.matched:
        bad = next((d for d in diffs if not d.passed), None)
        cell.reason = (f"{len(got)} outputs vs torch's {len(want)}" if len(got) != len(want) else
                       f"output {bad.name}: max abs {bad.max_abs:.3g} > atol {zoo.atol:g} + rtol {zoo.rtol:g}"
                       + (f" ({bad.note})" if bad.note else ""))
        if zoo.real is not None and len(got) == len(want):
            real = zoo.real(args).numpy()
            on_real = [compare_arrays(name, w[real], g[real], atol=zoo.atol, rtol=zoo.rtol)
                       for (name, g), w in zip(got.items(), want)]
            if all(d.passed for d in on_real):
                cell.reason += (f"; it differs only at padding positions, real tokens match "
                                f"(max abs {max(d.max_abs for d in on_real):.1e})")
    return cell


def run_grid(models: Sequence[str], exporters: Sequence[str] = EXPORTERS, opsets: Sequence[int] = OPSETS,
             folder: Path | None = None) -> list[Cell]:
    cells = []
    with contextlib.ExitStack() as stack:
        if folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="zoo-")))
        for name in models:
            for exporter in exporters:
                for opset in opsets:
                    cells.append(run_cell(ZOO[name], exporter, opset, folder))
    return cells


def format_table(cells: Sequence[Cell]) -> str:
    """A markdown table, architectures down and exporter/opset across, each cell saying
    whether the model exported, ran in ONNX Runtime and matched torch eager (max abs error);
    then the reason for each failure."""
    import onnxruntime

    columns = list(dict.fromkeys((c.exporter, c.opset) for c in cells))
    models = list(dict.fromkeys(c.model for c in cells))
    by_key = {(c.model, c.exporter, c.opset): c for c in cells}
    lines = [f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}. A cell: `ok MAX_ABS_ERR` "
             "(exported, ran in ONNX Runtime, matched torch eager), `MISMATCH MAX_ABS_ERR` (ran, did not "
             "match), `RUN FAILED` or `EXPORT FAILED`.", "",
             "| model | " + " | ".join(f"{e} {o}" for e, o in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for m in models:
        lines.append(f"| {m} | " + " | ".join(by_key[(m, e, o)].status if (m, e, o) in by_key else "-"
                                             for e, o in columns) + " |")
    ok = sum(c.matched for c in cells)
    lines += ["", f"{ok} of {len(cells)} cells export, run and match torch."]
    failures = [c for c in cells if not c.matched]
    if failures:
        lines += ["", "Failures (known: listed in KNOWN_FAILURES):"]
        lines += [f"- {c.model} {c.exporter} opset {c.opset}{' (known)' if _as_known(c) else ''}: {c.reason}"
                  for c in failures]
    fillers = sorted({f for c in cells for f in c.gap_fillers})
    if fillers:
        lines += ["", f"Gap fillers used: {', '.join(fillers)}."]
    exported = [c for c in cells if c.exported]
    if exported:
        slow = max(exported, key=lambda c: c.seconds)
        share = max(exported, key=lambda c: c.check_seconds / c.seconds)
        lines.append(f"Slowest export: {slow.model} {slow.exporter} opset {slow.opset}, {slow.seconds:.1f} s; "
                     f"ONNX Runtime load check: at most {share.check_seconds / share.seconds:.0%} of an "
                     f"export's time ({share.model} {share.exporter} {share.opset}: "
                     f"{share.check_seconds * 1e3:.0f} ms of {share.seconds:.2f} s).")
    return "\n".join(lines)


def _names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown {what} {bad or text!r}; choose from {', '.join(known)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=lambda s: _names(s, list(ZOO), "model"), default=list(ZOO),
                        help=f"comma-separated (default all: {','.join(ZOO)})")
    parser.add_argument("--exporters", type=lambda s: _names(s, EXPORTERS, "exporter"), default=list(EXPORTERS))
    parser.add_argument("--opsets", type=lambda s: [int(o) for o in s.split(",")], default=list(OPSETS))
    args = parser.parse_args(argv)
    cells = run_grid(args.models, args.exporters, args.opsets)
    print(format_table(cells))
    unexpected = [c for c in cells if not c.matched and not _as_known(c)]
    fixed = [c for c in cells if c.matched and known_failure(c.model, c.exporter, c.opset)]
    for c in unexpected:
        print(f"UNEXPECTED: {c.model} {c.exporter} opset {c.opset} fails", file=sys.stderr)
    for c in fixed:
        print(f"FIXED: {c.model} {c.exporter} opset {c.opset} is listed in KNOWN_FAILURES", file=sys.stderr)
    return 1 if unexpected or fixed else 0


def _as_known(cell: Cell) -> bool:
    words = known_failure(cell.model, cell.exporter, cell.opset)
    return words is not None and words in cell.reason


if __name__ == "__main__":
    sys.exit(main())
