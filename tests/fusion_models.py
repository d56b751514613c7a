"""Real architectures for the fusion tests and bench/fusions.py (torch needed).

- :class:`Encoder`: a small BERT-like encoder: token + position embeddings and LayerNorm,
  post-LN layers of multi-head self-attention and a GELU MLP (even layers ``nn.GELU()``,
  odd layers ``nn.GELU(approximate="tanh")``), and a pooler + classifier on the first token
  written as ``gelu_new(h @ W + b) @ W2 + b2`` (as hand-written heads are). ``norm="torch"`` uses ``nn.LayerNorm``;
  ``norm="manual"`` the hand-written LayerNorm of the original BERT code, which both
  exporters decompose at every opset.
- :class:`ResNet`: torchvision-style BasicBlocks (3x3 Conv + BatchNorm + ReLU, a 1x1
  Conv + BatchNorm downsample) behind a Conv + BN stem, average pool and a Linear head.
- :func:`transformer`: transformers' BertModel or GPT2Model from a tiny config, random weights
  (every parameter, biases too: equal ones would be shared by the exporter), returning the
  last hidden state.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class BertLayerNorm(nn.Module):
    """LayerNorm over the last axis as the original BERT code writes it (epsilon inside the root)."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight * x + self.bias


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """The tanh GELU as GPT-2 and many BERT ports write it by hand."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class SelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        hd = d // self.heads

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, hd).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)
        return self.o((att @ v).transpose(1, 2).reshape(b, t, d))


class EncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, norm: type, approximate: str) -> None:
        super().__init__()
        self.attn = SelfAttention(d, heads)
        self.ln1, self.ln2 = norm(d), norm(d)
        self.fc1, self.act, self.fc2 = nn.Linear(d, 4 * d), nn.GELU(approximate=approximate), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.fc2(self.act(self.fc1(x))))


class Encoder(nn.Module):
    def __init__(self, layers: int = 2, d: int = 16, heads: int = 2, vocab: int = 40, max_len: int = 16,
                 classes: int = 3, norm: str = "torch") -> None:
        super().__init__()
        norm_cls = {"torch": nn.LayerNorm, "manual": BertLayerNorm}[norm]
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.ln = norm_cls(d)
        self.layers = nn.ModuleList(EncoderLayer(d, heads, norm_cls, "tanh" if i % 2 else "none")
                                    for i in range(layers))
        self.pool_w = nn.Parameter(torch.randn(d, d) / math.sqrt(d))
        self.pool_b = nn.Parameter(torch.randn(d))
        self.cls_w = nn.Parameter(torch.randn(d, classes) / math.sqrt(d))
        self.cls_b = nn.Parameter(torch.randn(classes))

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.ln(self.tok(ids) + self.pos.weight[: ids.shape[1]])
        for layer in self.layers:
            x = layer(x)
        pooled = gelu_new(x[:, 0] @ self.pool_w + self.pool_b)
        return x, pooled @ self.cls_w + self.cls_b


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, bias: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=bias)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=bias)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=bias), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class ResNet(nn.Module):
    """Stem + two stages of one BasicBlock each: 6 Conv + BatchNorm pairs."""

    CONV_BN = 6

    def __init__(self, width: int = 8, classes: int = 5, bias: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=bias)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = BasicBlock(width, width, 1, bias)
        self.layer2 = BasicBlock(width, 2 * width, 2, bias)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.relu(self.bn1(self.conv1(x)))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Trained-looking statistics and affine parameters in every norm layer; eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm, BertLayerNorm)):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=gen) - 0.5)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=gen) - 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
    return model.eval()


class _LastHidden(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, return_dict=False)[0]


def transformer(kind: str, layers: int = 2, d: int = 16, heads: int = 2, vocab: int = 40, seed: int = 0) -> nn.Module:
    """``"bert"`` or ``"gpt2"``: a tiny transformers model in eval mode with random weights (the
    attention computed eagerly, as the exporters trace it)."""
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    torch.manual_seed(seed)
    if kind == "bert":
        model = BertModel(BertConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                                     num_attention_heads=heads, intermediate_size=2 * d, max_position_embeddings=16,
                                     attn_implementation="eager"))
    else:
        model = GPT2Model(GPT2Config(vocab_size=vocab, n_embd=d, n_layer=layers, n_head=heads, n_positions=16,
                                     bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation="eager"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return _LastHidden(model).eval()
