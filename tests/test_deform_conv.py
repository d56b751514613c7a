"""deform_conv2d end to end: reference vs a naive loop, C++ torch forward, export (both
exporters and the tutorial's torchvision symbolic), the four lowerings vs the reference,
and the error paths."""

from __future__ import annotations

import math
import os
import platform
import shlex
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphkit_ops.deform_conv2d
import graphkit
from graphkit_ops.deform_conv2d import DEFORM_CONV2D, infer_shapes, python_kernel
from graphkit.errors import KernelError, RewriteError, UnsupportedOpError, ValidationError
from graphkit.rewrite import Lowering

torch = pytest.importorskip("torch")

ATOL = 1e-4  # fp32, every lowering vs the torch reference
NATIVE_SOURCE = Path(graphkit_ops.deform_conv2d.__file__).with_name("deform_conv2d.cc")


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    n: int = 1
    c: int = 4
    h: int = 6
    w: int = 5
    m: int = 4
    kh: int = 3
    kw: int = 3
    groups: int = 1
    og: int = 1
    stride: tuple = (1, 1)
    padding: tuple = (1, 1)
    dilation: tuple = (1, 1)
    mask: bool = True
    bias: bool = True
    spread: float = 2.0  # offsets ~ N(0, spread): many points land outside the image

    @property
    def out_hw(self) -> tuple[int, int]:
        ho = (self.h + 2 * self.padding[0] - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1
        wo = (self.w + 2 * self.padding[1] - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1
        return ho, wo

    @property
    def attrs(self) -> dict:
        return {"stride": list(self.stride), "padding": list(self.padding), "dilation": list(self.dilation),
                "groups": self.groups, "offset_groups": self.og}

    def arrays(self, seed: int = 0, dtype=np.float32) -> dict:
        rng = np.random.default_rng(seed)
        ho, wo = self.out_hw
        kk = self.kh * self.kw
        out = {"input": rng.standard_normal((self.n, self.c, self.h, self.w)),
               "weight": rng.standard_normal((self.m, self.c // self.groups, self.kh, self.kw)) / math.sqrt(
                   self.c // self.groups * kk),
               "offset": rng.standard_normal((self.n, 2 * self.og * kk, ho, wo)) * self.spread}
        if self.bias:
            out["bias"] = rng.standard_normal(self.m)
        if self.mask:
            out["mask"] = rng.random((self.n, self.og * kk, ho, wo))
        return {k: v.astype(dtype) for k, v in out.items()}


CASES = {
    "dcnv2": Case(),
    "groups2_og2_stride21_dil21_pad01": Case(n=2, c=4, h=7, w=6, m=6, kh=3, kw=2, groups=2, og=2, stride=(2, 1),
                                             padding=(0, 1), dilation=(2, 1), bias=False),
    "groups3_og3_nomask": Case(c=6, m=3, groups=3, og=3, stride=(1, 2), padding=(1, 0), dilation=(1, 2), mask=False),
    "stride2_dil2_og4_outside": Case(h=8, w=8, groups=2, og=4, stride=(2, 2), dilation=(2, 2), spread=6.0),
    "pad0_groups2_og1": Case(h=5, w=6, kh=2, kw=2, groups=2, padding=(0, 0)),
    "1x1_og2_plain": Case(h=6, w=6, m=2, kh=1, kw=1, og=2, padding=(0, 0), mask=False, bias=False),
}


def _random_cases(count: int, seed: int = 58) -> dict:
    """Random shapes (fixed seed) over the same axes: groups, offset groups, kernel, stride,
    padding, dilation, mask, bias."""
    rng = np.random.default_rng(seed)
    cases = {}
    while len(cases) < count:
        groups, og = int(rng.integers(1, 3)), int(rng.integers(1, 4))
        case = Case(n=int(rng.integers(1, 3)), c=groups * og * int(rng.integers(1, 3)), h=int(rng.integers(3, 9)),
                    w=int(rng.integers(3, 9)), m=groups * int(rng.integers(1, 4)), kh=int(rng.integers(1, 4)),
                    kw=int(rng.integers(1, 4)), groups=groups, og=og,
                    stride=tuple(int(v) for v in rng.integers(1, 3, 2)),
                    padding=tuple(int(v) for v in rng.integers(0, 3, 2)),
                    dilation=tuple(int(v) for v in rng.integers(1, 3, 2)),
                    mask=bool(rng.integers(0, 2)), bias=bool(rng.integers(0, 2)), spread=float(rng.uniform(0.5, 4)))
        if min(case.out_hw) >= 1:
            cases[f"random{len(cases)}"] = case
    return cases


CASES.update(_random_cases(6))
BOTH_INPUTS = [k for k, c in CASES.items() if c.mask and c.bias]  # what a Python kernel can take


def _torch(arrays: dict) -> list:
    import torch

    return [None if arrays.get(k) is None else torch.from_numpy(arrays[k])
            for k in ("input", "weight", "offset", "bias", "mask")]


def reference(case: Case, arrays: dict) -> np.ndarray:
    return DEFORM_CONV2D.reference(*_torch(arrays), **case.attrs).numpy()


# --------------------------------------------------------------------------- the naive loop


def _bilinear(img: np.ndarray, y: float, x: float) -> float:
    """torchvision's bilinear_interpolate, literally."""
    height, width = img.shape
    if y <= -1 or height <= y or x <= -1 or width <= x:
        return 0.0
    y_low, x_low = math.floor(y), math.floor(x)
    y_high, x_high = y_low + 1, x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    v1 = float(img[y_low, x_low]) if y_low >= 0 and x_low >= 0 else 0.0
    v2 = float(img[y_low, x_high]) if y_low >= 0 and x_high <= width - 1 else 0.0
    v3 = float(img[y_high, x_low]) if y_high <= height - 1 and x_low >= 0 else 0.0
    v4 = float(img[y_high, x_high]) if y_high <= height - 1 and x_high <= width - 1 else 0.0
    return hy * hx * v1 + hy * lx * v2 + ly * hx * v3 + ly * lx * v4


def naive_deform_conv2d(case: Case, a: dict) -> np.ndarray:
    """One output element at a time, straight from torchvision's definition."""
    ho, wo = case.out_hw
    cin_g, mg, kk = case.c // case.groups, case.m // case.groups, case.kh * case.kw
    c_per_og = case.c // case.og
    out = np.zeros((case.n, case.m, ho, wo))
    for n in range(case.n):
        for m in range(case.m):
            g = m // mg
            for oh in range(ho):
                for ow in range(wo):
                    acc = float(a["bias"][m]) if case.bias else 0.0
                    for cl in range(cin_g):
                        c = g * cin_g + cl
                        og = c // c_per_og
                        for i in range(case.kh):
                            for j in range(case.kw):
                                t = i * case.kw + j
                                dy = float(a["offset"][n, og * 2 * kk + 2 * t, oh, ow])
                                dx = float(a["offset"][n, og * 2 * kk + 2 * t + 1, oh, ow])
                                y = oh * case.stride[0] - case.padding[0] + i * case.dilation[0] + dy
                                x = ow * case.stride[1] - case.padding[1] + j * case.dilation[1] + dx
                                v = _bilinear(a["input"][n, c], y, x)
                                if case.mask:
                                    v *= float(a["mask"][n, og * kk + t, oh, ow])
                                acc += float(a["weight"][m, cl, i, j]) * v
                    out[n, m, oh, ow] = acc
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_reference_matches_naive_loop(name):
    case = CASES[name]
    arrays = case.arrays(seed=1, dtype=np.float64)
    np.testing.assert_allclose(reference(case, arrays), naive_deform_conv2d(case, arrays), rtol=0, atol=1e-12)


def test_reference_on_the_sampling_boundaries():
    """Points exactly on -1, 0, H-1, H and halfway outside: torchvision's strict bounds."""
    case = Case(n=1, c=2, h=4, w=4, m=2, kh=1, kw=1, padding=(0, 0), mask=False)
    arrays = case.arrays(seed=2, dtype=np.float64)
    edges = np.array([-1.5, -1.0, -0.5, 0.0, 2.5, 3.0, 3.5, 4.0])
    arrays["offset"][0, 0] = edges[np.arange(16).reshape(4, 4) % 8] - np.arange(4).reshape(4, 1)
    arrays["offset"][0, 1] = edges[(np.arange(16).reshape(4, 4) * 3) % 8] - np.arange(4).reshape(1, 4)
    want = naive_deform_conv2d(case, arrays)
    np.testing.assert_allclose(reference(case, arrays), want, rtol=0, atol=1e-12)
    got = python_kernel(*[arrays.get(k) for k in ("input", "weight", "offset", "bias", "mask")], **case.attrs)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_nan_and_far_offsets_read_zero():
    """A sampling point at NaN or far outside reads 0 (no garbage index): the reference and
    the numpy kernel (each lowering: test_hard_offsets_agree_in_every_lowering)."""
    case = Case(n=1, c=2, h=4, w=4, m=2, kh=1, kw=1, padding=(0, 0), mask=False)
    arrays = case.arrays(seed=2)
    arrays["offset"][0, :, 0, :2] = [[np.nan, 1e30], [0.0, -np.inf]]
    want = reference(case, arrays)
    assert np.isfinite(want).all()
    np.testing.assert_allclose(want[0, :, 0, :2], np.broadcast_to(arrays["bias"][:, None], (2, 2)), atol=1e-6)
    args = [arrays.get(k) for k in ("input", "weight", "offset", "bias", "mask")]
    np.testing.assert_allclose(python_kernel(*args, **case.attrs), want, rtol=0, atol=ATOL)


def test_python_kernel_takes_empty_arrays_for_absent_inputs():
    """What a runtime can pass for an omitted optional input: a 0-size tensor."""
    case = CASES["dcnv2"]
    a = case.arrays(seed=6)
    empty = np.zeros((0,), np.float32)
    got = python_kernel(a["input"], a["weight"], a["offset"], empty, empty, **case.attrs)
    plain = replace(case, mask=False, bias=False)
    np.testing.assert_allclose(got, reference(plain, {k: a[k] for k in ("input", "weight", "offset")}),
                               rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", list(CASES))
def test_python_kernel_matches_reference(name):
    case = CASES[name]
    arrays = case.arrays(seed=3)
    got = python_kernel(*[arrays.get(k) for k in ("input", "weight", "offset", "bias", "mask")], **case.attrs)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, reference(case, arrays), rtol=0, atol=ATOL)


def test_infer_shapes_and_mismatches():
    attrs = CASES["dcnv2"].attrs
    assert infer_shapes([["N", 4, 6, 5], [4, 4, 3, 3], None], attrs) == [["N", 4, 6, 5]]
    assert infer_shapes([None, [8, 2, 3, 3], ["N", 18, "h", "w"]], attrs) == [["N", 8, "h", "w"]]
    with pytest.raises(ValueError, match=r"offset has 17 channels; expected 2 \* offset_groups \* kh \* kw = 18"):
        infer_shapes([[1, 4, 6, 5], [4, 4, 3, 3], [1, 17, 6, 5]], attrs)
    with pytest.raises(ValueError, match="mask has 8 channels"):
        infer_shapes([[1, 4, 6, 5], [4, 4, 3, 3], [1, 18, 6, 5], [4], [1, 8, 6, 5]], attrs)
    with pytest.raises(ValueError, match="offset height is 5; the output height is 6"):
        infer_shapes([[1, 4, 6, 5], [4, 4, 3, 3], [1, 18, 5, 5]], attrs)
    with pytest.raises(ValueError, match="groups=2 the input needs 8 channels, it has 4"):
        infer_shapes([[1, 4, 6, 5], [4, 4, 3, 3], None], {**attrs, "groups": 2})
    with pytest.raises(ValueError, match="stride must hold 2 values"):
        infer_shapes([[1, 4, 6, 5], [4, 4, 3, 3], None], {**attrs, "stride": [1]})


# --------------------------------------------------------------------------- torch side

@pytest.fixture(scope="module")
def forward():
    """The C++ torch forward (built once per machine; later runs load the cache)."""
    return DEFORM_CONV2D.torch_forward()


@pytest.mark.parametrize("name", list(CASES))
def test_cpp_forward_matches_reference(forward, name):
    case = CASES[name]
    for dtype, atol in ((np.float32, ATOL), (np.float64, 1e-12)):
        arrays = case.arrays(seed=4, dtype=dtype)
        got = forward(*_torch(arrays), **case.attrs)
        assert got.dtype == (torch.float32 if dtype == np.float32 else torch.float64)
        np.testing.assert_allclose(got.numpy(), reference(case, arrays), rtol=0, atol=atol)


def test_cpp_forward_checks_its_inputs(forward):
    case = CASES["dcnv2"]
    args = _torch(case.arrays())
    with pytest.raises(RuntimeError, match=r"\[deform_conv2d\] offset has 16 channels; expected"):
        forward(args[0], args[1], args[2][:, :16], args[3], args[4], **case.attrs)
    with pytest.raises(RuntimeError, match=r"\[deform_conv2d\] weight must have the input's dtype"):
        forward(args[0], args[1].double(), *args[2:], **case.attrs)
    with pytest.raises(RuntimeError, match=r"\[deform_conv2d\] input must be float32 or float64"):
        forward(args[0].half(), *args[1:], **case.attrs)
    # 46343 x 46343 output positions from a 1x1 input padded by 23171: over 2^31, more than
    # OpenBLAS's 32-bit dimensions take (an empty batch keeps the tensors empty)
    ho = 2 * 23171 + 1
    empty = (torch.zeros(0, 1, 1, 1), torch.ones(1, 1, 1, 1), torch.zeros(0, 2, ho, ho))
    with pytest.raises(RuntimeError, match=r"\[deform_conv2d\] too large for the GEMM's 32-bit dimensions: .*"
                                           r"output positions Ho \* Wo = 2147673649"):
        forward(*empty, None, None, stride=[1, 1], padding=[23171, 23171], dilation=[1, 1], groups=1,
                offset_groups=1)


def test_functional_and_module_follow_torchvision(forward):
    from graphkit_ops.deform_conv2d.nn import DeformConv2d, deform_conv2d

    case = CASES["stride2_dil2_og4_outside"]
    a = _torch(case.arrays(seed=5))
    got = deform_conv2d(a[0], a[2], a[1], a[3], stride=2, padding=1, dilation=2, mask=a[4])  # torchvision's order
    np.testing.assert_allclose(got.numpy(), reference(case, case.arrays(seed=5)), rtol=0, atol=ATOL)

    torch.manual_seed(0)
    layer = DeformConv2d(4, 6, 3, padding=1, groups=2)
    assert layer.weight.shape == (6, 2, 3, 3) and layer.bias.shape == (6,)
    x = torch.randn(1, 4, 5, 5, requires_grad=True)
    offset = torch.randn(1, 18, 5, 5) * 2
    y = layer(x, offset)
    want = DEFORM_CONV2D.reference(x, layer.weight, offset, layer.bias, None, [1, 1], [1, 1], [1, 1], 2, 1)
    torch.testing.assert_close(y, want, rtol=0, atol=ATOL)
    y.sum().backward()  # gradients come from the reference
    assert x.grad is not None and layer.weight.grad is not None and layer.bias.grad is not None


# --------------------------------------------------------------------------- export


class DCNBlock(torch.nn.Module):
    """A DCNv2 block: a conv predicts offsets and mask; weight groups 2, offset groups 2."""

    def __init__(self, use_mask: bool = True, bias: bool = True) -> None:
        super().__init__()
        from graphkit_ops.deform_conv2d.nn import DeformConv2d

        self.use_mask = use_mask
        self.predict = torch.nn.Conv2d(4, 3 * 2 * 9, 3, stride=2, padding=1)
        self.dcn = DeformConv2d(4, 6, 3, stride=2, padding=1, groups=2, bias=bias)

    def forward(self, x):
        p = self.predict(x)
        offset, mask = p[:, :36], torch.sigmoid(p[:, 36:])
        return self.dcn(x, offset, mask if self.use_mask else None)


def _custom_nodes(model: onnx.ModelProto) -> list:
    return [n for n in model.graph.node if n.domain == "custom"]


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


WANT_ATTRS = {"stride": [2, 2], "padding": [1, 1], "dilation": [1, 1], "groups": 2, "offset_groups": 2}


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("use_mask, bias", [(True, True), (False, False)], ids=["mask_bias", "plain"])
def test_export_writes_one_placeholder(tmp_path, forward, dynamo, use_mask, bias):
    from graphkit.export import export

    torch.manual_seed(0)
    model = DCNBlock(use_mask, bias)
    x = torch.randn(2, 4, 9, 9)
    path = tmp_path / "dcn.onnx"
    report = export(model, (x,), path, dynamo=dynamo, dynamic_dims={"x": {0: "batch"}})
    proto = onnx.load(path)
    (node,) = _custom_nodes(proto)
    assert report.count("deform_conv2d") == 1 and node.op_type == "deform_conv2d"
    assert _attrs(node) == WANT_ATTRS
    names = list(node.input)
    assert names[0] == "x" and names[1] == "dcn.weight"
    if use_mask:
        assert len(names) == 5 and names[3] == ("dcn.bias" if bias else "")
    else:
        assert names[3:] == (["dcn.bias"] if bias else [])
    lowered, _ = graphkit.rewrite_model(proto, lowering=Lowering.NATIVE)
    x3 = torch.randn(3, 4, 9, 9)  # a batch the export did not see
    (got,) = graphkit.open_session(lowered).run({"x": x3.numpy()}).values()
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x3).numpy(), rtol=0, atol=ATOL)


TORCHVISION_SCHEMA = ("deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
                      "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
                      "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor")


@pytest.fixture
def torchvision_op():
    """torchvision::deform_conv2d as torchvision declares it, for this test only."""
    lib = torch.library.Library("torchvision", "DEF")
    try:
        lib.define(TORCHVISION_SCHEMA)

        def impl(input, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, groups, og, use_mask):
            return DEFORM_CONV2D.reference(input, weight, offset, bias, mask if use_mask else None,
                                           [sh, sw], [ph, pw], [dh, dw], groups, og)

        lib.impl("deform_conv2d", impl, "CompositeExplicitAutograd")
        yield torch.ops.torchvision.deform_conv2d
    finally:
        lib._destroy()


class TutorialModel(torch.nn.Module):
    """The tutorial's model: Conv2d(3, 18, 3) predicts offsets for a 3x3 deformable conv,
    called the way torchvision.ops.deform_conv2d calls its op."""

    def __init__(self, op, use_mask: bool) -> None:
        super().__init__()
        self.op, self.use_mask = op, use_mask
        self.conv1 = torch.nn.Conv2d(3, 27 if use_mask else 18, 3)
        self.weight = torch.nn.Parameter(torch.randn(3, 3, 3, 3) / 5)
        self.bias = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        p = self.conv1(x)
        offset = p[:, :18]
        mask = torch.sigmoid(p[:, 18:]) if self.use_mask else torch.zeros((x.shape[0], 1), dtype=x.dtype)
        return self.op(x, self.weight, offset, mask, self.bias, 1, 1, 0, 0, 1, 1, 1, 1, self.use_mask)


@pytest.mark.parametrize("use_mask", [False, True], ids=["dcnv1", "dcnv2"])
def test_tutorial_torchvision_symbolic(tmp_path, torchvision_op, use_mask):
    from graphkit_ops.deform_conv2d.nn import TORCHVISION_OP, torchvision_symbolics
    from graphkit.export import export
    from torch.onnx._internal.torchscript_exporter import registration

    torch.manual_seed(0)
    model = TutorialModel(torchvision_op, use_mask)
    x = torch.rand(1, 3, 10, 10)
    path = tmp_path / "dcn.onnx"
    with torchvision_symbolics():
        assert registration.registry.is_registered_op(TORCHVISION_OP, 9)
        export(model, (x,), path, dynamo=False)
    assert not registration.registry.is_registered_op(TORCHVISION_OP, 9)  # scoped to the block
    proto = onnx.load(path)
    (node,) = _custom_nodes(proto)
    assert len(node.input) == (5 if use_mask else 4) and node.input[0] == "x" and node.input[1] == "weight"
    assert _attrs(node) == {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1,
                            "offset_groups": 1}
    lowered, _ = graphkit.rewrite_model(proto, lowering=Lowering.NATIVE)
    (got,) = graphkit.open_session(lowered).run({"x": x.numpy()}).values()
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=0, atol=ATOL)


# --------------------------------------------------------------------------- lowerings


def onnx_model(case: Case, opset: int, *, dtype=TensorProto.FLOAT, batch="N", offset_channels=None,
               weight_static: bool = True, seed: int = 0) -> tuple[onnx.ModelProto, dict]:
    """
        input  offset  [bias]  [mask]     weight (initializer)
            \\     |     |       /          /
             custom::deform_conv2d ---------
                      |
                    output
    """
    np_t = helper.tensor_dtype_to_np_dtype(dtype)
    arrays = case.arrays(seed=seed, dtype=np_t)
    ho, wo = case.out_hw
    kk = case.kh * case.kw
    if offset_channels is not None:
        arrays["offset"] = arrays["offset"][:, :offset_channels].copy()
    names = ["input", "weight", "offset", "bias" if case.bias else "", "mask" if case.mask else ""]
    while not names[-1]:
        names.pop()
    node = helper.make_node("deform_conv2d", names, ["output"], domain="custom", name="dcn0", **case.attrs)
    shapes = {"input": [batch, case.c, case.h, case.w],
              "offset": [batch, arrays["offset"].shape[1], ho, wo],
              "bias": [case.m], "mask": [batch, case.og * kk, ho, wo]}
    inputs = [helper.make_tensor_value_info(k, dtype, shapes[k]) for k in ("input", "offset", "bias", "mask")
              if k in arrays]
    inits = []
    if weight_static:
        inits.append(numpy_helper.from_array(arrays["weight"], "weight"))
    else:
        inputs.insert(1, helper.make_tensor_value_info("weight", dtype, None))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("output", dtype, None)],
                              initializer=inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", opset),
                                                                   helper.make_opsetid("custom", 1)])
    feeds = {k: v for k, v in arrays.items() if k != "weight" or not weight_static}
    return model, feeds


