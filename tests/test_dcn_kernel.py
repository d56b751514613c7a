"""deform_conv2d's native kernel (strips and OpenBLAS GEMMs on ORT's threads) in each of its regimes, and
the NativeKernels link options it relies on (include_dirs, library_dirs, libraries, rpath).

Regimes (deform_conv2d.cc): fused tiles of positions (many positions per image; the strips
GEMM with a constant weight, OpenBLAS with a weight that is an input), or two phases (few
positions: sample a chunk of positions, possibly across images, then the strips GEMM split
into blocks of strips, then of positions; tiles of MR positions, the last one smaller); the
weight reordered and packed once when it is a constant initializer, else per call. Every
case is compared with the torch reference, and 2 and 4 threads with 1 thread bit for bit (the
blocking never changes a sum's order; 2 threads may block like 1, 4 do not).
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphkit
from graphkit.errors import OpDefinitionError
from graphkit.ops import NativeKernels, OpDef, OpPackage, OpRegistry, Param
from graphkit.rewrite import Lowering
from graphkit.runtime import native, open_session

pytest.importorskip("torch")
from test_deform_conv import Case, onnx_model, reference  # noqa: E402

NP = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64}
ATOL = {TensorProto.FLOAT: 2e-4, TensorProto.DOUBLE: 1e-10}

# name -> (case, element type). Sizes put each case in the regime its name says (fused when a
# tile of at most 512 KiB of columns holds at least half as many positions as a weight group
# has output channels; a two-phase chunk at most 8 MiB). Strips hold 64 float or 32 double
# output channels; tiles 7 positions (AVX-512).
REGIMES = {
    # 64 channels: a tile of 227 positions > 64/2 output channels -> fused tiles, 3 images
    "fused": (Case(n=3, c=64, h=20, w=17, m=64, og=4, spread=3.0), TensorProto.FLOAT),
    # more positions per tile than output channels, no bias: fused tiles (OpenBLAS: 96
    # channels would be 2 strips of 64 with AVX-512, a third of the multiply-adds wasted)
    "fused_no_bias": (Case(n=2, c=192, h=12, w=12, m=96, bias=False), TensorProto.FLOAT),
    # 1024 channels would be two phases, but 40 output channels fill 5/8 of a strip: fused
    # tiles of 14 positions with OpenBLAS
    "fused_few_channels_per_strip": (Case(n=1, c=1024, h=5, w=4, m=40, og=2), TensorProto.FLOAT),
    # 256 channels at 7x7, 6 images (294 positions): two phases, one chunk spanning the images
    "two_phase_across_images": (Case(n=6, c=256, h=7, w=7, m=256, spread=3.0), TensorProto.FLOAT),
    # one image, stride 2 (input 14x14 -> 7x7): 49 positions, 7 tiles of 7
    "strips_one_image_stride2": (Case(n=1, c=256, h=14, w=14, m=256, stride=(2, 2), og=4, mask=False),
                                 TensorProto.FLOAT),
    # strips across 2 images (60 positions: the last tile of 4), 2 weight groups of 60
    # channels (a partial strip of 28)
    "strips_groups_double": (Case(n=2, c=256, h=5, w=6, m=120, groups=2, og=4, spread=3.0), TensorProto.DOUBLE),
    # double: 455 positions per chunk -> 3 images of 14x14 in 2 chunks crossing an image
    # boundary (455 then 133); 2 weight groups
    "two_phase_chunks_groups_double": (Case(n=3, c=256, h=14, w=14, m=128, groups=2, og=2, spread=3.0),
                                       TensorProto.DOUBLE),
    # one strip (60 channels) and 2 threads: the 72 positions split into blocks of rows (42 + 30)
    "strips_row_blocks": (Case(n=2, c=512, h=6, w=6, m=60, og=2, spread=3.0), TensorProto.FLOAT),
}


def _run(model: onnx.ModelProto, feeds: dict, threads: int) -> np.ndarray:
    lowered, _ = graphkit.rewrite_model(model, lowering=Lowering.NATIVE)
    (out,) = open_session(lowered, threads=threads).run(feeds).values()
    return out


@pytest.mark.parametrize("name", list(REGIMES))
def test_native_regimes_match_reference_with_constant_and_input_weight(name):
    case, dtype = REGIMES[name]
    arrays = case.arrays(seed=1, dtype=NP[dtype])
    want = reference(case, arrays)
    results = []
    for weight_static in (True, False):  # reordered (and packed) once at creation / per call
        model, feeds = onnx_model(case, 17, dtype=dtype, weight_static=weight_static, seed=1)
        one = _run(model, feeds, threads=1)
        np.testing.assert_allclose(one, want, rtol=0, atol=ATOL[dtype])
        for threads in (2, 4):  # 2 threads may split like 1 (blocks clamped to at least 2); 4 splits finer
            np.testing.assert_array_equal(_run(model, feeds, threads=threads), one, err_msg=f"{threads} threads")
        results.append(one)
    if not name.startswith("fused"):  # fused tiles: strips (constant) vs OpenBLAS (input) sum differently
        np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("positions", [1, 2, 3, 4, 5, 6, 8, 13])
def test_strips_tile_of_every_row_count(positions):
    """512 channels (two phases, strips): one image of 1 x `positions` output positions, so
    the last tile holds every row count from 1 to MR (7 on AVX-512, 6 on AVX2, 4 otherwise)."""
    case = Case(n=1, c=512, h=1, w=positions, m=64, og=2, spread=1.0)
    arrays = case.arrays(seed=positions)
    model, feeds = onnx_model(case, 17, seed=positions)
    one = _run(model, feeds, threads=1)
    np.testing.assert_allclose(one, reference(case, arrays), rtol=0, atol=ATOL[TensorProto.FLOAT])
    for threads in (2, 4):
        np.testing.assert_array_equal(_run(model, feeds, threads=threads), one, err_msg=f"{threads} threads")


def test_native_library_links_openblas_with_rpath():
    """graphkit_ops' library finds libscipy_openblas through its rpath, without LD_LIBRARY_PATH."""
    lib = native.library_path()
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, env=env, check=True).stdout
    line = next(x for x in out.splitlines() if "libscipy_openblas" in x)
    assert "not found" not in line


