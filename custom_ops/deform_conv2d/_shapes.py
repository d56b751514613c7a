"""Shape rules of deform_conv2d, shared by infer_shapes, the references, the decompositions
and the kernels' callers (the C++ kernels check the same rules with the same wording).

Dims are ints when known, anything else (a symbolic name, None, a torch SymInt) when not:
only known dims are checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Geometry", "check", "output_size"]

_INPUTS = ("input", "weight", "offset", "bias", "mask")
_RANKS = {"input": 4, "weight": 4, "offset": 4, "bias": 1, "mask": 4}


def _known(d: Any) -> bool:
    return isinstance(d, int) and not isinstance(d, bool)


def output_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """torchvision's (and Conv's) output length along one spatial axis."""
    return (size + 2 * pad - (dilation * (kernel - 1) + 1)) // stride + 1


@dataclass(frozen=True)
class Geometry:
    """What the shapes say; None where a dim is unknown."""

    n: Any
    c: Any
    h: Any
    w: Any
    m: Any
    kh: Any
    kw: Any
    ho: Any
    wo: Any

    @property
    def kernel_known(self) -> bool:
        return _known(self.kh) and _known(self.kw)

    @property
    def output_shape(self) -> list[Any]:
        return [self.n, self.m, self.ho, self.wo]


def _attrs(attrs: Mapping[str, Any]) -> tuple[list[int], list[int], list[int], int, int]:
    stride, padding, dilation = (list(attrs[k]) for k in ("stride", "padding", "dilation"))
    groups, offset_groups = int(attrs["groups"]), int(attrs["offset_groups"])
    for name, value, low in (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)):
        if len(value) != 2:
            raise ValueError(f"{name} must hold 2 values (height, width), got {value}")
        if any(v < low for v in value):
            raise ValueError(f"{name} values must be >= {low}, got {value}")
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    if offset_groups < 1:
        raise ValueError(f"offset_groups must be >= 1, got {offset_groups}")
    return stride, padding, dilation, groups, offset_groups


def check(shapes: Sequence[Sequence[Any] | None], attrs: Mapping[str, Any]) -> Geometry:
    """Check the input shapes (input, weight, offset, bias, mask; None or missing = absent or
    unknown) against each other and the attributes; raise ValueError naming the mismatch."""
    shapes = list(shapes) + [None] * (len(_INPUTS) - len(shapes))
    named = dict(zip(_INPUTS, shapes))
    for name, shape in named.items():
        if shape is not None and len(shape) != _RANKS[name]:
            raise ValueError(f"{name} must have rank {_RANKS[name]}, got shape {list(shape)}")
    stride, padding, dilation, groups, og = _attrs(attrs)
    x = named["input"] or [None] * 4
    wt = named["weight"] or [None] * 4
    off = named["offset"]
    bias = named["bias"]
    mask = named["mask"]
    n, c, h, w = x
    m, cin_g, kh, kw = wt

    def fail(message: str) -> None:
        raise ValueError(message)

    if _known(c) and c % og:
        fail(f"input has {c} channels, not divisible by offset_groups={og}")
    if _known(c) and _known(cin_g) and cin_g * groups != c:
        fail(f"weight has {cin_g} input channels per group; with groups={groups} the input needs "
             f"{cin_g * groups} channels, it has {c}")
    if _known(m) and m % groups:
        fail(f"weight has {m} output channels, not divisible by groups={groups}")
    for name, value in (("weight in_channels", cin_g), ("kernel height", kh), ("kernel width", kw)):
        if _known(value) and value < 1:
            fail(f"{name} must be >= 1, got {value}")
    ho = wo = None
    if _known(h) and _known(kh):
        ho = output_size(h, kh, stride[0], padding[0], dilation[0])
    if _known(w) and _known(kw):
        wo = output_size(w, kw, stride[1], padding[1], dilation[1])
    for name, value in (("height", ho), ("width", wo)):
        if value is not None and value < 1:
            fail(f"output {name} would be {value}: the input is smaller than the dilated kernel "
                 f"(input {x[2:]}, kernel {[kh, kw]}, padding {padding}, dilation {dilation})")
    kk = kh * kw if _known(kh) and _known(kw) else None
    if off is not None:
        if kk is not None and _known(off[1]) and off[1] != 2 * og * kk:
            fail(f"offset has {off[1]} channels; expected 2 * offset_groups * kh * kw = {2 * og * kk} "
                 f"(offset_groups={og}, kernel {kh}x{kw})")
        if kk is None and _known(off[1]) and off[1] % (2 * og):
            fail(f"offset has {off[1]} channels, not a multiple of 2 * offset_groups = {2 * og}")
        for axis, want, label in ((2, ho, "height"), (3, wo, "width")):
            if want is not None and _known(off[axis]) and off[axis] != want:
                fail(f"offset {label} is {off[axis]}; the output {label} is {want}")
        ho = ho if ho is not None else (off[2] if off[2] is not None else None)
        wo = wo if wo is not None else (off[3] if off[3] is not None else None)
    if mask is not None:
        if kk is not None and _known(mask[1]) and mask[1] != og * kk:
            fail(f"mask has {mask[1]} channels; expected offset_groups * kh * kw = {og * kk}")
        for axis, want, label in ((2, ho, "height"), (3, wo, "width")):
            if _known(want) and _known(mask[axis]) and mask[axis] != want:
                fail(f"mask {label} is {mask[axis]}; the output {label} is {want}")
    batch = [(name, s[0]) for name, s in (("input", x), ("offset", off), ("mask", mask))
             if s is not None and _known(s[0])]
    if len({b for _, b in batch}) > 1:
        fail("batch sizes differ: " + ", ".join(f"{name} {b}" for name, b in batch))
    if bias is not None and _known(bias[0]) and _known(m) and bias[0] != m:
        fail(f"bias has {bias[0]} values; the weight has {m} output channels")
    if n is None or not _known(n):
        n = next((b for _, b in batch), n if n is not None else (off[0] if off is not None else None))
    return Geometry(n=n, c=c, h=h, w=w, m=m, kh=kh, kw=kw, ho=ho, wo=wo)