def _run(model: onnx.ModelProto, feeds: dict, threads: int = 1) -> np.ndarray:
    (out,) = graphkit.open_session(model, threads=threads).run(feeds).values()
    return out


DECOMPOSITIONS = [(19, "onnx_deform_conv"), (16, "grid_sample"), (13, "gather")]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("opset, decomposition", DECOMPOSITIONS, ids=[d for _, d in DECOMPOSITIONS])
def test_decompositions_match_reference(name, opset, decomposition):
    case = CASES[name]
    model, feeds = onnx_model(case, opset)
    lowered, report = graphkit.rewrite_model(model, lowering=Lowering.DECOMPOSE)
    assert dict(report.actions) == {("custom::deform_conv2d", f"decompose:{decomposition}"): 1}
    assert not any(n.domain for n in lowered.graph.node)
    want = reference(case, case.arrays(seed=0))
    np.testing.assert_allclose(_run(lowered, feeds), want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("opset", [16, 13])
def test_sampling_decompositions_with_dynamic_sizes(opset):
    """Batch, height and width symbolic: sizes come from Shape in the graph."""
    case = CASES["groups2_og2_stride21_dil21_pad01"]
    model, _ = onnx_model(case, opset, batch="N")
    for vi in model.graph.input:
        for d, name in zip(vi.type.tensor_type.shape.dim[2:], ("H", "W") if vi.name == "input" else ("Ho", "Wo")):
            d.dim_param = name
    lowered, _ = graphkit.rewrite_model(model, lowering=Lowering.DECOMPOSE)
    bigger = replace(case, n=3, h=9, w=7)
    _, feeds = onnx_model(bigger, opset, seed=7)
    got = _run(lowered, {k: v for k, v in feeds.items() if k != "weight"})
    arrays = dict(bigger.arrays(seed=7), weight=case.arrays(seed=0)["weight"])  # the model's weight
    np.testing.assert_allclose(got, reference(bigger, arrays), rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", list(CASES))
def test_native_kernel_matches_reference(name):
    case = CASES[name]
    model, feeds = onnx_model(case, 17)
    lowered, report = graphkit.rewrite_model(model, lowering=Lowering.NATIVE)
    assert lowered.graph.node[0].domain == "graphkit.native"
    want = reference(case, case.arrays(seed=0))
    np.testing.assert_allclose(_run(lowered, feeds), want, rtol=0, atol=ATOL)
    np.testing.assert_allclose(_run(model, feeds), want, rtol=0, atol=ATOL)  # the placeholder runs too


def test_native_kernel_empty_batch():
    model, feeds = onnx_model(CASES["dcnv2"], 17)
    feeds = {k: (v[:0] if k in ("input", "offset", "mask") else v) for k, v in feeds.items()}
    lowered, _ = graphkit.rewrite_model(model, lowering=Lowering.NATIVE)
    assert _run(lowered, feeds).shape == (0, 4, 6, 5)


def test_native_kernel_double_and_threads():
    import ctypes

    from graphkit.runtime import native

    case = Case(n=2, c=16, h=23, w=19, m=40, og=2, spread=4.0)  # several tiles, a partial micro-tile
    model, feeds = onnx_model(case, 17, dtype=TensorProto.DOUBLE)
    want = reference(case, case.arrays(seed=0, dtype=np.float64))
    one = _run(model, feeds, threads=1)
    np.testing.assert_allclose(one, want, rtol=0, atol=1e-12)
    lib = ctypes.CDLL(str(native.library_path()))  # the instance ORT loaded
    lib.graphkit_native_parallel_for_calls.restype = ctypes.c_uint64
    before = lib.graphkit_native_parallel_for_calls()
    np.testing.assert_array_equal(_run(model, feeds, threads=2), one)  # tiles are independent
    assert lib.graphkit_native_parallel_for_calls() >= before + 2  # channels-last copy + tiles


@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"], ids=["avx2", "baseline"])
def test_native_source_compiles_without_avx512(march):
    """The sampling's AVX2 and portable paths (the library is built -march=native here)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 -march values")
    from graphkit.runtime import native
    from graphkit_ops import PACKAGE

    cxx = shlex.split(os.environ.get("CXX") or "c++")
    proc = subprocess.run([*cxx, "-std=c++17", f"-march={march}", "-fsyntax-only",
                           "-I", str(native.include_dir()), *(f"-I{d}" for d in PACKAGE.native.resolved().include_paths()),
                           str(NATIVE_SOURCE)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("name", BOTH_INPUTS)
def test_python_kernel_in_ort_matches_reference(name):
    case = CASES[name]
    model, feeds = onnx_model(case, 17)
    lowered, _ = graphkit.rewrite_model(model, lowering=Lowering.PYTHON)
    assert lowered.graph.node[0].domain == "graphkit.python"
    np.testing.assert_allclose(_run(lowered, feeds), reference(case, case.arrays(seed=0)), rtol=0, atol=ATOL)


def test_python_lowering_without_optional_inputs_matches_native():
    """The rewrite feeds empty tensors for the omitted mask (and bias): the kernel reads them as absent."""
    model, feeds = onnx_model(CASES["groups3_og3_nomask"], 17)
    py, _ = graphkit.rewrite_model(model, lowering=Lowering.PYTHON)
    native, _ = graphkit.rewrite_model(model, lowering=Lowering.NATIVE)
    got = graphkit.open_session(py).run(feeds)
    want = graphkit.open_session(native).run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-4)


# --------------------------------------------------------------------------- edge values

# (lowering, opset): every decomposition at its first opset and a later one, both kernels
EDGE_LOWERINGS = [("gather", 11), ("gather", 20), ("grid_sample", 16), ("grid_sample", 20),
                  ("onnx_deform_conv", 19), ("onnx_deform_conv", 22), ("native", 17), ("python", 17)]
EDGE_VALUES = [np.nan, np.inf, -np.inf, 1e30, -1e30, 4.7e18, -4.7e18, 5e9, -3e9, 1e6]


def _lower(model: onnx.ModelProto, how: str) -> onnx.ModelProto:
    """The model lowered by ``how``: a kernel, or that one decomposition (forced)."""
    if how in ("native", "python"):
        lowered, report = graphkit.rewrite_model(model, lowering=Lowering(how))
    else:
        (dec,) = [d for d in DEFORM_CONV2D.decompositions if d.name == how]
        only = replace(DEFORM_CONV2D, decompositions=(dec,))
        lowered, report = graphkit.rewrite_model(model, registry=graphkit.ops.OpRegistry([only]),
                                                 lowering=Lowering.DECOMPOSE)
        assert not any(n.domain for n in lowered.graph.node)
    assert dict(report.actions) == {("custom::deform_conv2d", f"{'bind' if how in ('native', 'python') else 'decompose'}:{how}"): 1}
    return lowered


def test_edge_offsets_read_zero_exactly():
    """Every tap of every point non-finite or far: the output is the bias, exactly."""
    case = Case(n=1, c=2, h=3, w=3, m=2, kh=1, kw=1, padding=(0, 0))
    arrays = case.arrays(seed=5)
    arrays["offset"][...] = np.resize(EDGE_VALUES, arrays["offset"].shape)
    want = np.broadcast_to(arrays["bias"].reshape(1, 2, 1, 1), (1, 2, 3, 3))
    np.testing.assert_array_equal(reference(case, arrays), want)
    for how, opset in EDGE_LOWERINGS:
        model, feeds = onnx_model(case, opset, seed=5)
        got = _run(_lower(model, how), dict(feeds, offset=arrays["offset"]))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=f"{how} at opset {opset}")


# Offsets that put a tap exactly on, just inside or just outside -1, 0, H-1 and H (the base
# points are integral), non-finite or far ones, and signed zeros.
HARD_OFFSETS = [np.nan, np.inf, -np.inf, 3e38, -3e38, 1e30, 4.7e18, -4.7e18, 5e9, 0.0, -0.0, 1e-30,
                -1e-7, 1e-7, 0.5, -0.5, 1.0, -1.0, -1.5, 2.0, -2.0, 3.0, 4.0, -4.0, 5.0, 5.5, -5.5, 0.99999994]


@pytest.fixture(scope="module")
def edge_sessions():
    """One session per lowering of one small model (offsets vary per example)."""
    case = Case(n=1, c=2, h=4, w=5, m=2, kh=2, kw=2, padding=(1, 1), spread=1.0)
    sessions = {}
    for how, opset in EDGE_LOWERINGS:
        model, feeds = onnx_model(case, opset, seed=8)
        sessions[f"{how}{opset}"] = graphkit.open_session(_lower(model, how))
    return case, feeds, sessions


def test_hard_offsets_agree_in_every_lowering(edge_sessions):
    """NaN, +-inf, far and boundary offsets (hypothesis over HARD_OFFSETS and small floats):
    every lowering gives the reference's output (the GridSample decomposition read border
    pixels for offsets beyond ~4.6e18, inf or NaN)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    case, feeds, sessions = edge_sessions
    arrays = case.arrays(seed=8)
    size = arrays["offset"].size
    values = st.sampled_from(HARD_OFFSETS) | st.floats(-6, 6, width=32)

    @settings(max_examples=12, derandomize=True, deadline=None, database=None)
    @given(changes=st.lists(st.tuples(st.integers(0, size - 1), values), min_size=1, max_size=60))
    def check(changes):
        offset = arrays["offset"].copy()
        for index, value in changes:  # dy or dx of one tap at one position
            offset.flat[index] = value
        want = reference(case, dict(arrays, offset=offset))
        assert np.isfinite(want).all()
        for name, session in sessions.items():
            (got,) = session.run(dict(feeds, offset=offset)).values()
            np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=name)

    check()


