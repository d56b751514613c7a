"""deform_conv2d: torchvision's deformable convolution (DCNv1, and DCNv2 with a mask).

Placeholder node ``custom::deform_conv2d``, inputs in this order (the order of ONNX's
standard ``DeformConv``; torchvision's Python call order differs, see
``graphkit_ops.deform_conv2d.nn.deform_conv2d``):

====== ======================================= ==========================================
input  shape                                   meaning
====== ======================================= ==========================================
input  (N, C, H, W)                            the image
weight (M, C / groups, kh, kw)                 the kernel
offset (N, 2 * offset_groups * kh * kw, Ho, Wo) (dy, dx) per offset group and kernel tap
bias   (M,)                    optional
mask   (N, offset_groups * kh * kw, Ho, Wo)    optional: modulation (DCNv2)
====== ======================================= ==========================================

Attributes: ``stride``, ``padding``, ``dilation`` (INTS, height then width; defaults
[1, 1], [0, 0], [1, 1]), ``groups`` and ``offset_groups`` (INT, default 1). Output
(N, M, Ho, Wo) with Ho = (H + 2 * pad_h - dilation_h * (kh - 1) - 1) // stride_h + 1.

Edge values. A sampling point reads the image only when -1 < y < H and -1 < x < W, so a
point whose offset is NaN, +-inf or far outside (any finite value that leaves the image,
however large) contributes exactly 0, like any point outside: the output there is the
bias plus the other taps. This holds in the reference and in every lowering
(tests/test_deform_conv.py::test_hard_offsets_agree_in_every_lowering); torchvision's own kernel
leaves NaN undefined (it casts the coordinate to an integer index). A corner outside the
image contributes 0 without reading a pixel (torchvision's rule), so a NaN or inf pixel
reaches exactly the outputs whose sampling points read it, in the reference, both
sampling decompositions and both kernels (test_nan_pixel_reaches_only_the_outputs_that_read_it).
ONNX Runtime's DeformConv (the ``onnx_deform_conv`` lowering, ONNX Runtime 1.32) departs
from this in one way: a sampling point with a corner outside the image (not 0 <= y < H - 1
and 0 <= x < W - 1: points outside, NaN points, the border strip, and points on the last
row or column, whose far corners have weight 0) reads pixel (0, 0) of its channel with
weight 0, so a NaN or infinite pixel (0, 0) gives NaN at every output of that position
(and weight group) that has such a point; torch's outputs there stay finite
(tests/test_edges.py::test_onnx_deform_conv_nan_rule_is_documented_and_real; the edge
harness compares that lowering with this rule). NaN or inf in the weight, bias or mask
propagate by IEEE arithmetic. The mask multiplies
the interpolated sample (torchvision's ``mask * bilinear(...)``), so an infinite or NaN mask
gives NaN at a point outside the image (mask * 0) and +-inf (or NaN) inside, in the
reference and every lowering, ONNX Runtime's DeformConv included
(test_non_finite_mask_multiplies_the_sample_in_every_lowering); the kernels fold a finite
mask into the bilinear weights and take a slower path only when a mask value is not finite.
Finite inputs give the reference's output in every lowering.

Beside this file: the torch reference (_reference.py), the numpy kernel
(_numpy_kernel.py), the decompositions (_decompose.py), the C++ core shared by the native
ONNX Runtime kernel (deform_conv2d.cc) and the torch forward (deform_conv2d_torch.cpp)
in deform_conv2d_core.h, and the torch-facing API (nn.py: ``deform_conv2d``,
``DeformConv2d``, the tutorial's ``torchvision::deform_conv2d`` symbolic).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphkit.ops import Attr, AttrType, ChannelLinear, Decomposition, ForeignOp, OpDef, Param, StandardOp

from . import _decompose, _shapes
from ._numpy_kernel import python_kernel
from ._reference import reference

FLOATS = ("tensor(float)", "tensor(double)")
SOURCES = ["deform_conv2d_torch.cpp", "deform_conv2d_core.h"]


def infer_shapes(shapes: list[Any], attrs: Mapping[str, Any]) -> list[Any]:
    """(N, M, Ho, Wo) from the input and weight (or offset) shapes; ValueError on a mismatch."""
    return [_shapes.check(shapes, attrs).output_shape]


def _torch_forward():
    from graphkit.export.extension import load_extension

    return load_extension("deform_conv2d", __name__, SOURCES).deform_conv2d


TORCHVISION_SCHEMA = (
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
    "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor")


def _from_torchvision(a: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """torchvision's call -> this op's. torchvision passes zeros for a missing bias (kept:
    adding zeros is exact) and a dummy mask with ``use_mask=False`` (dropped)."""
    inputs = [a["input"], a["weight"], a["offset"], a["bias"], a["mask"] if a["use_mask"] else None]
    return inputs, {"stride": [a["stride_h"], a["stride_w"]], "padding": [a["pad_h"], a["pad_w"]],
                    "dilation": [a["dilation_h"], a["dilation_w"]], "groups": a["groups"],
                    "offset_groups": a["offset_groups"]}


def _from_onnx_deform_conv(a: Mapping[str, Any]) -> dict[str, Any]:
    """ai.onnx DeformConv's attributes -> this op's (its inputs are in this op's order).
    ``kernel_shape`` is the weight's and needs no attribute; pads must be the same on both
    sides (deform_conv2d pads symmetrically); 2-D only."""
    unknown = sorted(set(a) - {"strides", "pads", "dilations", "group", "offset_group", "kernel_shape"})
    if unknown:
        raise ValueError(f"DeformConv attribute(s) {unknown} are not DeformConv-19's")
    pads = list(a.get("pads", [0, 0, 0, 0]))
    if len(pads) != 4 or pads[:2] != pads[2:]:
        raise ValueError(f"pads {pads} differ between the two sides of an axis (or are not 2-D); "
                         "deform_conv2d pads both sides alike")
    out = {"stride": list(a.get("strides", [1, 1])), "padding": pads[:2],
           "dilation": list(a.get("dilations", [1, 1])), "group": a.get("group", 1),
           "offset_groups": a.get("offset_group", 1)}
    for key in ("stride", "dilation"):
        if len(out[key]) != 2:
            raise ValueError(f"{key} {out[key]} is not 2-D")
    out["groups"] = out.pop("group")
    return out


DEFORM_CONV2D = OpDef(
    name="deform_conv2d",
    doc=("torchvision.ops.deform_conv2d: deformable 2-D convolution, bilinear sampling at the "
         "offset kernel taps (zero outside the image), optionally modulated by a mask. "
         "Inputs: input, weight, offset, bias (optional), mask (optional)."),
    inputs=(
        Param("input", "T", "(N, C, H, W)"),
        Param("weight", "T", "(M, C / groups, kh, kw)"),
        Param("offset", "T", "(N, 2 * offset_groups * kh * kw, Ho, Wo): (dy, dx) per tap"),
        Param("bias", "T", "(M,)", optional=True),
        Param("mask", "T", "(N, offset_groups * kh * kw, Ho, Wo)", optional=True),
    ),
    outputs=(Param("output", "T", "(N, M, Ho, Wo)"),),
    type_constraints={"T": FLOATS},
    attributes=(
        Attr("stride", AttrType.INTS, [1, 1], "(stride_h, stride_w)"),
        Attr("padding", AttrType.INTS, [0, 0], "(pad_h, pad_w), applied on both sides"),
        Attr("dilation", AttrType.INTS, [1, 1], "(dilation_h, dilation_w)"),
        Attr("groups", AttrType.INT, 1, "weight groups: C / weight.shape[1]"),
        Attr("offset_groups", AttrType.INT, 1, "offset groups: offset.shape[1] / (2 * kh * kw)"),
    ),
    reference=reference,
    infer_shapes=infer_shapes,
    torch_forward=_torch_forward,
    python_kernel=python_kernel,
    native=True,
    # sums of kh * kw * C bilinear samples, in another order per lowering: relative to the
    # sum of the terms' magnitudes (tests/test_edges.py)
    tolerance={"float32": (2e-6, 1e-30), "float64": (4e-15, 1e-300)},
    decompositions=(
        Decomposition("onnx_deform_conv", _decompose.onnx_deform_conv, min_opset=19),
        Decomposition("grid_sample", _decompose.grid_sample, min_opset=16),
        Decomposition("gather", _decompose.gather, min_opset=11),
    ),
    # torchvision.ops.deform_conv2d calls torch.ops.torchvision.deform_conv2d
    foreign_ops=(ForeignOp("torchvision::deform_conv2d", TORCHVISION_SCHEMA, _from_torchvision),),
    # torch's dynamo exporter writes torchvision::deform_conv2d as DeformConv (any opset)
    standard_ops=(StandardOp("DeformConv", 19, _from_onnx_deform_conv, decomposition="onnx_deform_conv"),),
    # out[:, m] = sum over taps of weight[m] * samples + bias[m]: a following BatchNormalization
    # or per-channel scale/shift folds into weight and bias (graphkit simplify)
    channel_linear=ChannelLinear(weight="weight", bias="bias"),
)

__all__ = ["DEFORM_CONV2D", "TORCHVISION_SCHEMA", "infer_shapes", "python_kernel", "reference"]
