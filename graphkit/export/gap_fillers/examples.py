"""The inputs of the gap fillers' examples (each checked against torch in ONNX Runtime by
the tests): seeded random tensors, with hard values appended."""

from __future__ import annotations

import math

import torch

from graphkit.export.aten import Example

__all__ = ["INF", "NAN", "binary_inputs", "edges", "example", "randn", "unary_inputs"]


def randn(*shape, scale=1.0):
    def make(gen: torch.Generator):
        return (torch.randn(*shape, generator=gen) * scale,)

    return make


def edges(values):
    """Random values with ``values`` appended (zeros, signed zeros, infinities, NaN...)."""
    def make(gen: torch.Generator):
        return (torch.cat([torch.randn(2, 8, generator=gen).flatten() * 3,
                           torch.tensor(values, dtype=torch.float32)]),)

    return make


def unary_inputs(low: float = -3.0, high: float = 3.0, extra=()):
    def make(gen: torch.Generator):
        x = torch.rand(2, 3, 8, generator=gen) * (high - low) + low
        if extra:
            x = torch.cat([x.flatten(), torch.tensor(extra, dtype=torch.float32)])
        return (x,)

    return make


def binary_inputs(scale=3.0, extra=()):
    def make(gen: torch.Generator):
        x = torch.randn(2, 3, 8, generator=gen) * scale
        y = torch.randn(2, 3, 8, generator=gen) * scale
        if extra:
            x = torch.cat([x.flatten(), torch.tensor([a for a, _ in extra], dtype=torch.float32)])
            y = torch.cat([y.flatten(), torch.tensor([b for _, b in extra], dtype=torch.float32)])
        return x, y

    return make


def example(fn, inputs, label=""):
    return Example(fn, inputs, label)


INF, NAN = math.inf, math.nan