def test_nan_pixel_reaches_only_the_outputs_that_read_it(edge_sessions):
    """torchvision's rule: a corner outside the image contributes 0 without reading a pixel,
    so a NaN pixel reaches the outputs whose points read it, and no others (a clamped read
    times a zero weight would spread it). ONNX Runtime's DeformConv spreads a NaN pixel
    (0, 0) further, by the rule the package docstring states (edge_harness.OP_DOCUMENTED
    models it): that lowering is compared with the rule."""
    import edge_harness

    case, feeds, sessions = edge_sessions
    arrays = case.arrays(seed=8)
    arrays["input"][0, 0, 0, 0] = np.nan
    arrays["input"][0, 1, 3, 4] = np.nan  # the opposite corner, in the other channel
    arrays["offset"][0, :, ::2, ::3] = 100.0  # some points far outside
    want = reference(case, arrays)
    assert 0 < np.isnan(want).mean() < 0.5
    _, onnx_runtime = edge_harness.OP_DOCUMENTED[("deform_conv2d", "onnx_deform_conv")](
        DEFORM_CONV2D, edge_harness.OpCase(arrays, case.attrs), want)
    assert (np.isnan(onnx_runtime) & ~np.isnan(want)).any()
    for name, session in sessions.items():
        (got,) = session.run(dict(feeds, input=arrays["input"], offset=arrays["offset"])).values()
        expected = onnx_runtime if name.startswith("onnx_deform_conv") else want
        np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL, equal_nan=True, err_msg=name)