# ---- NativeKernels link options, as any package uses them -------------------------------------------

SCALE_C = """
extern "C" float demo_scale(float x) { return 3.0f * x; }
"""

SCALE_H = """
#pragma once
extern "C" float demo_scale(float x);
"""

KERNEL_CC = """
#include <demo_scale.h>
#include <graphkit/kernel.h>

namespace {
struct Scale {
  static const char* name() { return "scaled"; }
  static constexpr ONNXTensorElementDataType inputs[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
  static constexpr ONNXTensorElementDataType outputs[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
  Scale(const gk::Api&, const gk::KernelInfo&) {}
  void compute(gk::Context& ctx) {
    const gk::TensorView x = ctx.input(0);
    float* y = ctx.output<float>(0, x.shape);
    for (size_t i = 0; i < x.size; ++i) y[i] = demo_scale(x.as<float>()[i]);
  }
};
}  // namespace

GRAPHKIT_OPS(scaled, gk::make_op<Scale>())
"""


def _scaled_package(tmp_path: Path) -> OpPackage:
    """A package whose kernel calls demo_scale() from libdemoscale.so in another folder."""
    vendor = tmp_path / "vendor"
    (vendor / "include").mkdir(parents=True)
    (vendor / "lib").mkdir()
    (vendor / "include" / "demo_scale.h").write_text(SCALE_H)
    (vendor / "scale.cc").write_text(SCALE_C)
    subprocess.run(["c++", "-shared", "-fPIC", "-o", str(vendor / "lib" / "libdemoscale.so"),
                    str(vendor / "scale.cc")], check=True)
    pkg = tmp_path / "scaled_ops"
    pkg.mkdir()
    (pkg / "kernels.cc").write_text(textwrap.dedent(KERNEL_CC))
    op = OpDef(name="scaled", doc="3 * x", domain="scaled", torch_namespace="scaled", inputs=(Param("x", "T"),),
               outputs=(Param("y", "T"),), type_constraints={"T": ("tensor(float)",)}, reference=lambda x: 3 * x,
               infer_shapes=lambda s, a: [s[0]], native=True)
    return OpPackage("scaled_ops", (op,), native=NativeKernels(
        root=pkg, sources=("kernels.cc",), include_dirs=(vendor / "include",),
        library_dirs=("../vendor/lib",), libraries=("demoscale",)))  # relative: from root


