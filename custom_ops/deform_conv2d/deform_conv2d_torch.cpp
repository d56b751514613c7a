// deform_conv2d: the torch C++ forward of graphkit's deform_conv2d op (CPU, float/double).
//
// Same algorithm and checks as the ONNX Runtime kernel, from the shared core
// (deform_conv2d_core.h): the image is copied channels-last with a trailing zero pixel,
// every output position is sampled into columns on torch's intra-op threads
// (at::parallel_for), and one batched matmul (torch's BLAS) applies the weight.
// Built and cached by graphkit.export.extension.load_extension.
#include <torch/python.h>

#include <ATen/Parallel.h>

#include <optional>
#include <string>
#include <vector>

#include "deform_conv2d_core.h"

namespace {

std::vector<int64_t> dims(const torch::Tensor& t) { return t.sizes().vec(); }

void check_tensor(const torch::Tensor& t, const char* name, const torch::Tensor& input) {
  TORCH_CHECK(t.defined(), "[deform_conv2d] ", name, " must be a defined tensor");
  TORCH_CHECK(t.scalar_type() == input.scalar_type(), "[deform_conv2d] ", name, " must have the input's dtype (",
              input.scalar_type(), "), got ", t.scalar_type());
  TORCH_CHECK(t.device().is_cpu(), "[deform_conv2d] ", name, " must be on the CPU, got ", t.device());
}

}  // namespace

torch::Tensor deform_conv2d(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& offset,
                            const std::optional<torch::Tensor>& bias, const std::optional<torch::Tensor>& mask,
                            std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
                            int64_t groups, int64_t offset_groups) {
  TORCH_CHECK(input.defined(), "[deform_conv2d] input must be a defined tensor");
  TORCH_CHECK(input.scalar_type() == torch::kFloat || input.scalar_type() == torch::kDouble,
              "[deform_conv2d] input must be float32 or float64, got ", input.scalar_type());
  check_tensor(input, "input", input);
  check_tensor(weight, "weight", input);
  check_tensor(offset, "offset", input);
  const bool has_bias = bias.has_value() && bias->defined();
  const bool has_mask = mask.has_value() && mask->defined();
  if (has_bias) check_tensor(*bias, "bias", input);
  if (has_mask) check_tensor(*mask, "mask", input);

  gk::dcn::Attributes attrs;
  attrs.stride = stride, attrs.padding = padding, attrs.dilation = dilation;
  attrs.groups = groups, attrs.offset_groups = offset_groups;
  gk::dcn::Geometry g;
  const std::vector<int64_t> bias_dims = has_bias ? dims(*bias) : std::vector<int64_t>();
  const std::vector<int64_t> mask_dims = has_mask ? dims(*mask) : std::vector<int64_t>();
  const std::string problem = gk::dcn::check(attrs, dims(input), dims(weight), dims(offset),
                                             has_bias ? &bias_dims : nullptr, has_mask ? &mask_dims : nullptr, g);
  TORCH_CHECK(problem.empty(), "[deform_conv2d] ", problem);

  const int64_t hw = g.h * g.w, np = g.positions(), kk = g.taps(), K = g.group_k();
  auto out = torch::empty({g.n, g.m, g.ho, g.wo}, input.options());
  if (out.numel() == 0) return out;

  // (N, H*W + 1, C): channels last, one zero pixel per image.
  auto pixels = torch::zeros({g.n, hw + 1, g.c}, input.options());
  pixels.narrow(1, 0, hw).copy_(input.reshape({g.n, g.c, hw}).transpose(1, 2));
  auto off = offset.contiguous();
  auto msk = has_mask ? mask->contiguous() : torch::Tensor();
  auto cols = torch::empty({g.n, g.groups, np, K}, input.options());

  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "deform_conv2d", [&] {
    const scalar_t* px = pixels.data_ptr<scalar_t>();
    const scalar_t* po = off.data_ptr<scalar_t>();
    const scalar_t* pm = has_mask ? msk.data_ptr<scalar_t>() : nullptr;
    scalar_t* pc = cols.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, kk * g.offset_groups));
    at::parallel_for(0, g.n * np, grain, [&](int64_t begin, int64_t end) {
      while (begin < end) {  // split the range at image boundaries
        const int64_t n = begin / np, p0 = begin % np, p1 = std::min(np, p0 + (end - begin));
        gk::dcn::sample<scalar_t>(g, px + n * (hw + 1) * g.c, po + n * 2 * g.offset_groups * kk * np,
                                  pm ? pm + n * g.offset_groups * kk * np : nullptr, p0, p1,
                                  pc + (n * g.groups * np + p0) * K, K, np * K);
        begin += p1 - p0;
      }
    });
  });

  // weight (M, cin_g, kh, kw) -> (groups, M/groups, kh*kw*cin_g) in the columns' k order.
  auto wt = weight.reshape({g.groups, g.mg(), g.cin_g, kk}).transpose(2, 3).reshape({g.groups, g.mg(), K});
  auto result = torch::matmul(wt.unsqueeze(0), cols.transpose(2, 3));  // (N, groups, M/groups, P)
  out.copy_(result.reshape({g.n, g.m, g.ho, g.wo}));
  if (has_bias) out.add_(bias->reshape({1, g.m, 1, 1}));
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "graphkit deform_conv2d torch forward (torchvision semantics)";
  m.def("deform_conv2d", &deform_conv2d, "deformable 2-D convolution", pybind11::arg("input"),
        pybind11::arg("weight"), pybind11::arg("offset"), pybind11::arg("bias") = pybind11::none(),
        pybind11::arg("mask") = pybind11::none(), pybind11::arg("stride") = std::vector<int64_t>{1, 1},
        pybind11::arg("padding") = std::vector<int64_t>{0, 0}, pybind11::arg("dilation") = std::vector<int64_t>{1, 1},
        pybind11::arg("groups") = 1, pybind11::arg("offset_groups") = 1);
}