# (tap, oh, ow, mask value) at positions oh * 6 + ow of a 5x6 output: the native kernel's
# 16-wide vector lanes hold positions 0-15, its scalar tail 16-29
VECTOR_LANES = ((1, 0, 0, np.inf), (2, 2, 3, np.nan), (3, 1, 2, -np.inf), (2, 1, 4, np.nan))
SCALAR_TAIL = ((3, 3, 2, np.inf), (1, 4, 3, -np.inf), (0, 4, 0, np.nan), (2, 3, 1, -np.inf))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("where", [VECTOR_LANES, SCALAR_TAIL, VECTOR_LANES + SCALAR_TAIL],
                         ids=["vector_lanes", "scalar_tail", "both"])
def test_non_finite_mask_multiplies_the_sample_in_every_lowering(edge_sessions, where):
    """torchvision multiplies the interpolated sample by the mask: an infinite or NaN mask
    gives NaN at a point outside the image (mask * 0) and +-inf inside. Every lowering,
    ONNX Runtime's DeformConv included, gives the reference's output, which is torchvision's
    loop's (naive_deform_conv2d)."""
    case, feeds, sessions = edge_sessions
    arrays = case.arrays(seed=8)
    arrays["offset"][0, :, ::2, ::3] = 100.0  # some points far outside: (0, 0), (2, 3), (4, 0), (4, 3)...
    mask = arrays["mask"]  # (1, kk = 4, 5, 6)
    for tap, oh, ow, value in where:
        mask[0, tap, oh, ow] = value
    want = reference(case, arrays)
    np.testing.assert_allclose(want, naive_deform_conv2d(case, arrays), rtol=0, atol=ATOL, equal_nan=True)
    outside = [(oh, ow) for _, oh, ow, _ in where if oh % 2 == 0 and ow % 3 == 0]
    assert outside and all(np.isnan(want[0, :, oh, ow]).all() for oh, ow in outside)  # mask * 0
    assert np.isinf(want).any()  # an infinite mask inside the image
    assert np.isfinite(want).mean() > 0.5
    for name, session in sessions.items():
        (got,) = session.run(dict(feeds, offset=arrays["offset"], mask=mask)).values()
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, equal_nan=True, err_msg=name)