def test_package_links_a_library_found_through_rpath(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHKIT_CACHE_DIR", str(tmp_path / "cache"))
    package = _scaled_package(tmp_path)
    registry = OpRegistry([package])
    lib = native.library_for([package], registry)
    assert "scaled::scaled" in native.served_ops(lib)
    node = helper.make_node("scaled", ["x"], ["y"], domain="scaled", name="s0")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17),
                                                                   helper.make_opsetid("scaled", 1)])
    lowered, _ = graphkit.rewrite_model(model, lowering=Lowering.NATIVE, registry=registry)
    x = np.arange(4, dtype=np.float32)
    (y,) = open_session(lowered, registry=registry).run({"x": x}).values()
    np.testing.assert_array_equal(y, 3 * x)
    # A rebuilt library (new size/time) is relinked: a new cache key. It is replaced by a
    # rename, as installers do: rewriting a loaded .so in place crashes this process at exit.
    so = tmp_path / "vendor" / "lib" / "libdemoscale.so"
    (so.parent / "new.so").write_bytes(so.read_bytes() + b"\0" * 64)
    os.replace(so.parent / "new.so", so)
    assert native.library_for([package], registry) != lib


@pytest.mark.parametrize("kwargs, message", [
    ({"libraries": ("libopenblas.so",)}, "must be a name as passed to -l"),
    ({"libraries": ("-lopenblas",)}, "must be a name as passed to -l"),
    ({"libraries": ("openblas.so.0",)}, "must be a name as passed to -l"),
])
def test_bad_library_name_is_a_definition_error(kwargs, message):
    with pytest.raises(OpDefinitionError, match=message):
        NativeKernels(root=".", sources=("k.cc",), **kwargs)


def test_link_options_with_a_prebuilt_library_are_refused(tmp_path):
    with pytest.raises(OpDefinitionError, match="not to a prebuilt library"):
        NativeKernels(library=tmp_path / "libx.so", libraries=("m",))


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_scratch_over_64_mib_is_released_after_the_call():
    """A 1x1 kernel over 64 channels of 520 x 520: the kernel's channels-last copy of the input
    is 66 MiB, over the 64 MiB it keeps between calls; with it kept, the process grew by
    68 MiB per session thread, released 2 MiB (measured). Calls after the release agree."""
    case = Case(n=1, c=64, h=520, w=520, m=1, kh=1, kw=1, padding=(0, 0), mask=False, bias=False)
    model, feeds = onnx_model(case, 17, seed=3)
    lowered, _ = graphkit.rewrite_model(model, lowering=Lowering.NATIVE)
    session = open_session(lowered, threads=1)
    before = _rss_mib()
    (first,) = session.run(feeds).values()
    grown = _rss_mib() - before
    assert grown < 32, f"{grown:.1f} MiB kept after the call"
    np.testing.assert_allclose(first, reference(case, case.arrays(seed=3)), rtol=0, atol=ATOL[TensorProto.FLOAT])
    (second,) = session.run(feeds).values()
    np.testing.assert_array_equal(second, first)
