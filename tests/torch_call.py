"""The smallest model an exporter takes: a torch module that calls a function."""

from __future__ import annotations

import torch


class Call(torch.nn.Module):
    """``Call(torch.hypot)(x, y)`` is ``torch.hypot(x, y)`` as a module."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)