BIG_HW = (4097, 4100)  # 16.8M pixels > 2^24: float32 flat indices are inexact there


@pytest.mark.parametrize("how, opset", [("gather", 11), ("gather", 20), ("grid_sample", 16), ("onnx_deform_conv", 19),
                                        ("native", 17), ("python", 17)],
                         ids=["gather11", "gather20", "grid_sample16", "onnx_deform_conv19", "native", "python"])
def test_image_past_2_24_pixels(how, opset, big_image):
    """One channel, 4097x4100, a 1x1 kernel striding to a 2x2 output whose offsets land on
    odd flat indices past 2^24 (a float32 index rounds them to the neighbouring pixel)."""
    case, arrays, want = big_image
    model, _ = onnx_model(case, opset, seed=0)
    feeds = {k: arrays[k] for k in ("input", "offset", "bias", "mask")}
    got = _run(_lower(model, how), feeds)
    # GridSample's normalized float32 grid costs ~W * 2^-24 pixel in position
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 if how == "grid_sample" else ATOL)


@pytest.fixture(scope="module")
def big_image():
    h, w = BIG_HW
    case = Case(n=1, c=1, h=h, w=w, m=1, kh=1, kw=1, stride=(h - 1, w - 1), padding=(0, 0))
    assert case.out_hw == (2, 2)
    rng = np.random.default_rng(11)
    image = rng.standard_normal((1, 1, h, w)).astype(np.float32)
    base_y, base_x = np.array([[0, 0], [h - 1, h - 1]]), np.array([[0, w - 1], [0, w - 1]])
    # targets near the bottom right, flat index y * W + x odd and > 2^24, fractional parts
    ty = np.array([[4095.25, 4096.0], [4094.5, 4095.75]])
    tx = np.array([[4097.0, 3.5], [4097.25, 1.0]])
    assert all((int(y) * w + int(x)) % 2 == 1 and int(y) * w + int(x) > 2 ** 24 for y, x in zip(ty.flat, tx.flat))
    offset = np.stack([ty - base_y, tx - base_x])[None].astype(np.float32)  # (1, 2, 2, 2)
    weight = case.arrays(seed=0)["weight"]  # onnx_model's initializer
    arrays = {"input": image, "weight": weight, "offset": offset,
              "bias": np.zeros(1, np.float32), "mask": np.ones((1, 1, 2, 2), np.float32)}
    img = image[0, 0].astype(np.float64)
    want = np.zeros((1, 1, 2, 2))
    for (i, j), y in np.ndenumerate(ty):  # bilinear in float64, straight from the image
        x = tx[i, j]
        y0, x0 = int(np.floor(y)), int(np.floor(x))
        ly, lx = y - y0, x - x0
        want[0, 0, i, j] = sum(wgt * img[yy, xx] for yy, xx, wgt in (
            (y0, x0, (1 - ly) * (1 - lx)), (y0, x0 + 1, (1 - ly) * lx), (y0 + 1, x0, ly * (1 - lx)),
            (y0 + 1, x0 + 1, ly * lx)) if yy < h and xx < w) * float(weight.item())
    np.testing.assert_allclose(reference(case, arrays), want, rtol=0, atol=1e-5)
    return case, arrays, want


# --------------------------------------------------------------------------- errors


def test_wrong_offset_channels_at_rewrite_time():
    model, _ = onnx_model(CASES["dcnv2"], 19, offset_channels=16)
    with pytest.raises(RewriteError) as info:
        graphkit.rewrite_model(model, lowering=Lowering.DECOMPOSE)
    err = info.value
    assert err.op == "custom::deform_conv2d" and err.node == "dcn0"
    assert "offset has 16 channels; expected 2 * offset_groups * kh * kw = 18" in err.message
    with pytest.raises(ValidationError, match=r"\[custom::deform_conv2d\] offset has 16 channels"):
        graphkit.rewrite_model(model, lowering=Lowering.NATIVE)  # caught by the model check


def test_wrong_offset_channels_at_run_time():
    """Shapes unknown to the checks: the native kernel fails the run with a KernelError."""
    model, feeds = onnx_model(CASES["dcnv2"], 17, offset_channels=16)
    for vi in model.graph.input:
        vi.type.tensor_type.ClearField("shape")
    lowered, _ = graphkit.rewrite_model(model, lowering=Lowering.NATIVE)
    session = graphkit.open_session(lowered)
    with pytest.raises(KernelError, match=r"\[deform_conv2d\] offset has 16 channels; expected"):
        session.run(feeds)
    good = dict(feeds, offset=CASES["dcnv2"].arrays(seed=0)["offset"])
    assert session.run(good)["output"].shape == (1, 4, 6, 5)  # the session survives


def test_no_decomposition_at_the_opset_names_the_ranges():
    model, _ = onnx_model(CASES["dcnv2"], 10)
    with pytest.raises(UnsupportedOpError) as info:
        graphkit.rewrite_model(model, lowering=Lowering.DECOMPOSE)
    assert info.value.op == "custom::deform_conv2d"
    assert info.value.message == ("no decomposition valid at opset 10 (has onnx_deform_conv: opset 19.., "
                                  "grid_sample: opset 16.., gather: opset 11..)")


def test_sampling_decomposition_needs_a_static_weight():
    model, _ = onnx_model(CASES["dcnv2"], 16, weight_static=False)
    with pytest.raises(RewriteError, match=r"decomposition 'grid_sample': the weight's shape must be static"):
        graphkit.rewrite_model(model, lowering=Lowering.DECOMPOSE)
    at19, _ = onnx_model(CASES["dcnv2"], 19, weight_static=False)  # DeformConv needs no shapes
    graphkit.rewrite_model(at19, lowering=Lowering.DECOMPOSE)
